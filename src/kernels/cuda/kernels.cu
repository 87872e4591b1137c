// The CUDA kernels' launchers (launch.hpp): every kernel family's header, instantiated for the
// dtypes the backend runs.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "kernels/cuda/adapter.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/cells.cuh"
#include "kernels/cuda/decoder.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/lnlstm.cuh"
#include "kernels/cuda/loss.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/optimizer.cuh"
#include "kernels/cuda/recurrence.cuh"

namespace seqforge::cuda {

namespace {

// Calls fn.template operator()<E>() with an element type of `bytes` bytes (a plain copy).
template <typename Fn>
void dispatch_bytes(size_t bytes, Fn&& fn) {
  switch (bytes) {
    case 2:
      return fn.template operator()<uint16_t>();
    case 4:
      return fn.template operator()<uint32_t>();
    case 8:
      return fn.template operator()<uint64_t>();
    default:
      fail("cuda: no copy kernel for ", bytes, "-byte elements");
  }
}

// Calls fn.template operator()<Y>() with Y the storage of an output computed in T: T itself, or
// bf16 or f16 from f32 (a half GEMM's operand, written directly).
template <typename T, typename Fn>
void dispatch_output(DType y_type, const char* op, Fn&& fn) {
  if (y_type == dtype_of<T>()) return fn.template operator()<T>();
  if (std::is_same_v<T, float> && y_type == DType::bf16) return fn.template operator()<bf16>();
  if (std::is_same_v<T, float> && y_type == DType::f16) return fn.template operator()<__half>();
  fail("cuda: ", op, " into ", dtype_name(y_type), " from ", dtype_name(dtype_of<T>()));
}

// A kernel whose shared memory (its static arrays and `bytes` more) passes the default 48 KB
// asks for it; past what the GPU offers a block, the launch would fail: one line instead.
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* what,
                  const char* narrower = "model.hidden") {
  cudaFuncAttributes attributes{};
  cudaFuncGetAttributes(&attributes, kernel);
  if (attributes.sharedSizeBytes + bytes <= (size_t{48} << 10)) return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess) {
    cudaGetLastError();
    fail("cuda: ", what, " needs ", (attributes.sharedSizeBytes + bytes) >> 10,
         " KB of shared memory per block, more than this GPU offers; use a narrower ", narrower,
         " or train.device: cpu");
  }
}

}  // namespace

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

void cell_forward(CellKind cell, const CellForward& p, DType dtype, cudaStream_t stream) {
  const int64_t n = p.batch * p.hidden;
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    if (cell == CellKind::lstm)
      return SF_LAUNCH(blocks_for(n), kThreads, 0, stream, lstm_forward_kernel<T>)(p);
    if (cell == CellKind::gru)
      return SF_LAUNCH(blocks_for(n), kThreads, 0, stream, gru_forward_kernel<T>)(p);
    const unsigned rows = static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535);
    const size_t shared = 4 * p.hidden * sizeof(T);
    allow_shared(lnlstm_forward_kernel<T>, shared, "the LN-LSTM cell's forward step");
    SF_LAUNCH(rows, kThreads, shared, stream, lnlstm_forward_kernel<T>)(p);
  });
}

void cell_backward(CellKind cell, const CellBackward& p, void* dbias_rows, DType dtype,
                   cudaStream_t stream) {
  const int64_t n = p.batch * p.hidden;
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    if (cell == CellKind::lstm)
      return SF_LAUNCH(blocks_for(n), kThreads, 0, stream, lstm_backward_kernel<T>)(p);
    if (cell == CellKind::gru)
      return SF_LAUNCH(blocks_for(n), kThreads, 0, stream, gru_backward_kernel<T>)(p);
    const unsigned rows = static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535);
    const size_t shared = 5 * p.hidden * sizeof(T);
    allow_shared(lnlstm_backward_kernel<T>, shared, "the LN-LSTM cell's backward step");
    SF_LAUNCH(rows, kThreads, shared, stream, lnlstm_backward_kernel<T>)
    (p, static_cast<T*>(dbias_rows));
  });
}

namespace {

// A whole-chain launch's plan and blocks: the largest chunk of K (all of it, or a multiple of 8)
// whose staging fits the GPU's shared memory per block, with W_hh's slice resident when it fits
// too and every tile can have a block of its own; no more blocks than the GPU holds at once (the
// blocks wait for each other). `elements(plan)` is the shared memory a plan needs.
template <typename T, typename Kernel, typename Elements>
std::pair<RecurrencePlan, unsigned> plan_recurrence(Kernel kernel, int64_t k_total, int64_t tiles,
                                                    Elements elements, const char* what) {
  int device = 0, sms = 0, cooperative = 0, optin = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (!cooperative) fail("cuda: ", what, ": this GPU has no cooperative launches");
  for (const bool resident : {true, false}) {
    RecurrencePlan plan{static_cast<int>(k_total), resident};
    auto bytes = [&] { return static_cast<size_t>(elements(plan)) * sizeof(T); };
    while (bytes() > static_cast<size_t>(optin) && plan.chunk > 8)
      plan.chunk = std::max(8, (plan.chunk / 2 + 7) / 8 * 8);
    if (bytes() > static_cast<size_t>(optin)) continue;
    allow_shared(kernel, bytes(), what);
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kRecurrenceThreads, bytes());
    const int64_t capacity = int64_t{per_sm} * sms;
    if (per_sm < 1 || (resident && tiles > capacity)) continue;
    return {plan, static_cast<unsigned>(std::min(tiles, capacity))};
  }
  fail("cuda: ", what,
       " needs more shared memory than this GPU offers a block; use a narrower "
       "model.hidden or train.device: cpu");
}

}  // namespace

int64_t recurrence_bias_rows(int64_t batch) { return tile_groups(batch, kTileRows); }

namespace {

static_assert(kMaxChains == recurrence_chains_together);

// The launches' groups of chains, `together` (at most kMaxChains) at a time, all of one batch,
// width and length.
template <typename Chain>
std::vector<Chains<Chain>> chain_groups(std::span<const Chain> chains, int together) {
  std::vector<Chains<Chain>> groups;
  for (const Chain& c : chains) {
    const Chain& first = chains.front();
    SF_CHECK(c.cell.batch == first.cell.batch && c.cell.hidden == first.cell.hidden &&
                 c.steps == first.steps && c.gemm == first.gemm,
             "cuda: chains run together need one batch, width, length and product dtype");
    if (groups.empty() || groups.back().count == together) groups.emplace_back();
    groups.back().chain[groups.back().count++] = c;
  }
  return groups;
}

// Launches `kernel` over the chains, `launch(group, plan, blocks)` for each group: together in
// one launch (up to kMaxChains) unless that would cost them their resident weights, which one
// chain alone keeps; then a launch a chain.
template <typename T, typename Chain, typename Kernel, typename Elements, typename Launch>
void launch_chains(std::span<const Chain> chains, Kernel kernel, int64_t k_total, Elements elements,
                   const char* what, Launch&& launch) {
  const int64_t per_chain =
      tile_groups(chains[0].cell.batch, kTileRows) * tile_groups(chains[0].cell.hidden, kTileUnits);
  const int together = static_cast<int>(std::min<int64_t>(chains.size(), kMaxChains));
  const auto joint = plan_recurrence<T>(kernel, k_total, together * per_chain, elements, what);
  if (together > 1 && !joint.first.resident) {
    const auto alone = plan_recurrence<T>(kernel, k_total, per_chain, elements, what);
    if (alone.first.resident) {
      for (const Chains<Chain>& group : chain_groups(chains, 1))
        launch(group, alone.first, alone.second);
      return;
    }
  }
  for (const Chains<Chain>& group : chain_groups(chains, together)) {
    const auto [plan, blocks] =
        group.count == together
            ? joint
            : plan_recurrence<T>(kernel, k_total, group.count * per_chain, elements, what);
    launch(group, plan, blocks);
  }
}

}  // namespace

void recurrence_forward(CellKind cell, std::span<const RecurrenceForward> chains, DType dtype,
                        cudaStream_t stream) {
  if (chains.empty()) return;
  const int64_t B = chains[0].cell.batch, H = chains[0].cell.hidden;
  if (chains[0].steps == 0 || B == 0 || H == 0) return;
  SF_CHECK(cell == CellKind::lstm || cell == CellKind::gru, "cuda: no whole-chain ",
           cell_type(cell).name);
  dispatch_float(dtype, [&]<typename T>() {
    auto run = [&]<int G>() {
      auto elements = [&](const RecurrencePlan& p) {
        return recurrence_forward_elements(G, H, p, sizeof(T));
      };
      launch_chains<T>(
          chains, recurrence_forward_kernel<T, G>, H, elements, "the recurrence's forward kernel",
          [&](const Chains<RecurrenceForward>& group, const RecurrencePlan& plan, unsigned blocks) {
            SF_LAUNCH_COOPERATIVE(blocks, kRecurrenceThreads, elements(plan) * sizeof(T), stream,
                                  recurrence_forward_kernel<T, G>)
            (group, plan);
          });
    };
    if (cell == CellKind::lstm)
      run.template operator()<4>();
    else
      run.template operator()<3>();
  });
}

void recurrence_backward(CellKind cell, std::span<const RecurrenceBackward> chains,
                         void* dgates_step, void* drec_step, void* bias_rows, DType dtype,
                         cudaStream_t stream) {
  if (chains.empty()) return;
  const int64_t B = chains[0].cell.batch, H = chains[0].cell.hidden;
  if (chains[0].steps == 0 || B == 0 || H == 0) return;
  SF_CHECK(cell == CellKind::lstm || cell == CellKind::gru, "cuda: no whole-chain ",
           cell_type(cell).name);
  const bool dbias = chains[0].cell.dbias != nullptr;
  for (const RecurrenceBackward& c : chains)
    SF_CHECK((c.cell.dbias != nullptr) == dbias,
             "cuda: chains run together either all sum their bias gradients or none does");
  dispatch_float(dtype, [&]<typename T>() {
    auto run = [&]<int G>() {
      const int64_t GH = G * H, columns = (G == 3 ? 2 : 1) * GH;
      const int64_t rows = recurrence_bias_rows(B) * columns;  // a chain's bias sums
      auto elements = [&](const RecurrencePlan& p) {
        return recurrence_backward_elements(G, H, p, sizeof(T));
      };
      launch_chains<T>(
          chains, recurrence_backward_kernel<T, G>, GH, elements,
          "the recurrence's backward kernel",
          [&](const Chains<RecurrenceBackward>& group, const RecurrencePlan& plan,
              unsigned blocks) {
            if (dbias) cudaMemsetAsync(bias_rows, 0, group.count * rows * sizeof(T), stream);
            SF_LAUNCH_COOPERATIVE(blocks, kRecurrenceThreads, elements(plan) * sizeof(T), stream,
                                  recurrence_backward_kernel<T, G>)
            (group, plan, static_cast<T*>(dgates_step), static_cast<T*>(drec_step),
             dbias ? static_cast<T*>(bias_rows) : nullptr);
            if (dbias)
              for (int c = 0; c < group.count; ++c)
                sum_rows_acc(group.chain[c].cell.dbias, static_cast<T*>(bias_rows) + c * rows,
                             dtype, recurrence_bias_rows(B), columns, stream);
          });
    };
    if (cell == CellKind::lstm)
      run.template operator()<4>();
    else
      run.template operator()<3>();
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
    });
  });
}

void embedding_backward(void* dtable, const void* dout, const void* ids, DType id_type, DType dtype,
                        int64_t n, int64_t e, int64_t vocab, cudaStream_t stream) {
  if (n * e == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    dispatch_ids(id_type, [&]<typename I>() {
      if (vocab * n <= (int64_t{1} << 27)) {
        SF_LAUNCH(blocks_for(vocab * e), kThreads, 0, stream, embedding_backward_kernel<T, I>)
        (static_cast<T*>(dtable), static_cast<const T*>(dout), static_cast<const I*>(ids), n, e,
         vocab);
      } else {
        SF_LAUNCH(blocks_for(n * e), kThreads, 0, stream, embedding_backward_atomic_kernel<T, I>)
        (static_cast<T*>(dtable), static_cast<const T*>(dout), static_cast<const I*>(ids), n, e,
         vocab);
      }
    });
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

void layer_norm_forward(void* y, DType y_type, void* saved, const void* x, const void* w,
                        const void* b, DType dtype, int64_t rows, int64_t C, double eps,
                        cudaStream_t stream) {
  if (rows == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    dispatch_output<T>(y_type, "layer_norm_forward", [&]<typename Y>() {
      SF_LAUNCH(blocks_for(rows * kThreads), kThreads, 0, stream, layer_norm_forward_kernel<T, Y>)
      (static_cast<Y*>(y), static_cast<T*>(saved), static_cast<const T*>(x),
       static_cast<const T*>(w), static_cast<const T*>(b), rows, C, eps);
    });
  });
}

int64_t layer_norm_partial_chunks(int64_t rows) {
  return std::clamp<int64_t>((rows + 63) / 64, 1, 256);
}

void layer_norm_backward(void* dx, void* dw, void* db, const void* residual, const void* dy,
                         const void* x, const void* w, const void* saved, double* partial,
                         DType dtype, int64_t rows, int64_t C, cudaStream_t stream) {
  if (rows == 0 || C == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(rows * kThreads), kThreads, 0, stream, layer_norm_backward_input_kernel<T>)
    (static_cast<T*>(dx), static_cast<const T*>(residual), static_cast<const T*>(dy),
     static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(saved), rows, C);
    const int64_t chunks = layer_norm_partial_chunks(rows);
    SF_LAUNCH(band_blocks(chunks, C), kThreads, 0, stream, layer_norm_params_partial_kernel<T>)
    (partial, static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(saved),
     rows, C, chunks);
    SF_LAUNCH(blocks_for(C), kThreads, 0, stream, layer_norm_params_final_kernel<T>)
    (static_cast<T*>(dw), static_cast<T*>(db), partial, C, chunks);
  });
}

void gelu_forward(void* y, DType y_type, const void* x, const void* scale, const void* bias,
                  DType dtype, int64_t n, int64_t C, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    dispatch_output<T>(y_type, "gelu_forward", [&]<typename Y>() {
      SF_LAUNCH(blocks_for(n), kThreads, 0, stream, gelu_forward_kernel<T, Y>)
      (static_cast<Y*>(y), static_cast<const T*>(x), static_cast<const T*>(scale),
       static_cast<const T*>(bias), n, C);
    });
  });
}

void gelu_backward(void* dx, void* dscale, const void* dy, const void* x, const void* scale,
                   const void* bias, double* partial, DType dtype, int64_t n, int64_t C,
                   cudaStream_t stream) {
  if (C == 0 || (n == 0 && !dscale)) return;
  dispatch_float(dtype, [&]<typename T>() {
    const T *s = static_cast<const T*>(scale), *b = static_cast<const T*>(bias);
    if (!dscale) {
      SF_LAUNCH(blocks_for(n), kThreads, 0, stream, gelu_backward_kernel<T>)
      (static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), s, b, n, C);
      return;
    }
    const int64_t rows = n / C, chunks = layer_norm_partial_chunks(rows);
    SF_LAUNCH(band_blocks(chunks, C), kThreads, 0, stream, gelu_backward_partial_kernel<T>)
    (partial, static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), s, b, rows,
     C, chunks);
    SF_LAUNCH(blocks_for(C), kThreads, 0, stream, column_sums_final_kernel<T>)
    (static_cast<T*>(dscale), partial, C, chunks, false);
  });
}

void rms_norm_forward(void* y, void* saved, const void* x, const void* w, double offset,
                      DType dtype, int64_t rows, int64_t C, double eps, cudaStream_t stream) {
  if (rows == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(rows * kThreads), kThreads, 0, stream, rms_norm_forward_kernel<T>)
    (static_cast<T*>(y), static_cast<T*>(saved), static_cast<const T*>(x), static_cast<const T*>(w),
     offset, rows, C, eps);
  });
}

void rms_norm_backward(void* dx, void* dw, const void* residual, const void* dy, const void* x,
                       const void* w, double offset, const void* saved, double* partial,
                       DType dtype, int64_t rows, int64_t C, cudaStream_t stream) {
  if (rows == 0 || C == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(rows * kThreads), kThreads, 0, stream, rms_norm_backward_input_kernel<T>)
    (static_cast<T*>(dx), static_cast<const T*>(residual), static_cast<const T*>(dy),
     static_cast<const T*>(x), static_cast<const T*>(w), offset, static_cast<const T*>(saved), rows,
     C);
    const int64_t chunks = layer_norm_partial_chunks(rows);
    SF_LAUNCH(band_blocks(chunks, C), kThreads, 0, stream, rms_norm_params_partial_kernel<T>)
    (partial, static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(saved),
     rows, C, chunks);
    SF_LAUNCH(blocks_for(C), kThreads, 0, stream, rms_norm_params_final_kernel<T>)
    (static_cast<T*>(dw), partial, C, chunks);
  });
}

void rotary(const Rotary& a, DType dtype, cudaStream_t stream) {
  const int64_t n = a.rows * a.heads * (a.head_dim / 2);
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, rotary_kernel<T>)(a);
  });
}

template <typename T>
GluMaps<T> glu_maps(const GluColumns& c) {
  const auto at = [](const void* p) { return static_cast<const T*>(p); };
  return {at(c.gate_scale), at(c.gate_bias), at(c.up_scale), at(c.up_bias)};
}

void glu_forward(void* y, const void* gate, const void* up, const GluColumns& cols, GluKind kind,
                 DType dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, glu_forward_kernel<T>)
    (static_cast<T*>(y), static_cast<const T*>(gate), static_cast<const T*>(up), glu_maps<T>(cols),
     kind, n, cols.C);
  });
}

void soft_cap_forward(void* y, const void* x, double cap, DType dtype, int64_t n,
                      cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, soft_cap_forward_kernel<T>)
    (static_cast<T*>(y), static_cast<const T*>(x), cap, n);
  });
}

void soft_cap_backward(void* dx, const void* dy, const void* y, double cap, DType dtype, int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, soft_cap_backward_kernel<T>)
    (static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(y), cap, n);
  });
}

void glu_backward(void* dgate, void* dup, const void* dy, const void* gate, const void* up,
                  const GluColumns& cols, GluKind kind, double* partial, DType dtype, int64_t n,
                  cudaStream_t stream) {
  if (cols.C == 0 || (n == 0 && !cols.dgate_scale && !cols.dup_scale)) return;
  dispatch_float(dtype, [&]<typename T>() {
    if (cols.dgate_scale || cols.dup_scale) {
      const int64_t rows = n / cols.C, chunks = layer_norm_partial_chunks(rows);
      SF_LAUNCH(band_blocks(chunks, cols.C), kThreads, 0, stream, glu_backward_partial_kernel<T>)
      (partial, static_cast<T*>(dgate), static_cast<T*>(dup), static_cast<const T*>(dy),
       static_cast<const T*>(gate), static_cast<const T*>(up), glu_maps<T>(cols), kind, rows,
       cols.C, chunks);
      SF_LAUNCH(blocks_for(cols.C), kThreads, 0, stream, glu_backward_final_kernel<T>)
      (static_cast<T*>(cols.dgate_scale), static_cast<T*>(cols.dup_scale), partial, cols.C, chunks);
      return;
    }
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, glu_backward_kernel<T>)
    (static_cast<T*>(dgate), static_cast<T*>(dup), static_cast<const T*>(dy),
     static_cast<const T*>(gate), static_cast<const T*>(up), glu_maps<T>(cols), kind, n, cols.C);
  });
}

namespace {

// The tile of R query (or key) rows: the largest power of two up to 32 whose shared memory,
// `tiles` (R, D) tiles, `squares` (R, R) ones and `vectors` (R) ones, fits the default 48 KB.
size_t attention_shared(int64_t R, int64_t D, int tiles, int squares, int vectors, size_t element) {
  return static_cast<size_t>(tiles * R * tile_ld(D) + squares * R * tile_ld(R) + vectors * R) *
         element;
}
int64_t attention_tile(int64_t D, int tiles, int squares, int vectors, size_t element) {
  int64_t R = 32;
  while (R > 1 && attention_shared(R, D, tiles, squares, vectors, element) > (48u << 10)) R /= 2;
  return R;
}

AttentionDropout attention_dropout(const AttentionShape& s) {
  AttentionDropout d;
  if (s.dropout > 0) {
    d.threshold = kernels::attention_drop_threshold(s.dropout);
    d.keep_scale = 1.0 / (1.0 - s.dropout);
  }
  return d;
}

// Blocks for tiles of R of `rows` rows in each of `units` (pairs, or key/value groups).
unsigned attention_blocks(int64_t units, int64_t rows, int64_t R) {
  const int64_t tiles = units * ((rows + R - 1) / R);
  return static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, 65535));
}

// Tensor cores (attention_tc.cuh) for bf16 products of f32 tensors where
// SEQFORGE_CUDA_ATTENTION=tensor_cores asks for them (until they have run on a GPU, the f32
// kernels are the default): the rows of the other side per tile, the most of 64, 32 and 16 whose
// shared memory this GPU offers a block; 0 for the f32 kernels.
int64_t tensor_core_tile(const AttentionShape& s, DType dtype, size_t (*shared)(int64_t, int64_t)) {
  if (dtype != DType::f32 || !s.bf16_products) return 0;
  const char* choice = std::getenv("SEQFORGE_CUDA_ATTENTION");
  if (!choice || std::string_view(choice) == "" || std::string_view(choice) == "f32") return 0;
  if (std::string_view(choice) != "tensor_cores")
    fail("SEQFORGE_CUDA_ATTENTION: unknown value '", choice, "' (expected f32 or tensor_cores)");
  int device = 0, optin = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  for (const int64_t other : {64, 32, 16})
    if (shared(s.head_dim, other) <= static_cast<size_t>(optin)) return other;
  return 0;
}

}  // namespace

void attention_forward(const AttentionForward& a, DType dtype, cudaStream_t stream) {
  const AttentionShape& s = a.shape;
  if (s.batch * s.heads == 0 || a.first_row >= s.seq) return;
  if (const int64_t other = tensor_core_tile(s, dtype, tc_forward_shared)) {
    const size_t shared = tc_forward_shared(s.head_dim, other);
    allow_shared(attention_forward_tc_kernel, shared, "attention's forward", "head size");
    SF_LAUNCH(attention_blocks(s.batch * s.heads, s.seq - a.first_row, kTcRows), kTcThreads, shared,
              stream, attention_forward_tc_kernel)
    (a, other, attention_dropout(s));
    return;
  }
  dispatch_float(dtype, [&]<typename T>() {
    const int64_t D = s.head_dim, R = attention_tile(D, 4, 1, 3, sizeof(T));
    const size_t shared = attention_shared(R, D, 4, 1, 3, sizeof(T));
    allow_shared(attention_forward_kernel<T>, shared, "attention's forward", "head size");
    SF_LAUNCH(attention_blocks(s.batch * s.heads, s.seq - a.first_row, R), kThreads, shared, stream,
              attention_forward_kernel<T>)
    (a, R, attention_dropout(s));
  });
}

void attention_backward(const AttentionBackward& a, void* delta, DType dtype, cudaStream_t stream) {
  const AttentionShape& s = a.shape;
  if (s.batch * s.heads * s.seq == 0) return;
  const AttentionDropout drop = attention_dropout(s);
  const int64_t other_k = tensor_core_tile(s, dtype, tc_dkdv_shared),
                other_q = tensor_core_tile(s, dtype, tc_dq_shared);
  if (other_k && other_q) {
    float* d = static_cast<float*>(delta);
    SF_LAUNCH(blocks_for(s.batch * s.heads * s.seq), kThreads, 0, stream, attention_delta_tc_kernel)
    (d, static_cast<const float*>(a.out), static_cast<const float*>(a.dout), s);
    const size_t shared_k = tc_dkdv_shared(s.head_dim, other_k),
                 shared_q = tc_dq_shared(s.head_dim, other_q);
    allow_shared(attention_dkdv_tc_kernel, shared_k, "attention's backward", "head size");
    SF_LAUNCH(attention_blocks(s.batch * s.kv(), s.seq, kTcRows), kTcThreads, shared_k, stream,
              attention_dkdv_tc_kernel)
    (a, d, other_k, drop);
    allow_shared(attention_dq_tc_kernel, shared_q, "attention's backward", "head size");
    SF_LAUNCH(attention_blocks(s.batch * s.heads, s.seq, kTcRows), kTcThreads, shared_q, stream,
              attention_dq_tc_kernel)
    (a, d, other_q, drop);
    return;
  }
  dispatch_float(dtype, [&]<typename T>() {
    const int64_t D = s.head_dim;
    T* d = static_cast<T*>(delta);
    SF_LAUNCH(blocks_for(s.batch * s.heads * s.seq), kThreads, 0, stream, attention_delta_kernel<T>)
    (d, static_cast<const T*>(a.out), static_cast<const T*>(a.dout), s);
    const int64_t Rk = attention_tile(D, 6, 2, 2, sizeof(T));
    const size_t shared_k = attention_shared(Rk, D, 6, 2, 2, sizeof(T));
    allow_shared(attention_dkdv_kernel<T>, shared_k, "attention's backward", "head size");
    SF_LAUNCH(attention_blocks(s.batch * s.kv(), s.seq, Rk), kThreads, shared_k, stream,
              attention_dkdv_kernel<T>)
    (a, d, Rk, drop);
    const int64_t Rq = attention_tile(D, 5, 2, 2, sizeof(T));
    const size_t shared_q = attention_shared(Rq, D, 5, 2, 2, sizeof(T));
    allow_shared(attention_dq_kernel<T>, shared_q, "attention's backward", "head size");
    SF_LAUNCH(attention_blocks(s.batch * s.heads, s.seq, Rq), kThreads, shared_q, stream,
              attention_dq_kernel<T>)
    (a, d, Rq, drop);
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
