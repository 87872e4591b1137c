#pragma once
// GEMMs through oneDNN matmul primitives (f32, or bf16 operands with f32 output), created once
// per shape and cached.
#include <map>
#include <memory>
#include <tuple>

#include "seqforge/backend/backend.hpp"

namespace seqforge::cpu {

class OneDnnGemm {
 public:
  OneDnnGemm();
  ~OneDnnGemm();
  void run(const GemmShape& s, DType operands, const void* a, const void* b, float* c,
           const float* bias);
  // B in the layout the primitive for `s` prefers ("any"), reordered once.
  void pack(const GemmShape& s, DType operands, const void* b, std::unique_ptr<PackedB>* packed);
  // With `packed` when the primitive planned here wants its layout, else with plain `b`.
  void run_packed(const GemmShape& s, DType operands, const void* a, const void* b,
                  const PackedB& packed, float* c, const float* bias);

 private:
  void pack_planned(const GemmShape& s, DType operands, const void* b,
                    std::unique_ptr<PackedB>* packed);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace seqforge::cpu
