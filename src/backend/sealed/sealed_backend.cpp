// The sealed backend: the reference kernels over memory the host cannot read or write outside
// the backend's own calls. Its memory is one reserved range of pages kept PROT_NONE; every call
// opens the used part for its duration. Host code that touches a tensor directly faults, and an
// op handed host memory (not the backend's) is an error naming the op, as on a device.
#include <sys/mman.h>
#include <unistd.h>

#include <initializer_list>
#include <mutex>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {
namespace {

class SealedBackend final : public Backend {
 public:
  SealedBackend() : inner_(make_reference_backend()) {
    base_ = static_cast<char*>(
        mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (base_ == MAP_FAILED) fail("sealed backend: cannot reserve ", kReserve >> 20, " MiB");
  }
  ~SealedBackend() override { munmap(base_, kReserve); }

  std::string_view name() const override { return "sealed"; }
  std::string description() const override {
    return "sealed: reference kernels, memory closed to the host outside backend calls";
  }
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
    Open o(*this, "upload", {dst});
    inner_->upload(dst, host);
  }
  void download(void* host, Tensor src) override {
    Open o(*this, "download", {src});
    inner_->download(host, src);
  }
  void copy(Tensor dst, Tensor src) override {
    Open o(*this, "copy", {dst, src});
    inner_->copy(dst, src);
  }
  void fill(Tensor dst, double value) override {
    Open o(*this, "fill", {dst});
    inner_->fill(dst, value);
  }
  void convert(Tensor dst, Tensor src) override {
    Open o(*this, "convert", {dst, src});
    inner_->convert(dst, src);
  }
  void pack_b(const GemmShape& s, DType dtype, const void* b,
              std::unique_ptr<PackedB>* packed) override {
    Open o(*this, "pack_b", {}, {b});
    inner_->pack_b(s, dtype, b, packed);
  }
  void sum_rows_acc(Tensor db, Tensor dy) override {
    Open o(*this, "sum_rows_acc", {db, dy});
    inner_->sum_rows_acc(db, dy);
  }
  void add(Tensor y, Tensor x) override {
    Open o(*this, "add", {y, x});
    inner_->add(y, x);
  }
  void mul(Tensor y, Tensor a, Tensor b) override {
    Open o(*this, "mul", {y, a, b});
    inner_->mul(y, a, b);
  }
  void dropout_mask(Tensor mask, double p, uint64_t seed) override {
    Open o(*this, "dropout_mask", {mask});
    inner_->dropout_mask(mask, p, seed);
  }
  void transpose01(Tensor dst, Tensor src) override {
    Open o(*this, "transpose01", {dst, src});
    inner_->transpose01(dst, src);
  }
  void copy_rows(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                 int64_t n, DType dtype) override {
    Open o(*this, "copy_rows", {}, {dst, src});
    inner_->copy_rows(dst, ld_dst, src, ld_src, rows, n, dtype);
  }
  void copy_transposed(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                       int64_t cols, DType dtype) override {
    Open o(*this, "copy_transposed", {}, {dst, src});
    inner_->copy_transposed(dst, ld_dst, src, ld_src, rows, cols, dtype);
  }
  void cell_forward(CellKind cell, const CellForward& a, DType dtype) override {
    Open o(*this, "cell_forward", {},
           {a.gates, a.gates_low, a.gates_rec, a.bias_rec, a.h_prev, a.c_prev, a.c, a.saved,
            a.params, a.h, a.h_low, a.x, a.w_ih_t, a.bias});
    inner_->cell_forward(cell, a, dtype);
  }
  void cell_backward(CellKind cell, const CellBackward& a, DType dtype) override {
    Open o(*this, "cell_backward", {},
           {a.gates, a.gates_low, a.c_prev, a.saved, a.params, a.h_prev, a.dh_out, a.dh_rec, a.dc,
            a.dgates, a.dgates_low, a.dgates_rec, a.dgates_rec_low, a.dh_direct, a.dbias});
    inner_->cell_backward(cell, a, dtype);
  }
  void embedding_forward(Tensor out, Tensor table, Tensor ids) override {
    Open o(*this, "embedding_forward", {out, table, ids});
    inner_->embedding_forward(out, table, ids);
  }
  void embedding_backward(Tensor dtable, Tensor dout, Tensor ids) override {
    Open o(*this, "embedding_backward", {dtable, dout, ids});
    inner_->embedding_backward(dtable, dout, ids);
  }
  void layer_norm_forward(Tensor y, Tensor saved, Tensor x, Tensor w, Tensor b,
                          double eps) override {
    Open o(*this, "layer_norm_forward", {y, saved, x, w, b});
    inner_->layer_norm_forward(y, saved, x, w, b, eps);
  }
  void layer_norm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w,
                           Tensor saved) override {
    Open o(*this, "layer_norm_backward", {dx, dw, db, dy, x, w, saved});
    inner_->layer_norm_backward(dx, dw, db, dy, x, w, saved);
  }
  void gelu_forward(Tensor y, Tensor x) override {
    Open o(*this, "gelu_forward", {y, x});
    inner_->gelu_forward(y, x);
  }
  void gelu_backward(Tensor dx, Tensor dy, Tensor x) override {
    Open o(*this, "gelu_backward", {dx, dy, x});
    inner_->gelu_backward(dx, dy, x);
  }
  void scale_columns(Tensor y, Tensor x, Tensor s, Tensor b) override {
    Open o(*this, "scale_columns", {y, x, s, b});
    inner_->scale_columns(y, x, s, b);
  }
  void dora_backward(Tensor dpre, Tensor dm, Tensor dy, Tensor pre, Tensor scale,
                     Tensor inv_norm) override {
    Open o(*this, "dora_backward", {dpre, dm, dy, pre, scale, inv_norm});
    inner_->dora_backward(dpre, dm, dy, pre, scale, inv_norm);
  }
  void dora_norm(Tensor scale, Tensor inv_norm, Tensor v, Tensor m) override {
    Open o(*this, "dora_norm", {scale, inv_norm, v, m});
    inner_->dora_norm(scale, inv_norm, v, m);
  }
  void attention_forward(const AttentionForward& a, DType dtype) override {
    Open o(*this, "attention_forward", {}, {a.qkv, a.lengths, a.out, a.lse});
    inner_->attention_forward(a, dtype);
  }
  void attention_backward(const AttentionBackward& a, DType dtype) override {
    Open o(*this, "attention_backward", {}, {a.qkv, a.lengths, a.out, a.lse, a.dout, a.dqkv});
    inner_->attention_backward(a, dtype);
  }
  void mse_loss(Tensor pred, Tensor target, Tensor mask, Tensor dpred, Tensor loss) override {
    Open o(*this, "mse_loss", {pred, target, mask, dpred, loss});
    inner_->mse_loss(pred, target, mask, dpred, loss);
  }
  void cross_entropy_loss(Tensor logits, Tensor targets, Tensor weights, int64_t ignore_index,
                          Tensor dlogits, Tensor loss) override {
    Open o(*this, "cross_entropy_loss", {logits, targets, weights, dlogits, loss});
    inner_->cross_entropy_loss(logits, targets, weights, ignore_index, dlogits, loss);
  }
  void sum_squares(Tensor x, Tensor out) override {
    Open o(*this, "sum_squares", {x, out});
    inner_->sum_squares(x, out);
  }
  void scale(Tensor x, double alpha) override {
    Open o(*this, "scale", {x});
    inner_->scale(x, alpha);
  }
  void adam_step(Tensor params, Tensor grads, Tensor m, Tensor v, const AdamParams& p) override {
    Open o(*this, "adam_step", {params, grads, m, v}, {p.clip.sum_squares});
    inner_->adam_step(params, grads, m, v, p);
  }
  void sgd_step(Tensor params, Tensor grads, Tensor momentum, const SgdParams& p) override {
    Open o(*this, "sgd_step", {params, grads, momentum}, {p.clip.sum_squares});
    inner_->sgd_step(params, grads, momentum, p);
  }

 protected:
  void run_gemm(const GemmShape& s, DType dtype, const void* a, const void* b, void* c,
                const void* bias) override {
    Open o(*this, "gemm", {}, {a, b, c, bias});
    inner_->gemm(s, dtype, a, b, c, bias);
  }

 private:
  static constexpr size_t kReserve = size_t{16} << 30;  // address space only

  // Opens the used pages for one call (calls may nest or overlap across threads: the loader
  // uploads while the trainer runs ops) after checking that every pointer it takes is ours.
  class Open {
   public:
    Open(SealedBackend& be, const char* op, std::initializer_list<Tensor> tensors,
         std::initializer_list<const void*> pointers = {})
        : be_(be) {
      for (const Tensor& t : tensors) be.check(t.data(), op);
      for (const void* p : pointers) be.check(p, op);
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
  char* base_ = nullptr;
  size_t used_ = 0;  // bytes handed out from base_
  int open_ = 0;     // calls running
  std::mutex mutex_;
};

}  // namespace

std::unique_ptr<Backend> make_sealed_backend() { return std::make_unique<SealedBackend>(); }

}  // namespace seqforge
