#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <tuple>

#include "run.hpp"
#include "seqforge/backend/onednn_info.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/nn/checkpoint.hpp"
#include "seqforge/nn/decoder.hpp"
#include "seqforge/train/data_options.hpp"
#include "seqforge/train/trainer.hpp"
#include "task_type.hpp"

namespace seqforge {

namespace fs = std::filesystem;

// The adapter.* keys, checked: for a transformer (`cell` empty; targets are a block's Linears)
// or a recurrent layer of cell `cell` (targets are its weights, by default weight_ih and
// weight_hh).
AdapterOptions adapter_options(const Config& c, const std::string& cell) {
  AdapterOptions a;
  const std::string kind = c.str("adapter.kind");
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
    if (v <= 0) fail(c.origin(key), ": ", key, " must be positive, got ", v);
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
  m.final_states = !m.per_step && !t.is_text() && c.str("model.output") == "final_states";
  const std::string family = c.str("model.family");
  if (family == "transformer") {
    if (!t.is_text() || t.kind == TaskKind::lm)
      fail(c.origin("model.family"),
           ": model.family transformer takes data.task charlm or text_classify, not ",
           task_name(t.kind),
           t.kind == TaskKind::lm ? " (a tokenizer's tokens train a Hugging Face model: "
                                    "model.family decoder, model.init_from its folder)"
                                  : "");
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
      fail(c.origin("model.bidirectional"),
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
    if (t.text.seq_len > m.decoder.max_positions)
      fail(c.origin("data.seq_len"), ": data.seq_len ", t.text.seq_len, " is longer than the ",
           m.decoder.max_positions, " positions of ", init,
           " (max_position_embeddings in its config.json)");
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
  } else if (t.kind == TaskKind::text_classify) {  // recurrent
    fail(c.origin("data.task"), ": data.task text_classify takes model.family transformer");
  } else if (t.kind == TaskKind::lm) {
    fail(c.origin("data.task"),
         ": data.task lm takes model.family decoder (a Hugging Face model on its tokenizer's "
         "tokens, model.init_from its folder); a recurrent model of characters is data.task "
         "charlm");
  } else {
    // The backward direction of a character model would read the very character each step
    // predicts: a loss near 0 that measures nothing.
    if (t.kind == TaskKind::charlm && m.rnn.bidirectional)
      fail(c.origin("model.bidirectional"),
           ": model.bidirectional: a character model predicts each character from those before "
           "it; a backward direction would read the character it is to predict (set it false)");
    m.adapter = adapter_options(c, cell_type(m.rnn.cell).name);
  }
  return m;
}

std::unique_ptr<Backend> make_device_backend(const Config& c, const ModelOptions& m,
                                             bool inference) {
  std::string device = c.str("train.device");
  if (inference && device == "cuda") device = "auto";
  const std::string matmul = c.str("train.matmul_precision");
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
  // A recurrent run's checkpoint (PyTorch's names: lstm.weight_ih_l0, ...) holds no transformer.
  if (!wte && std::any_of(file.entries().begin(), file.entries().end(), [](const auto& e) {
        return e.name.find(".weight_ih_l") != std::string::npos;
      }))
    fail(c.origin("model.init_from"), ": model.init_from ", c.str("model.init_from"),
         " is a recurrent model; model.family transformer starts from a transformer's checkpoint");
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
      fail(c.origin(key), ": ", key, " ", text(key, given), " differs from the base model's ",
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
  const std::string data_task = c.str("data.task");
  const bool recurrent = !transformer && !decoder;
  if (recurrent && c.differs_from_default("model.bias"))
    out.push_back(
        "model.bias is for transformers; a recurrent layer keeps its biases (as "
        "nn.LSTM's default): it is ignored");
  if (recurrent && data_task != "charlm" && data_task != "lm" && data_task != "text_classify" &&
      c.differs_from_default("model.embedding"))
    out.push_back("model.embedding is for characters and transformers; a recurrent " + data_task +
                  " model reads its features as they are: it is ignored");
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
  // A text task reads none of the time series' keys, and a time-series task no text key.
  const bool text = task == "charlm" || task == "lm" || task == "text_classify";
  if (text) {
    for (const char* key :
         {"data.lookback",    "data.horizon",       "data.stride",         "data.features",
          "data.targets",     "data.date_column",   "data.date_order",     "data.series_column",
          "data.transform",   "data.calendar",      "data.known_future",   "data.static",
          "data.categorical", "data.missing",       "data.missing_values", "data.frequency",
          "data.holidays",    "data.normalize",     "data.normalize_per",  "data.label_fraction",
          "data.split.by",    "data.split.context", "model.output"})
      if (c.differs_from_default(key))
        out.push_back(
            std::string(key) + " is for time series; data.task is " + task +
            (std::string(key) == "data.lookback" ? ", whose sequences are data.seq_len long" : "") +
            ": it is ignored");
  } else if (c.differs_from_default("data.seq_len")) {
    out.push_back("data.seq_len is for text (charlm, lm, text_classify); data.task is " + task +
                  ", whose windows are data.lookback long: it is ignored");
  }
  if (task != "lm" && task != "text_classify" && c.differs_from_default("data.text_columns"))
    out.push_back("data.text_columns is for lm and text_classify; data.task is " + task +
                  ": it is ignored");
  if (task != "text_classify" && c.differs_from_default("data.separator"))
    out.push_back("data.separator joins text_classify's pairs; data.task is " + task +
                  ": it is ignored");
  if (task != "classify")
    for (const char* key : {"data.label", "data.label_column"})
      if (c.differs_from_default(key))
        out.push_back(std::string(key) + " is for data.task classify; data.task is " + task +
                      ": it is ignored");
  if ((task == "charlm" || task == "lm") && c.differs_from_default("data.class_column"))
    out.push_back("data.class_column is for classifiers; data.task is " + task + ": it is ignored");
  if ((task == "forecast" || task == "mae") && c.differs_from_default("data.class_column"))
    out.push_back("data.class_column is for classifiers; data.task is " + task + ": it is ignored" +
                  (c.list("data.features").empty()
                       ? ", but for keeping column '" + c.str("data.class_column") +
                             "' out of the features (data.features is empty: every other column)"
                       : ""));
  if ((task == "classify" || task == "mae") && c.differs_from_default("data.targets"))
    out.push_back(
        "data.targets is for data.task forecast; data.task is " + task +
        (task == "mae" ? ", which reconstructs its features" : ", whose truth is its class") +
        ": it is ignored");
  if (task == "classify" && c.str("data.label") == "column" &&
      c.differs_from_default("data.label_column"))
    out.push_back(
        "data.label_column is for data.label direction and volatility; data.label is "
        "column (the class is data.class_column's): it is ignored");
  if (c.str("data.split.mode") == "random")
    for (const char* key : {"data.split.by", "data.split.context"})
      if (c.differs_from_default(key))
        out.push_back(std::string(key) +
                      " is for time splits; data.split.mode is random: it is ignored");
  if (!c.boolean("augment.cache") && c.differs_from_default("augment.cache_versions"))
    out.push_back("augment.cache_versions is set but augment.cache is false: nothing is cached");
  if (task != "mae" && c.differs_from_default("data.mask_ratio"))
    out.push_back("data.mask_ratio is for data.task mae (the masked autoencoder); data.task is " +
                  task + ": it is ignored");
  // Settings of a schedule, optimizer, saving or augmentation the run does not use.
  const std::string schedule = c.str("train.schedule");
  for (const auto& [key, used, what] : std::vector<std::tuple<std::string, bool, std::string>>{
           {"train.gamma", schedule == "step" || schedule == "plateau",
            "train.schedule step and plateau"},
           {"train.step_epochs", schedule == "step", "train.schedule step"},
           {"train.plateau_patience", schedule == "plateau", "train.schedule plateau"}})
    if (!used && c.differs_from_default(key))
      out.push_back(key + " is for " + what + "; train.schedule is " + schedule +
                    ": it is ignored");
  if (c.str("train.save") != "every_n" && c.differs_from_default("train.save_every"))
    out.push_back("train.save_every is for train.save every_n; train.save is " +
                  c.str("train.save") + ": it is ignored");
  const std::string optimizer = c.str("optim.kind");
  for (const char* key : {"optim.momentum", "optim.nesterov"})
    if (optimizer != "sgd" && c.differs_from_default(key))
      out.push_back(std::string(key) + " is for optim.kind sgd; optim.kind is " + optimizer +
                    ": it is ignored");
  for (const char* key : {"optim.beta1", "optim.beta2", "optim.eps"})
    if (optimizer == "sgd" && c.differs_from_default(key))
      out.push_back(std::string(key) +
                    " is for optim.kind adam and adamw; optim.kind is sgd: " + "it is ignored");
  if (c.list("train.freeze_modules").empty() && c.differs_from_default("train.freeze_epochs"))
    out.push_back(
        "train.freeze_epochs is set but train.freeze_modules is empty: nothing is frozen");
  if (c.str("model.init_from").empty() && c.differs_from_default("model.init_from_modules"))
    out.push_back("model.init_from_modules is set but model.init_from is empty: nothing is loaded");
  for (const auto& [name, settings] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"jitter", {"sigma"}},
           {"scaling", {"sigma"}},
           {"magnitude_warp", {"sigma", "knots"}},
           {"time_warp", {"sigma", "knots"}},
           {"window_slice", {"ratio"}}})
    for (const std::string& setting : settings)
      if (c.number("augment." + name + ".p") == 0 &&
          c.differs_from_default("augment." + name + "." + setting))
        out.push_back("augment." + name + "." + setting + " is set but augment." + name +
                      ".p is 0: " + name + " never applies");
  // Early stopping, the plateau schedule and `save: best` read the mode: a loss watched with
  // `max` keeps the worst epoch.
  const std::string monitor = c.str("train.early_stopping.monitor"),
                    mode = c.str("train.early_stopping.mode");
  const bool higher_better = higher_is_better(monitor);
  if ((mode == "max" && !higher_better) || (mode == "min" && higher_better))
    out.push_back("train.early_stopping.mode is " + mode + " but " + monitor + " is better " +
                  (higher_better ? "higher" : "lower") +
                  ": the run keeps and waits for its worst epochs (mode auto picks " +
                  (higher_better ? "max" : "min") + ")");
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

RegressionLoss regression_loss_of(const Config& c, TaskKind task) {
  RegressionLoss l;
  const std::string kind = c.str("train.loss");
  if (kind == "mae")
    l.kind = LossKind::mae;
  else if (kind == "huber")
    l.kind = LossKind::huber;
  else if (kind == "quantile")
    l.kind = LossKind::quantile;
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

}  // namespace seqforge
