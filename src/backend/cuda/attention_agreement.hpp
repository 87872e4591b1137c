#pragma once
// Attention's kernels on a GPU checked against the scalar reference (kernels/attention.hpp) on
// one slice of a call: the key/value group of the last key/value head in the second batch row (or
// the first, where there is one), in double on the host. The backend checks the first call of
// each kind, so that a defect only a real GPU shows in those kernels (a race, a tile misplaced at
// a size the emulation does not reach) stops the run, or drops the tensor cores, instead of
// training a silently wrong model.
#include <cuda_runtime_api.h>

#include <set>
#include <string>

#include "kernels/cuda/launch.hpp"
#include "seqforge/backend/ops.hpp"

namespace seqforge::cuda {

struct AttentionAgreement {
  bool compared = false;  // false where the slice's inputs are not all finite: nothing to check
  double error = 0;       // the largest relative error of a tensor, against the reference
  double bound = 0;       // what rounding explains for that tensor
  std::string tensor;     // "out", "lse", "dq", "dk" or "dv": the one furthest past its bound
  bool agrees() const { return !compared || error <= bound; }
};

// After the kernels of `a` ran on `stream`: their results on the slice against the reference's.
// Waits for the stream. Forward compares out and lse from a.first_row on (the last rows of a long
// sequence only, as many as a fixed amount of work allows); backward, dq of the group's query
// heads and dk and dv of its key/value head.
AttentionAgreement check_attention_forward(const AttentionForward& a, DType dtype,
                                           AttentionKernels kernels, cudaStream_t stream);
AttentionAgreement check_attention_backward(const AttentionBackward& a, DType dtype,
                                            AttentionKernels kernels, cudaStream_t stream);

// A backend's policy: which kernels its calls take, and which kinds of call (pass, kernels,
// dtype, head size, group, masks, dropout, products, decoding) have been checked.
class AttentionChecks {
 public:
  // The tensor cores where asked for (attention_kernels), until one of their calls disagreed.
  AttentionKernels kernels(const AttentionShape& s, DType dtype) const;
  // The kind of a call still to be checked, or "" where its kind has been.
  std::string unchecked(const char* pass, AttentionKernels kernels, const AttentionShape& s,
                        DType dtype, int64_t first_row) const;
  // Records a check of a call of `kind`. Tensor cores that disagree are dropped for the tiles,
  // with a warning, and false returned: the caller runs the call again. Tiles that disagree stop
  // the run, as nothing is left to fall back on. Inputs that were not finite leave the kind to a
  // later call.
  bool agrees(const std::string& kind, AttentionKernels kernels, const AttentionAgreement& r);

 private:
  std::set<std::string> checked_;
  bool tensor_cores_dropped_ = false;
};

}  // namespace seqforge::cuda
