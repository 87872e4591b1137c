// The CUDA backend's GEMM mapping, checked on the host: the row-major GEMM of GemmShape, handed to
// cuBLASLt as its column-major problem (column_major), computed here as cuBLASLt defines it,
// equals the reference's row-major GEMM for every transpose, leading dimension and scaling.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/cublaslt.hpp"
#include "kernels/reference.hpp"
#include "seqforge/core/rng.hpp"

namespace seqforge {
namespace {

// cuBLASLt's D = alpha op(first) op(second) + beta C, column-major, over stored matrices of the
// given (rows, cols) and leading dimensions.
void column_major_gemm(const cuda::ColumnMajorGemm& g, double alpha, double beta,
                       const double* first, const double* second, double* c) {
  auto at = [](const double* x, cublasOperation_t op, int64_t ld, uint64_t i, uint64_t l) {
    return op == CUBLAS_OP_N ? x[i + l * ld] : x[l + i * ld];
  };
  for (uint64_t j = 0; j < g.n; ++j)
    for (uint64_t i = 0; i < g.m; ++i) {
      double acc = 0;
      for (uint64_t l = 0; l < g.k; ++l)
        acc += at(first, g.trans_first, g.ld_first, i, l) *
               at(second, g.trans_second, g.ld_second, l, j);
      double& d = c[i + j * g.ld_c];
      d = alpha * acc + beta * d;
    }
}

TEST(CudaGemmMapping, ColumnMajorProblemEqualsTheRowMajorGemm) {
  Rng rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    GemmShape s;
    s.trans_a = rng.next() % 2;
    s.trans_b = rng.next() % 2;
    s.m = 1 + rng.next() % 9, s.n = 1 + rng.next() % 9, s.k = 1 + rng.next() % 9;
    s.lda = (s.trans_a ? s.m : s.k) + rng.next() % 3;
    s.ldb = (s.trans_b ? s.k : s.n) + rng.next() % 3;
    s.ldc = s.n + rng.next() % 3;
    s.alpha = trial % 3 ? 1.0 : 0.5;
    s.beta = trial % 4 ? 0.0 : 1.5;
    const cuda::ColumnMajorGemm g = cuda::column_major(s);
    // cuBLASLt's own rules: each stored matrix's leading dimension covers its rows, and the
    // operands' shapes agree with (m, n, k).
    ASSERT_GE(g.ld_first, int64_t(g.first_rows));
    ASSERT_GE(g.ld_second, int64_t(g.second_rows));
    ASSERT_GE(g.ld_c, int64_t(g.m));
    ASSERT_EQ(g.trans_first == CUBLAS_OP_N ? g.first_rows : g.first_cols, g.m);
    ASSERT_EQ(g.trans_second == CUBLAS_OP_N ? g.second_cols : g.second_rows, g.n);
    auto random = [&](int64_t n) {
      std::vector<double> v(static_cast<size_t>(n));
      for (double& x : v) x = rng.uniform(-1, 1);
      return v;
    };
    const auto a = random((s.trans_a ? s.k : s.m) * s.lda);
    const auto b = random((s.trans_b ? s.n : s.k) * s.ldb);
    const auto c0 = random(s.m * s.ldc);
    std::vector<double> want = c0, got = c0;
    ref::gemm<double, double>(s, a.data(), b.data(), want.data(), nullptr, 0, s.m);
    column_major_gemm(g, s.alpha, s.beta, b.data(), a.data(), got.data());
    for (int64_t r = 0; r < s.m; ++r)
      for (int64_t j = 0; j < s.n; ++j)
        ASSERT_NEAR(got[r * s.ldc + j], want[r * s.ldc + j], 1e-12)
            << "m " << s.m << " n " << s.n << " k " << s.k << " trans " << s.trans_a << s.trans_b;
  }
}

}  // namespace
}  // namespace seqforge
