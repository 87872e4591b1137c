// The launchers (launch.hpp) of the memory, elementwise, dropout, embedding, adapter, loss and
// optimizer kernels, instantiated for the dtypes the backend runs.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/adapter.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/loss.cuh"
#include "kernels/cuda/optimizer.cuh"

namespace seqforge::cuda {

void fill(void* p, DType dtype, int64_t n, double value, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_storage(dtype, [&]<typename T>() {
    // The value rounded as the host rounds it, then stored as bits.
    T v;
    if constexpr (std::is_same_v<T, bf16>) {
      v = to_bf16(static_cast<float>(value));
    } else if constexpr (std::is_same_v<T, __half>) {
      v = __float2half_rn(static_cast<float>(value));
    } else {
      v = static_cast<T>(value);
    }
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, fill_kernel<T>)(static_cast<T*>(p), n, v);
  });
}

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
             cudaStream_t stream) {
  if (n == 0) return;
  if (src_type == DType::f32 && dst_type == DType::bf16) {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, f32_to_bf16_kernel)
    (static_cast<bf16*>(dst), static_cast<const float*>(src), n);
    return;
  }
  dispatch_storage(dst_type, [&]<typename D>() {
    dispatch_storage(src_type, [&]<typename S>() {
      SF_LAUNCH(blocks_for(n), kThreads, 0, stream, convert_kernel<D, S>)
      (static_cast<D*>(dst), static_cast<const S*>(src), n);
    });
  });
}

void add(void* y, const void* x, DType dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, add_kernel<T>)
    (static_cast<T*>(y), static_cast<const T*>(x), n);
  });
}

void mul(void* y, const void* a, const void* b, DType dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, mul_kernel<T>)
    (static_cast<T*>(y), static_cast<const T*>(a), static_cast<const T*>(b), n);
  });
}

void scale(void* x, DType dtype, int64_t n, double alpha, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, scale_kernel<T>)
    (static_cast<T*>(x), n, static_cast<T>(alpha));
  });
}

void sum_rows_acc(void* db, const void* dy, DType dtype, int64_t rows, int64_t cols,
                  cudaStream_t stream) {
  if (cols == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(cols), kThreads, 0, stream, sum_rows_acc_kernel<T>)
    (static_cast<T*>(db), static_cast<const T*>(dy), rows, cols);
  });
}

void sum_rows_acc_banded(void* db, const void* dy, DType dtype, int64_t rows, int64_t cols,
                         double* partial, void* low, DType low_type, cudaStream_t stream) {
  if (cols == 0) return;
  SF_CHECK(!low || (dtype == DType::f32 && (low_type == DType::bf16 || low_type == DType::f16)),
           "sum_rows_acc_banded: a copy of ", dtype_name(dtype), " in ", dtype_name(low_type));
  const int64_t chunks = layer_norm_partial_chunks(rows);
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(band_blocks(chunks, cols), kThreads, 0, stream, sum_rows_partial_kernel<T>)
    (partial, static_cast<const T*>(dy), low, low_type, rows, cols, chunks);
    SF_LAUNCH(blocks_for(cols), kThreads, 0, stream, column_sums_final_kernel<T>)
    (static_cast<T*>(db), partial, cols, chunks, true);
  });
}

void add_bias_rows(void* c, int64_t ldc, const void* bias, DType dtype, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  if (rows * cols == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(rows * cols), kThreads, 0, stream, add_bias_rows_kernel<T>)
    (static_cast<T*>(c), ldc, static_cast<const T*>(bias), rows, cols);
  });
}

void gemm_fallback(const GemmShape& s, DType dtype, const void* a, const void* b, void* c,
                   const void* bias, cudaStream_t stream) {
  if (s.m * s.n == 0) return;
  if (dtype == DType::f64) {
    SF_LAUNCH(blocks_for(s.m * s.n), kThreads, 0, stream, gemm_fallback_kernel<double>)
    (static_cast<double*>(c), a, b, dtype, s, static_cast<const double*>(bias));
  } else {
    SF_LAUNCH(blocks_for(s.m * s.n), kThreads, 0, stream, gemm_fallback_kernel<float>)
    (static_cast<float*>(c), a, b, dtype, s, static_cast<const float*>(bias));
  }
}

void gemm_without_k(void* c, int64_t ldc, int64_t rows, int64_t cols, double beta, const void* bias,
                    DType dtype, cudaStream_t stream) {
  if (rows * cols == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(rows * cols), kThreads, 0, stream, gemm_without_k_kernel<T>)
    (static_cast<T*>(c), ldc, rows, cols, static_cast<T>(beta), static_cast<const T*>(bias));
  });
}

void sum_squares(double* out, const void* x, DType dtype, int64_t n, double* partials,
                 cudaStream_t stream) {
  if (n == 0) {
    cudaMemsetAsync(out, 0, sizeof(double), stream);
    return;
  }
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(partial_blocks(n), kThreads, 0, stream, sum_squares_kernel<T>)
    (partials, static_cast<const T*>(x), n);
  });
  SF_LAUNCH(1, kThreads, 0, stream, sum_partials_kernel<double>)(out, partials, false);
}

void transpose01(void* dst, const void* src, int64_t d0, int64_t d1, int64_t f,
                 size_t element_bytes, cudaStream_t stream) {
  const int64_t n = d0 * d1 * f;
  if (n == 0) return;
  dispatch_bytes(element_bytes, [&]<typename E>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, transpose01_kernel<E>)
    (static_cast<E*>(dst), static_cast<const E*>(src), d0, d1, f);
  });
}

void copy_transposed(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                     int64_t cols, size_t element_bytes, cudaStream_t stream) {
  if (rows * cols == 0) return;
  dispatch_bytes(element_bytes, [&]<typename E>() {
    SF_LAUNCH(blocks_for(rows * cols), kThreads, 0, stream, copy_transposed_kernel<E>)
    (static_cast<E*>(dst), ld_dst, static_cast<const E*>(src), ld_src, rows, cols);
  });
}

void dropout_mask(void* mask, DType dtype, int64_t n, uint64_t below, double keep, uint64_t seed,
                  const uint64_t* seed_base, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, dropout_mask_kernel<T>)
    (static_cast<T*>(mask), n, below, static_cast<T>(keep), seed, seed_base);
  });
}

namespace {

template <typename Fn>
void dispatch_ids(DType id_type, Fn&& fn) {
  if (id_type == DType::i32) return fn.template operator()<int32_t>();
  if (id_type == DType::i64) return fn.template operator()<int64_t>();
  fail("cuda: ids must be i32 or i64, got ", dtype_name(id_type));
}

}  // namespace

void embedding_forward(void* out, const void* table, const void* ids, DType id_type, DType dtype,
                       int64_t n, int64_t e, int64_t vocab, uint64_t* bad, cudaStream_t stream) {
  if (n * e == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    dispatch_ids(id_type, [&]<typename I>() {
      SF_LAUNCH(blocks_for(n * e), kThreads, 0, stream, embedding_forward_kernel<T, I>)
      (static_cast<T*>(out), static_cast<const T*>(table), static_cast<const I*>(ids), n, e, vocab,
       reinterpret_cast<unsigned long long*>(bad));
      SF_LAUNCH(1, 1, 0, stream, resolve_bad_kernel<I>)
      (reinterpret_cast<unsigned long long*>(bad), static_cast<const I*>(ids), vocab, kBadTokenId);
    });
  });
}

int64_t embedding_sort_keys(int64_t n) {
  int64_t n2 = 1;
  while (n2 < n) n2 *= 2;
  return n2;
}

void embedding_backward(void* dtable, const void* dout, const void* ids, DType id_type, DType dtype,
                        int64_t n, int64_t e, int64_t vocab, uint64_t* keys, cudaStream_t stream) {
  if (n * e == 0) return;
  SF_CHECK(n <= (int64_t{1} << 32) && vocab < (int64_t{1} << 32) - 1,
           "cuda: embedding_backward of ", n, " ids into ", vocab, " rows");
  const int64_t n2 = embedding_sort_keys(n);
  auto* k = reinterpret_cast<unsigned long long*>(keys);
  dispatch_ids(id_type, [&]<typename I>() {
    SF_LAUNCH(blocks_for(n2), kThreads, 0, stream, embedding_keys_kernel<I>)
    (k, static_cast<const I*>(ids), n, n2, vocab);
  });
  const int64_t len = std::min(n2, kSortChunk);
  const unsigned chunks = static_cast<unsigned>(std::min<int64_t>(n2 / len, 65535));
  SF_LAUNCH(chunks, kThreads, 0, stream, bitonic_chunk_kernel)(k, n2, 2, len);
  for (int64_t merge = 2 * len; merge <= n2; merge *= 2) {
    for (int64_t j = merge / 2; j >= len; j /= 2)
      SF_LAUNCH(blocks_for(n2 / 2), kThreads, 0, stream, bitonic_stage_kernel)(k, n2, merge, j);
    SF_LAUNCH(chunks, kThreads, 0, stream, bitonic_chunk_kernel)(k, n2, merge, merge);
  }
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n * e), kThreads, 0, stream, embedding_backward_kernel<T>)
    (static_cast<T*>(dtable), static_cast<const T*>(dout), k, n, e);
  });
}

void scale_columns(void* y, int64_t ldy, const void* addend, const void* x, const void* s,
                   const void* b, DType dtype, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(rows * cols), kThreads, 0, stream, scale_columns_kernel<T>)
    (static_cast<T*>(y), ldy, static_cast<const T*>(addend), static_cast<const T*>(x),
     static_cast<const T*>(s), static_cast<const T*>(b), rows, cols);
  });
}

void dora_norm(void* scale, void* inv_norm, const void* v, const void* m, DType dtype, int64_t rows,
               int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(rows), kThreads, 0, stream, dora_norm_kernel<T>)
    (static_cast<T*>(scale), static_cast<T*>(inv_norm), static_cast<const T*>(v),
     static_cast<const T*>(m), rows, cols);
  });
}

void dora_backward(void* dpre, void* dm, const void* dy, int64_t ldy, const void* pre,
                   const void* scale, const void* inv_norm, double* partial, DType dtype,
                   int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols == 0 || rows == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    const int64_t chunks = layer_norm_partial_chunks(rows);
    SF_LAUNCH(band_blocks(chunks, cols), kThreads, 0, stream, dora_backward_partial_kernel<T>)
    (partial, static_cast<T*>(dpre), static_cast<const T*>(dy), ldy, static_cast<const T*>(pre),
     static_cast<const T*>(scale), rows, cols, chunks);
    SF_LAUNCH(blocks_for(cols), kThreads, 0, stream, dora_backward_final_kernel<T>)
    (static_cast<T*>(dm), partial, static_cast<const T*>(inv_norm), cols, chunks);
  });
}

void regression_loss(const RegressionLoss& kind, const void* pred, const void* target,
                     const void* mask, void* dpred, DType dtype, int64_t rows, int64_t f,
                     double* sums, double* partials, cudaStream_t stream) {
  cudaMemsetAsync(sums, 0, 2 * sizeof(double), stream);
  dispatch_float(dtype, [&]<typename T>() {
    const T* m = static_cast<const T*>(mask);
    // Counts of rows: whole numbers, exact in any order.
    SF_LAUNCH(blocks_for(rows), kThreads, 0, stream, count_selected_kernel<T>)(m, rows, sums);
    if (rows * f == 0) return;
    SF_LAUNCH(partial_blocks(rows * f), kThreads, 0, stream, regression_kernel<T>)
    (kind, static_cast<const T*>(pred), static_cast<const T*>(target), m, static_cast<T*>(dpred),
     rows, f, sums, partials);
    SF_LAUNCH(1, kThreads, 0, stream, sum_partials_kernel<double>)(sums, partials, false);
  });
}

void cross_entropy_loss(const void* logits, const void* targets, DType target_type,
                        const void* weights, int64_t ignore_index, void* dlogits, DType dtype,
                        int64_t rows, int64_t classes, double* sums, double* partials,
                        uint64_t* bad_row, cudaStream_t stream) {
  cudaMemsetAsync(sums, 0, 2 * sizeof(double), stream);
  if (rows == 0) return;
  auto* bad = reinterpret_cast<unsigned long long*>(bad_row);
  dispatch_float(dtype, [&]<typename T>() {
    auto run = [&]<typename I>() {
      const T* w = static_cast<const T*>(weights);
      SF_LAUNCH(partial_blocks(rows), kThreads, 0, stream, class_weight_kernel<T, I>)
      (targets, w, ignore_index, rows, classes, partials, bad);
      SF_LAUNCH(1, 1, 0, stream, resolve_bad_kernel<I>)
      (bad, static_cast<const I*>(targets), classes, kBadTargetClass);
      SF_LAUNCH(1, kThreads, 0, stream, sum_partials_kernel<double>)(sums + 1, partials, false);
      const unsigned grid = static_cast<unsigned>(rows < kPartialBlocks ? rows : kPartialBlocks);
      SF_LAUNCH(grid, kThreads, 0, stream, cross_entropy_kernel<T, I>)
      (static_cast<const T*>(logits), targets, w, ignore_index, static_cast<T*>(dlogits), rows,
       classes, sums, partials);
      SF_LAUNCH(1, kThreads, 0, stream, sum_partials_kernel<double>)(sums, partials, false);
    };
    if (target_type == DType::i32) return run.template operator()<int32_t>();
    if (target_type == DType::i64) return run.template operator()<int64_t>();
    fail("cuda: cross-entropy targets must be i32 or i64, got ", dtype_name(target_type));
  });
}

void mean(double* out, const double* sums, double per_term, cudaStream_t stream) {
  SF_LAUNCH(1, 1, 0, stream, mean_kernel)(out, sums, per_term);
}

void adam_step(void* params, void* grads, void* m, void* v, DType dtype, int64_t n,
               const AdamParams& a, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    const double bc1 = 1.0 - std::pow(a.beta1, double(a.step));
    const AdamScalars<T> s{T(a.lr / bc1),
                           T(1.0 - a.lr * a.weight_decay),
                           T(a.beta1),
                           T(a.beta2),
                           T(a.eps),
                           T(a.weight_decay),
                           T(1.0 - a.beta1),
                           T(1.0 - a.beta2),
                           T(std::sqrt(1.0 - std::pow(a.beta2, double(a.step)))),
                           a.grad_scale,
                           a.clip,
                           a.decoupled,
                           a.zero_grads};
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, adam_kernel<T>)
    (static_cast<T*>(params), static_cast<T*>(grads), static_cast<T*>(m), static_cast<T*>(v), n, s);
  });
}

void sgd_step(void* params, const void* grads, void* momentum, DType dtype, int64_t n,
              const SgdParams& a, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    const SgdScalars<T> s{
        T(a.momentum), T(1.0 - a.dampening),  T(a.weight_decay), T(a.lr),      a.grad_scale,
        a.clip,        a.weight_decay != 0.0, a.momentum != 0.0, a.first_step, a.nesterov};
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, sgd_kernel<T>)
    (static_cast<T*>(params), static_cast<const T*>(grads), static_cast<T*>(momentum), n, s);
  });
}

void optimizer_step(const OptimizerStep& a, DType dtype, cudaStream_t stream) {
  if (a.segment_count == 0 || a.grad_elements == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    const int64_t tiles = (a.grad_elements + kOptimizerTile - 1) / kOptimizerTile;
    SF_LAUNCH(static_cast<unsigned>(std::min<int64_t>(tiles, 65535)), kThreads, 0, stream,
              optimizer_kernel<T>)
    (a);
  });
  SF_LAUNCH(1, kThreads, 0, stream, count_updates_kernel)(a);
}

}  // namespace seqforge::cuda
