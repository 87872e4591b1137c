// seqforge merge: a run's adapters folded into its base weights.
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "io/file_util.hpp"
#include "nn/dense.hpp"
#include "run.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/nn/checkpoint.hpp"
#include "seqforge/train/data_options.hpp"
#include "seqforge/train/trainer.hpp"

namespace seqforge {

namespace fs = std::filesystem;

namespace {

constexpr const char* kAdapterPrefix = "base_model.model.";

// W0 (out, in) + s B A, then for DoRA each row scaled to m / its norm: in double. `stem` names
// the adapter in errors.
std::vector<double> merged_weight(const std::vector<double>& w0, const std::vector<double>& a,
                                  const std::vector<double>& b, const std::vector<double>* m,
                                  int64_t out, int64_t in, int64_t rank, double s,
                                  const std::string& run, const std::string& stem) {
  std::vector<double> w = nn::adapted_weight(w0, a, b, out, in, rank, s);
  if (!m) return w;
  const std::vector<double> norms = nn::row_norms(w, out, in);
  for (int64_t r = 0; r < out; ++r) {
    // m V / ||V|| has no value there: the merged row would be NaN.
    if (!(norms[r] > 0) || !std::isfinite(norms[r]))
      fail(run, ": DoRA adapter ", stem, ": row ", r, " of W0 + (alpha/r) B A has norm ", norms[r],
           ", so m V / ||V|| is undefined; refusing to write NaN weights");
    for (int64_t c = 0; c < in; ++c) w[r * in + c] *= (*m)[r] / norms[r];
  }
  for (int64_t i = 0; i < out * in; ++i)
    if (!std::isfinite(w[i]))
      fail(run, ": adapter ", stem, ": the merged weight is not finite at (", i / in, ", ", i % in,
           "); refusing to write it");
  return w;
}

// The value of parameter `name`, or an empty tensor when the model has none.
Tensor value_of(const Parameters& p, const std::string& name) {
  const Arena::Entry* e = p.values().find(name);
  if (!e) return Tensor();
  return p.value(static_cast<size_t>(e - p.values().entries().data()));
}

}  // namespace

int64_t merge_adapters(const std::string& run, const std::string& output) {
  if (output == "-")
    fail(
        "--output -: merge writes a model file (or a Hugging Face directory), not standard "
        "output; give a path");
  check_output_outside_run(output, run, "--output");
  LoadedRun r = load_run_model(run);
  const AdapterOptions& ad = r.task.model.adapter;
  if (ad.kind == AdapterKind::none) fail(run, ": no adapters to merge (adapter.kind is none)");
  const bool hf_folder =
      r.task.model.family == ModelFamily::decoder && !output.ends_with(".safetensors");
  if (const std::string& base = r.base_model; !base.empty()) {
    std::error_code ec;
    const fs::path target = fs::weakly_canonical(output, ec);
    if (target == fs::weakly_canonical(base, ec) ||
        target == fs::weakly_canonical(fs::path(base) / "model.safetensors", ec))
      fail("--output: ", output, " is the base model the run started from (model.init_from); ",
           "writing it would replace the base: give another path");
  }
  if (!hf_folder) {
    check_output_file(output, "--output");
  } else if (std::error_code ec; fs::exists(output, ec) && !fs::is_directory(output, ec)) {
    fail("--output: ", output,
         " is a file; a decoder merges into a Hugging Face folder (or name a .safetensors file)");
  } else {  // a new folder, in one that exists, and not named as a file of another kind
    const fs::path parent = fs::path(output).parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec))
      fail("--output: ", output, ": there is no folder ", parent.string(), " to make it in");
    static const std::set<std::string> file_kinds = {".json", ".bin", ".pt",  ".pth", ".ckpt",
                                                     ".gguf", ".csv", ".txt", ".npy", ".yaml"};
    if (!fs::exists(output, ec) && file_kinds.count(fs::path(output).extension().string()))
      fail("--output: ", output, ": a decoder merges into a Hugging Face folder (name it without ",
           fs::path(output).extension().string(), ") or into a .safetensors file");
  }
  auto be = make_device_backend(r.config, r.task.model, true);
  auto adapted = load_model(*be, r, nullptr);
  ModelOptions plain_options = r.task.model;
  plain_options.adapter.kind = plain_options.decoder.adapter.kind = AdapterKind::none;
  auto plain = make_model(plain_options);
  plain->initialize(*be, 0);
  const Parameters& src = adapted->parameters();
  Parameters& dst = plain->parameters();
  const double s = ad.alpha / double(ad.rank);
  int64_t merged = 0;
  for (size_t i = 0; i < dst.size(); ++i) {
    const std::string& name = dst.values().entries()[i].name;
    const Tensor w0 = value_of(src, name);
    // A Linear's adapter is named after the module (attn.c_attn), a recurrent layer's after the
    // weight (lstm.weight_ih_l0).
    std::string stem = kAdapterPrefix + name;
    if (value_of(src, stem + ".lora_A.weight").empty() && name.ends_with(".weight"))
      stem = kAdapterPrefix + name.substr(0, name.rfind('.'));
    const Tensor a = value_of(src, stem + ".lora_A.weight");
    if (a.empty()) {  // not an adapted weight: as it is (a base held in bf16: widened)
      if (w0.dtype() == dst.value(i).dtype())
        be->copy(dst.value(i), w0);
      else
        be->convert(dst.value(i), w0);
      continue;
    }
    const std::vector<double> m =
        ad.kind == AdapterKind::dora
            ? download_doubles(*be, value_of(src, stem + ".lora_magnitude_vector"))
            : std::vector<double>();
    upload_doubles(*be, dst.value(i),
                   merged_weight(download_doubles(*be, w0), download_doubles(*be, a),
                                 download_doubles(*be, value_of(src, stem + ".lora_B.weight")),
                                 ad.kind == AdapterKind::dora ? &m : nullptr, w0.dim(0), w0.dim(1),
                                 ad.rank, s, run, stem));
    ++merged;
  }
  std::map<std::string, std::string> meta = r.file.metadata();
  meta["seqforge.config"] =
      Config::parse(r.config.resolved_yaml(), r.config.source(), {"adapter.kind=none"})
          .resolved_yaml();
  meta["seqforge.merged_from"] = run;
  if (hf_folder) {
    // A Hugging Face folder: the run's config.json (a classifier's, with its labels) or else the
    // base's, the merged weights, the tokenizer's files.
    const fs::path dir(output), base(r.base_model);
    const fs::path own =
        (fs::is_directory(run) ? fs::path(run) : fs::path(run).parent_path()) / "config.json";
    fs::create_directories(dir);
    const auto copy_file = [&](const fs::path& from, const std::string& name) {
      const std::string text = io::read_file(from.string());
      io::write_file_atomically((dir / name).string(), {{text.data(), text.size()}});
    };
    // The config's dtype names the merged weights': f32 (a bf16 base is merged in f32, and
    // transformers 5 loads a folder in its config's dtype).
    const fs::path config = fs::exists(own) ? own : base / "config.json";
    nlohmann::ordered_json c = nlohmann::ordered_json::parse(io::read_file(config.string()),
                                                             nullptr, /*allow_exceptions=*/false);
    if (!c.is_object()) fail(config.string(), ": not a JSON object");
    for (const char* key : {"torch_dtype", "dtype"})
      if (c.contains(key)) c[key] = "float32";
    const std::string text = c.dump(2) + "\n";
    io::write_file_atomically((dir / "config.json").string(), {{text.data(), text.size()}});
    copy_file(data_options(r.config).text.tokenizer, "tokenizer.json");  // the run's copy
    for (const char* extra :
         {"tokenizer_config.json", "special_tokens_map.json", "generation_config.json"})
      if (fs::exists(own.parent_path() / extra))
        copy_file(own.parent_path() / extra, extra);
      else if (fs::exists(base / extra))
        copy_file(base / extra, extra);
    save_parameters((dir / "model.safetensors").string(), *be, dst, {{"format", "pt"}});
    return merged;
  }
  save_parameters(output, *be, dst, meta);
  return merged;
}

}  // namespace seqforge
