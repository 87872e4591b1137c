// The sealed backend: the reference kernels over memory the host cannot read or write outside
// the backend's own calls. Its memory is one reserved range of pages kept PROT_NONE; every call
// opens the used part for its duration. Host code that touches a tensor directly faults, and an
// op handed host memory (not the backend's) is an error naming the op, as on a device.
//
// sealed_async is the same with a GPU stream's timing: ops run later, in order, on a worker
// thread; an upload waits for the ops enqueued before it (which may still read what it
// overwrites) and copies at once, as the CUDA backend's copy stream does; download and
// synchronize wait for every op enqueued before them and raise the first error an op met since
// the last wait. Host code that relies on an op having run, or on an error coming out of the
// call that caused it, goes wrong there as it would on a GPU.
#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {
namespace {

class SealedBackend final : public Backend {
 public:
  explicit SealedBackend(bool async) : inner_(make_reference_backend()), async_(async) {
    base_ = static_cast<char*>(
        mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (base_ == MAP_FAILED) fail("sealed backend: cannot reserve ", kReserve >> 20, " MiB");
    if (async_) worker_ = std::thread([this] { work(); });
  }
  ~SealedBackend() override {
    if (async_) {
      {
        std::lock_guard lock(queue_mutex_);
        stopping_ = true;
      }
      queue_cv_.notify_all();
      worker_.join();
    }
    munmap(base_, kReserve);
  }

  std::string_view name() const override { return async_ ? "sealed_async" : "sealed"; }
  std::string description() const override {
    return async_ ? "sealed_async: reference kernels run later on a worker thread, memory closed "
                    "to the host outside backend calls"
                  : "sealed: reference kernels, memory closed to the host outside backend calls";
  }
  void synchronize() override { wait_for(enqueued()); }
  bool supports(Op op, DType d) const override { return inner_->supports(op, d); }

  // Fresh pages only (never reused), so every allocation is zeroed; free keeps the pages.
  void* alloc(size_t bytes) override {
    std::lock_guard lock(mutex_);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t rounded = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
    if (used_ + rounded > kReserve)
      fail("sealed backend: out of its ", kReserve >> 20, " MiB allocating ", bytes, " bytes");
    char* p = base_ + used_;
    used_ += rounded;
    if (open_ > 0) protect(p, rounded, PROT_READ | PROT_WRITE);
    return p;
  }
  void free(void* p) override { check(p, "free"); }

  void upload(Tensor dst, const void* host) override {
    check(dst.data(), "upload");
    wait_for(enqueued(), /*raise=*/false);
    Open o(*this);
    inner_->upload(dst, host);
  }
  void download(void* host, Tensor src) override {
    check(src.data(), "download");
    wait_for(enqueued());
    Open o(*this);
    inner_->download(host, src);
  }
  void copy(Tensor dst, Tensor src) override {
    call("copy", {dst, src}, {}, [=, this] { inner_->copy(dst, src); });
  }
  void fill(Tensor dst, double value) override {
    call("fill", {dst}, {}, [=, this] { inner_->fill(dst, value); });
  }
  void convert(Tensor dst, Tensor src) override {
    call("convert", {dst, src}, {}, [=, this] { inner_->convert(dst, src); });
  }
  void pack_b(const GemmShape& s, DType dtype, const void* b,
              std::unique_ptr<PackedB>* packed) override {
    check(b, "pack_b");
    wait_for(enqueued());  // its result is the host's
    Open o(*this);
    inner_->pack_b(s, dtype, b, packed);
  }
  void sum_rows_acc(Tensor db, Tensor dy) override {
    call("sum_rows_acc", {db, dy}, {}, [=, this] { inner_->sum_rows_acc(db, dy); });
  }
  void sum_rows_acc_and_convert(Tensor db, Tensor dy, Tensor dy_low) override {
    call("sum_rows_acc_and_convert", {db, dy, dy_low}, {},
         [=, this] { inner_->sum_rows_acc_and_convert(db, dy, dy_low); });
  }
  void add(Tensor y, Tensor x) override {
    call("add", {y, x}, {}, [=, this] { inner_->add(y, x); });
  }
  void mul(Tensor y, Tensor a, Tensor b) override {
    call("mul", {y, a, b}, {}, [=, this] { inner_->mul(y, a, b); });
  }
  void set_seed_base(const uint64_t* base) override {
    check(base, "set_seed_base");
    Backend::set_seed_base(base);
    inner_->set_seed_base(base);
  }
  void dropout_mask(Tensor mask, double p, uint64_t seed) override {
    call("dropout_mask", {mask}, {}, [=, this] { inner_->dropout_mask(mask, p, seed); });
  }
  void transpose01(Tensor dst, Tensor src) override {
    call("transpose01", {dst, src}, {}, [=, this] { inner_->transpose01(dst, src); });
  }
  void copy_rows(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                 int64_t n, DType dtype) override {
    call("copy_rows", {}, {dst, src},
         [=, this] { inner_->copy_rows(dst, ld_dst, src, ld_src, rows, n, dtype); });
  }
  void copy_transposed(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                       int64_t cols, DType dtype) override {
    call("copy_transposed", {}, {dst, src},
         [=, this] { inner_->copy_transposed(dst, ld_dst, src, ld_src, rows, cols, dtype); });
  }
  void cell_forward(CellKind cell, const CellForward& a, DType dtype) override {
    call("cell_forward", {},
         {a.gates, a.gates_low, a.gates_rec, a.bias_rec, a.h_prev, a.c_prev, a.c, a.saved, a.params,
          a.h, a.h_low, a.x, a.w_ih_t, a.bias},
         [=, this] { inner_->cell_forward(cell, a, dtype); });
  }
  void cell_backward(CellKind cell, const CellBackward& a, DType dtype) override {
    call("cell_backward", {},
         {a.gates, a.gates_low, a.c_prev, a.saved, a.params, a.h_prev, a.dh_out, a.dh_rec, a.dc,
          a.dgates, a.dgates_low, a.dgates_rec, a.dgates_rec_low, a.dh_direct, a.dbias},
         [=, this] { inner_->cell_backward(cell, a, dtype); });
  }
  void embedding_forward(Tensor out, Tensor table, Tensor ids) override {
    call("embedding_forward", {out, table, ids}, {},
         [=, this] { inner_->embedding_forward(out, table, ids); });
  }
  void embedding_backward(Tensor dtable, Tensor dout, Tensor ids) override {
    call("embedding_backward", {dtable, dout, ids}, {},
         [=, this] { inner_->embedding_backward(dtable, dout, ids); });
  }
  void layer_norm_forward(Tensor y, Tensor saved, Tensor x, Tensor w, Tensor b,
                          double eps) override {
    call("layer_norm_forward", {y, saved, x, w, b}, {},
         [=, this] { inner_->layer_norm_forward(y, saved, x, w, b, eps); });
  }
  void layer_norm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w,
                           Tensor saved, Tensor residual) override {
    call("layer_norm_backward", {dx, dw, db, dy, x, w, saved, residual}, {},
         [=, this] { inner_->layer_norm_backward(dx, dw, db, dy, x, w, saved, residual); });
  }
  void gelu_forward(Tensor y, Tensor x, const ColumnMap& map) override {
    call("gelu_forward", {y, x, map.scale, map.bias}, {},
         [=, this] { inner_->gelu_forward(y, x, map); });
  }
  void gelu_backward(Tensor dx, Tensor dy, Tensor x, const ColumnMap& map) override {
    call("gelu_backward", {dx, dy, x, map.scale, map.bias, map.dscale}, {},
         [=, this] { inner_->gelu_backward(dx, dy, x, map); });
  }
  void rms_norm_forward(Tensor y, Tensor saved, Tensor x, Tensor w, double offset,
                        double eps) override {
    call("rms_norm_forward", {y, saved, x, w}, {},
         [=, this] { inner_->rms_norm_forward(y, saved, x, w, offset, eps); });
  }
  void rms_norm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, double offset,
                         Tensor saved, Tensor residual) override {
    call("rms_norm_backward", {dx, dw, dy, x, w, saved, residual}, {},
         [=, this] { inner_->rms_norm_backward(dx, dw, dy, x, w, offset, saved, residual); });
  }
  void rotary(const Rotary& a, DType dtype) override {
    call("rotary", {}, {a.x, a.cos, a.sin}, [=, this] { inner_->rotary(a, dtype); });
  }
  void glu_forward(Tensor y, Tensor gate, Tensor up, GluKind kind,
                   const GluAffine& affine) override {
    call("glu_forward",
         {y, gate, up, affine.gate.scale, affine.gate.bias, affine.up.scale, affine.up.bias}, {},
         [=, this] { inner_->glu_forward(y, gate, up, kind, affine); });
  }
  void glu_backward(Tensor dgate, Tensor dup, Tensor dy, Tensor gate, Tensor up, GluKind kind,
                    const GluAffine& affine) override {
    call("glu_backward",
         {dgate, dup, dy, gate, up, affine.gate.scale, affine.gate.bias, affine.up.scale,
          affine.up.bias, affine.gate.dscale, affine.up.dscale},
         {}, [=, this] { inner_->glu_backward(dgate, dup, dy, gate, up, kind, affine); });
  }
  void soft_cap_forward(Tensor y, Tensor x, double cap) override {
    call("soft_cap_forward", {y, x}, {}, [=, this] { inner_->soft_cap_forward(y, x, cap); });
  }
  void soft_cap_backward(Tensor dx, Tensor dy, Tensor y, double cap) override {
    call("soft_cap_backward", {dx, dy, y}, {},
         [=, this] { inner_->soft_cap_backward(dx, dy, y, cap); });
  }
  void run_scale_columns(Tensor y, int64_t ldy, const void* addend, Tensor x, Tensor s,
                         Tensor b) override {
    call("scale_columns", {y, x, s, b}, {addend},
         [=, this] { inner_->scale_columns(y, x, s, b, ldy, addend); });
  }
  void run_dora_backward(Tensor dpre, Tensor dm, Tensor dy, int64_t ldy, Tensor pre, Tensor scale,
                         Tensor inv_norm) override {
    call("dora_backward", {dpre, dm, dy, pre, scale, inv_norm}, {},
         [=, this] { inner_->dora_backward(dpre, dm, dy, pre, scale, inv_norm, ldy); });
  }
  void dora_norm(Tensor scale, Tensor inv_norm, Tensor v, Tensor m) override {
    call("dora_norm", {scale, inv_norm, v, m}, {},
         [=, this] { inner_->dora_norm(scale, inv_norm, v, m); });
  }
  void attention_forward(const AttentionForward& a, DType dtype) override {
    call("attention_forward", {}, {a.qkv, a.lengths, a.out, a.lse},
         [=, this] { inner_->attention_forward(a, dtype); });
  }
  void attention_backward(const AttentionBackward& a, DType dtype) override {
    call("attention_backward", {}, {a.qkv, a.lengths, a.out, a.lse, a.dout, a.dqkv},
         [=, this] { inner_->attention_backward(a, dtype); });
  }
  void regression_loss(const RegressionLoss& kind, Tensor pred, Tensor target, Tensor mask,
                       Tensor dpred, Tensor loss) override {
    call("regression_loss", {pred, target, mask, dpred, loss}, {},
         [=, this] { inner_->regression_loss(kind, pred, target, mask, dpred, loss); });
  }
  void cross_entropy_loss(Tensor logits, Tensor targets, Tensor weights, int64_t ignore_index,
                          Tensor dlogits, Tensor loss) override {
    call("cross_entropy_loss", {logits, targets, weights, dlogits, loss}, {}, [=, this] {
      inner_->cross_entropy_loss(logits, targets, weights, ignore_index, dlogits, loss);
    });
  }
  void sum_squares(Tensor x, Tensor out) override {
    call("sum_squares", {x, out}, {}, [=, this] { inner_->sum_squares(x, out); });
  }
  void scale(Tensor x, double alpha) override {
    call("scale", {x}, {}, [=, this] { inner_->scale(x, alpha); });
  }
  void adam_step(Tensor params, Tensor grads, Tensor m, Tensor v, const AdamParams& p) override {
    call("adam_step", {params, grads, m, v}, {p.clip.sum_squares},
         [=, this] { inner_->adam_step(params, grads, m, v, p); });
  }
  void sgd_step(Tensor params, Tensor grads, Tensor momentum, const SgdParams& p) override {
    call("sgd_step", {params, grads, momentum}, {p.clip.sum_squares},
         [=, this] { inner_->sgd_step(params, grads, momentum, p); });
  }
  void optimizer_step(const OptimizerStep& a, DType dtype) override {
    call("optimizer_step", {},
         {a.params, a.grads, a.m, a.v, a.segments, a.steps, a.lr, a.clip.sum_squares},
         [=, this] { inner_->optimizer_step(a, dtype); });
  }

 protected:
  void run_gemm(const GemmShape& s, DType dtype, const void* a, const void* b, void* c,
                const void* bias) override {
    call("gemm", {}, {a, b, c, bias}, [=, this] { inner_->gemm(s, dtype, a, b, c, bias); });
  }

 private:
  static constexpr size_t kReserve = size_t{16} << 30;  // address space only

  // Runs an op, after checking that every pointer it takes is ours: now, or (async) later on the
  // worker, in order.
  template <class Fn>
  void call(const char* op, std::initializer_list<Tensor> tensors,
            std::initializer_list<const void*> pointers, Fn&& fn) {
    for (const Tensor& t : tensors) check(t.data(), op);
    for (const void* p : pointers) check(p, op);
    if (!async_) {
      Open o(*this);
      fn();
      return;
    }
    {
      std::lock_guard lock(queue_mutex_);
      queue_.emplace_back(std::forward<Fn>(fn));
      ++enqueued_;
    }
    queue_cv_.notify_all();
  }
  uint64_t enqueued() {
    std::lock_guard lock(queue_mutex_);
    return enqueued_;
  }
  // Waits until the first `ticket` ops have run; with `raise`, rethrows the first error one met.
  void wait_for(uint64_t ticket, bool raise = true) {
    if (!async_) return;
    std::unique_lock lock(queue_mutex_);
    done_cv_.wait(lock, [&] { return done_ >= ticket; });
    if (raise && error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  void work() {
    std::unique_lock lock(queue_mutex_);
    while (true) {
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr failed;
      try {
        Open o(*this);
        fn();
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed && !error_) error_ = failed;
      ++done_;
      done_cv_.notify_all();
    }
  }

  // Opens the used pages for one call (calls may nest or overlap across threads: the loader
  // uploads while the trainer runs ops).
  class Open {
   public:
    explicit Open(SealedBackend& be) : be_(be) {
      std::lock_guard lock(be.mutex_);
      if (be.open_++ == 0) be.protect(be.base_, be.used_, PROT_READ | PROT_WRITE);
    }
    ~Open() {
      std::lock_guard lock(be_.mutex_);
      if (--be_.open_ == 0) be_.protect(be_.base_, be_.used_, PROT_NONE);
    }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    SealedBackend& be_;
  };

  // Null pointers (an empty or absent operand) pass.
  void check(const void* p, const char* op) const {
    const auto* c = static_cast<const char*>(p);
    SF_CHECK(!c || (c >= base_ && c < base_ + kReserve), "sealed backend: ", op,
             " was given memory that is not the backend's (host memory?)");
  }
  void protect(char* p, size_t bytes, int prot) {
    if (bytes && mprotect(p, bytes, prot) != 0) fail("sealed backend: mprotect failed");
  }

  std::unique_ptr<Backend> inner_;
  const bool async_;
  // async: the ops waiting for the worker, how many were enqueued and have run, the first error.
  std::thread worker_;
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, done_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  char* base_ = nullptr;
  size_t used_ = 0;  // bytes handed out from base_
  int open_ = 0;     // calls running
  std::mutex mutex_;
};

}  // namespace

std::unique_ptr<Backend> make_sealed_backend() { return std::make_unique<SealedBackend>(false); }
std::unique_ptr<Backend> make_sealed_async_backend() {
  return std::make_unique<SealedBackend>(true);
}

}  // namespace seqforge
