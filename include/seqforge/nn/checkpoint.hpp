#pragma once
// Model weights as safetensors under PyTorch's parameter names, loadable with
// `model.load_state_dict(...)` after reading the file in PyTorch, and the reverse.
#include <map>
#include <string>
#include <vector>

#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/parameters.hpp"

namespace seqforge {

// Writes every parameter (and each alias, a copy under its name) in the arena's dtype,
// atomically.
void save_parameters(const std::string& path, Backend& backend, const Parameters& params,
                     const std::map<std::string, std::string>& metadata = {});

// Loads every parameter by name, converting from any float dtype in the file. A missing or
// mis-shaped tensor, or one holding NaN or infinity, is an error naming the file and the tensor;
// tensors in the file that the model does not have are an error too unless `allow_extra`; an alias
// (Parameters::alias) must equal its parameter. With `modules` ("lstm", "head", ...), only
// parameters named "<module>.*" are loaded, whole, and the file's other modules are ignored.
// Parameters named in `optional` that the file lacks keep their values (adapters or a new head on a
// base model's weights), and the file's tensors named in `ignored` are skipped (a base model's LM
// head), as are the model's parameters of those names (which the caller loads its own way). A parameter the file lacks under its own name is read from its name in `tied` when the
// file has that one (a tied weight saved once). `shape_hint` ends the message of a mis-shaped
// tensor. Returns the names of the parameters loaded.
std::vector<std::string> load_parameters(const std::string& path, Parameters& params,
                                         Backend& backend, bool allow_extra = false,
                                         const std::vector<std::string>& modules = {},
                                         const std::vector<std::string>& optional = {},
                                         const std::vector<std::string>& ignored = {},
                                         const std::map<std::string, std::string>& tied = {},
                                         const std::string& shape_hint = "");

// A parameter's tensor in a checkpoint: under its name, or under torch.compile's wrapper prefix
// `_orig_mod.` (kept in nanoGPT's checkpoints of compiled models); null when neither is there.
const io::SafetensorsEntry* find_parameter(const io::SafetensorsFile& file,
                                           const std::string& name);
// A checkpoint tensor's parameter name: without torch.compile's prefix.
std::string parameter_name(const std::string& tensor_name);

// The model's modules, the parameter names' first parts in order: "embedding, lstm, head".
std::string module_names(const Parameters& params);

}  // namespace seqforge
