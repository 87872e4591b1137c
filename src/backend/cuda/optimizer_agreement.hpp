#pragma once
// The optimizer's one-pass update on a GPU (OptimizerStep) checked against the reference
// backend's on samples of every segment (the first and last elements of each), the first time
// it runs: a defect only a real GPU shows in that kernel (a segment's flags, step count or
// learning rate misread, elements skipped) stops the run instead of training a wrong model.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "seqforge/backend/ops.hpp"

namespace seqforge::cuda {

class OptimizerSample {
 public:
  // Before the update of `a` is enqueued on `stream`: the samples' parameters, gradients and
  // state, the segments' update counts, the learning rate and the gradients' sum of squares.
  // Waits for the stream.
  OptimizerSample(const OptimizerStep& a, DType dtype, cudaStream_t stream);
  // After it: what differs from the reference's update of the samples beyond rounding ("" where
  // nothing does), e.g. "segment 2's parameters: element 5 of 300 is 0.52, the reference's
  // 0.51". Waits for the stream.
  std::string disagreement() const;
  int64_t samples() const { return samples_; }

 private:
  struct Range {  // elements [offset, offset + n) of segment `segment`, at `at` in the samples
    int64_t segment, value_offset, grad_offset, n, at;
  };
  // The samples of an arena (params when `values`, else grads or a state), as bytes.
  std::vector<unsigned char> read(const void* base, bool values) const;

  OptimizerStep a_;
  DType dtype_;
  cudaStream_t stream_;
  std::vector<OptimizerSegment> segments_;
  std::vector<Range> ranges_;
  int64_t samples_ = 0;
  std::vector<unsigned char> p_, g_, m_, v_;  // before the update
  std::vector<int64_t> steps_;
  double lr_ = 0, sum_squares_ = 0;
};

}  // namespace seqforge::cuda
