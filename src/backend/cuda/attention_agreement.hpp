#pragma once
// Attention's kernels on a GPU checked against the scalar reference (kernels/attention.hpp) on
// one slice of a call: the key/value group of the last key/value head in the second batch row (or
// the first, where there is one), in double on the host. The backend checks the first call of
// each kind, so that a defect only a real GPU shows in those kernels (a race, a tile misplaced at
// a size the emulation does not reach) stops the run, or drops the tensor cores, instead of
// training a silently wrong model.
#include <cuda_runtime_api.h>

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

}  // namespace seqforge::cuda
