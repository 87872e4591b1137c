#pragma once
// Dense helpers the models share, on the backend's ops.
#include "seqforge/backend/backend.hpp"

namespace seqforge::nn {

// C(m, n) (+)= alpha op(A) op(B), all packed row-major (bf16 operands: C in f32).
inline void gemm(Backend& be, DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                 float alpha, float beta, Tensor a, Tensor b, Tensor c) {
  const GemmShape s{.trans_a = ta,
                    .trans_b = tb,
                    .m = m,
                    .n = n,
                    .k = k,
                    .lda = ta ? m : k,
                    .ldb = tb ? k : n,
                    .ldc = n,
                    .alpha = alpha,
                    .beta = beta};
  be.gemm(s, dt, a.data(), b.data(), c.data());
}

}  // namespace seqforge::nn
