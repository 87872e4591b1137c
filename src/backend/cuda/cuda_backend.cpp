// The CUDA backend: device memory from the stream-ordered pool, GEMMs on cuBLASLt, its own
// kernels (kernels/cuda) for the elementwise, layout, dropout, cell (LSTM, GRU, LN-LSTM),
// embedding, layer norm, GELU, attention, adapter, loss and optimizer ops, on one stream but for
// independent op sequences (run_concurrently), each on a lane of its own, forked from it and
// joined back by events; uploads from page-locked staging memory on a copy stream, ordered
// against the ops by events.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/attention_agreement.hpp"
#include "backend/cuda/cublaslt.hpp"
#include "backend/cuda/cuda_error.hpp"
#include "backend/cuda/nccl.hpp"
#include "backend/cuda/optimizer_agreement.hpp"
#include "kernels/attention.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/reference.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/core/autotune.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

namespace {

cuda::GluColumns glu_columns(const Tensor& gate, const GluAffine& a) {
  return {.C = a.width(gate),
          .gate_scale = a.gate.scale.data(),
          .gate_bias = a.gate.bias.data(),
          .up_scale = a.up.scale.data(),
          .up_bias = a.up.bias.data(),
          .dgate_scale = a.gate.dscale.data(),
          .dup_scale = a.up.dscale.data()};
}

using cuda::check_cuda;

int64_t rows_of(Tensor t) { return t.shape().rank() ? t.dim(0) : 1; }

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    if (const std::string why = cuda_unavailable_reason(); !why.empty()) fail(why);
    try {
      select_local_device();
      check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
      check_cuda(cudaGetDeviceProperties(&props_, device_), "cudaGetDeviceProperties");
      int cooperative = 0;
      check_cuda(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device_),
                 "cudaDeviceGetAttribute (cooperative launches)");
      cooperative_ = cooperative != 0;
      check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      check_cuda(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                 "cudaStreamCreate (copies)");
      check_cuda(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming),
                 "cudaEventCreate");
      check_cuda(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), "cudaEventCreate");
      check_cuda(cudaMalloc(&scratch_, 2 * sizeof(double)), "cudaMalloc (scratch)");
      check_cuda(cudaMalloc(&partials_, (cuda::kPartialBlocks + 1) * sizeof(double)),
                 "cudaMalloc (partial sums)");
      check_cuda(cudaMalloc(&reports_, sizeof host_reports_), "cudaMalloc (reports)");
      check_cuda(cudaMemsetAsync(reports_, 0xff, sizeof host_reports_, stream_),
                 "cudaMemsetAsync (reports)");
      // Freed memory stays in the pool across synchronisations (the default gives it back at
      // each, and the next allocation pays for it again).
      cudaMemPool_t pool = nullptr;
      if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      }
      blas_ = std::make_unique<cuda::CublasLt>();
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaBackend() override { release(); }

  std::string_view name() const override { return "cuda"; }
  std::string description() const override {
    return std::string("cuda: ") + props_.name + " (sm_" + std::to_string(props_.major) +
           std::to_string(props_.minor) + ", " + std::to_string(props_.totalGlobalMem >> 20) +
           " MiB), cuBLASLt " + blas_->version() + " GEMMs" +
           (tf32_ ? " (f32 on TF32 tensor cores: matmul precision high)" : "");
  }
  bool device_memory(size_t* free, size_t* total, std::string* device) const override {
    if (cudaMemGetInfo(free, total) != cudaSuccess) return false;
    *device = "GPU " + std::to_string(device_) + ", " + props_.name;
    return true;
  }
  void set_float32_matmul_precision(std::string_view precision) override {
    tf32_ = precision == "high";
  }
  bool supports(Op op, DType d) const override {
    switch (op) {
      case Op::memory:
        return true;
      case Op::gemm:
        return d == DType::f32 || d == DType::f64 ||
               ((d == DType::bf16 || d == DType::f16) && props_.major >= 8);
      case Op::elementwise:
      case Op::layout:
      case Op::dropout:
      case Op::cell:
      case Op::embedding:
      case Op::adapter:
      case Op::loss:
      case Op::optimizer:
      case Op::norm:
      case Op::activation:
      case Op::attention:
      case Op::decoder:
        return d == DType::f32 || d == DType::f64;
    }
    return false;
  }

  // Memory: stream-ordered, zeroed on the stream before any op that follows can read it. While a
  // step is captured, other threads (the loader's) wait: their work on the stream would join it.
  void* alloc(size_t bytes) override {
    refuse_in_capture("an allocation of " + std::to_string(bytes) + " bytes");
    std::lock_guard<std::mutex> gate(gate_);
    on_device();
    ++epoch_;
    void* p = nullptr;
    check_cuda(cudaMallocAsync(&p, std::max<size_t>(bytes, 1), stream()),
               "out of device memory allocating " + std::to_string(bytes) + " bytes");
    check_cuda(cudaMemsetAsync(p, 0, bytes, stream()), "cudaMemsetAsync");
    return p;
  }
  // Never throws: it runs in destructors, also after a device error, which every later call
  // returns again (the op that failed has reported it). Inside a capture, freed after it.
  void free(void* p) override {
    if (!p) return;
    if (capturing_here()) {
      deferred_frees_.push_back(p);
      return;
    }
    std::lock_guard<std::mutex> gate(gate_);
    on_device();
    ++epoch_;
    cudaFreeAsync(p, stream());
  }

  // Capture: the gate held throughout, so that only this thread's ops reach the stream.
  bool captures() const override { return true; }
  void begin_capture() override {
    refuse_in_capture("a capture");
    gate_.lock();
    const cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      gate_.unlock();
      check_cuda(e, "beginning the capture of a training step");
    }
    capture_thread_ = std::this_thread::get_id();
    capturing_ = true;
  }
  std::unique_ptr<StepGraph> end_capture() override {
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    const bool freed = !deferred_frees_.empty();
    finish_capture();
    if (e != cudaSuccess || freed) {
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      fail("cuda: the training step could not be captured: ",
           freed ? "it frees memory" : cudaGetErrorName(e));
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check_cuda(instantiated, "instantiating the training step's graph");
    return std::make_unique<Graph>(exec, stream_);
  }
  void abort_capture() noexcept override {
    if (!capturing_) return;
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    finish_capture();
  }
  uint64_t memory_epoch() const override { return epoch_.load(); }

  // Independent op sequences (a bidirectional layer's directions, a wavefront's layers) run on
  // streams of their own, lanes forked from the backend's stream and joined back to it; the
  // workers' host code runs in turn on the calling thread, enqueueing each one's ops on its lane.
  // Lanes have their own scratch and cuBLASLt workspace, so that ops on two never share memory.
  int concurrency() const override { return kLanes; }
  void run_concurrently(int n, const std::function<void(int)>& fn) override {
    SF_CHECK(n >= 1 && n <= kLanes, "cuda: run_concurrently(", n, ") with ", kLanes, " streams");
    SF_CHECK(lane_owner_ != this, "cuda: run_concurrently inside run_concurrently");
    on_device();
    make_lanes(n);
    check_cuda(cudaEventRecord(forked_, stream_), "fork of concurrent ops");
    for (int j = 0; j < n; ++j) {
      check_cuda(cudaStreamWaitEvent(lanes_[j].stream, forked_, 0), "fork of concurrent ops");
      lanes_[j].signals = 0;
    }
    std::exception_ptr error;
    lane_owner_ = this;
    for (int j = 0; j < n && !error; ++j) {
      lane_index_ = j;
      try {
        fn(j);
      } catch (...) {
        error = std::current_exception();
      }
    }
    lane_owner_ = nullptr;
    // Joined also after an error, so that the stream stays ordered; the last lane first, so that
    // on the emulated GPU (which runs a stream's work when another waits for it) a worker's ops
    // run before those of the workers it should have waited for, where it did not.
    for (int j = n - 1; j >= 0; --j) {
      cudaEventRecord(lanes_[j].finished, lanes_[j].stream);
      cudaStreamWaitEvent(stream_, lanes_[j].finished, 0);
    }
    if (error) std::rethrow_exception(error);
    check_cuda(cudaGetLastError(), "join of concurrent ops");
  }
  void signal_worker() override {
    SF_CHECK(lane_owner_ == this, "cuda: signal_worker outside run_concurrently");
    Lane& lane = lanes_[lane_index_];
    if (lane.signals == static_cast<int64_t>(lane.marks.size())) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      lane.marks.push_back(e);
    }
    check_cuda(cudaEventRecord(lane.marks[lane.signals++], lane.stream), "signal_worker");
  }
  void wait_for_worker(int worker, int64_t marks) override {
    SF_CHECK(lane_owner_ == this && worker >= 0 && worker < lane_index_, "cuda: worker ",
             lane_index_, " waits for worker ", worker,
             " (a worker waits for workers before it, inside run_concurrently)");
    const Lane& from = lanes_[worker];
    SF_CHECK(marks <= from.signals, "cuda: worker ", lane_index_, " waits for mark ", marks,
             " of worker ", worker, ", which made ", from.signals);
    if (marks > 0)
      check_cuda(cudaStreamWaitEvent(lanes_[lane_index_].stream, from.marks[marks - 1], 0),
                 "wait_for_worker");
  }
  void copy(Tensor dst, Tensor src) override {
    SF_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), dst.shape().str(), " <- ",
             src.shape().str());
    if (dst.nbytes())
      check_cuda(
          cudaMemcpyAsync(dst.data(), src.data(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream()),
          "copy");
  }
  void fill(Tensor dst, double value) override {
    cuda::fill(dst.data(), dst.dtype(), dst.numel(), value, stream());
    launched("fill", dst);
  }
  void convert(Tensor dst, Tensor src) override {
    SF_CHECK(dst.numel() == src.numel(), dst.shape().str(), " <- ", src.shape().str());
    if (dst.dtype() == src.dtype()) return copy(dst, src);
    cuda::convert(dst.data(), dst.dtype(), src.data(), src.dtype(), src.numel(), stream());
    launched("convert", dst);
  }
  // Waits for the ops before, then raises what their kernels reported (a bad id or target).
  void synchronize() override {
    refuse_in_capture("a synchronisation");
    check_cuda(cudaMemcpyAsync(host_reports_, reports_, sizeof host_reports_,
                               cudaMemcpyDeviceToHost, stream()),
               "read-back of the kernels' reports");
    check_cuda(cudaStreamSynchronize(stream()), "synchronize");
    raise_reports();
  }

  // Uploads run on the copy stream (the loader's workers call this while a step runs): each
  // copy waits for the ops enqueued before it (which may still read the batch slot it refills),
  // and the ops enqueued after it wait for the copy. The host buffer may be reused on return.
  void upload(Tensor dst, const void* host) override {
    if (!dst.nbytes()) return;
    const std::string what = "upload of " + dst.shape().str();
    refuse_in_capture("an " + what);
    std::lock_guard<std::mutex> gate(gate_);
    on_device();
    check_cuda(cudaEventRecord(compute_mark_, stream()), what);
    check_cuda(cudaStreamWaitEvent(copy_stream_, compute_mark_, 0), what);
    check_cuda(
        cudaMemcpyAsync(dst.data(), host, dst.nbytes(), cudaMemcpyHostToDevice, copy_stream_),
        what);
    check_cuda(cudaEventRecord(copied_, copy_stream_), what);
    check_cuda(cudaStreamWaitEvent(stream(), copied_, 0), what);
    check_cuda(cudaEventSynchronize(copied_), what);
  }
  // Page-locked: the copy engine reads it directly. Allocating and freeing it synchronise the
  // device, which would break a capture in progress: they wait for it, as uploads do.
  void* alloc_host(size_t bytes) override {
    const std::string what = "page-locked allocation of " + std::to_string(bytes) + " bytes";
    refuse_in_capture("a " + what);
    std::lock_guard<std::mutex> gate(gate_);
    on_device();
    void* p = nullptr;
    check_cuda(cudaMallocHost(&p, std::max<size_t>(bytes, 1)), "out of memory: " + what);
    return p;
  }
  void free_host(void* p) override {
    if (!p) return;
    if (capturing_here()) {
      deferred_host_frees_.push_back(p);
      return;
    }
    std::lock_guard<std::mutex> gate(gate_);
    on_device();
    cudaFreeHost(p);
  }
  void download(void* host, Tensor src) override {
    if (!src.nbytes()) return;
    refuse_in_capture("a download of " + src.shape().str());
    on_device();
    check_cuda(cudaMemcpyAsync(host, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, stream()),
               "download of " + src.shape().str());
    synchronize();
  }

  void sum_rows_acc(Tensor db, Tensor dy) override { sum_rows(db, dy, Tensor()); }
  void sum_rows_acc_and_convert(Tensor db, Tensor dy, Tensor dy_low) override {
    if (dy.dtype() != DType::f32 || (dy_low.dtype() != DType::bf16 && dy_low.dtype() != DType::f16))
      return Backend::sum_rows_acc_and_convert(db, dy, dy_low);
    SF_CHECK(dy_low.numel() == dy.numel(), dy_low.shape().str(), " <- ", dy.shape().str());
    sum_rows(db, dy, dy_low);
  }
  void add(Tensor y, Tensor x) override {
    SF_CHECK(y.numel() == x.numel(), y.shape().str(), " += ", x.shape().str());
    cuda::add(y.data(), x.data(), y.dtype(), y.numel(), stream());
    launched("add", y);
  }
  void mul(Tensor y, Tensor a, Tensor b) override {
    SF_CHECK(y.numel() == a.numel() && y.numel() == b.numel(), "mul sizes");
    cuda::mul(y.data(), a.data(), b.data(), y.dtype(), y.numel(), stream());
    launched("mul", y);
  }
  void dropout_mask(Tensor mask, double p, uint64_t seed) override {
    cuda::dropout_mask(mask.data(), mask.dtype(), mask.numel(), ref::uniform_below(p),
                       1.0 / (1.0 - p), seed, seed_base_, stream());
    launched("dropout_mask", mask);
  }
  void transpose01(Tensor dst, Tensor src) override {
    SF_CHECK(src.shape().rank() == 3 && dst.shape() == Shape({src.dim(1), src.dim(0), src.dim(2)}),
             dst.shape().str(), " <- transpose ", src.shape().str());
    cuda::transpose01(dst.data(), src.data(), src.dim(0), src.dim(1), src.dim(2),
                      dtype_size(src.dtype()), stream());
    launched("transpose01", src);
  }
  void copy_rows(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                 int64_t n, DType dtype) override {
    const size_t e = dtype_size(dtype);
    if (rows == 0 || n == 0) return;
    check_cuda(cudaMemcpy2DAsync(dst, ld_dst * e, src, ld_src * e, n * e, rows,
                                 cudaMemcpyDeviceToDevice, stream()),
               "copy_rows");
  }
  void copy_transposed(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                       int64_t cols, DType dtype) override {
    cuda::copy_transposed(dst, ld_dst, src, ld_src, rows, cols, dtype_size(dtype), stream());
    check_cuda(cudaGetLastError(), "copy_transposed");
  }

  void cell_forward(CellKind cell, const CellForward& a, DType dtype) override {
    cuda::cell_forward(cell, a, dtype, stream());
    check_cuda(cudaGetLastError(), std::string(cell_type(cell).name) + " cell forward");
  }
  // The bias gradient is the column sums of dgates (and of dgates_rec when apart), summed here;
  // a step that keeps only their bf16 copies writes them to scratch first.
  void cell_backward(CellKind cell, const CellBackward& a, DType dtype) override {
    const CellType& type = cell_type(cell);
    const int64_t GH = type.gates * a.hidden;
    const size_t bytes = static_cast<size_t>(a.batch * GH) * dtype_size(dtype);
    CellBackward p = a;
    if (!p.dgates) p.dgates = scratch(0, bytes);
    if (type.recurrent_grads && !p.dgates_rec) p.dgates_rec = scratch(1, bytes);
    const int64_t bias_columns = bias_grad_columns(type, a.hidden);
    void* rows = cell == CellKind::lnlstm
                     ? scratch(2, static_cast<size_t>(a.batch * bias_columns) * dtype_size(dtype))
                     : nullptr;
    cuda::cell_backward(cell, p, rows, dtype, stream());
    if (p.dbias && rows) {
      cuda::sum_rows_acc(p.dbias, rows, dtype, a.batch, bias_columns, stream());
    } else if (p.dbias) {
      cuda::sum_rows_acc(p.dbias, p.dgates, dtype, a.batch, GH, stream());
      if (type.recurrent_grads)
        cuda::sum_rows_acc(static_cast<char*>(p.dbias) + GH * dtype_size(dtype), p.dgates_rec,
                           dtype, a.batch, GH, stream());
    }
    check_cuda(cudaGetLastError(), std::string(type.name) + " cell backward");
  }
  // A chain's recurrence in one cooperative launch, its blocks waiting for each other between
  // steps (recurrence.cuh): no launch per step. A GPU without cooperative launches takes the
  // steps. A stack's two layers share a launch where that keeps, or does not cost, their
  // weights' residence; else the Backend's definition runs them a layer at a time (each through
  // here).
  bool fuses_recurrence(CellKind cell) const override {
    return cooperative_ && (cell == CellKind::lstm || cell == CellKind::gru);
  }
  void recurrence_forward(CellKind cell, std::span<const RecurrenceForward> chains,
                          DType dtype) override {
    if (!fuses_recurrence(cell) || (is_stack(chains) && !stack_together(cell, chains, dtype)))
      return Backend::recurrence_forward(cell, chains, dtype);
    if (chains.empty()) return;
    cuda::recurrence_forward(
        cell, chains, dtype,
        scratch(3, static_cast<size_t>(cuda::recurrence_progress_bytes(chains[0].cell.batch))),
        stream());
    check_cuda(cudaGetLastError(), std::string(cell_type(cell).name) + " recurrence forward");
  }
  void recurrence_backward(CellKind cell, std::span<const RecurrenceBackward> chains,
                           DType dtype) override {
    if (!fuses_recurrence(cell) || (is_stack(chains) && !stack_together(cell, chains, dtype)))
      return Backend::recurrence_backward(cell, chains, dtype);
    if (chains.empty()) return;
    const CellType& type = cell_type(cell);
    const RecurrenceBackward& a = chains.front();
    const int64_t GH = type.gates * a.cell.hidden, size = dtype_size(dtype);
    const int64_t together =
        std::min<int64_t>(static_cast<int64_t>(chains.size()), cuda::recurrence_chains_together);
    auto per_chain = [&](int slot, int64_t elements) {
      return scratch(slot, static_cast<size_t>(together * elements * size));
    };
    bool own_dgates = false, own_drec = false;
    for (const RecurrenceBackward& c : chains) {
      own_dgates |= !c.cell.dgates;
      own_drec |= type.recurrent_grads && !c.cell.dgates_rec;
    }
    void* dgates = own_dgates ? per_chain(0, a.cell.batch * GH) : nullptr;
    void* drec = own_drec ? per_chain(1, a.cell.batch * GH) : nullptr;
    void* rows = a.cell.dbias ? per_chain(2, cuda::recurrence_bias_rows(a.cell.batch) *
                                                 bias_grad_columns(type, a.cell.hidden))
                              : nullptr;
    void* progress = scratch(3, static_cast<size_t>(cuda::recurrence_progress_bytes(a.cell.batch)));
    cuda::recurrence_backward(cell, chains, dgates, drec, rows, progress, dtype, stream());
    check_cuda(cudaGetLastError(), std::string(type.name) + " recurrence backward");
  }
  template <typename Chain>
  bool stack_together(CellKind cell, std::span<const Chain> chains, DType dtype) const {
    constexpr bool backward = std::is_same_v<Chain, RecurrenceBackward>;
    if (chains[0].steps == 0 || chains[0].cell.batch == 0) return true;
    return cuda::recurrence_stack_together(cell, chains[0].cell.batch, chains[0].cell.hidden, dtype,
                                           backward);
  }
  // A bad id is reported at the next synchronisation (raise_reports).
  void embedding_forward(Tensor out, Tensor table, Tensor ids) override {
    const int64_t vocab = table.dim(0), e = table.dim(1);
    SF_CHECK(out.numel() == ids.numel() * e, "embedding: ", out.shape().str(), " for ", ids.numel(),
             " ids of width ", e);
    cuda::embedding_forward(out.data(), table.data(), ids.data(), ids.dtype(), table.dtype(),
                            ids.numel(), e, vocab, reports_, stream());
    launched("embedding_forward", out);
  }
  void embedding_backward(Tensor dtable, Tensor dout, Tensor ids) override {
    const int64_t n = ids.numel();
    auto* keys = static_cast<uint64_t*>(
        scratch(0, static_cast<size_t>(cuda::embedding_sort_keys(n)) * sizeof(uint64_t)));
    cuda::embedding_backward(dtable.data(), dout.data(), ids.data(), ids.dtype(), dtable.dtype(), n,
                             dtable.dim(1), dtable.dim(0), keys, stream());
    launched("embedding_backward", dtable);
  }
  void layer_norm_forward(Tensor y, Tensor saved, Tensor x, Tensor w, Tensor b,
                          double eps) override {
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(y.numel() == x.numel() && saved.numel() == 2 * N && w.numel() == C && b.numel() == C,
             "layer_norm_forward shapes");
    cuda::layer_norm_forward(y.data(), y.dtype(), saved.data(), x.data(), w.data(), b.data(),
                             x.dtype(), N, C, eps, stream());
    launched("layer_norm_forward", x);
  }
  void layer_norm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w,
                           Tensor saved, Tensor residual) override {
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(dx.numel() == x.numel() && dy.numel() == x.numel() && dw.numel() == C &&
                 db.numel() == C && saved.numel() == 2 * N &&
                 (residual.empty() || residual.numel() == x.numel()),
             "layer_norm_backward shapes");
    const size_t partial = static_cast<size_t>(2 * cuda::layer_norm_partial_chunks(N) * C);
    cuda::layer_norm_backward(dx.data(), dw.data(), db.data(), residual.data(), dy.data(), x.data(),
                              w.data(), saved.data(), static_cast<double*>(scratch(0, partial * 8)),
                              x.dtype(), N, C, stream());
    launched("layer_norm_backward", x);
  }
  void rms_norm_forward(Tensor y, Tensor saved, Tensor x, Tensor w, double offset,
                        double eps) override {
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(
        y.numel() == x.numel() && saved.numel() == N && w.numel() == C && y.dtype() == x.dtype(),
        "rms_norm_forward shapes");
    cuda::rms_norm_forward(y.data(), saved.data(), x.data(), w.data(), offset, x.dtype(), N, C, eps,
                           stream());
    launched("rms_norm_forward", x);
  }
  void rms_norm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, double offset,
                         Tensor saved, Tensor residual) override {
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(dx.numel() == x.numel() && dy.numel() == x.numel() && saved.numel() == N &&
                 w.numel() == C && dw.numel() == C &&
                 (residual.empty() || residual.numel() == x.numel()),
             "rms_norm_backward shapes");
    const size_t partial = static_cast<size_t>(cuda::layer_norm_partial_chunks(N) * C);
    cuda::rms_norm_backward(dx.data(), dw.data(), residual.data(), dy.data(), x.data(), w.data(),
                            offset, saved.data(), static_cast<double*>(scratch(0, partial * 8)),
                            x.dtype(), N, C, stream());
    launched("rms_norm_backward", x);
  }
  void rotary(const Rotary& a, DType dtype) override {
    cuda::rotary(a, dtype, stream());
    launched("rotary", Tensor(nullptr, dtype, {a.rows, a.heads, a.head_dim}));
  }
  void soft_cap_forward(Tensor y, Tensor x, double cap) override {
    SF_CHECK(y.numel() == x.numel() && cap > 0, "soft_cap_forward sizes or cap ", cap);
    cuda::soft_cap_forward(y.data(), x.data(), cap, y.dtype(), y.numel(), stream());
    launched("soft_cap_forward", y);
  }
  void soft_cap_backward(Tensor dx, Tensor dy, Tensor y, double cap) override {
    SF_CHECK(dx.numel() == dy.numel() && y.numel() == dy.numel() && cap > 0,
             "soft_cap_backward sizes or cap ", cap);
    cuda::soft_cap_backward(dx.data(), dy.data(), y.data(), cap, dy.dtype(), dy.numel(), stream());
    launched("soft_cap_backward", dy);
  }
  void glu_forward(Tensor y, Tensor gate, Tensor up, GluKind kind,
                   const GluAffine& affine) override {
    const cuda::GluColumns cols = glu_columns(gate, affine);
    SF_CHECK(y.numel() == gate.numel() && up.numel() == gate.numel(), "glu_forward sizes");
    cuda::glu_forward(y.data(), gate.data(), up.data(), cols, kind, y.dtype(), y.numel(), stream());
    launched("glu_forward", y);
  }
  void glu_backward(Tensor dgate, Tensor dup, Tensor dy, Tensor gate, Tensor up, GluKind kind,
                    const GluAffine& affine) override {
    const cuda::GluColumns cols = glu_columns(gate, affine);
    SF_CHECK(dgate.numel() == dy.numel() && dup.numel() == dy.numel() &&
                 gate.numel() == dy.numel() && up.numel() == dy.numel(),
             "glu_backward sizes");
    const int64_t rows = cols.C ? dy.numel() / cols.C : 0;
    const size_t partial = static_cast<size_t>(2 * cuda::layer_norm_partial_chunks(rows) * cols.C);
    cuda::glu_backward(dgate.data(), dup.data(), dy.data(), gate.data(), up.data(), cols, kind,
                       static_cast<double*>(scratch(0, partial * 8)), dy.dtype(), dy.numel(),
                       stream());
    launched("glu_backward", dy);
  }
  void gelu_forward(Tensor y, Tensor x, const ColumnMap& map) override {
    SF_CHECK(y.numel() == x.numel(), "gelu sizes");
    cuda::gelu_forward(y.data(), y.dtype(), x.data(), map.scale.data(), map.bias.data(), x.dtype(),
                       x.numel(), map.width(x), stream());
    launched("gelu_forward", x);
  }
  void gelu_backward(Tensor dx, Tensor dy, Tensor x, const ColumnMap& map) override {
    SF_CHECK(dx.numel() == x.numel() && dy.numel() == x.numel(), "gelu sizes");
    const int64_t C = map.width(x), rows = C ? x.numel() / C : 0;
    const size_t partial =
        map.dscale.empty() ? 0 : static_cast<size_t>(cuda::layer_norm_partial_chunks(rows) * C);
    cuda::gelu_backward(dx.data(), map.dscale.data(), dy.data(), x.data(), map.scale.data(),
                        map.bias.data(), static_cast<double*>(scratch(0, partial * 8)), x.dtype(),
                        x.numel(), C, stream());
    launched("gelu_backward", x);
  }
  void run_scale_columns(Tensor y, int64_t ldy, const void* addend, Tensor x, Tensor s,
                         Tensor b) override {
    const int64_t C = s.numel();
    SF_CHECK(
        y.numel() == x.numel() && x.numel() % C == 0 && (b.empty() || b.numel() == C) && ldy >= C,
        "scale_columns shapes");
    cuda::scale_columns(y.data(), ldy, addend, x.data(), s.data(), b.empty() ? nullptr : b.data(),
                        x.dtype(), x.numel() / C, C, stream());
    launched("scale_columns", x);
  }
  void dora_norm(Tensor scale, Tensor inv_norm, Tensor v, Tensor m) override {
    const int64_t R = m.numel();
    SF_CHECK(scale.numel() == R && inv_norm.numel() == R && v.numel() % R == 0, "dora_norm shapes");
    cuda::dora_norm(scale.data(), inv_norm.data(), v.data(), m.data(), v.dtype(), R, v.numel() / R,
                    stream());
    launched("dora_norm", v);
  }
  void run_dora_backward(Tensor dpre, Tensor dm, Tensor dy, int64_t ldy, Tensor pre, Tensor scale,
                         Tensor inv_norm) override {
    const int64_t C = scale.numel();
    SF_CHECK(dpre.numel() == dy.numel() && pre.numel() == dy.numel() && dy.numel() % C == 0 &&
                 dm.numel() == C && inv_norm.numel() == C && ldy >= C,
             "dora_backward shapes");
    const int64_t rows = dy.numel() / C;
    const size_t partial = static_cast<size_t>(cuda::layer_norm_partial_chunks(rows) * C);
    cuda::dora_backward(dpre.data(), dm.data(), dy.data(), ldy, pre.data(), scale.data(),
                        inv_norm.data(), static_cast<double*>(scratch(0, partial * 8)), dy.dtype(),
                        rows, C, stream());
    launched("dora_backward", dy);
  }
  void attention_forward(const AttentionForward& given, DType dtype) override {
    kernels::check_attention_shape(given.shape);
    SF_CHECK(given.first_row >= 0 && given.first_row <= given.shape.seq, "attention first row ",
             given.first_row, " of ", given.shape.seq);
    AttentionForward a = given;
    a.shape.seed_base = seed_base_;
    const cuda::AttentionKernels kernels = attention_checks_.kernels(a.shape, dtype);
    cuda::attention_forward(a, dtype, kernels, stream());
    launched("attention_forward", attention_shape(a.shape, dtype));
    const std::string kind = unchecked_attention("forward", kernels, a.shape, dtype, a.first_row);
    if (kind.empty() ||
        attention_checks_.agrees(kind, kernels,
                                 cuda::check_attention_forward(a, dtype, kernels, stream())))
      return;
    attention_forward(given, dtype);  // on the tiles
  }
  void attention_backward(const AttentionBackward& given, DType dtype) override {
    kernels::check_attention_shape(given.shape);
    AttentionBackward a = given;
    a.shape.seed_base = seed_base_;
    const AttentionShape& s = a.shape;
    const cuda::AttentionKernels kernels = attention_checks_.kernels(s, dtype);
    const size_t head_rows_bytes =
        static_cast<size_t>(s.batch * s.heads * s.seq) * dtype_size(dtype);
    cuda::attention_backward(a, scratch(0, head_rows_bytes), dtype, kernels, stream());
    launched("attention_backward", attention_shape(s, dtype));
    const std::string kind = unchecked_attention("backward", kernels, s, dtype, 0);
    if (kind.empty() ||
        attention_checks_.agrees(kind, kernels,
                                 cuda::check_attention_backward(a, dtype, kernels, stream())))
      return;
    // On the tiles, from a forward of their own: the probabilities are recomputed from the lse,
    // which came from the tensor cores' products.
    AttentionForward f{
        .shape = given.shape,
        .qkv = given.qkv,
        .lengths = given.lengths,
        .out = scratch(
            1, static_cast<size_t>(s.batch * s.seq * s.heads * s.head_dim) * dtype_size(dtype)),
        .lse = scratch(2, head_rows_bytes)};
    attention_forward(f, dtype);
    AttentionBackward again = given;
    again.out = f.out;
    again.lse = f.lse;
    attention_backward(again, dtype);
  }

  // The losses and the sum of squares stay on the device: nothing is read back here.
  void regression_loss(const RegressionLoss& kind, Tensor pred, Tensor target, Tensor mask,
                       Tensor dpred, Tensor loss) override {
    SF_CHECK(pred.numel() == target.numel() && pred.numel() == dpred.numel(), "loss: prediction ",
             pred.shape().str(), " vs target ", target.shape().str());
    const int64_t rows = rows_of(pred), f = pred.numel() / std::max<int64_t>(rows, 1);
    SF_CHECK(mask.empty() || mask.numel() == rows, "mse mask ", mask.shape().str(), " for ", rows,
             " rows");
    cuda::regression_loss(kind, pred.data(), target.data(), mask.empty() ? nullptr : mask.data(),
                          dpred.data(), pred.dtype(), rows, f, reduction("regression_loss"),
                          partials_, stream());
    cuda::mean(scalar_out(loss), scratch_, double(f), stream());
    launched("regression_loss", pred);
  }
  // A target out of range is reported at the next synchronisation (raise_reports).
  void cross_entropy_loss(Tensor logits, Tensor targets, Tensor weights, int64_t ignore_index,
                          Tensor dlogits, Tensor loss) override {
    const int64_t rows = logits.dim(0), classes = logits.dim(1);
    SF_CHECK(targets.numel() == rows, "cross-entropy: ", rows, " rows of logits, ", targets.numel(),
             " targets");
    SF_CHECK(weights.empty() || weights.numel() == classes, "class weights ", weights.shape().str(),
             " for ", classes, " classes");
    cuda::cross_entropy_loss(logits.data(), targets.data(), targets.dtype(),
                             weights.empty() ? nullptr : weights.data(), ignore_index,
                             dlogits.data(), logits.dtype(), rows, classes,
                             reduction("cross_entropy_loss"), partials_, reports_, stream());
    cuda::mean(scalar_out(loss), scratch_, 1.0, stream());
    launched("cross_entropy_loss", logits);
  }
  void sum_squares(Tensor x, Tensor out) override {
    reduction("sum_squares");
    cuda::sum_squares(scalar_out(out), x.data(), x.dtype(), x.numel(), partials_, stream());
    launched("sum_squares", x);
  }
  void scale(Tensor x, double alpha) override {
    cuda::scale(x.data(), x.dtype(), x.numel(), alpha, stream());
    launched("scale", x);
  }
  void adam_step(Tensor params, Tensor grads, Tensor m, Tensor v, const AdamParams& p) override {
    cuda::adam_step(params.data(), grads.data(), m.data(), v.data(), params.dtype(), params.numel(),
                    p, stream());
    launched("adam_step", params);
  }
  void sgd_step(Tensor params, Tensor grads, Tensor momentum, const SgdParams& p) override {
    cuda::sgd_step(params.data(), grads.data(), momentum.empty() ? nullptr : momentum.data(),
                   params.dtype(), params.numel(), p, stream());
    launched("sgd_step", params);
  }
  // The first update (outside a capture) is checked against the reference on samples of every
  // segment (optimizer_agreement.hpp); a disagreement stops the run.
  void optimizer_step(const OptimizerStep& a, DType dtype) override {
    std::optional<cuda::OptimizerSample> sample;
    if (!optimizer_checked_ && !capturing_here() && lane_owner_ != this &&
        (dtype == DType::f32 || dtype == DType::f64) && a.segment_count > 0)
      sample.emplace(a, dtype, stream());
    cuda::optimizer_step(a, dtype, stream());
    launched("optimizer_step", Tensor(a.params, dtype, {a.grad_elements}));
    if (!sample) return;
    optimizer_checked_ = true;
    const std::string wrong = sample->disagreement();
    if (wrong.empty()) {
      if (autotune::verbose())
        std::fprintf(stderr,
                     "seqforge: cuda: the optimizer's update agrees with the reference on %lld "
                     "sampled values of %lld segments\n",
                     static_cast<long long>(sample->samples()),
                     static_cast<long long>(a.segment_count));
      return;
    }
    fail("cuda: the optimizer's update disagrees with the reference on this device (", wrong,
         "). This is a defect: please report it with the output of `seqforge diagnose`, and "
         "train on the CPU (train.device: cpu) until it is fixed");
  }

  // NCCL, one GPU per process.
  std::string collectives_unavailable() override {
    if (const char* v = std::getenv("SEQFORGE_NCCL"); v && std::string_view(v) == "0")
      return "SEQFORGE_NCCL=0";
    std::string why;
    if (!nccl_) nccl_ = cuda::Nccl::load(&why);
    return why;
  }
  uint64_t device_identity() const override {
    return (uint64_t(props_.pciDomainID) << 16 | uint64_t(props_.pciBusID) << 8 |
            uint64_t(props_.pciDeviceID)) +
           1;
  }
  void join_collectives(const HostCollectives& host) override {
    SF_CHECK(nccl_, "cuda: join_collectives before collectives_unavailable");
    on_device();  // a communicator belongs to the device current where it is made
    std::array<std::byte, cuda::Nccl::kIdBytes> id{};
    if (host.rank == 0) nccl_->unique_id(id);
    host.broadcast(id);
    nccl_->join(host.rank, host.size, id);
    joined_ = true;
  }
  void all_reduce_sum(Tensor x) override {
    SF_CHECK(joined_, "cuda: all_reduce_sum before join_collectives");
    SF_CHECK(x.dtype() == DType::f32, "cuda: all_reduce_sum of ", dtype_name(x.dtype()));
    on_device();
    nccl_->all_reduce_sum(static_cast<float*>(x.data()), size_t(x.numel()), stream());
    launched("all_reduce_sum", x);
  }
  std::string collectives_name() const override {
    return joined_ ? "NCCL " + nccl_->version() + " on the GPUs" : "";
  }

 protected:
  void run_gemm(const GemmShape& s, DType dtype, const void* a, const void* b, void* c,
                const void* bias) override {
    if (s.m == 0 || s.n == 0) return;
    if (s.k == 0) {  // no products: cuBLASLt takes no empty operand
      cuda::gemm_without_k(c, s.ldc, s.m, s.n, s.beta, bias,
                           dtype == DType::f64 ? DType::f64 : DType::f32, stream());
      return check_cuda(cudaGetLastError(), "gemm");
    }
    // cuBLASLt's bias epilogue is not offered in f64, and a call it has no algorithm for
    // (operands aligned to less than its kernels need) may have one without the epilogue: the
    // bias is then added after. With none at all, the GEMM is our own (slow) kernel. Its
    // alignment preferences cover the operands only, and an epilogue kernel may read the bias
    // in 16-byte vectors (a misaligned address kills the context): a bias aligned to less goes
    // after the GEMM.
    const bool tf32 = tf32_ && dtype == DType::f32;
    const bool epilogue =
        bias && dtype != DType::f64 && reinterpret_cast<uintptr_t>(bias) % 16 == 0;
    void* workspace = lane_owner_ == this ? lanes_[lane_index_].workspace : nullptr;
    if (epilogue && blas_->gemm(s, dtype, a, b, c, bias, tf32, stream(), workspace))
      return check_cuda(cudaGetLastError(), "gemm");
    if (blas_->gemm(s, dtype, a, b, c, nullptr, tf32, stream(), workspace)) {
      if (bias)
        cuda::add_bias_rows(c, s.ldc, bias, dtype == DType::f64 ? DType::f64 : DType::f32, s.m, s.n,
                            stream());
    } else {
      cuda::gemm_fallback(s, dtype, a, b, c, bias, stream());
    }
    check_cuda(cudaGetLastError(), "gemm");
  }

 private:
  // A replayable training step: the instantiated graph, launched on the backend's stream.
  class Graph final : public StepGraph {
   public:
    Graph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
    ~Graph() override { cudaGraphExecDestroy(exec_); }
    void replay() override {
      check_cuda(cudaGraphLaunch(exec_, stream_), "replay of the training step's graph");
    }

   private:
    cudaGraphExec_t exec_;
    cudaStream_t stream_;
  };
  static constexpr int kLanes = 4, kScratchSlots = 4;
  struct Lane {
    cudaStream_t stream = nullptr;
    cudaEvent_t finished = nullptr;  // the worker's last op, for the join
    std::vector<cudaEvent_t> marks;  // signal_worker's, in order
    int64_t signals = 0;             // marks recorded in this run_concurrently
    void* workspace = nullptr;       // cuBLASLt's
    std::pair<void*, size_t> scratch[kScratchSlots] = {};
  };
  // The calling thread's lane (inside run_concurrently) is lanes_[lane_index_] of lane_owner_.
  static inline thread_local const CudaBackend* lane_owner_ = nullptr;
  static inline thread_local int lane_index_ = 0;
  cudaStream_t stream() const { return lane_owner_ == this ? lanes_[lane_index_].stream : stream_; }
  // Lanes 0 .. n-1, each made on first use: never inside a capture (a workspace is allocated).
  void make_lanes(int n) {
    if (forked_ && lanes_[n - 1].workspace) return;
    refuse_in_capture("a first use of " + std::to_string(n) + " concurrent streams");
    if (!forked_)
      check_cuda(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming), "cudaEventCreate");
    for (int j = 0; j < n; ++j) {
      Lane& lane = lanes_[j];
      if (!lane.stream)
        check_cuda(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking),
                   "cudaStreamCreate (a lane)");
      if (!lane.finished)
        check_cuda(cudaEventCreateWithFlags(&lane.finished, cudaEventDisableTiming),
                   "cudaEventCreate");
      if (!lane.workspace)
        check_cuda(cudaMalloc(&lane.workspace, blas_->workspace_bytes()),
                   "out of device memory for a stream's cuBLASLt workspace");
    }
  }
  // The scratch of the losses and reductions, which are the backend stream's alone.
  double* reduction(const char* op) const {
    SF_CHECK(lane_owner_ != this, "cuda: ", op, " inside run_concurrently");
    return scratch_;
  }
  bool capturing_here() const {
    return capturing_ && capture_thread_ == std::this_thread::get_id();
  }
  void refuse_in_capture(const std::string& what) const {
    if (capturing_here()) fail("cuda: ", what, " inside a captured training step");
  }
  void finish_capture() noexcept {
    capturing_ = false;
    gate_.unlock();
    for (void* p : std::exchange(deferred_frees_, {})) free(p);
    for (void* p : std::exchange(deferred_host_frees_, {})) free_host(p);
  }

  // The kind of an attention call to check against the reference (attention_agreement.hpp):
  // none inside a capture or a lane, which cannot wait for the device.
  std::string unchecked_attention(const char* pass, cuda::AttentionKernels kernels,
                                  const AttentionShape& s, DType dtype, int64_t first_row) const {
    if (capturing_here() || lane_owner_ == this) return "";
    return attention_checks_.unchecked(pass, kernels, s, dtype, first_row);
  }
  // (B, T, heads, head_dim), to name attention's shape.
  static Tensor attention_shape(const AttentionShape& s, DType dtype) {
    return Tensor(nullptr, dtype, {s.batch, s.seq, s.heads, s.head_dim});
  }
  // A launch error names the op and the shape.
  void launched(const char* op, Tensor t) {
    check_cuda(cudaGetLastError(), std::string(op) + " on " + t.shape().str() + " " +
                                       std::string(dtype_name(t.dtype())));
  }
  // One f64 of device memory for a reduction's result.
  static double* scalar_out(Tensor t) {
    SF_CHECK(t.dtype() == DType::f64 && t.numel() == 1, "a scalar result goes to one f64, got ",
             dtype_name(t.dtype()), " ", t.shape().str());
    return static_cast<double*>(t.data());
  }
  // What the kernels reported since the last synchronisation, as the CPU backends' errors; the
  // reports are reset first, so that the backend stays usable after the error.
  void raise_reports() {
    const uint64_t none = UINT64_MAX;
    using namespace cuda;
    if (host_reports_[kReportIndex] == none) return;
    uint64_t r[kReportWords];
    std::copy(std::begin(host_reports_), std::end(host_reports_), r);
    std::fill(std::begin(host_reports_), std::end(host_reports_), none);
    cudaMemsetAsync(reports_, 0xff, sizeof host_reports_, stream());
    const int64_t value = static_cast<int64_t>(r[kReportValue]);
    const uint64_t index = r[kReportIndex] & ~kResolvedReport;
    const int64_t bound = static_cast<int64_t>(r[kReportBound]);
    if (r[kReportKind] == kBadTokenId)
      fail("token id ", value, " at position ", index, " outside [0, ", bound, ")");
    fail("target class ", value, " at row ", index, " outside [0, ", bound, ")");
  }
  // The calling thread works on this backend's GPU: the current device is per thread, and the
  // loader's workers allocate, upload and free here as well.
  void on_device() const {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != device_) cudaSetDevice(device_);
  }
  // A process of a job that a launcher started on this machine (mpirun, srun) takes the GPU of
  // its local rank, so that the job's processes use one GPU each (modulo the GPUs there are).
  static void select_local_device() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) return;
    for (const char* key : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
      if (const char* v = std::getenv(key)) {
        char* end = nullptr;
        const long rank = std::strtol(v, &end, 10);
        if (end != v && *end == '\0' && rank >= 0)
          check_cuda(cudaSetDevice(int(rank % count)),
                     "cudaSetDevice (local rank " + std::string(v) + ")");
        return;
      }
  }
  void release() {
    nccl_.reset();
    for (auto& [ptr, size] : scratch_buffers_) free(ptr);
    for (Lane& lane : lanes_) {
      for (auto& [ptr, size] : lane.scratch) free(ptr);
      if (lane.stream) {
        cudaStreamSynchronize(lane.stream);
        cudaStreamDestroy(lane.stream);
      }
      if (lane.finished) cudaEventDestroy(lane.finished);
      for (cudaEvent_t e : lane.marks) cudaEventDestroy(e);
      if (lane.workspace) cudaFree(lane.workspace);
      lane = Lane{};
    }
    if (forked_) cudaEventDestroy(forked_);
    forked_ = nullptr;
    blas_.reset();
    if (scratch_) cudaFree(scratch_);
    if (partials_) cudaFree(partials_);
    if (reports_) cudaFree(reports_);
    reports_ = nullptr;
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (copy_stream_) {
      cudaStreamSynchronize(copy_stream_);
      cudaStreamDestroy(copy_stream_);
    }
    if (compute_mark_) cudaEventDestroy(compute_mark_);
    if (copied_) cudaEventDestroy(copied_);
    copy_stream_ = nullptr;
    compute_mark_ = copied_ = nullptr;
    scratch_ = nullptr;
    partials_ = nullptr;
    stream_ = nullptr;
  }
  // db += column sums of dy over bands of rows in parallel, dy also written to low when given.
  void sum_rows(Tensor db, Tensor dy, Tensor low) {
    const int64_t rows = rows_of(dy), cols = dy.numel() / std::max<int64_t>(rows, 1);
    SF_CHECK(db.numel() == cols, db.shape().str(), " vs rows of ", dy.shape().str());
    const size_t partial = static_cast<size_t>(cuda::layer_norm_partial_chunks(rows) * cols);
    cuda::sum_rows_acc_banded(db.data(), dy.data(), dy.dtype(), rows, cols,
                              static_cast<double*>(scratch(0, partial * 8)),
                              low.empty() ? nullptr : low.data(), low.dtype(), stream());
    launched(low.empty() ? "sum_rows_acc" : "sum_rows_acc_and_convert", dy);
  }
  // Device scratch `slot` of at least `bytes` (the calling worker's lane's, or the stream's), kept
  // for later calls (freed in stream order).
  void* scratch(int slot, size_t bytes) {
    auto& [ptr, size] =
        (lane_owner_ == this ? lanes_[lane_index_].scratch : scratch_buffers_)[slot];
    if (size < bytes) {  // held by no one while alloc may throw (a capture, out of memory)
      size = 0;
      free(std::exchange(ptr, nullptr));
      ptr = alloc(bytes);
      size = bytes;
    }
    return ptr;
  }

  int device_ = 0;
  bool tf32_ = false;
  cudaDeviceProp props_{};
  bool cooperative_ = false;       // the GPU runs cooperative launches (the whole-chain kernels)
  cudaStream_t stream_ = nullptr;  // every op
  cudaStream_t copy_stream_ = nullptr;  // uploads
  cudaEvent_t compute_mark_ = nullptr, copied_ = nullptr;
  // Uploads, allocations and frees come from several threads (the loader's); the events are
  // shared, and a capture holds it so that no other thread's work joins the captured stream.
  std::mutex gate_;
  std::atomic<bool> capturing_{false};
  std::thread::id capture_thread_;
  std::vector<void*> deferred_frees_;       // freed inside a capture
  std::vector<void*> deferred_host_frees_;  // page-locked, freed inside a capture
  std::atomic<uint64_t> epoch_{0};          // allocations and frees so far
  double* scratch_ = nullptr;               // a loss's sum and denominator
  double* partials_ = nullptr;              // a reduction's block sums (cuda::kPartialBlocks + 1)
  // The first bad input the kernels found (cuda::kReport*: a token id or a target class, its
  // position, value and range); all ones while none.
  uint64_t* reports_ = nullptr;
  uint64_t host_reports_[cuda::kReportWords] = {UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX};
  std::pair<void*, size_t> scratch_buffers_[kScratchSlots] = {};
  std::array<Lane, kLanes> lanes_;
  cudaEvent_t forked_ = nullptr;  // the backend stream's ops before a fork
  std::unique_ptr<cuda::CublasLt> blas_;
  std::unique_ptr<cuda::Nccl> nccl_;  // loaded by collectives_unavailable
  bool joined_ = false;               // join_collectives ran
  cuda::AttentionChecks attention_checks_;
  bool optimizer_checked_ = false;  // its first update was checked
};

}  // namespace

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return std::string("no CUDA device: ") + cudaGetErrorName(e);
  }
  if (count == 0) return "no CUDA device: none found";
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (major < 8)  // the kernels are built for sm_80 and later
    return "no usable CUDA device: GPU " + std::to_string(device) + " is sm_" +
           std::to_string(major) + std::to_string(minor) +
           "; seqforge's kernels need sm_80 or later";
  return "";
}

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

bool cuda_free_memory(size_t* free, size_t* total) {
  return cuda_unavailable_reason().empty() && cudaMemGetInfo(free, total) == cudaSuccess;
}

std::string cuda_summary() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  auto version = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  };
  // cuDNN is not used by seqforge; its version says what PyTorch beside it would run on.
  std::string out =
      "runtime " + version(runtime) +
      (driver ? ", driver for CUDA " + version(driver) : ", no driver") + "; cuBLASLt " +
      cuda::library_version("libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR),
                            "cublasLtGetVersion", 10000, 100) +
      "; cuDNN " + cuda::library_version("libcudnn.so.9", "cudnnGetVersion", 10000, 100);
  std::string why_not_nccl;
  const std::unique_ptr<cuda::Nccl> nccl = cuda::Nccl::load(&why_not_nccl);
  out += "; NCCL " + (nccl ? nccl->version() : "not found (libnccl.so.2)");
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) return out + "; " + why;
  int count = 0, current = 0;
  cudaGetDeviceCount(&count);
  cudaGetDevice(&current);
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    size_t free_bytes = 0, total = 0;
    cudaGetDeviceProperties(&p, d);
    if (cudaSetDevice(d) == cudaSuccess) cudaMemGetInfo(&free_bytes, &total);
    out += "; GPU " + std::to_string(d) + ": " + p.name + " (sm_" + std::to_string(p.major) +
           std::to_string(p.minor) + ", " + std::to_string(p.totalGlobalMem >> 20) + " MiB, " +
           std::to_string(free_bytes >> 20) + " MiB free)";
  }
  cudaSetDevice(current);
  return out;
}

}  // namespace seqforge
