#pragma once
// The device interface. Layers, losses and optimizers call only these functions, so a CUDA
// backend can be added without touching them. Every op exists in the reference backend (scalar,
// f32 and f64, kept forever as the oracle); the CPU backend runs f32 through oneDNN and threaded
// kernels and hands other dtypes to the reference kernels.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "seqforge/backend/ops.hpp"
#include "seqforge/core/tensor.hpp"

namespace seqforge {

// A recorded op sequence (a CUDA graph) that runs again exactly as it was recorded: the same
// kernels on the same memory with the same arguments.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  virtual void replay() = 0;
};

// A GEMM's B operand rearranged once into the backend's preferred layout, for many GEMMs of one
// shape and dtype with the same B (the recurrent weights, at every time step). Made by
// Backend::pack_b; what it holds is the backend's business.
class PackedB {
 public:
  virtual ~PackedB() = default;
};

// A per-column affine map on an activation's input, fused into the activation (DoRA's column
// scaling m / ||V|| and a frozen base's bias): the activation sees x * scale + bias per column of
// x (R, C); an empty tensor leaves its part out (scale 1, bias 0). Backward then writes the
// gradient of x as given (through the scale), and where dscale is given the scale's gradient
// (assigned): dscale (C) = the column sums of d(mapped x) * x.
struct ColumnMap {
  Tensor scale{}, bias{}, dscale{};
  bool empty() const { return scale.empty() && bias.empty() && dscale.empty(); }
  // C, the width of x's rows: the given tensors' length (each checked against x's dtype and
  // size), else x's last axis.
  int64_t width(const Tensor& x) const;
};
// A gated MLP's two inputs' maps.
struct GluAffine {
  ColumnMap gate{}, up{};
  int64_t width(const Tensor& gate_x) const;  // both maps' C (ColumnMap::width)
};

// The interface's operations, in the groups backends implement them (Backend::supports).
enum class Op {
  memory,       // alloc, copy, fill, convert, upload, download
  gemm,         // gemm, pack_b (dtype: the operands')
  elementwise,  // sum_rows_acc, add, mul, scale, sum_squares
  layout,       // transpose01, copy_rows, copy_transposed
  dropout,      // dropout_mask
  cell,         // cell_forward, cell_backward
  embedding,    // embedding_forward, embedding_backward
  norm,         // layer_norm_forward, layer_norm_backward
  activation,   // gelu_forward, gelu_backward
  attention,    // attention_forward, attention_backward
  adapter,      // scale_columns, dora_norm, dora_backward
  loss,         // mse_loss, cross_entropy_loss
  optimizer,    // adam_step, sgd_step
  decoder,      // rms_norm_forward, rms_norm_backward, rotary, glu_forward, glu_backward,
                // soft_cap_forward, soft_cap_backward
};
const char* op_name(Op op);
constexpr Op kAllOps[] = {Op::memory,     Op::gemm,      Op::elementwise, Op::layout,
                          Op::dropout,    Op::cell,      Op::embedding,   Op::norm,
                          Op::activation, Op::attention, Op::adapter,     Op::loss,
                          Op::optimizer,  Op::decoder};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // What runs the ops, for start-up lines and reports ("cpu: oneDNN 2.6.3 GEMMs, ...").
  virtual std::string description() const { return std::string(name()); }
  // Whether the backend runs `op` on `dtype`: calls it does not support are errors.
  virtual bool supports(Op op, DType dtype) const = 0;

  // Memory: 64-byte aligned and zeroed.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* ptr) = 0;
  virtual void copy(Tensor dst, Tensor src) = 0;  // same dtype and element count
  virtual void fill(Tensor dst, double value) = 0;
  // dst = src converted to dst's dtype (f32, f64, bf16, f16), same element count.
  virtual void convert(Tensor dst, Tensor src) = 0;
  virtual void synchronize() {}
  // PyTorch's torch.set_float32_matmul_precision: "highest" (f32 products) or "high" (f32 GEMMs
  // may run on TF32 tensor cores, where the backend has them; the CPU backends keep f32).
  virtual void set_float32_matmul_precision(std::string_view precision) { (void)precision; }

  // Host <-> backend memory. Host code (train/, data/, io/, dist/) moves values into and out of
  // backend tensors only through these (or host_access.hpp), so a backend whose memory the host
  // cannot address needs no change there. `host` holds dst/src.nbytes() bytes.
  virtual void upload(Tensor dst, const void* host) = 0;
  virtual void download(void* host, Tensor src) = 0;
  // Whether the host may address this backend's memory directly (the CPU backends): host code
  // then reads and writes tensors in place instead of through a host copy.
  virtual bool host_addressable() const { return false; }
  // A device with memory of its own (a GPU): its free and total bytes now, and its name
  // ("GPU 0, NVIDIA H100"); false where the backend's memory is the host's.
  virtual bool device_memory(size_t* free, size_t* total, std::string* device) const {
    (void)free, (void)total, (void)device;
    return false;
  }
  // Host memory to stage uploads in (a loader's batches): page-locked where the backend copies
  // from it faster and without an extra copy (a GPU's DMA engine), else ordinary memory.
  virtual void* alloc_host(size_t bytes);
  virtual void free_host(void* ptr);  // never throws

  // Capturing an op sequence to replay it (CUDA graphs), where captures() says so: between
  // begin_capture and end_capture the calling thread's ops are recorded, not run; none may
  // allocate, upload, download or wait (those calls throw), and memory freed meanwhile makes
  // end_capture throw. abort_capture ends a capture that threw. memory_epoch() counts the
  // allocations and frees: a graph replays safely only while it is what it was at the capture.
  virtual bool captures() const { return false; }
  virtual void begin_capture();
  virtual std::unique_ptr<StepGraph> end_capture();
  virtual void abort_capture() noexcept {}
  virtual uint64_t memory_epoch() const { return 0; }

  // Independent op sequences this backend can run at the same time (CPU: its threads; GPU: its
  // streams).
  virtual int concurrency() const { return 1; }
  // Runs the op sequences fn(0) .. fn(n-1) concurrently, n <= concurrency(); returns when all are
  // done (on a GPU: enqueued, and ordered before the ops called next). Ops called from inside fn
  // run on that worker alone. A backend whose ops run asynchronously may call fn(0) .. fn(n-1)
  // one after another on this thread: a worker's host code waits only for workers before it.
  virtual void run_concurrently(int n, const std::function<void(int)>& fn) {
    SF_CHECK(n == 1, "this backend runs one op sequence at a time, asked for ", n);
    fn(0);
  }
  // Ordering between the workers' ops where they run asynchronously (a GPU's streams; the CPU's
  // run as they are called, so the host's own ordering of the calls is all they need).
  // signal_worker marks the point the calling worker's ops have reached; wait_for_worker(i, n)
  // orders the calling worker's later ops after worker i's ops before its n-th mark, which the
  // host has already made (i is before the caller).
  virtual void signal_worker() {}
  virtual void wait_for_worker(int worker, int64_t marks) { (void)worker, (void)marks; }

  void gemm(const GemmShape& s, DType dtype, const void* a, const void* b, void* c,
            const void* bias = nullptr) {
    SF_CHECK(s.bias == (bias != nullptr) && (!s.bias || s.alpha == 1.0f), "gemm bias");
    run_gemm(s, dtype, a, b, c, bias);
  }
  // (Re)packs `b` for GEMMs of shape `s` (any lda) and `dtype` into `*packed`, reusing its
  // memory when it fits. Backends without a packed layout leave `*packed` empty.
  virtual void pack_b(const GemmShape& s, DType dtype, const void* b,
                      std::unique_ptr<PackedB>* packed) {
    (void)s, (void)dtype, (void)b;
    packed->reset();
  }
  // gemm() with B's packed form when `packed` is set (b, unchanged since packing, is the
  // fallback).
  void gemm(const GemmShape& s, DType dtype, const void* a, const void* b, const PackedB* packed,
            void* c, const void* bias = nullptr) {
    SF_CHECK(s.bias == (bias != nullptr) && (!s.bias || s.alpha == 1.0f), "gemm bias");
    if (!packed) return run_gemm(s, dtype, a, b, c, bias);
    run_gemm_packed(s, dtype, a, b, *packed, c, bias);
  }

  // db(N) += column sums of dy(R, N).
  virtual void sum_rows_acc(Tensor db, Tensor dy) = 0;
  // Both of a Linear's backward reads of dy at once: db(N) += column sums of dy(R, N) (as
  // sum_rows_acc sums them) and dy_low = dy in dy_low's dtype (as convert rounds it).
  virtual void sum_rows_acc_and_convert(Tensor db, Tensor dy, Tensor dy_low) {
    sum_rows_acc(db, dy);
    convert(dy_low, dy);
  }
  // y += x, elementwise.
  virtual void add(Tensor y, Tensor x) = 0;
  // y = a * b, elementwise.
  virtual void mul(Tensor y, Tensor a, Tensor b) = 0;
  // mask[i] = 0 with probability p, else 1 / (1 - p); a pure function of (seed, i).
  virtual void dropout_mask(Tensor mask, double p, uint64_t seed) = 0;
  // Every dropout mask from here on (dropout_mask's, attention's) is drawn from its seed mixed
  // with the u64 at `base` (backend memory, read when the op runs; null: the seeds as given), so
  // that the same ops draw new masks at each step from one value written per step, as a replayed
  // CUDA graph must.
  virtual void set_seed_base(const uint64_t* base) { seed_base_ = base; }
  // dst(T, B, F) = src(B, T, F) with the first two axes swapped.
  virtual void transpose01(Tensor dst, Tensor src) = 0;
  // dst(rows, n) <- src with rows ld_src apart (strided copy, e.g. one direction of (T, B, 2H)).
  virtual void copy_rows(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                         int64_t n, DType dtype) = 0;
  // dst(cols, rows) = src(rows, cols) transposed; rows ld_src and ld_dst elements apart.
  virtual void copy_transposed(void* dst, int64_t ld_dst, const void* src, int64_t ld_src,
                               int64_t rows, int64_t cols, DType dtype) = 0;

  // One step of a recurrent cell (ops.hpp), forward and backward.
  virtual void cell_forward(CellKind cell, const CellForward& a, DType dtype) = 0;
  virtual void cell_backward(CellKind cell, const CellBackward& a, DType dtype) = 0;
  // Whole chains' recurrences (ops.hpp), LSTM or GRU: independent chains of one batch, width and
  // length (a bidirectional layer's two directions), here one after another, each as its steps, a
  // recurrent GEMM and a cell call (the definition); a backend that runs the chains in one go
  // says so with fuses_recurrence and overrides both.
  virtual void recurrence_forward(CellKind cell, std::span<const RecurrenceForward> chains,
                                  DType dtype);
  virtual void recurrence_backward(CellKind cell, std::span<const RecurrenceBackward> chains,
                                   DType dtype);
  virtual bool fuses_recurrence(CellKind cell) const {
    (void)cell;
    return false;
  }

  // out(N, E) = table[ids]; ids (N) i32 or i64, checked against V (an id outside it is an error,
  // which a device backend may report at its next synchronisation).
  virtual void embedding_forward(Tensor out, Tensor table, Tensor ids) = 0;
  // dtable(V, E) += scatter of dout by ids.
  virtual void embedding_backward(Tensor dtable, Tensor dout, Tensor ids) = 0;

  // Layer norm over the last axis of x(N, C): y = (x - mean) * rstd * w + b, with
  // rstd = 1 / sqrt(var + eps), var the biased variance; saved (N, 2) keeps mean and rstd.
  // y may be bf16 with x in f32 (the result rounded): the operand of bf16 GEMMs, written directly.
  virtual void layer_norm_forward(Tensor y, Tensor saved, Tensor x, Tensor w, Tensor b,
                                  double eps) = 0;
  // dx = d(loss)/dx (assigned), + residual (x's shape) when given: a residual stream's gradient
  // joining in the same pass; dw, db (C) accumulate.
  virtual void layer_norm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w,
                                   Tensor saved, Tensor residual = {}) = 0;
  // y = GELU(x) in its exact form x * Phi(x) (PyTorch's nn.GELU()), and dx = dy * GELU'(x) (dx
  // may be dy); with `map` (ColumnMap) of x mapped per column first. As in layer_norm_forward,
  // y may be bf16 with x in f32.
  virtual void gelu_forward(Tensor y, Tensor x, const ColumnMap& map = {}) = 0;
  virtual void gelu_backward(Tensor dx, Tensor dy, Tensor x, const ColumnMap& map = {}) = 0;

  // RMS norm over the last axis of x(N, C) (Llama, Qwen2, Gemma): y = x * rstd * (offset + w),
  // rstd = 1 / sqrt(mean(x^2) + eps), saved (N) keeps rstd; Gemma scales by 1 + w (offset 1).
  virtual void rms_norm_forward(Tensor y, Tensor saved, Tensor x, Tensor w, double offset,
                                double eps);
  // dx assigned (+ residual when given, as layer_norm_backward's), dw (C) accumulates.
  virtual void rms_norm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, double offset,
                                 Tensor saved, Tensor residual = {});
  // Rotary position embeddings in place (ops.hpp).
  virtual void rotary(const Rotary& a, DType dtype);
  // A gated MLP's product y = act(gate) * up of gate, up (R, C), and its gradients (assigned).
  // With `affine` (GluAffine) the inputs are first mapped per column.
  virtual void glu_forward(Tensor y, Tensor gate, Tensor up, GluKind kind,
                           const GluAffine& affine = {});
  virtual void glu_backward(Tensor dgate, Tensor dup, Tensor dy, Tensor gate, Tensor up,
                            GluKind kind, const GluAffine& affine = {});
  // Soft-capping (Gemma's final_logit_softcapping): y = cap * tanh(x / cap) (y may be x), and
  // dx = dy * (1 - (y / cap)^2) from the capped y (dx may be dy).
  virtual void soft_cap_forward(Tensor y, Tensor x, double cap);
  virtual void soft_cap_backward(Tensor dx, Tensor dy, Tensor y, double cap);

  // y(R, C) = x(R, C) * s(C) broadcast over rows, + b(C) when given, + addend when given; y's
  // and addend's rows are ldy apart (0: C), so that they may sit inside wider rows. y may be x
  // (C apart, no addend) or the addend (a residual stream gaining a branch).
  void scale_columns(Tensor y, Tensor x, Tensor s, Tensor b, int64_t ldy = 0,
                     const void* addend = nullptr) {
    run_scale_columns(y, ldy ? ldy : s.numel(), addend, x, s, b);
  }
  // DoRA's weight norm, per row of v(R, C): inv_norm(R) = 1 / ||v_r||, scale(R) = m * inv_norm.
  virtual void dora_norm(Tensor scale, Tensor inv_norm, Tensor v, Tensor m) = 0;
  // DoRA's backward through y = pre * scale + b per column, pre(R, C) = x V^T and scale = m / ||V||
  // (||V|| held constant): dpre(R, C) = dy * scale (assigned), dm(C) += inv_norm * the column
  // sums of dy * pre; dy's rows are ldy apart (0: C).
  void dora_backward(Tensor dpre, Tensor dm, Tensor dy, Tensor pre, Tensor scale, Tensor inv_norm,
                     int64_t ldy = 0) {
    run_dora_backward(dpre, dm, dy, ldy ? ldy : scale.numel(), pre, scale, inv_norm);
  }

  // Multi-head attention (ops.hpp), forward and backward.
  virtual void attention_forward(const AttentionForward& a, DType dtype) = 0;
  virtual void attention_backward(const AttentionBackward& a, DType dtype) = 0;

  // A regression loss (ops.hpp: mse, mae, huber) over rows of pred(N, F) selected by mask(N)
  // (empty = all rows), the mean over the selected values. Writes dpred = d(loss)/d(pred) and the
  // loss into `loss` (one f64 in this backend's memory), without waiting for it.
  virtual void regression_loss(const RegressionLoss& kind, Tensor pred, Tensor target, Tensor mask,
                               Tensor dpred, Tensor loss) = 0;
  // Cross-entropy of logits(N, C) against targets(N) (i32/i64), optional class weights(C),
  // rows with target == ignore_index skipped; weighted mean. Writes dlogits and `loss` as above.
  // A target outside [0, C) is an error, which a device backend may report at its next
  // synchronisation.
  virtual void cross_entropy_loss(Tensor logits, Tensor targets, Tensor weights,
                                  int64_t ignore_index, Tensor dlogits, Tensor loss) = 0;
  // out (one f64 in this backend's memory) = the sum of squares of x.
  virtual void sum_squares(Tensor x, Tensor out) = 0;

  // The same, waiting for the value (evaluation, tests); mse_loss is the mse kind.
  double regression_loss(const RegressionLoss& kind, Tensor pred, Tensor target, Tensor mask,
                         Tensor dpred);
  double mse_loss(Tensor pred, Tensor target, Tensor mask, Tensor dpred) {
    return regression_loss({}, pred, target, mask, dpred);
  }
  double cross_entropy_loss(Tensor logits, Tensor targets, Tensor weights, int64_t ignore_index,
                            Tensor dlogits);
  double sum_squares(Tensor x);

  virtual void scale(Tensor x, double alpha) = 0;
  virtual void adam_step(Tensor params, Tensor grads, Tensor m, Tensor v, const AdamParams& p) = 0;
  virtual void sgd_step(Tensor params, Tensor grads, Tensor momentum, const SgdParams& p) = 0;
  // The whole update (ops.hpp: OptimizerStep). Defined here for host memory, segment by segment
  // through adam_step and sgd_step; a device backend runs it itself, in one pass.
  virtual void optimizer_step(const OptimizerStep& a, DType dtype);

  // Data-parallel sums on the device itself (NCCL between GPUs), where the backend has them:
  // "" when this process could join them (what they need is loaded), else why not.
  virtual std::string collectives_unavailable();
  // This process's device (a GPU's PCI address), so that two processes on one can be told; 0
  // where memory is the host's.
  virtual uint64_t device_identity() const { return 0; }
  // Joins the job's device collectives; every rank calls it at once, after all have found them
  // available on distinct devices, with host collectives to exchange what joining needs.
  struct HostCollectives {
    int rank = 0, size = 1;
    std::function<void(std::span<std::byte>)> broadcast;  // rank 0's bytes to every rank
  };
  virtual void join_collectives(const HostCollectives& host);
  // x (f32) summed over the job's ranks in place, in order with the other ops (after joining).
  virtual void all_reduce_sum(Tensor x);
  // What sums gradients across ranks once join_collectives succeeded ("NCCL 2.28.3").
  virtual std::string collectives_name() const { return ""; }

 protected:
  const uint64_t* seed_base_ = nullptr;  // set_seed_base's
  virtual void run_scale_columns(Tensor y, int64_t ldy, const void* addend, Tensor x, Tensor s,
                                 Tensor b) = 0;
  virtual void run_dora_backward(Tensor dpre, Tensor dm, Tensor dy, int64_t ldy, Tensor pre,
                                 Tensor scale, Tensor inv_norm) = 0;
  virtual void run_gemm(const GemmShape& s, DType dtype, const void* a, const void* b, void* c,
                        const void* bias) = 0;
  virtual void run_gemm_packed(const GemmShape& s, DType dtype, const void* a, const void* b,
                               const PackedB& packed, void* c, const void* bias) {
    (void)packed;
    run_gemm(s, dtype, a, b, c, bias);
  }
};

// The scalar reference backend (single thread; f32 and f64, and bf16 GEMM operands).
std::unique_ptr<Backend> make_reference_backend();
// The CPU backend (oneDNN GEMMs in f32 and bf16, SIMD kernels over the OpenMP pool; f64 through
// the reference kernels). It flushes denormals to zero on the calling thread and the OpenMP pool
// (set_flush_denormals) unless SEQFORGE_FLUSH_DENORMALS=0.
std::unique_ptr<Backend> make_cpu_backend();
// The CUDA backend (one GPU: the current device). Throws the reason when none can be used.
std::unique_ptr<Backend> make_cuda_backend();
// Why this process cannot use the CUDA backend ("no CUDA device: cudaErrorNoDevice", or a build
// without it), or "" when it can.
std::string cuda_unavailable_reason();
// The current GPU's free and total memory; false when there is none.
bool cuda_free_memory(size_t* free, size_t* total);
// The CUDA runtime and driver versions and each GPU (name, compute capability, memory total and
// free), or why there is none; for seqforge diagnose.
std::string cuda_summary();
// The backends this build can make, by name, the reference (the oracle) first.
struct BackendEntry {
  const char* name;
  std::unique_ptr<Backend> (*make)();
  // Why make() would fail on this machine (no device), "" when it would not; null: never fails.
  std::string (*unavailable)() = nullptr;
  bool usable() const { return !unavailable || unavailable().empty(); }
};
const std::vector<BackendEntry>& registered_backends();
// One of registered_backends() by name; throws naming them on an unknown name.
std::unique_ptr<Backend> make_backend(std::string_view name);
// The backend of train, eval, predict and generate: SEQFORGE_BACKEND when set, else by `device`:
// cpu, cuda (an error naming the reason when it cannot run, or does not run every op of `needs`),
// or auto (cuda where it can run `needs`, else cpu).
std::unique_ptr<Backend> make_run_backend(std::string_view device = "cpu",
                                          const std::vector<Op>& needs = {});
// The reference backend behind a seal: its memory is unreadable to the host outside its own ops
// and upload/download, and its ops take only its own memory, as a device backend's would. Host
// code that reads backend memory directly faults under it (SEQFORGE_BACKEND=sealed).
std::unique_ptr<Backend> make_sealed_backend();
// The same with a GPU stream's timing: ops run later, in order, on a worker thread; download and
// synchronize wait for them and raise their first error (SEQFORGE_BACKEND=sealed_async).
std::unique_ptr<Backend> make_sealed_async_backend();

}  // namespace seqforge
