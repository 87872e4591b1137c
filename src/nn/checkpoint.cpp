#include "seqforge/nn/checkpoint.hpp"

#include <algorithm>
#include <vector>

#include "seqforge/backend/host_access.hpp"
#include "seqforge/io/safetensors.hpp"

namespace seqforge {

void save_parameters(const std::string& path, Backend& backend, const Parameters& params,
                     const std::map<std::string, std::string>& metadata) {
  const Tensor flat = params.values().flat();
  const HostView values(backend, flat);
  std::vector<io::SafetensorsTensor> tensors;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor v = params.value(i);
    const char* at = static_cast<const char*>(values.bytes()) +
                     (static_cast<const char*>(v.data()) - static_cast<const char*>(flat.data()));
    tensors.push_back({params.values().entries()[i].name, v.dtype(), v.shape().to_vector(), at});
  }
  for (const auto& [alias, i] : params.aliases()) {
    io::SafetensorsTensor t = tensors[i];
    t.name = alias;
    tensors.push_back(t);
  }
  io::write_safetensors(path, tensors, metadata);
}

std::string module_names(const Parameters& params) {
  std::string out, last;
  for (const auto& e : params.values().entries()) {
    const std::string module = e.name.substr(0, e.name.find('.'));
    if (module == last) continue;
    out += (out.empty() ? "" : ", ") + module;
    last = module;
  }
  return out;
}

namespace {
constexpr std::string_view kCompiledPrefix = "_orig_mod.";
}  // namespace

const io::SafetensorsEntry* find_parameter(const io::SafetensorsFile& file,
                                           const std::string& name) {
  const io::SafetensorsEntry* plain = file.find(name);
  const io::SafetensorsEntry* compiled = file.find(std::string(kCompiledPrefix) + name);
  if (plain && compiled)
    fail("the checkpoint holds both '", name, "' and '", kCompiledPrefix, name,
         "' (torch.compile's name): which one is the model's is not clear; keep one");
  return plain ? plain : compiled;
}

std::string parameter_name(const std::string& tensor_name) {
  if (tensor_name.rfind(kCompiledPrefix, 0) == 0) return tensor_name.substr(kCompiledPrefix.size());
  return tensor_name;
}

std::vector<std::string> load_parameters(const std::string& path, Parameters& params,
                                         Backend& backend, bool allow_extra,
                                         const std::vector<std::string>& modules,
                                         const std::vector<std::string>& optional,
                                         const std::vector<std::string>& ignored,
                                         const std::map<std::string, std::string>& tied,
                                         const std::string& shape_hint) {
  if (!params.values().allocated())
    fail(path, ": the model to load it into is not initialized: initialize the model first");
  auto listed = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  std::vector<std::string> loaded;
  bool skipped = false;
  const io::SafetensorsFile file = io::SafetensorsFile::read(path);
  file.check_data_hash();
  auto selected = [&](const std::string& name) {
    if (modules.empty()) return true;
    for (const auto& m : modules)
      if (name.rfind(m + ".", 0) == 0) return true;
    return false;
  };
  for (const auto& m : modules) {
    bool any = false;
    for (const auto& e : params.values().entries()) any |= e.name.rfind(m + ".", 0) == 0;
    if (!any)
      fail(path, ": the model has no module '", m, "' (modules: ", module_names(params), ")");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& entry = params.values().entries()[i];
    if (!selected(entry.name)) continue;
    if (listed(ignored, entry.name)) {  // the caller loads it its own way
      skipped = true;
      continue;
    }
    const io::SafetensorsEntry* t = find_parameter(file, entry.name);
    if (const auto other = tied.find(entry.name); !t && other != tied.end())
      t = find_parameter(file, other->second);
    if (!t && listed(optional, entry.name)) continue;
    if (!t) fail(path, ": missing tensor '", entry.name, "' of shape ", entry.shape.str());
    if (t->shape.size() > size_t(Shape::kMaxRank))
      fail(path, ": tensor '", entry.name, "' has ", t->shape.size(),
           " dimensions, the model expects ", entry.shape.str());
    if (Shape(t->shape) != entry.shape)
      fail(path, ": tensor '", entry.name, "' has shape ", Shape(t->shape).str(),
           ", the model expects ", entry.shape.str(), shape_hint);
    if (t->dtype == DType::i32 || t->dtype == DType::i64)
      fail(path, ": tensor '", entry.name, "' is ", dtype_safetensors_name(t->dtype),
           ", expected a float dtype");
    const auto bytes = file.bytes(*t);
    std::vector<std::byte> aligned(bytes.begin(), bytes.end());  // file data may be unaligned
    const DType dtype = params.value(i).dtype();  // a fixed base weight may be narrower
    std::vector<std::byte> converted(static_cast<size_t>(entry.shape.numel()) * dtype_size(dtype));
    convert(aligned.data(), t->dtype, converted.data(), dtype,
            static_cast<size_t>(entry.shape.numel()));
    // Checked as converted: a finite f64 beyond f32's range becomes infinite too.
    double bad = 0;
    if (const int64_t at = first_non_finite(converted.data(), dtype,
                                            static_cast<size_t>(entry.shape.numel()), &bad);
        at >= 0)
      fail(path, ": tensor '", t->name, "' holds a non-finite value (", bad, " at index ", at,
           "): refusing a model with NaN or infinite weights");
    backend.upload(params.value(i), converted.data());
    loaded.push_back(entry.name);
  }
  // A selection that loads nothing is a mistake (a module named for another naming scheme), not a
  // start from random weights.
  if (loaded.empty() && !skipped && !modules.empty()) {
    std::string names;
    for (const auto& m : modules) names += (names.empty() ? "" : ", ") + m;
    fail(path, ": init_from_modules [", names, "] loads no tensor: none of the file's ",
         file.entries().size(), " tensors (",
         file.entries().empty() ? std::string("none") : file.entries()[0].name,
         ", ...) is a parameter of those modules under the model's names");
  }
  // An alias of a parameter (a tied weight) must hold the same values as the parameter.
  for (const auto& [alias, i] : params.aliases()) {
    const io::SafetensorsEntry* a = find_parameter(file, alias);
    const io::SafetensorsEntry* p = find_parameter(file, params.values().entries()[i].name);
    if (!a || !p || !selected(params.values().entries()[i].name)) continue;
    const auto ab = file.bytes(*a), pb = file.bytes(*p);
    if (a->dtype != p->dtype || a->shape != p->shape ||
        !std::equal(ab.begin(), ab.end(), pb.begin(), pb.end()))
      fail(path, ": tensor '", alias, "' differs from '", params.values().entries()[i].name,
           "', which this model ties it to");
  }
  if (!allow_extra) {
    auto known = [&](const std::string& name) {
      if (params.values().find(name) || listed(ignored, name)) return true;
      for (const auto& [alias, i] : params.aliases())
        if (alias == name) return true;
      return false;
    };
    // The modules loaded come whole (a layer or a direction more is no partial start); the
    // file's other modules are ignored.
    for (const auto& t : file.entries()) {
      if (!selected(parameter_name(t.name)) || known(parameter_name(t.name))) continue;
      if (t.name.starts_with("base_model.model.") && t.name.find(".lora_") != std::string::npos)
        fail(path, ": holds adapters ('", t.name,
             "') that this model does not have: fold them into the base weights first "
             "(`seqforge merge RUN --output FILE.safetensors`), or give the adapter.* settings "
             "of the run that trained them");
      fail(path, ": tensor '", t.name, "' is not a parameter of this model",
           modules.empty() ? "" : " (its module is one model.init_from_modules loads)");
    }
  }
  return loaded;
}

}  // namespace seqforge
