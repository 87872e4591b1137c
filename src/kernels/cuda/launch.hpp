#pragma once
// The CUDA kernels' launchers, callable from host C++: each enqueues its kernel on `stream` and
// returns at once. Pointers are device memory; float dtypes are f32 and f64 unless named.
// Errors of the launch itself are reported by the backend's next check (cudaGetLastError).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "seqforge/backend/ops.hpp"
#include "seqforge/core/dtype.hpp"

namespace seqforge::cuda {

// The most blocks of a reduction whose block sums are added in a fixed order (block_partial).
constexpr unsigned kPartialBlocks = 1024;

// Memory and elementwise (elementwise.cuh).
void fill(void* p, DType dtype, int64_t n, double value, cudaStream_t stream);
// dst = src converted (f32, f64, bf16, f16 either way), rounding as the host's convert().
void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
             cudaStream_t stream);
void add(void* y, const void* x, DType dtype, int64_t n, cudaStream_t stream);
void mul(void* y, const void* a, const void* b, DType dtype, int64_t n, cudaStream_t stream);
void scale(void* x, DType dtype, int64_t n, double alpha, cudaStream_t stream);
// db(cols) += column sums of dy(rows, cols), a thread per column (for few rows).
void sum_rows_acc(void* db, const void* dy, DType dtype, int64_t rows, int64_t cols,
                  cudaStream_t stream);
// The same over bands of rows in parallel (`partial`: layer_norm_partial_chunks(rows) * cols
// doubles), then the bands' sums in order; with `low` (f32 dy only), dy is also written there in
// low_type (bf16 or f16) as convert writes it.
void sum_rows_acc_banded(void* db, const void* dy, DType dtype, int64_t rows, int64_t cols,
                         double* partial, void* low, DType low_type, cudaStream_t stream);
// c(rows, cols) += bias(cols) broadcast over rows, rows ldc apart.
void add_bias_rows(void* c, int64_t ldc, const void* bias, DType dtype, int64_t rows, int64_t cols,
                   cudaStream_t stream);
// The GEMM of GemmShape on our own kernel, for what cuBLASLt has no algorithm for: dtype as
// CublasLt::gemm's (f32 C and bias for f32, bf16 and f16 operands; f64 for f64). Slow.
void gemm_fallback(const GemmShape& s, DType dtype, const void* a, const void* b, void* c,
                   const void* bias, cudaStream_t stream);
// A GEMM with k = 0 on c(rows, cols), rows ldc apart: c = beta c (+ bias(cols)).
void gemm_without_k(void* c, int64_t ldc, int64_t rows, int64_t cols, double beta, const void* bias,
                    DType dtype, cudaStream_t stream);
// *out (one double, device memory) = sum of x^2, through `partials` (kPartialBlocks + 1 doubles of
// device memory; sums in a fixed order).
void sum_squares(double* out, const void* x, DType dtype, int64_t n, double* partials,
                 cudaStream_t stream);
// dst(d1, d0, f) = src(d0, d1, f), elements of `element_bytes` (2, 4 or 8).
void transpose01(void* dst, const void* src, int64_t d0, int64_t d1, int64_t f,
                 size_t element_bytes, cudaStream_t stream);
// dst(cols, rows) = src(rows, cols), rows ld_src and ld_dst elements apart.
void copy_transposed(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                     int64_t cols, size_t element_bytes, cudaStream_t stream);
// mask[i] = 0 where counter_hash(seed, i) >> 11 < below (hash_uniform < p), else keep; the seed
// mixed with *seed_base (device memory) where that is given (ref::seed_with_base).
void dropout_mask(void* mask, DType dtype, int64_t n, uint64_t below, double keep, uint64_t seed,
                  const uint64_t* seed_base, cudaStream_t stream);

// The recurrent cells (cells.cuh, lnlstm.cuh): steps as the reference's, but for dbias, which the
// backend sums over the rows afterwards: the LSTM's and GRU's from dgates (and dgates_rec), the
// LN-LSTM's from the per-row terms it writes to dbias_rows (batch, bias_grad_columns). dgates and,
// with recurrent_grads, dgates_rec must be given (scratch when the step keeps only bf16 copies).
void cell_forward(CellKind cell, const CellForward& p, DType dtype, cudaStream_t stream);
void cell_backward(CellKind cell, const CellBackward& p, void* dbias_rows, DType dtype,
                   cudaStream_t stream);

// Independent whole chains of one batch, width and length, LSTM or GRU, up to
// recurrence_chains_together at a time in one cooperative launch (recurrence.cuh), or a stack
// (ops.hpp) in one launch, its layers stepping together; recurrence_stack_together says whether
// a stack should: where its tiles keep their weights resident, or where one layer's would not
// either (else the caller runs a layer at a time, where each keeps them). Backward needs
// scratch for that many chains, one after another: for dgates and dgates_rec when they are null
// (B, G*H each), and for the bias sums when dbias is given (recurrence_bias_rows(B) x bias
// columns), all in `dtype`; both, recurrence_progress_bytes(B) for the steps' progress counters
// where SEQFORGE_CUDA_CHAIN_SYNC=row_groups takes them instead of grid syncs.
void recurrence_forward(CellKind cell, std::span<const RecurrenceForward> chains, DType dtype,
                        void* progress, cudaStream_t stream);
void recurrence_backward(CellKind cell, std::span<const RecurrenceBackward> chains,
                         void* dgates_step, void* drec_step, void* bias_rows, void* progress,
                         DType dtype, cudaStream_t stream);
int64_t recurrence_progress_bytes(int64_t batch);
bool recurrence_stack_together(CellKind cell, int64_t batch, int64_t hidden, DType dtype,
                               bool backward);
constexpr int64_t recurrence_chains_together = 2;
int64_t recurrence_bias_rows(int64_t batch);

// A bad input found by a kernel (report_bad), in kReportWords words of device memory that the
// caller sets to all ones: the first op's, at its lowest index, with kResolvedReport set in
// [kReportIndex]; its value, the op's bound (the valid range is [0, bound)) and the op's kind.
// An op finds nothing new while a report stands.
constexpr int kReportIndex = 0, kReportValue = 1, kReportBound = 2, kReportKind = 3;
constexpr int kReportWords = 4;
constexpr uint64_t kResolvedReport = uint64_t{1} << 63;
constexpr uint64_t kBadTokenId = 0, kBadTargetClass = 1;  // the kinds

// Embedding and adapters (adapter.cuh). An id outside [0, vocab) is reported in `bad`
// (kBadTokenId).
void embedding_forward(void* out, const void* table, const void* ids, DType id_type, DType dtype,
                       int64_t n, int64_t e, int64_t vocab, uint64_t* bad, cudaStream_t stream);
// embedding_backward sorts its ids in `keys`: embedding_sort_keys(n) values of device memory.
int64_t embedding_sort_keys(int64_t n);
void embedding_backward(void* dtable, const void* dout, const void* ids, DType id_type, DType dtype,
                        int64_t n, int64_t e, int64_t vocab, uint64_t* keys, cudaStream_t stream);
void scale_columns(void* y, int64_t ldy, const void* addend, const void* x, const void* s,
                   const void* b, DType dtype, int64_t rows, int64_t cols, cudaStream_t stream);
void dora_norm(void* scale, void* inv_norm, const void* v, const void* m, DType dtype, int64_t rows,
               int64_t cols, cudaStream_t stream);
// dora_backward needs `partial`: layer_norm_partial_chunks(rows) * cols doubles.
void dora_backward(void* dpre, void* dm, const void* dy, int64_t ldy, const void* pre,
                   const void* scale, const void* inv_norm, double* partial, DType dtype,
                   int64_t rows, int64_t cols, cudaStream_t stream);

// Layer norm and GELU (norm.cuh); y may be bf16 with x in f32. layer_norm_backward needs
// `partial`: 2 * layer_norm_partial_chunks(rows) * C doubles of device memory; its dx gains
// `residual` (rows of C) where given.
void layer_norm_forward(void* y, DType y_type, void* saved, const void* x, const void* w,
                        const void* b, DType dtype, int64_t rows, int64_t C, double eps,
                        cudaStream_t stream);
int64_t layer_norm_partial_chunks(int64_t rows);
void layer_norm_backward(void* dx, void* dw, void* db, const void* residual, const void* dy,
                         const void* x, const void* w, const void* saved, double* partial,
                         DType dtype, int64_t rows, int64_t C, cudaStream_t stream);
// GELU of x mapped per column (rows of C; scale, bias null: left out); with dscale (the scale's
// gradient), gelu_backward needs `partial`: layer_norm_partial_chunks(n / C) * C doubles.
void gelu_forward(void* y, DType y_type, const void* x, const void* scale, const void* bias,
                  DType dtype, int64_t n, int64_t C, cudaStream_t stream);
void gelu_backward(void* dx, void* dscale, const void* dy, const void* x, const void* scale,
                   const void* bias, double* partial, DType dtype, int64_t n, int64_t C,
                   cudaStream_t stream);

// The decoders' ops (decoder.cuh): RMS norm (rms_norm_backward needs `partial`:
// layer_norm_partial_chunks(rows) * C doubles; dx gains `residual` where given), rotary
// embeddings, the gated activations.
void rms_norm_forward(void* y, void* saved, const void* x, const void* w, double offset,
                      DType dtype, int64_t rows, int64_t C, double eps, cudaStream_t stream);
void rms_norm_backward(void* dx, void* dw, const void* residual, const void* dy, const void* x,
                       const void* w, double offset, const void* saved, double* partial,
                       DType dtype, int64_t rows, int64_t C, cudaStream_t stream);
void rotary(const Rotary& a, DType dtype, cudaStream_t stream);
void soft_cap_forward(void* y, const void* x, double cap, DType dtype, int64_t n,
                      cudaStream_t stream);
void soft_cap_backward(void* dx, const void* dy, const void* y, double cap, DType dtype, int64_t n,
                       cudaStream_t stream);
// A GLU over rows of C with per-column input maps (Backend's GluAffine; null: left out). With
// the scales' gradients, glu_backward needs `partial`: 2 * layer_norm_partial_chunks(rows) * C
// doubles.
struct GluColumns {
  int64_t C = 0;
  const void *gate_scale = nullptr, *gate_bias = nullptr, *up_scale = nullptr, *up_bias = nullptr;
  void *dgate_scale = nullptr, *dup_scale = nullptr;
};
void glu_forward(void* y, const void* gate, const void* up, const GluColumns& cols, GluKind kind,
                 DType dtype, int64_t n, cudaStream_t stream);
void glu_backward(void* dgate, void* dup, const void* dy, const void* gate, const void* up,
                  const GluColumns& cols, GluKind kind, double* partial, DType dtype, int64_t n,
                  cudaStream_t stream);

// Attention (attention.cuh, attention_tc.cuh). Backward needs `delta`: B * heads * T elements of
// the dtype. The kernels: tiles of f32 (or f64) products, or tensor cores for bf16 products of
// f32 tensors (AttentionShape::bf16_products) where SEQFORGE_CUDA_ATTENTION=tensor_cores asks for
// them and the GPU's shared memory holds their tiles (attention_kernels says which); a backward
// must take the kernels of the forward whose lse it reads.
enum class AttentionKernels { tiles, tensor_cores };
AttentionKernels attention_kernels(const AttentionShape& s, DType dtype);
void attention_forward(const AttentionForward& a, DType dtype, AttentionKernels kernels,
                       cudaStream_t stream);
void attention_backward(const AttentionBackward& a, void* delta, DType dtype,
                        AttentionKernels kernels, cudaStream_t stream);

// Losses (loss.cuh). `sums` is device memory for two doubles, zeroed here: the loss sum and its
// denominator (selected rows, or the total class weight); mean() forms the loss from them.
// `partials` as sum_squares'.
// A regression loss (ops.hpp): pred, target, dpred (rows, f); mask (rows) or null.
// dpred = the term's derivative / (selected * f).
void regression_loss(const RegressionLoss& kind, const void* pred, const void* target,
                     const void* mask, void* dpred, DType dtype, int64_t rows, int64_t f,
                     double* sums, double* partials, cudaStream_t stream);
// Cross-entropy of logits (rows, classes) against targets (i32 or i64), class weights (classes) or
// null; dlogits as the reference's. A target outside [0, classes) (and not ignore_index) is
// reported in `bad_row` (kBadTargetClass: its row and class).
void cross_entropy_loss(const void* logits, const void* targets, DType target_type,
                        const void* weights, int64_t ignore_index, void* dlogits, DType dtype,
                        int64_t rows, int64_t classes, double* sums, double* partials,
                        uint64_t* bad_row, cudaStream_t stream);

// *out = sums[0] / (sums[1] * per_term), or 0 when sums[1] is 0: a loss, on the device.
void mean(double* out, const double* sums, double per_term, cudaStream_t stream);

// Optimizers (optimizer.cuh), PyTorch's update order, as ref::adam_step and ref::sgd_step.
void adam_step(void* params, void* grads, void* m, void* v, DType dtype, int64_t n,
               const AdamParams& p, cudaStream_t stream);
void sgd_step(void* params, const void* grads, void* momentum, DType dtype, int64_t n,
              const SgdParams& p, cudaStream_t stream);
// The whole update (OptimizerStep), one pass over the arenas and one launch for the counts.
void optimizer_step(const OptimizerStep& a, DType dtype, cudaStream_t stream);

}  // namespace seqforge::cuda
