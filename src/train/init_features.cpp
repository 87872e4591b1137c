// model.init_from on series data: the loaded weights that read the data's features (the first
// recurrent layer's input weights and their adapters' A, a masked autoencoder's head rows) take
// them in the checkpoint's order. The same features in another order are put in this run's;
// other features are an error, never weights silently reading other columns. A forecaster's or
// classifier's head (a text classifier's too) follows its targets or classes the same way.
#include <algorithm>
#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/file_util.hpp"
#include "run.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/nn/checkpoint.hpp"

namespace seqforge {

namespace {

std::string listed(const std::vector<std::string>& names) {
  std::string out = "[";
  for (size_t i = 0; i < names.size() && i < 12; ++i)
    out += (i ? ", " : "") + io::quoted(names[i], 40);
  return out + (names.size() > 12 ? ", ... (" + std::to_string(names.size()) + ")]" : "]");
}

// Whether a parameter's columns (`by_rows`: rows) are the features, one each.
bool reads_features(const std::string& name, TaskKind task, bool* by_rows) {
  auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  *by_rows = false;
  for (const char* input : {".weight_ih_l0", ".weight_ih_l0_reverse"})
    if (ends_with(input) || ends_with(std::string(input) + ".lora_A.weight")) return true;
  *by_rows = task == TaskKind::mae && (name == "head.weight" || name == "head.bias");
  return *by_rows;
}

// `t` (rows, cols), or a vector (rows), with its columns (or rows) in `order`: new k is old
// order[k].
void reorder(Backend& be, Tensor t, const std::vector<size_t>& order, bool by_rows) {
  const int64_t rows = t.shape()[0], cols = t.shape().rank() == 2 ? t.shape()[1] : 1;
  const size_t elem = dtype_size(t.dtype());
  std::vector<std::byte> old(static_cast<size_t>(rows * cols) * elem), now(old.size());
  be.download(old.data(), t);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t from = by_rows ? order[r] * cols + c : r * cols + order[c];
      std::copy_n(old.begin() + from * elem, elem, now.begin() + (r * cols + c) * elem);
    }
  be.upload(t, now.data());
}

// A note for each feature the checkpoint's model read transformed or scaled otherwise: its weights
// meet other values than they learnt on (returns where they saw prices).
void note_other_values(const std::string& path, const std::map<std::string, std::string>& meta,
                       const Config& c, const std::vector<std::string>& ours, std::ostream& out) {
  const auto it = meta.find("seqforge.config");
  if (it == meta.end()) return;
  const Config stored = Config::parse(it->second, path + " (stored config)");
  const auto theirs = stored.map("data.transform"), now = c.map("data.transform");
  auto transform = [](const std::map<std::string, std::string>& m, const std::string& name) {
    const auto at = m.find(name);
    return at == m.end() ? std::string("none") : at->second;
  };
  std::string changed;
  for (const std::string& name : ours)
    if (transform(theirs, name) != transform(now, name))
      changed += (changed.empty() ? "" : ", ") + io::quoted(name, 40) + " (" +
                 transform(theirs, name) + " there, " + transform(now, name) + " here)";
  if (!changed.empty())
    out << "note: init_from: data.transform differs from the checkpoint's for " << changed
        << ": its first layer's weights meet other values than they learnt on\n";
  for (const char* key : {"data.normalize", "data.normalize_per"})
    if (stored.str(key) != c.str(key))
      out << "note: init_from: " << key << " is " << c.str(key) << ", the checkpoint's "
          << stored.str(key) << ": its first layer's weights meet other values than they learnt "
          << "on\n";
}

// The names a seqforge checkpoint's metadata `key` lists (none where it has no such key).
std::vector<std::string> listed_names(const std::map<std::string, std::string>& meta,
                                      const std::string& key, const std::string& path) {
  const auto it = meta.find(key);
  if (it == meta.end()) return {};
  const auto j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array() ||
      !std::all_of(j.begin(), j.end(), [](const auto& v) { return v.is_string(); }))
    fail(path, ": ", key, " metadata is not what seqforge wrote");
  return j.get<std::vector<std::string>>();
}

// A series model's head, a transformer's or a decoder's classifier: rows per output.
bool is_head(const std::string& name) {
  for (const char* head :
       {"head.weight", "head.bias", "classifier.weight", "classifier.bias", "score.weight"})
    if (name == head) return true;
  return false;
}

// For each of ours, its index in theirs; empty unless both hold the same distinct names.
std::vector<size_t> same_names_order(const std::vector<std::string>& theirs,
                                     const std::vector<std::string>& ours) {
  std::vector<std::string> a = theirs, b = ours;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a != b || std::adjacent_find(a.begin(), a.end()) != a.end()) return {};
  std::vector<size_t> order(ours.size());
  for (size_t k = 0; k < ours.size(); ++k)
    order[k] =
        static_cast<size_t>(std::find(theirs.begin(), theirs.end(), ours[k]) - theirs.begin());
  return order;
}

// A forecaster's or classifier's loaded head: its rows are the checkpoint's targets (per step
// ahead and quantile) or classes. The same ones in another order are put in this run's, with a
// line; others are a note (a head trained for them is only a start here).
void match_init_head(const std::string& path, const std::map<std::string, std::string>& meta,
                     const Task& task, const std::vector<std::string>& loaded, Parameters& params,
                     Backend& be, std::ostream& out) {
  const bool text = task.kind == TaskKind::text_classify;
  const bool classify = text || task.kind == TaskKind::classify;
  if (!classify && task.kind != TaskKind::forecast) return;
  const std::vector<std::string>& ours = text       ? task.text.class_names
                                         : classify ? task.series.class_names
                                                    : task.series.target_names;
  const char* key = classify ? "seqforge.classes" : "seqforge.targets";
  const std::vector<std::string> theirs = listed_names(meta, key, path);
  if (theirs.empty() || theirs == ours) return;
  const int64_t outputs = text ? static_cast<int64_t>(ours.size()) : task.series.num_outputs();
  std::vector<size_t> heads;
  for (const std::string& name : loaded)
    if (is_head(name))
      if (const Arena::Entry* e = params.values().find(name); e && e->shape[0] == outputs)
        heads.push_back(static_cast<size_t>(e - params.values().entries().data()));
  if (heads.empty()) return;
  const char* what = classify ? "classes" : "targets";
  const std::vector<size_t> order = same_names_order(theirs, ours);
  if (order.empty()) {
    out << "note: init_from: the checkpoint's head was trained for the " << what << " "
        << listed(theirs) << ", this run's are " << listed(ours) << ": it is only a start\n";
    return;
  }
  // Rows (k * targets + j) * quantiles + q for forecasts, one per class.
  const int64_t J = static_cast<int64_t>(ours.size()),
                Q = classify ? 1 : task.series.num_quantiles();
  const int64_t K = outputs / (J * Q);
  std::vector<size_t> rows(static_cast<size_t>(K * J * Q));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < J; ++j)
      for (int64_t q = 0; q < Q; ++q)
        rows[(k * J + j) * Q + q] = static_cast<size_t>((k * J + int64_t(order[j])) * Q + q);
  std::string names;
  for (size_t index : heads) {
    reorder(be, params.value(index), rows, /*by_rows=*/true);
    names += (names.empty() ? "" : ", ") + params.values().entries()[index].name;
  }
  out << "init_from: the checkpoint's " << what << " " << listed(theirs) << " are this run's "
      << listed(ours) << " in another order: " << names << " reordered to match\n";
}

// Where a forecaster's head rows stand for other outputs in the checkpoint than here (other steps
// ahead or quantiles, by its stored config): "data.horizon 3 (direct) there, 1 here, ..."; ""
// where they are laid out alike, or the checkpoint holds no config seqforge reads.
std::string head_layout_differences(const std::map<std::string, std::string>& meta,
                                    const std::string& path, const Config& c) {
  const auto stored = meta.find("seqforge.config");
  if (stored == meta.end()) return "";
  try {
    const Config t = Config::parse(stored->second, path + " (stored config)");
    const auto steps = [](const Config& x) {
      const int64_t h = x.integer("data.horizon");
      return h > 1 ? std::to_string(h) + " (" + x.str("data.horizon_mode") + ")"
                   : std::to_string(h);
    };
    const auto quantiles = [](const Config& x) {
      return x.str("train.loss") == "quantile" ? x.str("train.quantiles") : std::string("none");
    };
    std::string out;
    if (steps(t) != steps(c)) out = "data.horizon " + steps(t) + " there, " + steps(c) + " here";
    if (quantiles(t) != quantiles(c))
      out += (out.empty() ? "" : "; ") + std::string("quantiles ") + quantiles(t) + " there, " +
             quantiles(c) + " here";
    return out;
  } catch (const Error&) {
    return "";
  }
}

// The names a loaded head's rows stand for: a classifier's classes, a forecaster's targets.
const std::vector<std::string>& head_names(const Task& task) {
  return task.kind == TaskKind::text_classify ? task.text.class_names
         : task.kind == TaskKind::classify    ? task.series.class_names
                                              : task.series.target_names;
}

}  // namespace

std::vector<std::string> heads_by_name(const std::string& path, const Config& c, const Task& task,
                                       const Parameters& params,
                                       const std::vector<std::string>& modules) {
  const bool text = task.kind == TaskKind::text_classify;
  const bool classify = text || task.kind == TaskKind::classify;
  if (!classify && task.kind != TaskKind::forecast) return {};
  const std::string module = text ? "classifier" : "head";
  if (!modules.empty() && std::find(modules.begin(), modules.end(), module) == modules.end())
    return {};
  io::SafetensorsFile file;
  try {
    file = io::SafetensorsFile::read(path);
  } catch (const Error&) {
    return {};  // the loader says what is wrong with the file
  }
  const std::vector<std::string> theirs =
      listed_names(file.metadata(), classify ? "seqforge.classes" : "seqforge.targets", path);
  const std::vector<std::string>& ours = head_names(task);
  if (theirs.empty()) return {};  // not a seqforge model: its rows are the user's word
  // A forecaster's rows of other steps ahead or quantiles stand for other outputs: none loads.
  const bool other_layout = !classify && !head_layout_differences(file.metadata(), path, c).empty();
  // The same names, laid out alike: loaded whole, then put in this run's order.
  if (!other_layout && !same_names_order(theirs, ours).empty()) return {};
  std::vector<std::string> out;
  for (const auto& e : params.values().entries()) {
    if (e.name != module + ".weight" && e.name != module + ".bias") continue;
    const io::SafetensorsEntry* t = find_parameter(file, e.name);
    if (!t) continue;
    const int64_t per_name = e.shape[0] / static_cast<int64_t>(ours.size());
    if (!other_layout && (t->shape.size() != size_t(e.shape.rank()) ||
                          t->shape[0] != per_name * static_cast<int64_t>(theirs.size()) ||
                          (e.shape.rank() == 2 && t->shape[1] != e.shape[1])))
      return {};  // another model's head: the loader names the shapes
    out.push_back(e.name);
  }
  return out;
}

std::vector<std::string> load_heads_by_name(const std::string& path, const Config& c,
                                            const Task& task, const std::vector<std::string>& heads,
                                            Parameters& params, Backend& be, std::ostream& out) {
  if (heads.empty()) return {};
  const io::SafetensorsFile file = io::SafetensorsFile::read(path);
  const bool classify = task.kind != TaskKind::forecast;
  if (!classify)
    if (const std::string other = head_layout_differences(file.metadata(), path, c);
        !other.empty()) {
      out << "note: init_from: the checkpoint's head forecasts other outputs (" << other
          << "): it starts new\n";
      return {};
    }
  const std::vector<std::string> theirs =
      listed_names(file.metadata(), classify ? "seqforge.classes" : "seqforge.targets", path);
  const std::vector<std::string>& ours = head_names(task);
  // Row (k * names + j) * quantiles + q: step ahead k, name j, quantile q (one of each for a
  // classifier); `inner` rows per name at each step, laid out alike here and there.
  const int64_t J = static_cast<int64_t>(ours.size()), Jt = static_cast<int64_t>(theirs.size());
  const int64_t inner = classify ? 1 : task.series.num_quantiles();
  std::vector<std::string> shared, fresh;
  for (const std::string& name : ours)
    (std::find(theirs.begin(), theirs.end(), name) != theirs.end() ? shared : fresh)
        .push_back(name);
  const char* what = classify ? "classes" : "targets";
  out << "note: init_from: the checkpoint's head was trained for the " << what << " "
      << listed(theirs) << ", this run's are " << listed(ours) << ": "
      << (shared.empty() ? "none is shared, and the head starts new"
                         : "the rows of " + listed(shared) + " are loaded by name" +
                               (fresh.empty() ? "" : ", those of " + listed(fresh) + " start new"))
      << "\n";
  if (shared.empty()) return {};
  for (const std::string& head : heads) {
    const Arena::Entry* e = params.values().find(head);
    const Tensor dst = params.value(static_cast<size_t>(e - params.values().entries().data()));
    const io::SafetensorsEntry* t = find_parameter(file, head);
    const int64_t rows = dst.shape()[0], cols = dst.shape().rank() == 2 ? dst.shape()[1] : 1;
    const int64_t steps = rows / (J * inner);
    // In f32 whatever the parameter's dtype (a head held narrower is widened and narrowed back).
    std::vector<float> now(static_cast<size_t>(rows * cols)),
        saved(static_cast<size_t>(t->shape[0] * cols));
    std::vector<std::byte> held(static_cast<size_t>(dst.nbytes()));
    be.download(held.data(), dst);
    convert(held.data(), dst.dtype(), now.data(), DType::f32, now.size());
    const auto bytes = file.bytes(*t);
    std::vector<std::byte> aligned(bytes.begin(), bytes.end());  // file data may be unaligned
    convert(aligned.data(), t->dtype, saved.data(), DType::f32, saved.size());
    double bad = 0;
    if (const int64_t at = first_non_finite(saved.data(), DType::f32, saved.size(), &bad); at >= 0)
      fail(path, ": tensor '", t->name, "' holds a non-finite value (", bad, " at index ", at,
           "): refusing a model with NaN or infinite weights");
    for (int64_t j = 0; j < J; ++j) {
      const auto at = std::find(theirs.begin(), theirs.end(), ours[size_t(j)]);
      if (at == theirs.end()) continue;  // a name new here keeps its row's start
      const int64_t jt = at - theirs.begin();
      for (int64_t k = 0; k < steps; ++k)
        for (int64_t q = 0; q < inner; ++q)
          std::copy_n(saved.begin() + ((k * Jt + jt) * inner + q) * cols, cols,
                      now.begin() + ((k * J + j) * inner + q) * cols);
    }
    convert(now.data(), DType::f32, held.data(), dst.dtype(), now.size());
    be.upload(dst, held.data());
  }
  return heads;
}

std::string init_model_differences(const std::string& path, const Config& c) {
  std::map<std::string, std::string> meta;
  try {
    meta = io::SafetensorsFile::read(path).metadata();
  } catch (const Error&) {
    return "";
  }
  const auto stored_text = meta.find("seqforge.config");
  if (stored_text == meta.end()) return "";
  std::string differences;
  try {
    const Config theirs = Config::parse(stored_text->second, path + " (stored config)");
    // A key one of the two models has no use for (a forecaster's model.embedding) is no
    // difference: its default says nothing.
    const auto applies = [](const Config& config, const std::string& key) {
      const bool transformer = config.str("model.family") == "transformer";
      const std::string task = config.str("data.task");
      if (key == "model.embedding")
        return transformer || task == "charlm" || task == "lm" || task == "text_classify";
      if (key == "model.heads" || key == "model.block_size" || key == "model.bias")
        return transformer;
      if (key == "model.cell" || key == "model.hidden" || key == "model.proj_size" ||
          key == "model.bidirectional")
        return !transformer;
      return true;
    };
    for (const char* key : {"data.task", "model.family", "model.cell", "model.hidden",
                            "model.proj_size", "model.layers", "model.heads", "model.bidirectional",
                            "model.bias", "model.embedding", "model.block_size"}) {
      if (!applies(theirs, key) || !applies(c, key)) continue;
      const bool is_flag =
          std::string(key) == "model.bidirectional" || key == std::string("model.bias");
      const bool differ =
          is_flag ? theirs.boolean(key) != c.boolean(key) : theirs.str(key) != c.str(key);
      if (differ)
        differences += std::string(differences.empty() ? "" : ", ") + key + " " +
                       io::quoted(theirs.str(key), 40) + " there, " + io::quoted(c.str(key), 40) +
                       " here";
    }
  } catch (const Error&) {
    return "";  // a config of another version: the tensors' shapes say enough
  }
  return differences.empty() ? ""
                             : "; the checkpoint's model differs from this one's: " + differences;
}

void check_init_feature_count(const std::string& path, const Task& task,
                              const std::vector<std::string>& modules) {
  if (task.is_text()) return;
  const io::SafetensorsFile file = io::SafetensorsFile::read(path);
  const std::vector<std::string> theirs = listed_names(file.metadata(), "seqforge.features", path);
  const std::vector<std::string>& ours = task.series.feature_names;
  if (theirs.empty() || theirs.size() == ours.size()) return;
  for (const io::SafetensorsEntry& e : file.entries()) {
    const std::string name = parameter_name(e.name);
    const bool selected =
        modules.empty() || std::any_of(modules.begin(), modules.end(),
                                       [&](const auto& m) { return name.rfind(m + ".", 0) == 0; });
    bool by_rows = false;
    if (selected && reads_features(name, task.kind, &by_rows))
      fail(path, " (model.init_from): its model reads the ", theirs.size(), " features ",
           listed(theirs), ", this run's data gives ", ours.size(), ": ", listed(ours),
           "; name the same features in data.features, or leave the recurrent layer out of "
           "model.init_from_modules");
  }
}

void match_init_features(const std::string& path, const Config& c, const Task& task,
                         const std::vector<std::string>& loaded, Parameters& params, Backend& be,
                         std::ostream& out) {
  const bool head_loaded = std::any_of(loaded.begin(), loaded.end(), is_head);
  if (task.is_text()) {
    if (!head_loaded || task.kind != TaskKind::text_classify) return;
    const io::SafetensorsFile file = io::SafetensorsFile::read(path);
    return match_init_head(path, file.metadata(), task, loaded, params, be, out);
  }
  const std::vector<std::string>& ours = task.series.feature_names;
  std::vector<std::pair<size_t, bool>> readers;  // parameter index, by rows
  for (const std::string& name : loaded) {
    bool by_rows = false;
    const Arena::Entry* e = params.values().find(name);
    if (!e || !reads_features(name, task.kind, &by_rows)) continue;
    // An autoencoder's head has a row per file feature, the first of the features.
    const int64_t n = by_rows ? e->shape[0] : e->shape.rank() == 2 ? e->shape[1] : -1;
    if (n != (by_rows ? task.series.file_features : static_cast<int64_t>(ours.size()))) continue;
    readers.emplace_back(static_cast<size_t>(e - params.values().entries().data()), by_rows);
  }
  if (readers.empty() && !head_loaded) return;
  const io::SafetensorsFile file = io::SafetensorsFile::read(path);
  const auto& meta = file.metadata();
  if (head_loaded) match_init_head(path, meta, task, loaded, params, be, out);
  if (readers.empty()) return;
  // Without the key, not a seqforge series model: its columns are the user's word.
  const std::vector<std::string> theirs = listed_names(meta, "seqforge.features", path);
  if (theirs.empty()) return;
  note_other_values(path, meta, c, ours, out);
  if (theirs == ours) return;
  const std::vector<size_t> order = same_names_order(theirs, ours);
  // An autoencoder's head reordered by its rows: the file's features are the first in both.
  const auto file_first = [&] {
    if (std::none_of(readers.begin(), readers.end(), [](const auto& r) { return r.second; }))
      return true;
    for (int64_t k = 0; k < task.series.file_features; ++k)
      if (order[static_cast<size_t>(k)] >= static_cast<size_t>(task.series.file_features))
        return false;
    return true;
  };
  if (order.empty() || !file_first())
    fail(path, " (model.init_from): its model reads the features ", listed(theirs),
         ", this run's data gives ", listed(ours),
         ": its first layer's weights would read other columns; name the same features in "
         "data.features, or leave the recurrent layer out of model.init_from_modules");
  std::string names;
  for (const auto& [index, by_rows] : readers) {
    reorder(be, params.value(index), order, by_rows);
    names += (names.empty() ? "" : ", ") + params.values().entries()[index].name;
  }
  out << "init_from: the checkpoint's features " << listed(theirs) << " are this run's "
      << listed(ours) << " in another order: " << names << " reordered to match\n";
}

}  // namespace seqforge
