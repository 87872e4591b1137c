// A build without the CUDA backend (SEQFORGE_CUDA=OFF, or no nvcc): the cuda entry of the
// registry says so.
#include "seqforge/backend/backend.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

std::string cuda_unavailable_reason() {
  return "this seqforge was built without the CUDA backend (SEQFORGE_CUDA=OFF, or no nvcc)";
}
std::unique_ptr<Backend> make_cuda_backend() { fail(cuda_unavailable_reason()); }
std::string cuda_summary() { return cuda_unavailable_reason(); }
bool cuda_free_memory(size_t*, size_t*) { return false; }

}  // namespace seqforge
