// A Hugging Face model folder: config.json read strictly into DecoderOptions, and the weights
// from model.safetensors or the shards model.safetensors.index.json names, by HF's names.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "io/file_util.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/decoder.hpp"

namespace seqforge {

namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// config.json fields that describe the file or generation, not the function the model computes.
const std::set<std::string> kDescriptive = {"_name_or_path",
                                            "architectures",
                                            "model_type",
                                            "torch_dtype",
                                            "transformers_version",
                                            "bos_token_id",
                                            "eos_token_id",
                                            "pad_token_id",
                                            "use_cache",
                                            "output_attentions",
                                            "output_hidden_states",
                                            "return_dict",
                                            "id2label",
                                            "label2id",
                                            "problem_type",
                                            "tokenizer_class",
                                            "initializer_range",
                                            "pretraining_tp",
                                            "max_position_embeddings",
                                            "is_decoder",
                                            "chunk_size_feed_forward",
                                            "finetuning_task",
                                            "torchscript",
                                            "tie_encoder_decoder",
                                            "prefix",
                                            "task_specific_params",
                                            "decoder_start_token_id",
                                            "sep_token_id",
                                            "max_window_layers",
                                            "sliding_window",
                                            "dtype",
                                            "cache_implementation",
                                            "is_llama_config"};

class ConfigReader {
 public:
  ConfigReader(const Json& root, std::string path) : root_(root), path_(std::move(path)) {}

  const Json* get(const char* key) {
    used_.insert(key);
    const auto it = root_.find(key);
    return it == root_.end() || it->is_null() ? nullptr : &*it;
  }
  // Present and null (as against absent, where transformers' default applies).
  bool is_null(const char* key) {
    used_.insert(key);
    const auto it = root_.find(key);
    return it != root_.end() && it->is_null();
  }
  int64_t count(const char* key, int64_t fallback = -1) {
    const Json* v = get(key);
    if (!v) {
      if (fallback < 0) fail(path_, ": ", key, " is missing");
      return fallback;
    }
    if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > (1LL << 40))
      fail(path_, ": ", key, " must be a positive integer, got ", v->dump());
    return v->get<int64_t>();
  }
  int64_t count_or_zero(const char* key, int64_t fallback) {
    const Json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > (1LL << 40))
      fail(path_, ": ", key, " must be a non-negative integer, got ", v->dump());
    return v->get<int64_t>();
  }
  double number(const char* key, double fallback) {
    const Json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number() || !std::isfinite(v->get<double>()))
      fail(path_, ": ", key, " must be a number, got ", v->dump());
    return v->get<double>();
  }
  bool flag(const char* key, bool fallback) {
    const Json* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(path_, ": ", key, " must be true or false, got ", v->dump());
    return v->get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) {
    const Json* v = get(key);
    if (!v) return fallback;
    if (!v->is_string()) fail(path_, ": ", key, " must be a string, got ", v->dump());
    return v->get<std::string>();
  }
  // Every field neither read nor descriptive: refused, as seqforge cannot know it changes nothing.
  void check_all_used(const std::string& model_type) {
    for (const auto& item : root_.items())
      if (!used_.count(item.key()) && !kDescriptive.count(item.key()))
        fail(path_, ": field '", item.key(), "' is not known to seqforge for a ", model_type,
             " model (it may change what the model computes; remove it if it does not)");
  }
  const std::string& path() const { return path_; }

 private:
  const Json& root_;
  std::string path_;
  std::set<std::string> used_;
};

// layer_types: per layer, true for sliding_attention; empty when the config does not list them.
std::vector<bool> read_layer_types(ConfigReader& c, int64_t num_layers) {
  std::vector<bool> sliding;
  const Json* types = c.get("layer_types");
  if (!types) return sliding;
  if (!types->is_array() || int64_t(types->size()) != num_layers)
    fail(c.path(), ": layer_types must list ", num_layers, " layer types");
  for (const Json& t : *types) {
    if (t != "sliding_attention" && t != "full_attention")
      fail(c.path(), ": layer_types: ", t.dump(),
           " is neither sliding_attention nor full_attention");
    sliding.push_back(t == "sliding_attention");
  }
  return sliding;
}

// One rotation's parameters: transformers 4's rope_scaling object, or one of transformers 5's
// rope_parameters objects, which also carry rope_theta (into *theta, where given) and
// partial_rotary_factor.
RopeScaling read_rope_object(const Json& v, const std::string& where, double* theta) {
  RopeScaling s;
  if (!v.is_object()) fail(where, " must be an object or null, got ", v.dump());
  std::set<std::string> known = {"rope_type", "type"};
  const auto number = [&](const char* key) {
    known.insert(key);
    if (!v.contains(key) || !v[key].is_number() || !(v[key].get<double>() > 0))
      fail(where, ".", key, " must be a positive number");
    return v[key].get<double>();
  };
  if (theta) {
    if (v.contains("rope_theta")) *theta = number("rope_theta");
    known.insert("partial_rotary_factor");
    if (v.contains("partial_rotary_factor") &&
        !(v["partial_rotary_factor"].is_number() && v["partial_rotary_factor"] == 1))
      fail(where, ".partial_rotary_factor is not supported (seqforge rotates whole heads)");
  }
  // transformers 4 reads the older "type" for Llama and "rope_type" for Gemma 3; 5 reads
  // "rope_type": where both are given they must agree.
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (!v.contains(key) || v[key].is_null()) continue;
    if (!v[key].is_string()) fail(where, ".", key, " must be a string, got ", v[key].dump());
    const std::string named = v[key].get<std::string>();
    if (!type.empty() && named != type)
      fail(where, ": rope_type '", type, "' and type '", named,
           "' disagree (transformers' versions and models read one or the other): give one");
    type = named;
  }
  if (type.empty() && !theta) fail(where, ": give its rope_type");
  if (type == "default" && !theta) return s;
  if (type == "linear") {
    s.linear = true;
    s.factor = number("factor");
  } else if (type == "llama3") {
    s.llama3 = true;
    s.factor = number("factor");
    s.low_freq_factor = number("low_freq_factor");
    s.high_freq_factor = number("high_freq_factor");
    const double original = number("original_max_position_embeddings");
    if (original != std::floor(original) || original > double(int64_t{1} << 40))
      fail(where, ".original_max_position_embeddings must be a positive integer");
    s.original_max_position_embeddings = int64_t(original);
    if (!(s.high_freq_factor > s.low_freq_factor))
      fail(where, ": high_freq_factor must exceed low_freq_factor");
  } else if (type != "default" && !(theta && type.empty())) {
    fail(where, ": rope_type '", type,
         "' is not supported (seqforge applies the default rotation, linear and llama3 scaling)");
  }
  for (const auto& item : v.items())
    if (!known.count(item.key()))
      fail(where, ": field '", item.key(), "' is not known to seqforge");
  return s;
}

// The rotations: rope_theta and rope_scaling (transformers 4), or rope_parameters (transformers
// 5: one object, or for Gemma 3 one per layer type, the local layers' theta in
// sliding_attention).
void read_rotations(ConfigReader& c, DecoderOptions& o) {
  const std::string& path = c.path();
  const bool theta_given = c.get("rope_theta") != nullptr;
  const bool local_given = o.gemma && c.get("rope_local_base_freq") != nullptr;
  o.rope_theta = c.number("rope_theta", o.gemma ? 1e6 : 10000);
  if (o.gemma) o.rope_local_theta = c.number("rope_local_base_freq", 10000);
  if (const Json* v = c.get("rope_scaling"))
    o.rope_scaling = read_rope_object(*v, path + ": rope_scaling", nullptr);
  const Json* params = c.get("rope_parameters");
  if (params) {
    const std::string where = path + ": rope_parameters";
    if (c.get("rope_scaling"))
      fail(path,
           ": give rope_parameters (transformers 5) or rope_scaling (transformers 4), not both");
    if (!params->is_object()) fail(where, " must be an object, got ", params->dump());
    const double legacy_theta = o.rope_theta, legacy_local = o.rope_local_theta;
    const bool per_type =
        params->contains("full_attention") || params->contains("sliding_attention");
    if (!o.gemma && per_type)
      fail(where, ": rotations per layer type are read for gemma3_text models only");
    if (o.gemma && !per_type)
      fail(where,
           " must hold full_attention and sliding_attention objects for a gemma3_text model");
    if (per_type) {
      for (const auto& item : params->items())
        if (item.key() != "full_attention" && item.key() != "sliding_attention")
          fail(where, ": field '", item.key(), "' is not known to seqforge");
      if (const auto full = params->find("full_attention");
          full != params->end() && !full->is_null())
        o.rope_scaling = read_rope_object(*full, where + ".full_attention", &o.rope_theta);
      if (const auto local = params->find("sliding_attention");
          local != params->end() && !local->is_null()) {
        const RopeScaling s =
            read_rope_object(*local, where + ".sliding_attention", &o.rope_local_theta);
        if (s.linear || s.llama3)
          fail(where, ".sliding_attention: seqforge applies the default rotation to local layers");
      }
    } else {
      o.rope_scaling = read_rope_object(*params, where, &o.rope_theta);
    }
    if (theta_given && o.rope_theta != legacy_theta)
      fail(path, ": rope_theta (", legacy_theta, ") and rope_parameters' rope_theta (",
           o.rope_theta, ") differ");
    if (local_given && o.rope_local_theta != legacy_local)
      fail(path, ": rope_local_base_freq (", legacy_local,
           ") and rope_parameters.sliding_attention's rope_theta (", o.rope_local_theta,
           ") differ");
  }
  if (!(o.rope_theta > 1)) fail(path, ": rope_theta must exceed 1");
  if (o.gemma && !(o.rope_local_theta > 1)) fail(path, ": rope_local_base_freq must exceed 1");
}

// Refuses a model whose values cannot fit in memory even at 2 bytes each (a frozen base held in
// bf16) before any of it is built: a config.json with a billion layers would otherwise take hours
// to lay out, then fail.
void check_values_fit(const DecoderOptions& o, const std::string& path) {
  const double H = double(o.hidden_size), q = double(o.num_heads) * double(o.head_dim),
               kv = double(o.num_kv_heads) * double(o.head_dim);
  const double per_layer = 2 * H * q + 2 * H * kv + 3 * H * double(o.intermediate_size);
  const double count =
      double(o.vocab_size) * H * (o.tie_word_embeddings ? 1 : 2) + double(o.num_layers) * per_layer;
  const double mb = 1 << 20, need = 2 * count, available = double(available_memory_bytes());
  if (need <= available) return;
  fail(path, ": a model of about ", static_cast<int64_t>(std::min(count, 9e18)),
       " parameters (vocab_size ", o.vocab_size, ", hidden_size ", o.hidden_size,
       ", intermediate_size ", o.intermediate_size, ", num_hidden_layers ", o.num_layers,
       ") needs ", int64_t(need / mb), " MB for its values alone even in bf16, more than the ",
       int64_t(available / mb), " MB available");
}

// Whether two tensors hold the same shape and values, compared in blocks (an embedding of a
// large vocabulary need not be held twice).
bool same_values(const io::SafetensorsFile& fa, const io::SafetensorsEntry& a,
                 const io::SafetensorsFile& fb, const io::SafetensorsEntry& b) {
  const auto weights = [](DType t) {
    return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f64;
  };
  if (a.shape != b.shape || !weights(a.dtype) || !weights(b.dtype)) return false;
  const int64_t n = Shape(a.shape).numel(), block = int64_t{1} << 20;
  const std::byte *pa = fa.bytes(a).data(), *pb = fb.bytes(b).data();
  std::vector<double> va(size_t(std::min(n, block))), vb(va.size());
  for (int64_t i = 0; i < n; i += block) {
    const size_t m = size_t(std::min(block, n - i));
    convert(pa + i * int64_t(dtype_size(a.dtype)), a.dtype, va.data(), DType::f64, m);
    convert(pb + i * int64_t(dtype_size(b.dtype)), b.dtype, vb.data(), DType::f64, m);
    if (!std::equal(va.begin(), va.begin() + std::ptrdiff_t(m), vb.begin())) return false;
  }
  return true;
}

}  // namespace

DecoderOptions read_decoder_config(const std::string& path) {
  Json root;
  try {
    root = Json::parse(io::read_file(path));
  } catch (const Json::exception& e) {
    fail(path, ": not valid JSON ", io::json_syntax_error(e.what()));
  }
  if (!root.is_object()) fail(path, ": expected a JSON object (a Hugging Face config.json)");
  ConfigReader c(root, path);
  DecoderOptions o;
  o.model_type = c.text("model_type", "");
  if (o.model_type != "llama" && o.model_type != "qwen2" && o.model_type != "gemma3_text")
    fail(path, ": model_type '", o.model_type,
         "' is not supported (seqforge reads llama, qwen2 and gemma3_text models: Llama 2 and 3, "
         "SmolLM2, Qwen2 and 2.5, Gemma 3's text models)");
  o.gemma = o.model_type == "gemma3_text";
  if (const Json* eos = c.get("eos_token_id")) {  // one id, or a list of them
    for (const Json& id : eos->is_array() ? *eos : Json::array({*eos})) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0)
        fail(path, ": eos_token_id must be a token id or a list of them, got ", eos->dump());
      o.eos_token_ids.push_back(id.get<int64_t>());
    }
  }
  if (const Json* pad = c.get("pad_token_id"); pad && !pad->is_null()) {
    if (!pad->is_number_integer() || pad->get<int64_t>() < 0)
      fail(path, ": pad_token_id must be a token id or null, got ", pad->dump());
    o.pad_token_id = pad->get<int64_t>();
  }
  o.vocab_size = c.count("vocab_size");
  o.hidden_size = c.count("hidden_size");
  o.intermediate_size = c.count("intermediate_size");
  o.num_layers = c.count("num_hidden_layers");
  o.num_heads = c.count("num_attention_heads");
  // Keys a config may leave out take the defaults of transformers' config class of its type.
  const bool qwen2 = o.model_type == "qwen2";
  o.num_kv_heads = c.count("num_key_value_heads", o.gemma ? 4 : qwen2 ? 32 : o.num_heads);
  if (o.num_heads % o.num_kv_heads != 0)
    fail(path, ": num_attention_heads (", o.num_heads, ") must be a multiple of ",
         "num_key_value_heads (", o.num_kv_heads, ")");
  if (!c.get("head_dim") && !o.gemma && o.hidden_size % o.num_heads != 0)
    fail(path, ": hidden_size (", o.hidden_size, ") is not a multiple of num_attention_heads (",
         o.num_heads, "); give head_dim");
  o.head_dim = c.count("head_dim", o.gemma ? 256 : o.hidden_size / o.num_heads);
  if (o.head_dim % 2 != 0) fail(path, ": head_dim (", o.head_dim, ") must be even for RoPE");
  o.max_positions = c.count("max_position_embeddings", o.gemma ? 131072 : qwen2 ? 32768 : 2048);
  o.rms_norm_eps = c.number("rms_norm_eps", 1e-6);
  if (!(o.rms_norm_eps >= 0)) fail(path, ": rms_norm_eps must not be negative");
  read_rotations(c, o);
  o.initializer_range = c.number("initializer_range", 0.02);
  if (!(o.initializer_range >= 0)) fail(path, ": initializer_range must not be negative");
  o.tie_word_embeddings = c.flag("tie_word_embeddings", o.gemma);
  const std::string act =
      o.gemma ? c.text("hidden_activation", "gelu_pytorch_tanh") : c.text("hidden_act", "silu");
  if (o.gemma && c.get("hidden_act") && c.text("hidden_act", "") != act)
    fail(path, ": hidden_act and hidden_activation differ; Gemma 3 uses hidden_activation");
  if (act == "silu" || act == "swish")
    o.activation = GluKind::silu;
  else if (act == "gelu_pytorch_tanh")
    o.activation = GluKind::gelu_tanh;
  else
    fail(path, ": hidden_act '", act, "' is not supported (silu, gelu_pytorch_tanh)");
  if (c.number("attention_dropout", 0) != 0)
    fail(path, ": attention_dropout is not supported (set it to 0.0)");
  // SmolLM2's config says how its rotation pairs dimensions: halves, as transformers rotates.
  if (c.flag("rope_interleaved", false))
    fail(path,
         ": rope_interleaved true is not supported (seqforge, like transformers' Llama, "
         "rotates the two halves of each head)");
  if (c.number("partial_rotary_factor", 1) != 1)
    fail(path, ": partial_rotary_factor is not supported (seqforge rotates whole heads)");
  if (o.gemma) {
    o.qkv_bias = o.o_bias = c.flag("attention_bias", false);
    o.query_pre_attn_scalar = c.number("query_pre_attn_scalar", 256);
    if (!(o.query_pre_attn_scalar > 0)) fail(path, ": query_pre_attn_scalar must be positive");
    o.sliding_window = c.count("sliding_window", 4096);
    for (auto [key, cap] : {std::pair{"attn_logit_softcapping", &o.attn_logit_softcapping},
                            std::pair{"final_logit_softcapping", &o.final_logit_softcapping}}) {
      *cap = c.number(key, 0);
      if (c.get(key) && !(*cap > 0)) fail(path, ": ", key, " must be positive or null, got ", *cap);
    }
    if (c.flag("use_bidirectional_attention", false))
      fail(path, ": use_bidirectional_attention is not supported (a causal decoder)");
    // Which layers are local: layer_types, or every layer but each sliding_window_pattern-th.
    o.sliding = read_layer_types(c, o.num_layers);
    if (o.sliding.empty()) {
      const int64_t pattern = c.count("sliding_window_pattern", 6);
      for (int64_t i = 0; i < o.num_layers; ++i) o.sliding.push_back((i + 1) % pattern != 0);
    } else {
      c.get("sliding_window_pattern");  // layer_types says it
    }
  } else if (o.model_type == "llama") {
    const bool bias = c.flag("attention_bias", false);
    o.qkv_bias = o.o_bias = bias;
    o.mlp_bias = c.flag("mlp_bias", false);
  } else {  // qwen2: biases on q, k and v only
    o.qkv_bias = true;
    // transformers' Qwen2: with use_sliding_window, the layers from max_window_layers on (or
    // those layer_types names) attend sliding_window keys back (its default 4096 where absent);
    // without it, or with sliding_window null, none does.
    const bool windowed = c.flag("use_sliding_window", false) && !c.is_null("sliding_window");
    o.sliding = read_layer_types(c, o.num_layers);
    if (windowed) {
      o.sliding_window = c.count("sliding_window", 4096);
      if (o.sliding.empty()) {
        const int64_t first = c.count_or_zero("max_window_layers", 28);
        for (int64_t i = 0; i < o.num_layers; ++i) o.sliding.push_back(i >= first);
      }
    } else if (std::find(o.sliding.begin(), o.sliding.end(), true) != o.sliding.end()) {
      fail(path,
           ": layer_types names sliding_attention layers but use_sliding_window is false or "
           "sliding_window null");
    }
    if (c.flag("use_mrope", false)) fail(path, ": use_mrope is not supported");
  }
  c.check_all_used(o.model_type);
  check_values_fit(o, path);
  return o;
}

bool load_hf_weights(const std::string& folder, Decoder& model, Backend& be) {
  Parameters& params = model.parameters();
  const fs::path dir(folder);
  // Which file holds each tensor: the one file, else the index's map (transformers' order).
  std::map<std::string, std::string> shard_of;
  std::vector<std::string> shards;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(dir / "model.safetensors")) {
    shards.push_back("model.safetensors");
  } else if (fs::exists(index)) {
    Json root;
    try {
      root = Json::parse(io::read_file(index.string()));
    } catch (const Json::exception& e) {
      fail(index.string(), ": not valid JSON ", io::json_syntax_error(e.what()));
    }
    if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object())
      fail(index.string(), ": expected an object with a weight_map");
    for (const auto& [name, file] : root["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        fail(index.string(), ": weight_map['", name, "'] is not a file name in the folder");
      shard_of[name] = file.get<std::string>();
    }
    std::set<std::string> unique;
    for (const auto& [name, file] : shard_of) unique.insert(file);
    for (const std::string& f : unique) {
      if (!fs::exists(dir / f))
        fail(index.string(), ": names shard '", f, "', which is not in ", folder);
      shards.push_back(f);
    }
  } else {
    fail(folder, ": no model.safetensors nor model.safetensors.index.json");
  }

  std::map<std::string, size_t> number_of;  // parameter name -> index
  std::map<std::string, size_t> wanted;     // the same, but adapters and a new head
  const std::vector<std::string> fresh = model.fresh_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params.values().entries()[i].name;
    number_of[name] = i;
    if (std::find(fresh.begin(), fresh.end(), name) == fresh.end()) wanted[name] = i;
  }
  std::map<std::string, std::string> tied_name;  // a tied tensor's other name -> its parameter
  for (const auto& [param, other] : model.tied_base_tensors()) tied_name[other] = param;
  std::set<std::string> ignorable;
  for (const std::string& n : model.unused_base_tensors()) ignorable.insert(n);

  std::map<std::string, std::string> loaded;  // parameter name -> the shard it came from
  const auto load = [&](const io::SafetensorsFile& file, const io::SafetensorsEntry& e,
                        const std::string& target) {
    const std::string& path = file.source();
    const size_t i = number_of.at(target);
    const Tensor value = params.value(i);
    if (e.shape.size() > size_t(Shape::kMaxRank))
      fail(path, ": tensor '", e.name, "' has ", e.shape.size(), " dimensions; the config gives ",
           value.shape().str());
    if (Shape(e.shape) != value.shape())
      fail(path, ": tensor '", e.name, "' has shape ", Shape(e.shape).str(), "; the config gives ",
           value.shape().str());
    if (e.dtype != DType::f32 && e.dtype != DType::bf16 && e.dtype != DType::f16 &&
        e.dtype != DType::f64)
      fail(path, ": tensor '", e.name, "' is ", dtype_name(e.dtype),
           "; expected f32, bf16, f16 or f64 weights");
    const size_t n = size_t(value.numel());
    std::vector<double> values(n);
    convert(file.bytes(e).data(), e.dtype, values.data(), DType::f64, n);
    for (size_t k = 0; k < n; ++k)
      if (!std::isfinite(values[k]))
        fail(path, ": tensor '", e.name, "' holds ", values[k], " at element ", k);
    std::vector<std::byte> host(value.nbytes());
    convert(values.data(), DType::f64, host.data(), value.dtype(), n);
    be.upload(value, host.data());
    loaded[target] = fs::path(path).filename().string();
  };
  std::string tied_shard, tied_entry;  // where a tied weight's other name was seen
  const std::string score = model.decoder_options().num_labels > 0 ? "score.weight" : "";
  bool score_loaded = false;
  for (const std::string& shard : shards) {
    const io::SafetensorsFile file = io::SafetensorsFile::read((dir / shard).string());
    for (const io::SafetensorsEntry& e : file.entries()) {
      if (!shard_of.empty() && shard_of[e.name] != shard)
        fail(file.source(), ": tensor '", e.name,
             "' is not where model.safetensors.index.json says");
      if (e.name.starts_with("base_model.model."))
        fail(file.source(), ": holds adapters ('", e.name,
             "') beside its base model; `seqforge merge RUN --output DIR` folds a run's adapters "
             "in: give DIR");
      if (wanted.count(e.name)) {
        load(file, e, e.name);
      } else if (e.name == "score.weight" && !score.empty()) {
        const int64_t classes = model.decoder_options().num_labels;
        if (e.shape.size() != 2 || e.shape[0] != classes)
          fail(file.source(), ": its classifier's score.weight ", Shape(e.shape).str(),
               " scores another number of classes than this run's ", classes,
               ": start from its base model, or from the classifier merged and that tensor "
               "removed");
        load(file, e, e.name);
        score_loaded = true;
      } else if (e.name == "score.weight") {
        // A classifier's folder read as a language model: transformers leaves its head too.
      } else if (tied_name.count(e.name)) {
        tied_shard = shard, tied_entry = e.name;
      } else if (!ignorable.count(e.name)) {
        fail(file.source(), ": tensor '", e.name, "' is not part of this ",
             model.decoder_options().model_type, " model (config.json's sizes and flags)");
      }
    }
  }
  if (!tied_entry.empty() && !loaded.count(tied_name[tied_entry])) {
    const io::SafetensorsFile file = io::SafetensorsFile::read((dir / tied_shard).string());
    load(file, *file.find(tied_entry), tied_name[tied_entry]);
  } else if (!tied_entry.empty()) {
    // Both names given: transformers 4 ties them (the embedding serves), transformers 5 unties
    // them where they differ, so differing values have no one meaning.
    const std::string& param = tied_name[tied_entry];
    const io::SafetensorsFile head = io::SafetensorsFile::read((dir / tied_shard).string());
    const io::SafetensorsFile embedding = io::SafetensorsFile::read((dir / loaded[param]).string());
    if (!same_values(head, *head.find(tied_entry), embedding, *embedding.find(param)))
      fail(folder, ": config.json ties the head to the embedding (tie_word_embeddings true) but '",
           tied_entry, "' differs from '", param,
           "' (transformers 4 would use the embedding, transformers 5 the head): set "
           "tie_word_embeddings to false to train with '",
           tied_entry, "', or remove it to tie");
  }
  for (const auto& [name, i] : wanted)
    if (!loaded.count(name))
      fail(folder, ": tensor '", name, "' ", params.value(i).shape().str(),
           " is missing from the model's safetensors");
  return score_loaded;
}

void check_classifier_labels(const std::string& folder, const std::vector<std::string>& classes) {
  const std::string path = (fs::path(folder) / "config.json").string();
  const Json config = Json::parse(io::read_file(path), nullptr, false);
  if (!config.is_object() || !config.contains("id2label") || !config["id2label"].is_object())
    return;
  const Json& labels = config["id2label"];
  if (labels.size() != classes.size())
    fail(path, ": id2label names ", labels.size(), " classes, this run's data has ",
         classes.size());
  std::vector<std::string> theirs(classes.size());
  bool defaults = true;
  for (const auto& [id, label] : labels.items()) {
    const bool number =
        !id.empty() && id.size() < 10 &&
        std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t i = number ? std::stoll(id) : -1;
    if (i < 0 || i >= int64_t(classes.size()) || !label.is_string())
      fail(path, ": id2label ", io::quoted(id), " is not one of this run's ", classes.size(),
           " classes");
    theirs[size_t(i)] = label.get<std::string>();
    defaults = defaults && theirs[size_t(i)] == "LABEL_" + id;
  }
  if (defaults || theirs == classes) return;
  std::string a, b;
  for (size_t i = 0; i < classes.size(); ++i)
    a += (i ? ", " : "") + theirs[i], b += (i ? ", " : "") + classes[i];
  fail(path, ": its classifier scores [", a, "] (id2label), this run's data has [", b,
       "]: its score head would read them as others");
}

}  // namespace seqforge
