#include "run.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "seqforge/backend/onednn_info.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/profiler.hpp"
#include "seqforge/nn/checkpoint.hpp"
#include "seqforge/nn/decoder.hpp"
#include "seqforge/report/report.hpp"
#include "seqforge/train/data_options.hpp"
#include "seqforge/train/trainer.hpp"
#include "task_type.hpp"

namespace seqforge {

namespace fs = std::filesystem;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The adapter.* keys, checked: for a transformer (`cell` empty; targets are a block's Linears)
// or a recurrent layer of cell `cell` (targets are its weights, by default weight_ih and
// weight_hh).
AdapterOptions adapter_options(const Config& c, const std::string& cell) {
  AdapterOptions a;
  const std::string kind = c.str("adapter.kind");
  if (kind != "none" && kind != "lora" && kind != "dora")
    fail(c.origin("adapter.kind"), ": adapter.kind must be none, lora or dora, got '", kind, "'");
  a.kind = kind == "lora"   ? AdapterKind::lora
           : kind == "dora" ? AdapterKind::dora
                            : AdapterKind::none;
  // The adapter's own keys count only when there is one. A rank above the layer's width is
  // allowed, as PEFT allows it (the update B A then has rank min(in, out) at most).
  a.rank = c.integer("adapter.rank");
  a.alpha = c.number("adapter.alpha");
  a.dropout = c.number("adapter.dropout");
  if (a.kind != AdapterKind::none) {
    const double scale = a.alpha / double(a.rank);
    if (!(a.alpha > 0 && std::isfinite(a.alpha) && scale >= FLT_MIN && scale <= FLT_MAX))
      fail(c.origin("adapter.alpha"),
           ": adapter.alpha must be positive, with adapter.alpha / adapter.rank a normal float, "
           "got ",
           a.alpha, " / ", a.rank);
    if (!(a.dropout >= 0 && a.dropout < 1))
      fail(c.origin("adapter.dropout"), ": adapter.dropout must be in [0, 1), got ", a.dropout);
  }
  const std::string base = c.str("adapter.base_precision");
  if (base != "fp32" && base != "bf16")
    fail(c.origin("adapter.base_precision"), ": adapter.base_precision must be fp32 or bf16, got '",
         base, "'");
  a.bf16_base = a.kind != AdapterKind::none && base == "bf16";
  if (a.bf16_base && cpu_gemm_precision(c.str("train.precision"), nullptr) != DType::bf16)
    fail(c.origin("adapter.base_precision"),
         ": adapter.base_precision bf16 needs bf16 GEMMs (train.precision: bf16 on a ",
         "CPU with AVX512-BF16 or AMX-BF16)");
  a.targets = c.list("adapter.targets");
  if (cell == "decoder") {  // a Hugging Face decoder's Linears by their module names
    static const std::vector<std::string> kLinears = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"};
    if (a.targets.empty()) a.targets = {"q_proj", "v_proj"};  // PEFT's default for Llama
    for (const std::string& t : a.targets)
      if (std::find(kLinears.begin(), kLinears.end(), t) == kLinears.end())
        fail(c.origin("adapter.targets"), ": adapter.targets: '", t,
             "' is not a Linear of a decoder layer (q_proj, k_proj, v_proj, o_proj, gate_proj, "
             "up_proj, down_proj)");
    return a;
  }
  if (a.targets.empty())
    a.targets = cell.empty() ? AdapterOptions().targets
                             : std::vector<std::string>{cell + ".weight_ih", cell + ".weight_hh"};
  for (const std::string& t : a.targets) {
    const bool known = cell.empty() ? t == "attn.c_attn" || t == "attn.c_proj" || t == "mlp.c_fc" ||
                                          t == "mlp.c_proj"
                                    : t == cell + ".weight_ih" || t == cell + ".weight_hh" ||
                                          (cell == "lstm" && t == "lstm.weight_hr");
    if (known) continue;
    if (cell.empty())
      fail(c.origin("adapter.targets"), ": adapter.targets: '", t,
           "' is not a Linear of a block (attn.c_attn, ", "attn.c_proj, mlp.c_fc, mlp.c_proj)");
    fail(c.origin("adapter.targets"), ": adapter.targets: '", t, "' is not a weight of the ", cell,
         " layer (", cell, ".weight_ih, ", cell, ".weight_hh",
         cell == "lstm" ? ", lstm.weight_hr" : "", ")");
  }
  return a;
}

ModelOptions model_options(const Config& c, const Task& t) {
  ModelOptions m;
  auto positive = [&](const char* key) {
    const int64_t v = c.integer(key);
    if (v <= 0) fail(c.source(), ": ", key, " must be positive, got ", v);
    return v;
  };
  try {
    m.rnn.cell = cell_kind(c.str("model.cell"));
  } catch (const std::exception& e) {
    fail(c.origin("model.cell"), ": model.cell: ", e.what());
  }
  m.rnn.hidden_size = positive("model.hidden");
  if (const CellType& cell = cell_type(m.rnn.cell); m.rnn.hidden_size < cell.min_hidden)
    fail(c.origin("model.hidden"), ": model.hidden must be at least ", cell.min_hidden,
         " for model.cell ", cell.name, ", got ", m.rnn.hidden_size);
  m.rnn.proj_size = c.integer("model.proj_size");
  if (m.rnn.proj_size < 0 || m.rnn.proj_size >= m.rnn.hidden_size)
    fail(c.origin("model.proj_size"), ": model.proj_size must be 0 (none) or below model.hidden ",
         m.rnn.hidden_size, ", got ", m.rnn.proj_size);
  if (m.rnn.proj_size > 0 && m.rnn.cell != CellKind::lstm)
    fail(c.origin("model.proj_size"),
         ": model.proj_size is for model.cell: lstm (PyTorch's nn.LSTM proj_size)");
  m.rnn.num_layers = positive("model.layers");
  m.rnn.bidirectional = c.boolean("model.bidirectional");
  m.rnn.dropout = c.number("model.dropout");
  if (!(m.rnn.dropout >= 0 && m.rnn.dropout < 1))
    fail(c.origin("model.dropout"), ": model.dropout must be in [0, 1), got ", m.rnn.dropout);
  const std::string mode = c.str("model.dropout_mode");
  if (mode != "standard" && mode != "variational")
    fail(c.origin("model.dropout_mode"),
         ": model.dropout_mode must be standard or variational, got '", mode, "'");
  m.rnn.variational_dropout = mode == "variational";
  m.rnn.batch_first = true;
  task_type(t.kind).shape_model(c, t, &m);
  const std::string family = c.str("model.family");
  if (family == "transformer") {
    if (!t.is_text())
      fail(c.origin("model.family"),
           ": model.family transformer takes data.task charlm or text_classify, not ",
           task_name(t.kind));
    m.family = ModelFamily::transformer;
    TransformerOptions& o = m.transformer;
    o.vocab_size = m.vocab_size;
    o.n_embd = m.embedding_dim;
    o.n_layer = m.rnn.num_layers;
    o.n_head = positive("model.heads");
    if (o.n_embd % o.n_head != 0)
      fail(c.origin("model.embedding"), ": model.embedding ", o.n_embd,
           " is not a multiple of model.heads ", o.n_head);
    o.block_size = c.integer("model.block_size");
    if (o.block_size == 0) o.block_size = t.steps();
    if (o.block_size < t.steps())
      fail(c.origin("model.block_size"), ": model.block_size ", o.block_size,
           " is shorter than data.seq_len ", t.steps());
    o.dropout = m.rnn.dropout;
    o.checkpoint_activations = c.boolean("model.checkpoint_activations");
    o.bias = c.boolean("model.bias");
    m.adapter = adapter_options(c, "");
    if (t.kind == TaskKind::text_classify) {
      o.num_classes = m.output_size;
      o.segments = t.text.segments;
      o.causal = !m.rnn.bidirectional;
    } else if (m.rnn.bidirectional) {
      fail(c.source(),
           ": model.bidirectional: a charlm transformer is causal (each character predicts the "
           "next from those before it)");
    }
  } else if (family == "decoder") {
    if (t.kind != TaskKind::lm && t.kind != TaskKind::text_classify)
      fail(c.origin("model.family"),
           ": model.family decoder takes data.task lm or text_classify, not ", task_name(t.kind));
    m.family = ModelFamily::decoder;
    const std::string init = c.str("model.init_from");
    if (init.empty() || !fs::is_directory(init))
      fail(c.origin("model.init_from"),
           ": model.family decoder builds its model from a Hugging Face folder: set "
           "model.init_from to one (config.json, model.safetensors, tokenizer.json)",
           init.empty() ? "" : "; '" + init + "' is not a directory");
    m.decoder = read_decoder_config((fs::path(init) / "config.json").string());
    // A tokenizer may have ids past the model's rows (Gemma 3's image token): the data must not.
    if (const auto top = std::max_element(t.text.ids.begin(), t.text.ids.end());
        top != t.text.ids.end() && *top >= m.decoder.vocab_size)
      fail(c.origin("data.tokenizer"), ": the tokenizer ", t.text.tokenizer, " gives token id ",
           *top, " on ", t.path, ", past the model's vocab_size ", m.decoder.vocab_size,
           " (tokenizer and model do not belong together)");
    m.vocab_size = m.decoder.vocab_size;
    m.embedding_dim = m.decoder.hidden_size;
    if (t.kind == TaskKind::text_classify)
      m.decoder.num_labels = m.output_size;  // the classes: HF's sequence-classification head
    else
      m.output_size = m.vocab_size;
    m.adapter = m.decoder.adapter = adapter_options(c, "decoder");
    m.decoder.checkpoint_activations = c.boolean("model.checkpoint_activations");
  } else if (family != "recurrent") {
    fail(c.origin("model.family"),
         ": model.family must be recurrent, transformer or decoder, got '", family, "'");
  } else if (t.kind == TaskKind::text_classify) {
    fail(c.origin("data.task"), ": data.task text_classify takes model.family transformer");
  } else {
    m.adapter = adapter_options(c, cell_type(m.rnn.cell).name);
  }
  return m;
}

std::unique_ptr<Backend> make_device_backend(const Config& c, const ModelOptions& m,
                                             bool inference) {
  std::string device = c.str("train.device");
  if (device != "auto" && device != "cpu" && device != "cuda")
    fail(c.origin("train.device"), ": train.device must be auto, cpu or cuda, got '", device, "'");
  if (inference && device == "cuda") device = "auto";
  const std::string matmul = c.str("train.matmul_precision");
  if (matmul != "highest" && matmul != "high")
    fail(c.origin("train.matmul_precision"),
         ": train.matmul_precision must be highest or high, got '", matmul, "'");
  std::unique_ptr<Backend> be;
  try {
    be = make_run_backend(device, ops_needed(m));
  } catch (const Error& e) {
    if (std::getenv("SEQFORGE_BACKEND")) throw;
    fail(c.origin("train.device"), ": train.", e.what());
  }
  be->set_float32_matmul_precision(matmul);
  return be;
}

Config with_base_architecture(const Config& c, std::string* note) {
  std::string init = c.str("model.init_from");
  const std::vector<std::string> modules = c.list("model.init_from_modules");
  if (c.str("model.family") != "transformer" || init.empty() ||
      (!modules.empty() &&
       std::find(modules.begin(), modules.end(), "transformer") == modules.end()))
    return c;
  if (fs::is_directory(init)) init = (fs::path(init) / "model.safetensors").string();
  const io::SafetensorsFile file = io::SafetensorsFile::read(init);
  std::map<std::string, int64_t> base;  // key -> the base model's value
  const io::SafetensorsEntry* wte = find_parameter(file, "transformer.wte.weight");
  if (!wte) wte = find_parameter(file, "lm_head.weight");  // the tied pair saved once
  if (wte && wte->shape.size() == 2) base["model.embedding"] = wte->shape[1];
  if (const io::SafetensorsEntry* wpe = find_parameter(file, "transformer.wpe.weight");
      wpe && wpe->shape.size() == 2)
    base["model.block_size"] = wpe->shape[0];
  std::set<int64_t> blocks;  // the indices i of transformer.h.{i}.*
  for (const auto& e : file.entries()) {
    static const std::string kBlock = "transformer.h.";
    const std::string name = parameter_name(e.name);
    if (name.rfind(kBlock, 0) != 0) continue;
    // An index past model.layers' range cannot be a block of a model here: the loader names
    // the tensor as unexpected.
    int64_t i = -1;
    std::from_chars(name.data() + kBlock.size(), name.data() + name.size(), i);
    if (i >= 0 && i < 1024) blocks.insert(i);
  }
  // Blocks 0 to L-1, or the loader names what is missing.
  if (!blocks.empty() && *blocks.begin() == 0 && *blocks.rbegin() + 1 == int64_t(blocks.size()))
    base["model.layers"] = int64_t(blocks.size());
  if (find_parameter(file, "transformer.ln_f.weight"))
    base["model.bias"] = find_parameter(file, "transformer.ln_f.bias") != nullptr;
  if (const auto it = file.metadata().find("seqforge.config"); it != file.metadata().end()) {
    // Only a head count the config states: a blank or partial one would give the default.
    try {
      const Config saved = Config::parse(it->second, init);
      if (saved.is_set("model.heads")) base["model.heads"] = saved.integer("model.heads");
    } catch (const std::exception&) {  // a config of another seqforge version: heads unknown
    }
  }
  if (!base.count("model.heads") && !c.is_set("model.heads"))
    fail(c.origin("model.heads"), ": model.heads: ", init,
         " does not say how many attention heads its model has (nanoGPT's n_head is not in its "
         "checkpoint); set model.heads to the base model's");
  auto text = [](const std::string& key, int64_t v) {
    return key == "model.bias" ? std::string(v ? "true" : "false") : std::to_string(v);
  };
  std::map<std::string, std::string> taken;
  std::string shown;
  for (const auto& [key, value] : base) {
    const int64_t given = key == "model.bias" ? c.boolean(key) : c.integer(key);
    if (!c.is_set(key) || (key == "model.block_size" && given == 0)) {  // 0: data.seq_len
      taken[key] = text(key, value);
      shown += (shown.empty() ? "" : ", ") + key + " " + taken[key];
    } else if (given != value) {
      fail(c.source(), ": ", key, " ", text(key, given), " differs from the base model's ",
           text(key, value), " (model.init_from ", init, "): leave it out or set it to ",
           text(key, value));
    }
  }
  if (taken.empty()) return c;
  *note = "init_from: the base model's " + shown;
  return c.with_values(taken, "model.init_from");
}

std::vector<std::string> ignored_settings(const Config& c) {
  std::vector<std::string> out;
  const std::string family = c.str("model.family");
  const bool transformer = family == "transformer", decoder = family == "decoder";
  for (const char* key : {"model.cell", "model.hidden", "model.proj_size", "model.dropout_mode"})
    if ((transformer || decoder) && c.differs_from_default(key))
      out.push_back(std::string(key) + " is for recurrent models; model.family is " + family +
                    ": it is ignored");
  // A decoder's shape is its config.json's, and it has no dropout.
  for (const char* key :
       {"model.embedding", "model.layers", "model.dropout", "model.bidirectional", "model.bias"})
    if (decoder && c.differs_from_default(key))
      out.push_back(
          std::string(key) + " does not apply to model.family decoder (" +
          "model.init_from's config.json gives its shape; it has no dropout): " + "it is ignored");
  if (!decoder && c.differs_from_default("model.from_config"))
    out.push_back("model.from_config is for model.family decoder; model.family is " + family +
                  ": it is ignored");
  const std::string task = c.str("data.task");
  if (task != "lm" && !(task == "text_classify" && decoder) &&
      c.differs_from_default("data.tokenizer"))
    out.push_back(
        "data.tokenizer is for data.task lm, or text_classify on a decoder; data.task "
        "is " +
        task + ": it is ignored");
  if (!(task == "lm" && !c.list("data.text_columns").empty()) &&
      c.differs_from_default("data.eos_token"))
    out.push_back("data.eos_token is for data.task lm on data.text_columns: it is ignored");
  for (const char* key : {"model.heads", "model.block_size"})
    if (!transformer && c.differs_from_default(key))
      out.push_back(std::string(key) + " is for transformers; model.family is " + family +
                    ": it is ignored");
  if (!transformer && !decoder && c.differs_from_default("model.checkpoint_activations"))
    out.push_back(
        "model.checkpoint_activations is for transformers and decoders; model.family "
        "is " +
        family + ": it is ignored");
  const bool adapters = c.str("adapter.kind") != "none";
  for (const char* key : {"adapter.rank", "adapter.alpha", "adapter.dropout", "adapter.targets",
                          "adapter.base_precision"})
    if (!adapters && c.differs_from_default(key))
      out.push_back(std::string(key) + " is set but adapter.kind is none: no adapter is trained");
  if (c.str("data.task") != "forecast" && c.differs_from_default("data.season"))
    out.push_back("data.season is for forecasters' seasonal-naive baseline; data.task is " +
                  c.str("data.task") + ": it is ignored");
  if (c.str("train.loss") != "quantile" && c.differs_from_default("train.quantiles"))
    out.push_back("train.quantiles is set but train.loss is " + c.str("train.loss") +
                  ": the model forecasts one value per step, not quantiles");
  if (c.str("data.task") != "forecast" && c.differs_from_default("data.horizon_mode"))
    out.push_back("data.horizon_mode is for forecasters; data.task is " + c.str("data.task") +
                  ": it is ignored");
  if (c.str("train.loss") != "huber" && c.differs_from_default("train.huber_delta"))
    out.push_back("train.huber_delta is set but train.loss is " + c.str("train.loss") +
                  ": it is ignored");
  if (c.str("data.normalize_per") != "series" && c.differs_from_default("data.normalize_fallback"))
    out.push_back(
        "data.normalize_fallback is set but data.normalize_per is all (one scaler for "
        "every series): it is ignored");
  if (adapters && c.str("model.init_from").empty())
    out.push_back("adapter.kind " + c.str("adapter.kind") +
                  " without model.init_from: the adapters train on a randomly initialised, "
                  "frozen base");
  return out;
}

// Loads the task's data per the config; with `from`, reuses its normalisation and vocabulary.
// Whether init_from loads tensors indexed by the vocabulary (an embedding or an output head over
// characters): all of them, or init_from_modules names one of their modules.
bool init_loads_vocabulary(const Config& c) {
  const std::vector<std::string> modules = c.list("model.init_from_modules");
  if (modules.empty()) return true;
  for (const std::string& m : modules)
    if (m == "embedding" || m == "head" || m == "transformer" || m == "lm_head") return true;
  return false;
}

Config as_it_trained(const Config& stored) {
  Config c = stored;
  if (!c.is_set("data.split.context"))
    c = c.with_values({{"data.split.context", "strict"}},
                      c.source() + " (written before data.split.context; its windows were strict)");
  if (!c.is_set("data.horizon_mode"))
    c = c.with_values({{"data.horizon_mode", "last"}},
                      c.source() +
                          " (written before data.horizon_mode; its outputs were the "
                          "last step's)");
  return c;
}

Task load_task(const Config& c, const Task* from) {
  Task t;
  const Dataset* source = from;
  // A text task on a pre-trained model: the model's vocabulary, so that every id means the
  // character it meant in pre-training (the data's own could differ by one character and shift
  // every id after it).
  Dataset pretrained;
  const TaskKind task = parse_task(c.str("data.task"), c.origin("data.task"));
  // Characters (a decoder reads its tokenizer's tokens instead).
  const bool text = (task == TaskKind::text_classify || task == TaskKind::charlm) &&
                    c.str("model.family") != "decoder";
  if (std::string init = c.str("model.init_from");
      !from && !init.empty() && text && init_loads_vocabulary(c)) {
    if (fs::is_directory(init)) init = (fs::path(init) / "model.safetensors").string();
    const io::SafetensorsFile file = io::SafetensorsFile::read(init);
    const auto& meta = file.metadata();
    if (const auto it = meta.find("seqforge.vocab"); it != meta.end()) {
      const auto vocab = nlohmann::json::parse(it->second, nullptr, false);
      if (!vocab.is_string()) fail(init, ": seqforge.vocab metadata is not what seqforge wrote");
      pretrained.text.vocab = decode_utf8(vocab.get<std::string>(), init + ": seqforge.vocab");
      source = &pretrained;
    }
  }
  static_cast<Dataset&>(t) = load_dataset(c, source);
  t.model = model_options(c, t);
  t.loss = regression_loss_of(c, t.kind);
  return t;
}

RegressionLoss regression_loss_of(const Config& c, TaskKind task) {
  RegressionLoss l;
  const std::string kind = c.str("train.loss");
  if (kind == "mae")
    l.kind = LossKind::mae;
  else if (kind == "huber")
    l.kind = LossKind::huber;
  else if (kind == "quantile")
    l.kind = LossKind::quantile;
  else if (kind != "mse")
    fail(c.origin("train.loss"), ": train.loss must be mse, mae, huber or quantile, got '", kind,
         "'");
  if (l.kind == LossKind::quantile) {
    if (task != TaskKind::forecast)
      fail(c.origin("train.loss"),
           ": train.loss quantile forecasts quantiles of targets; data.task ", task_name(task),
           " has none");
    const std::vector<double> q = loss_quantiles(c);
    l.num_quantiles = static_cast<int>(q.size());
    std::copy(q.begin(), q.end(), l.quantiles);
  }
  l.delta = c.number("train.huber_delta");
  if (!(l.delta > 0 && std::isfinite(l.delta)))
    fail(c.origin("train.huber_delta"), ": train.huber_delta must be a positive number, got ",
         l.delta);
  if (l.kind != LossKind::mse && task != TaskKind::forecast && task != TaskKind::mae)
    fail(c.origin("train.loss"), ": train.loss ", kind,
         " is a regression loss; a classifier or language model trains on cross-entropy");
  return l;
}

// Bytes of one batch's buffers, for the loader's memory budget.
int64_t forward_rows(const Config& c) {
  const int64_t batch = c.integer("train.batch_size"), micro = c.integer("train.micro_batch_size");
  return micro > 0 ? std::min(micro, batch) : batch;
}

int64_t batch_bytes(const Task& t, int64_t batch_size) {
  return batch_size * t.steps() * task_type(t.kind).bytes_per_step(t);
}

void loss_of(Backend& be, const Task& t, Tensor out, const Batch& b, Tensor dout, Tensor loss) {
  task_type(t.kind).loss(be, t.loss, out, b, dout, loss);
}

double macro_f1(const std::vector<int64_t>& tp, const std::vector<int64_t>& fp,
                const std::vector<int64_t>& fn) {
  double sum = 0;
  int64_t present = 0;
  for (size_t k = 0; k < tp.size(); ++k) {
    const double denom = 2.0 * tp[k] + fp[k] + fn[k];
    if (denom == 0) continue;  // in neither the truth nor the predictions
    sum += 2.0 * tp[k] / denom;
    ++present;
  }
  return present > 0 ? sum / present : 0.0;
}

// The metrics an epoch of this task reports.
std::vector<std::string> metric_names(TaskKind kind) {
  std::vector<std::string> out = {"train_loss", "val_loss"};
  for (std::string& name : task_type(kind).metric_names()) out.push_back(std::move(name));
  return out;
}

// Metrics over a split (no training, no dropout).
std::map<std::string, double> evaluate_split(Backend& be, Model& model, const Task& t,
                                             const std::vector<int64_t>& starts, Loader& loader) {
  SF_PROFILE_SCOPE("validation");
  std::map<std::string, double> m;
  if (starts.empty()) return m;
  const TaskType& type = task_type(t.kind);
  std::unique_ptr<MetricSums> sums = type.metric_sums(t);
  Buffer dout_buf, loss_buf;
  const Tensor loss = loss_buf.get(be, DType::f64, {1});
  Rng rng(0);
  double loss_sum = 0;
  int64_t count = 0;
  loader.start(starts, INT64_MAX, {}, 0);
  for (size_t done = 0; done < starts.size();) {
    const Batch& b = loader.next();
    const int64_t* windows = starts.data() + done;  // (b.size) the batch's window starts
    done += b.size;
    model.set_token_layout(b.lengths, b.segments);
    Tensor out = model.forward(be, b.input, {}, {}, false, rng);
    Tensor dout = dout_buf.get(be, DType::f32, out.shape());
    const int64_t n = type.loss_terms(t, b, 0, b.size);
    type.loss(be, t.loss, out, b, dout, loss);
    double value = 0;
    be.download(&value, loss);
    loss_sum += value * double(n);
    count += n;
    sums->add(HostView(be, out).data<float>(), b, windows);
  }
  m["val_loss"] = loss_sum / double(count);
  sums->finish(&m);
  return m;
}

std::string format_metrics(const std::map<std::string, double>& m) {
  // Of a direct forecast's errors per step ahead, the first and the last step's.
  std::map<std::string, int> last_step;
  for (const auto& [k, v] : m)
    if (const int step = metric_step(k)) {
      int& last = last_step[k.substr(0, k.rfind("_h"))];
      last = std::max(last, step);
    }
  std::string out;
  char buf[64];
  for (const auto& [k, v] : m) {
    if (const int step = metric_step(k); step > 1 && step != last_step[k.substr(0, k.rfind("_h"))])
      continue;
    std::snprintf(buf, sizeof buf, "  %s %.5g", k.c_str(), v);
    out += buf;
  }
  return out;
}

// Metadata stored with the weights: what eval, predict and generate need to rebuild the task.
std::map<std::string, std::string> checkpoint_metadata(const Config& c, const Task& t,
                                                       int64_t epoch,
                                                       const std::map<std::string, double>& m) {
  std::map<std::string, std::string> meta = {
      {"format", "seqforge"},
      {"seqforge.version", SEQFORGE_VERSION},
      {"seqforge.layout",
       t.model.family == ModelFamily::transformer
           ? "nanoGPT names (model.py): transformer.wte, transformer.wpe, transformer.h.{i}.ln_1, "
             ".attn.c_attn (q, k, v row blocks), .attn.c_proj, .ln_2, .mlp.c_fc, .mlp.c_proj, "
             "transformer.ln_f; lm_head.weight is transformer.wte.weight (tied)"
           : "PyTorch names: embedding (nn.Embedding), lstm (nn.LSTM, batch_first=True, gate "
             "order i, f, g, o), gru (nn.GRU, batch_first=True, gate order r, z, n) or lnlstm "
             "(nn.LSTM's names and gate order, and the layer norms' "
             "lnlstm.{ln_ih_weight,ln_hh_weight,ln_c_weight,ln_c_bias}_l{k}), head (nn.Linear on "
             "the last step, or on "
             "every step for charlm)"},
      {"seqforge.config", c.resolved_yaml()},
      {"seqforge.epoch", std::to_string(epoch)},
      {"seqforge.metrics", nlohmann::json(m).dump()},
  };
  task_type(t.kind).store(c, t, &meta);
  return meta;
}

std::vector<std::pair<std::string, Tensor>> named(const Parameters& params, const Arena& arena,
                                                  const std::string& prefix, bool aliases) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params.size(); ++i)
    out.emplace_back(prefix + params.values().entries()[i].name, arena.view(i));
  if (aliases)
    for (const auto& [name, i] : params.aliases()) out.emplace_back(prefix + name, arena.view(i));
  return out;
}

// Copies a tensor of `file` into `dst`, checking its shape and values; errors name the file and
// tensor.
void load_tensor(const io::SafetensorsFile& file, const std::string& name, Tensor dst, Backend* be,
                 bool non_negative) {
  const io::SafetensorsEntry* e = file.find(name);
  if (!e) fail(file.source(), ": missing tensor '", name, "' (a run of another architecture?)");
  if (Shape(e->shape) != dst.shape() || e->dtype != dst.dtype())
    fail(file.source(), ": tensor '", name, "' is ", dtype_safetensors_name(e->dtype), " ",
         Shape(e->shape).str(), ", this run has ", dtype_safetensors_name(dst.dtype()), " ",
         dst.shape().str(), " (a run of another architecture?)");
  const auto bytes = file.bytes(*e);
  double bad = 0;
  if (const int64_t at = first_non_finite(bytes.data(), e->dtype, size_t(dst.numel()), &bad);
      at >= 0)
    fail(file.source(), ": tensor '", name, "' holds a non-finite value (", bad, " at index ", at,
         ")");
  if (non_negative && e->dtype == DType::f32)
    for (int64_t i = 0; i < dst.numel(); ++i) {
      float v = 0;
      std::memcpy(&v, bytes.data() + i * sizeof v, sizeof v);  // file data may be unaligned
      if (v < 0)
        fail(file.source(), ": tensor '", name, "' holds a negative value (", v, " at index ", i,
             "), which it cannot hold");
    }
  if (be)
    be->upload(dst, bytes.data());
  else
    std::memcpy(dst.data(), bytes.data(), bytes.size());
}

namespace {

// A run's checkpoint, its stored config (data.path replaced by `data_override` when given) and
// the task as stored: normalizers, classes, vocabulary, column names.
LoadedRun read_run(const std::string& run, const std::string& data_override) {
  const std::string path =
      fs::is_directory(run) ? (fs::path(run) / "model.safetensors").string() : run;
  if (!fs::exists(run)) fail(run, ": no such run directory or model.safetensors");
  if (fs::is_directory(run) && !fs::exists(path)) {
    if (fs::exists(fs::path(run) / "study.db") || fs::exists(fs::path(run) / "best.yaml"))
      fail(run, ": a tune study's directory, not a run: give one of its trials (", run,
           "/trial-N; `seqforge tune --report` names the best)");
    if (fs::exists(fs::path(run) / "metrics.jsonl"))
      fail(run,
           ": the run saved no model yet (model.safetensors is written at its first saved "
           "epoch)");
    fail(run, ": no model.safetensors here (not a run directory)");
  }
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".yaml" || ext == ".yml")
    fail(run, ": a config, not a run: train it first (seqforge train ", run,
         "), then give the run directory");
  io::SafetensorsFile file;
  try {
    file = io::SafetensorsFile::read(path);
  } catch (const std::exception& e) {
    if (ext == ".safetensors") throw;
    fail(run, ": not a run directory or a model.safetensors (", e.what(), ")");
  }
  const auto& meta = file.metadata();
  if (!meta.count("seqforge.config"))
    fail(path, ": not a seqforge checkpoint (no seqforge.config metadata)");
  std::vector<std::string> overrides;
  if (!data_override.empty()) overrides.push_back("data.path=" + data_override);
  Config config = as_it_trained(
      Config::parse(meta.at("seqforge.config"), path + " (stored config)", overrides));
  Task stored;
  stored.kind = parse_task(config.str("data.task"), path + " (stored config)");
  task_type(stored.kind).restore(meta, path, &stored);
  return {std::move(file), std::move(config), std::move(stored)};
}

}  // namespace

void check_output_outside_run(const std::string& output, const std::string& run,
                              const std::string& option) {
  if (output.empty() || output == "-") return;
  std::error_code ec;
  const fs::path dir = fs::is_directory(run, ec) ? fs::path(run) : fs::path(run).parent_path();
  const fs::path target = fs::weakly_canonical(output, ec);
  const fs::path run_dir = fs::weakly_canonical(dir.empty() ? "." : dir, ec);
  const std::string name = target.filename().string();
  const bool own =
      target.parent_path() == run_dir &&
      (name == "model.safetensors" || name == "training_state.safetensors" ||
       name == "config.resolved.yaml" || name == "metrics.jsonl" || name == "report.html" ||
       name == ".lock" || name == "adapter_config.json" || name == "train.log");
  if (own || (!fs::is_directory(run, ec) && target == fs::weakly_canonical(run, ec)))
    fail(option, ": ", output, " is the run's own ", name,
         "; writing it would destroy the run: give another path");
}

LoadedRun load_run(const std::string& run, const std::string& data_override, WindowSet windows) {
  LoadedRun r = read_run(run, data_override);
  const TaskKind kind = r.task.kind;
  const bool forecasts =
      kind == TaskKind::forecast || kind == TaskKind::classify || kind == TaskKind::text_classify;
  if (windows == WindowSet::every_window && !forecasts)
    fail(run, ": predict needs a forecast or classify run; this is a ", task_name(kind), " run",
         r.task.is_lm() ? " (sample from it with seqforge generate)" : "");
  if (windows == WindowSet::with_targets && r.task.is_lm())
    fail("--data: evaluating a language model on another file is not supported; use --split");
  Task task;
  static_cast<Dataset&>(task) = load_dataset(r.config, &r.task, windows);
  task.model = model_options(r.config, task);
  task.loss = regression_loss_of(r.config, task.kind);
  r.task = std::move(task);
  return r;
}

LoadedRun load_run_model(const std::string& run) {
  LoadedRun r = read_run(run, "");
  Task& t = r.task;
  if (!t.is_text() && t.series.feature_names.empty()) {
    // A checkpoint that does not name its columns: its data file does.
    static_cast<Dataset&>(t) = load_dataset(r.config, &t, WindowSet::splits);
    t.model = model_options(r.config, t);
    t.loss = regression_loss_of(r.config, t.kind);
    return r;
  }
  const DataOptions o = data_options(r.config);
  t.path = o.path;
  t.series.task = t.kind;
  t.series.lookback = o.series.lookback;
  t.series.horizon = o.series.horizon;
  t.text.seq_len = o.text.seq_len;
  t.text.segments = o.text.columns.size() == 2 ? 2 : 0;
  t.model = model_options(r.config, t);
  t.loss = regression_loss_of(r.config, t.kind);
  return r;
}

DType backend_precision(const std::string& precision, const Backend& be, std::string* notice) {
  auto fallback = [&](const std::string& why) {
    if (notice) *notice = "train.precision " + precision + ": " + why + "; fp32 GEMMs instead";
    return DType::f32;
  };
  if (precision == "fp16") {
    if (be.supports(Op::gemm, DType::f16)) return DType::f16;
    return fallback("the " + std::string(be.name()) +
                    " backend runs no fp16 GEMMs (fp16 is for GPUs: train.device cuda)");
  }
  // A GPU's GEMMs take bf16 by its own generation (sm_80 and later), whatever the host CPU has.
  if (be.name() == "cuda" && (precision == "bf16" || precision == "auto")) {
    if (be.supports(Op::gemm, DType::bf16)) return DType::bf16;
    if (precision == "bf16") return fallback("this GPU has no bf16 tensor cores (sm_80 and later)");
    return DType::f32;
  }
  const DType gemm = cpu_gemm_precision(precision, notice);
  if (gemm != DType::bf16 || be.supports(Op::gemm, DType::bf16)) return gemm;
  return fallback("the " + std::string(be.name()) + " backend runs no bf16 GEMMs");
}

DType cpu_gemm_precision(const std::string& precision, std::string* notice) {
  const DType gemm = resolve_precision(precision, notice);
  if (gemm != DType::bf16 || precision != "auto") return gemm;
  std::string why;
  if (bf16_gemms_pay_off(&why)) return gemm;
  if (notice)
    *notice = "train.precision auto: " + why + "; fp32 GEMMs (train.precision bf16 takes bf16)";
  return DType::f32;
}

DType model_precision(const std::string& precision, const Backend& be, const ModelOptions& m,
                      std::string* notice) {
  const DType gemm = backend_precision(precision, be, notice);
  if (m.family != ModelFamily::decoder || gemm != DType::f16) return gemm;
  if (notice)
    *notice = "train.precision " + precision + ": a " + m.decoder.model_type +
              " decoder runs fp32 or bf16 GEMMs so far; fp32 GEMMs instead";
  return DType::f32;
}

const char* gemm_precision_name(DType gemm) {
  return gemm == DType::bf16 ? "bf16" : gemm == DType::f16 ? "fp16" : "fp32";
}

// Floats a training step keeps per batch: per layer and direction the gates (T, B, G*H), the
// cell's saved state (T, B, H; the LSTM's c and tanh(c), the GRU's R_n and its dR (T, B, G*H)),
// the layer output (T, B, D*H), its input gradient (T, B, I_l), dropout masks and masked copies;
// half-precision GEMMs add half-size copies of gates and outputs.
double activation_bytes(const ModelOptions& m, int64_t T, int64_t B, bool half) {
  if (m.family == ModelFamily::decoder) {
    // Per layer and token what backward keeps: both norms' outputs, q, k and v (and their
    // per-head copies under GQA), the attention output, the stream after attention and after
    // the layer, the MLP's gate, up and product (3F); Gemma adds q and k before their norms and
    // both branches before theirs. Then the head: logits and their gradient (2V), or a
    // classifier's rows.
    const DecoderOptions& o = m.decoder;
    const double N = double(T) * double(B), C = double(o.hidden_size),
                 F = double(o.intermediate_size), HD = double(o.num_heads * o.head_dim),
                 W = double((o.num_heads + 2 * o.num_kv_heads) * o.head_dim);
    double layer = 4 * C + W + HD + 3 * F + (o.num_kv_heads < o.num_heads ? 3 * HD : 0);
    if (o.gemma) layer += 2 * C + HD + double(o.num_kv_heads * o.head_dim);
    const double head = o.num_labels > 0 ? 0 : 2.0 * double(o.vocab_size);
    return 4 * N * (double(o.num_layers) * layer + head + 2 * C);
  }
  if (m.family == ModelFamily::transformer) {
    // Per block and token: the LayerNorm outputs, qkv, attention output, both branch outputs,
    // the residual sums, the MLP's 4C pre- and post-GELU (18C), and in backward the MLP's 4C and
    // qkv's 3C gradients and four C-wide ones (11C); the logits and their gradient (2V).
    const double N = double(T) * double(B), C = double(m.transformer.n_embd);
    return 4 * N * (double(m.transformer.n_layer) * 29 * C + 2.0 * double(m.vocab_size));
  }
  const RecurrentOptions& o = m.rnn;
  const double D = o.bidirectional ? 2 : 1, H = static_cast<double>(o.hidden_size);
  double floats = 0;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const double I = l == 0 ? static_cast<double>(o.input_size) : D * H;
    const CellType& cell = cell_type(o.cell);
    const double GH = cell.gates * H;
    // What each chain keeps for backward: c, the cell's saved values, dR apart from dG.
    const double saved = (cell.cell_state ? H : 0) +
                         static_cast<double>(saved_columns(cell, o.hidden_size)) +
                         (cell.recurrent_grads ? GH : 0);
    double layer = D * (GH + saved) + D * H + I;
    if (o.dropout > 0 && l + 1 < o.num_layers) layer += 2 * D * H;
    if (half) layer += 0.5 * (D * GH + D * H);
    floats += layer * T * B;
  }
  const double head_rows = m.per_step ? static_cast<double>(T * B) : static_cast<double>(B);
  floats += 2 * head_rows * (D * H + static_cast<double>(m.output_size));
  if (m.vocab_size > 0) floats += 2.0 * T * B * m.embedding_dim;
  return floats * 4;
}

namespace {
// Bytes of a model's parameters in f32, with their gradients and AdamW's two moments (the ones
// that train) when `training`.
double parameter_bytes(const Parameters& p, bool training) {
  double values = 0, trained = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double n = double(p.values().entries()[i].shape.numel());
    values += n;
    if (!p.fixed(i)) trained += n;
  }
  return sizeof(float) * (values + (training ? 3 * trained : 0));
}
}  // namespace

std::string device_fit_problem(double free_bytes, const std::string& device, Model& model,
                               const ModelOptions& m, int64_t T, int64_t batch, bool half,
                               double* need_bytes) {
  const double mb = 1 << 20;
  const double fixed = parameter_bytes(model.parameters(), true);
  const double per_example = activation_bytes(m, T, 1, half);
  const double need = fixed + per_example * double(batch);
  if (need_bytes) *need_bytes = need;
  if (need <= free_bytes) return "";
  const auto fits = static_cast<int64_t>(std::floor((free_bytes - fixed) / per_example));
  char head[256];
  std::snprintf(head, sizeof head,
                "a training step needs about %.0f MiB on %s (parameters, gradients and AdamW's "
                "moments %.0f MiB, activations %.0f MiB for %lld examples at once), more than the "
                "%.0f MiB free",
                need / mb, device.c_str(), fixed / mb, per_example * double(batch) / mb,
                static_cast<long long>(batch), free_bytes / mb);
  if (fits >= 1)
    return std::string(head) + ": train.micro_batch_size " + std::to_string(fits) +
           " fits (the same steps, run in micro-batches)";
  return std::string(head) +
         ": even a batch of 1 does not fit; make the model (model.hidden, model.layers) or the "
         "windows (data.lookback, data.seq_len) smaller";
}

void check_model_fits(Model& model, const Config& c, bool training) {
  const double mb = 1 << 20;
  const Parameters& p = model.parameters();
  const double need = parameter_bytes(p, training);
  const double available = double(available_memory_bytes());
  if (need <= available) return;
  const bool transformer = c.str("model.family") == "transformer";
  fail(c.source(), ": the model's ", p.count(), " parameters need ",
       static_cast<int64_t>(need / mb), " MB",
       training ? " (values, gradients and AdamW's two moments)" : "", ", more than the ",
       static_cast<int64_t>(available / mb), " MB available: make ",
       transformer ? "model.embedding" : "model.hidden", " or model.layers smaller (now ",
       c.integer(transformer ? "model.embedding" : "model.hidden"), " and ",
       c.integer("model.layers"), ")");
}

// The model of a loaded run, its weights loaded, computing in the run's precision.
std::unique_ptr<Model> load_model(Backend& be, const LoadedRun& r, std::ostream* notes) {
  auto model = make_model(r.task.model);
  check_model_fits(*model, r.config, false);
  model->initialize(be, 0);
  load_parameters(r.file.source(), model->parameters(), be);
  std::string notice;
  model->set_gemm_dtype(
      model_precision(r.config.str("train.precision"), be, r.task.model, &notice));
  if (!notice.empty() && notes) *notes << "note: " << notice << "\n";
  return model;
}

StatefulStreams stateful_streams(const Dataset& d, int64_t batch_size) {
  const int64_t T = d.steps();
  std::vector<int64_t> chunks;
  std::vector<uint8_t> fresh;
  int64_t last = -1;
  for (int64_t s : d.split().train) {  // in time order
    if (last >= 0 && s < last + T) continue;
    const bool continues = last >= 0 && s == last + T &&
                           (d.is_lm() || &d.series.series_of(s) == &d.series.series_of(last));
    chunks.push_back(s);
    fresh.push_back(continues ? 0 : 1);
    last = s;
  }
  StatefulStreams out;
  const int64_t n = static_cast<int64_t>(chunks.size()), L = n / batch_size;
  out.batches = L;
  out.chunks = n;
  for (int64_t k = 0; k < L; ++k)
    for (int64_t i = 0; i < batch_size; ++i) {
      out.order.push_back(chunks[i * L + k]);
      out.reset.push_back(k == 0 || fresh[i * L + k] ? 1 : 0);
    }
  return out;
}

// Compute threads of one of `local` processes on this machine: an unbound process (mpirun
// --bind-to none) shares the machine's CPUs with the others.
ThreadConfig configure_rank_threads(const Config& c, int local) {
  const int64_t requested = c.integer("train.threads");  // 0: one per CPU
  const int cpus = usable_cpus(), online = online_cpus();
  ThreadConfig t;
  if (local <= 1 || requested > 0 || std::getenv("OMP_NUM_THREADS") || cpus < online) {
    t = configure_threads(static_cast<int>(requested));  // alone, or bound by the launcher
  } else {
    t = configure_threads(std::max(1, cpus / local));
    t.reason = std::to_string(cpus) + " CPUs shared by " + std::to_string(local) +
               " processes on this machine";
  }
  if (t.threads > cpus)
    t.warning = std::to_string(t.threads) + " threads (" + t.reason + ") on " +
                std::to_string(cpus) +
                " CPUs this process may use: threads will wait for each "
                "other; set train.threads to " +
                std::to_string(cpus) + " or fewer";
  return t;
}

}  // namespace seqforge
