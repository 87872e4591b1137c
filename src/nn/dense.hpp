#pragma once
// Dense helpers the models share, on the backend's ops.
#include <cmath>
#include <string>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::nn {

// C(m, n) (+)= alpha op(A) op(B), all packed row-major (bf16 operands: C in f32).
inline void gemm(Backend& be, DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                 double alpha, double beta, Tensor a, Tensor b, Tensor c) {
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

// W0 + s B A (out, in) in double, from host copies of W0 (out, in), A (rank, in), B (out, rank):
// a LoRA-adapted weight, or DoRA's V.
inline std::vector<double> adapted_weight(std::vector<double> w, const std::vector<double>& a,
                                          const std::vector<double>& b, int64_t out, int64_t in,
                                          int64_t rank, double s) {
  for (int64_t r = 0; r < out; ++r)
    for (int64_t k = 0; k < rank; ++k) {
      const double brk = s * b[r * rank + k];
      for (int64_t c = 0; c < in; ++c) w[r * in + c] += brk * a[k * in + c];
    }
  return w;
}

// The norm of each row of w (out, in).
inline std::vector<double> row_norms(const std::vector<double>& w, int64_t out, int64_t in) {
  std::vector<double> norms(static_cast<size_t>(out));
  for (int64_t r = 0; r < out; ++r) {
    double sq = 0;
    for (int64_t c = 0; c < in; ++c) sq += w[r * in + c] * w[r * in + c];
    norms[r] = std::sqrt(sq);
  }
  return norms;
}

// DoRA's magnitudes of the adapted weight v (out, in) of `weight`: its row norms. DoRA divides
// each row by its norm, so a row of zeros (a pruned model's) would make every loss NaN: refused.
inline std::vector<double> dora_magnitudes(const std::vector<double>& v, int64_t out, int64_t in,
                                           const std::string& weight) {
  std::vector<double> norms = row_norms(v, out, in);
  for (int64_t r = 0; r < out; ++r)
    if (norms[size_t(r)] == 0)
      fail("adapter.kind dora on ", weight, ": its row ", r,
           " is all zeros (norm 0), and DoRA divides each row by its norm; leave this Linear out "
           "of adapter.targets, or use adapter.kind lora");
  return norms;
}

// DoRA's start: m (out) = ||W0 + s B A|| per row, from W0 (out, in) named `weight`, A (rank, in),
// B (out, rank).
inline void init_dora_magnitude(Backend& be, Tensor m, Tensor w0, Tensor a, Tensor b, double s,
                                const std::string& weight) {
  const int64_t out = w0.dim(0), in = w0.dim(1), rank = a.dim(0);
  const std::vector<double> v = adapted_weight(download_doubles(be, w0), download_doubles(be, a),
                                               download_doubles(be, b), out, in, rank, s);
  upload_doubles(be, m, dora_magnitudes(v, out, in, weight));
}

}  // namespace seqforge::nn
