#pragma once
// f32 GEMM through oneDNN matmul primitives, created once per shape and cached.
#include <map>
#include <memory>
#include <tuple>

#include "seqforge/backend/backend.hpp"

namespace seqforge::cpu {

class OneDnnGemm {
 public:
  OneDnnGemm();
  ~OneDnnGemm();
  void run(const GemmShape& s, const float* a, const float* b, float* c);
  size_t cached_primitives() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace seqforge::cpu
