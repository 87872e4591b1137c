// The backends of this build, found by name.
#include <cstdlib>
#include <string>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

const char* op_name(Op op) {
  switch (op) {
    case Op::memory:
      return "memory";
    case Op::gemm:
      return "gemm";
    case Op::elementwise:
      return "elementwise";
    case Op::layout:
      return "layout";
    case Op::dropout:
      return "dropout";
    case Op::cell:
      return "cell";
    case Op::embedding:
      return "embedding";
    case Op::norm:
      return "norm";
    case Op::activation:
      return "activation";
    case Op::attention:
      return "attention";
    case Op::adapter:
      return "adapter";
    case Op::loss:
      return "loss";
    case Op::optimizer:
      return "optimizer";
    case Op::decoder:
      return "decoder";
  }
  return "?";
}

const std::vector<BackendEntry>& registered_backends() {
  static const std::vector<BackendEntry> all = {
      {"reference", make_reference_backend},
      {"cpu", make_cpu_backend},
      {"sealed", make_sealed_backend},
      {"sealed_async", make_sealed_async_backend},
      {"cuda", make_cuda_backend, cuda_unavailable_reason},  // backend/cuda, or no_cuda.cpp
  };
  return all;
}

std::unique_ptr<Backend> make_backend(std::string_view name) {
  std::string known;
  for (const BackendEntry& e : registered_backends()) {
    if (name == e.name) return e.make();
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  fail("unknown backend '", name, "' (expected one of: ", known, ")");
}

std::unique_ptr<Backend> make_run_backend(std::string_view device, const std::vector<Op>& needs) {
  if (const char* name = std::getenv("SEQFORGE_BACKEND"); name && *name) {
    try {
      return make_backend(name);
    } catch (const Error& e) {
      fail("SEQFORGE_BACKEND: ", e.what());
    }
  }
  if (device == "cpu") return make_cpu_backend();
  if (device != "cuda" && device != "auto")
    fail("unknown device '", device, "' (expected auto, cpu or cuda)");
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) {
    if (device == "auto") return make_cpu_backend();
    fail("device cuda: ", why);
  }
  std::unique_ptr<Backend> cuda;
  try {
    cuda = make_cuda_backend();
  } catch (const Error& e) {  // say, no cuBLASLt to load
    if (device == "auto") return make_cpu_backend();
    fail("device cuda: ", e.what());
  }
  for (Op op : needs)
    if (!cuda->supports(op, DType::f32)) {
      if (device == "auto") return make_cpu_backend();
      fail("device cuda: the cuda backend does not run the ", op_name(op),
           " ops yet (the transformer's); use the cpu");
    }
  return cuda;
}

}  // namespace seqforge
