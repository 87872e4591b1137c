#pragma once
// The benchmark's view of a training step's GEMMs: a backend that forwards every op and records
// each GEMM, so that the step's GEMMs can be replayed alone (the GEMM floor).
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/profiler.hpp"

namespace seqforge {

// Forwards every op to `inner` and records each GEMM, so the step's GEMMs can be replayed alone;
// under --profile each op is a scope of its own (on a device: the time to enqueue it).
class RecordingBackend : public Backend {
 public:
  struct Call {
    GemmShape shape;
    DType dtype;
    const void *a, *b;
    void* c;
    const void* bias;
    const PackedB* packed;  // B's packed form, or null
    // The run_concurrently call it ran in (-1: none), that call's worker count and its worker:
    // replayed so, the floor has the step's concurrency (a batch split's halves side by side).
    int group = -1, workers = 1, worker = 0;
  };
  explicit RecordingBackend(Backend& inner) : inner_(inner) {}
  ~RecordingBackend() override { release(); }
  std::vector<Call> calls;
  bool recording = false;

  std::string_view name() const override { return inner_.name(); }
  int concurrency() const override { return inner_.concurrency(); }
  void run_concurrently(int n, const std::function<void(int)>& fn) override;
  void signal_worker() override { inner_.signal_worker(); }
  void wait_for_worker(int worker, int64_t marks) override {
    inner_.wait_for_worker(worker, marks);
  }
  bool supports(Op op, DType d) const override { return inner_.supports(op, d); }
  void* alloc(size_t bytes) override {
    void* p = inner_.alloc(bytes);
    std::lock_guard lock(mutex_);
    if (!recording && !calls.empty()) fresh_.insert(p);  // after the recorded step: not its
    return p;
  }
  // While recording and until release(), memory is kept, not freed: the recorded GEMMs replay
  // on the buffers they ran on, temporaries of the step included. Memory allocated after the
  // recorded step (the steps timed beside the replays) is freed as usual.
  void free(void* p) override {
    std::lock_guard lock(mutex_);
    if (fresh_.erase(p) == 0 && (recording || !kept_.empty())) return kept_.push_back(p);
    inner_.free(p);
  }
  void release() {
    calls.clear();
    for (void* p : kept_) inner_.free(p);
    kept_.clear();
    fresh_.clear();
  }
  void copy(Tensor dst, Tensor src) override {
    SF_PROFILE_SCOPE("copy");
    inner_.copy(dst, src);
  }
  void fill(Tensor dst, double v) override {
    SF_PROFILE_SCOPE("fill");
    inner_.fill(dst, v);
  }
  void convert(Tensor dst, Tensor src) override {
    SF_PROFILE_SCOPE("convert");
    inner_.convert(dst, src);
  }
  void upload(Tensor dst, const void* host) override { inner_.upload(dst, host); }
  void download(void* host, Tensor src) override { inner_.download(host, src); }
  bool host_addressable() const override { return inner_.host_addressable(); }
  bool device_memory(size_t* free, size_t* total, std::string* device) const override {
    return inner_.device_memory(free, total, device);
  }
  void synchronize() override { inner_.synchronize(); }
  std::string description() const override { return inner_.description(); }
  bool captures() const override { return inner_.captures(); }
  void begin_capture() override { inner_.begin_capture(); }
  std::unique_ptr<StepGraph> end_capture() override { return inner_.end_capture(); }
  void abort_capture() noexcept override { inner_.abort_capture(); }
  uint64_t memory_epoch() const override { return inner_.memory_epoch(); }
  void run_gemm(const GemmShape& s, DType dt, const void* a, const void* b, void* c,
                const void* bias) override {
    if (recording) record({s, dt, a, b, c, bias, nullptr});
    SF_PROFILE_SCOPE("gemm");
    inner_.gemm(s, dt, a, b, c, bias);
  }
  void pack_b(const GemmShape& s, DType dt, const void* b,
              std::unique_ptr<PackedB>* packed) override {
    inner_.pack_b(s, dt, b, packed);
  }
  void run_gemm_packed(const GemmShape& s, DType dt, const void* a, const void* b,
                       const PackedB& packed, void* c, const void* bias) override {
    if (recording) record({s, dt, a, b, c, bias, &packed});
    SF_PROFILE_SCOPE("gemm");
    inner_.gemm(s, dt, a, b, &packed, c, bias);
  }
  void sum_rows_acc(Tensor db, Tensor dy) override {
    SF_PROFILE_SCOPE("sum_rows_acc");
    inner_.sum_rows_acc(db, dy);
  }
  void sum_rows_acc_and_convert(Tensor db, Tensor dy, Tensor dy_low) override {
    SF_PROFILE_SCOPE("sum_rows_acc_and_convert");
    inner_.sum_rows_acc_and_convert(db, dy, dy_low);
  }
  void add(Tensor y, Tensor x) override {
    SF_PROFILE_SCOPE("add");
    inner_.add(y, x);
  }
  void mul(Tensor y, Tensor a, Tensor b) override {
    SF_PROFILE_SCOPE("mul");
    inner_.mul(y, a, b);
  }
  void dropout_mask(Tensor m, double p, uint64_t seed) override {
    SF_PROFILE_SCOPE("dropout_mask");
    inner_.dropout_mask(m, p, seed);
  }
  void set_seed_base(const uint64_t* base) override { inner_.set_seed_base(base); }
  void transpose01(Tensor dst, Tensor src) override {
    SF_PROFILE_SCOPE("transpose01");
    inner_.transpose01(dst, src);
  }
  void copy_rows(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                 int64_t n, DType dt) override {
    SF_PROFILE_SCOPE("copy_rows");
    inner_.copy_rows(dst, ld_dst, src, ld_src, rows, n, dt);
  }
  void copy_transposed(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                       int64_t cols, DType dt) override {
    SF_PROFILE_SCOPE("copy_transposed");
    inner_.copy_transposed(dst, ld_dst, src, ld_src, rows, cols, dt);
  }
  void cell_forward(CellKind cell, const CellForward& a, DType dt) override {
    SF_PROFILE_SCOPE("cell_forward");
    inner_.cell_forward(cell, a, dt);
  }
  void cell_backward(CellKind cell, const CellBackward& a, DType dt) override {
    SF_PROFILE_SCOPE("cell_backward");
    inner_.cell_backward(cell, a, dt);
  }
  // A device's whole-chain kernel runs as such (its recurrent products are then no GEMMs of the
  // floor); otherwise the steps, through this backend, so that their GEMMs are recorded.
  bool fuses_recurrence(CellKind cell) const override { return inner_.fuses_recurrence(cell); }
  void recurrence_forward(CellKind cell, std::span<const RecurrenceForward> chains,
                          DType dt) override {
    if (!inner_.fuses_recurrence(cell)) return Backend::recurrence_forward(cell, chains, dt);
    inner_.recurrence_forward(cell, chains, dt);
  }
  void recurrence_backward(CellKind cell, std::span<const RecurrenceBackward> chains,
                           DType dt) override {
    if (!inner_.fuses_recurrence(cell)) return Backend::recurrence_backward(cell, chains, dt);
    inner_.recurrence_backward(cell, chains, dt);
  }
  void embedding_forward(Tensor out, Tensor table, Tensor ids) override {
    SF_PROFILE_SCOPE("embedding_forward");
    inner_.embedding_forward(out, table, ids);
  }
  void embedding_backward(Tensor dtable, Tensor dout, Tensor ids) override {
    SF_PROFILE_SCOPE("embedding_backward");
    inner_.embedding_backward(dtable, dout, ids);
  }
  void layer_norm_forward(Tensor y, Tensor s, Tensor x, Tensor w, Tensor b, double eps) override {
    SF_PROFILE_SCOPE("layer_norm_forward");
    inner_.layer_norm_forward(y, s, x, w, b, eps);
  }
  void layer_norm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w, Tensor s,
                           Tensor residual) override {
    SF_PROFILE_SCOPE("layer_norm_backward");
    inner_.layer_norm_backward(dx, dw, db, dy, x, w, s, residual);
  }
  void gelu_forward(Tensor y, Tensor x, const ColumnMap& map) override {
    SF_PROFILE_SCOPE("gelu_forward");
    inner_.gelu_forward(y, x, map);
  }
  void gelu_backward(Tensor dx, Tensor dy, Tensor x, const ColumnMap& map) override {
    SF_PROFILE_SCOPE("gelu_backward");
    inner_.gelu_backward(dx, dy, x, map);
  }
  void rms_norm_forward(Tensor y, Tensor s, Tensor x, Tensor w, double offset,
                        double eps) override {
    SF_PROFILE_SCOPE("rms_norm_forward");
    inner_.rms_norm_forward(y, s, x, w, offset, eps);
  }
  void rms_norm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, double offset,
                         Tensor s, Tensor residual) override {
    SF_PROFILE_SCOPE("rms_norm_backward");
    inner_.rms_norm_backward(dx, dw, dy, x, w, offset, s, residual);
  }
  void rotary(const Rotary& a, DType dt) override {
    SF_PROFILE_SCOPE("rotary");
    inner_.rotary(a, dt);
  }
  void glu_forward(Tensor y, Tensor gate, Tensor up, GluKind kind,
                   const GluAffine& affine) override {
    SF_PROFILE_SCOPE("glu_forward");
    inner_.glu_forward(y, gate, up, kind, affine);
  }
  void glu_backward(Tensor dgate, Tensor dup, Tensor dy, Tensor gate, Tensor up, GluKind kind,
                    const GluAffine& affine) override {
    SF_PROFILE_SCOPE("glu_backward");
    inner_.glu_backward(dgate, dup, dy, gate, up, kind, affine);
  }
  void soft_cap_forward(Tensor y, Tensor x, double cap) override {
    SF_PROFILE_SCOPE("soft_cap_forward");
    inner_.soft_cap_forward(y, x, cap);
  }
  void soft_cap_backward(Tensor dx, Tensor dy, Tensor y, double cap) override {
    SF_PROFILE_SCOPE("soft_cap_backward");
    inner_.soft_cap_backward(dx, dy, y, cap);
  }
  void run_scale_columns(Tensor y, int64_t ldy, const void* addend, Tensor x, Tensor s,
                         Tensor b) override {
    SF_PROFILE_SCOPE("scale_columns");
    inner_.scale_columns(y, x, s, b, ldy, addend);
  }
  void run_dora_backward(Tensor dpre, Tensor dm, Tensor dy, int64_t ldy, Tensor pre, Tensor s,
                         Tensor inv) override {
    SF_PROFILE_SCOPE("dora_backward");
    inner_.dora_backward(dpre, dm, dy, pre, s, inv, ldy);
  }
  void dora_norm(Tensor s, Tensor inv, Tensor v, Tensor m) override {
    SF_PROFILE_SCOPE("dora_norm");
    inner_.dora_norm(s, inv, v, m);
  }
  void attention_forward(const AttentionForward& a, DType dt) override {
    SF_PROFILE_SCOPE("attention_forward");
    inner_.attention_forward(a, dt);
  }
  void attention_backward(const AttentionBackward& a, DType dt) override {
    SF_PROFILE_SCOPE("attention_backward");
    inner_.attention_backward(a, dt);
  }
  void regression_loss(const RegressionLoss& k, Tensor p, Tensor t, Tensor m, Tensor d,
                       Tensor loss) override {
    SF_PROFILE_SCOPE("regression_loss");
    inner_.regression_loss(k, p, t, m, d, loss);
  }
  void cross_entropy_loss(Tensor l, Tensor t, Tensor w, int64_t ig, Tensor d,
                          Tensor loss) override {
    SF_PROFILE_SCOPE("cross_entropy_loss");
    inner_.cross_entropy_loss(l, t, w, ig, d, loss);
  }
  void sum_squares(Tensor x, Tensor out) override {
    SF_PROFILE_SCOPE("sum_squares");
    inner_.sum_squares(x, out);
  }
  void scale(Tensor x, double a) override {
    SF_PROFILE_SCOPE("scale");
    inner_.scale(x, a);
  }
  void adam_step(Tensor p, Tensor g, Tensor m, Tensor v, const AdamParams& a) override {
    SF_PROFILE_SCOPE("adam_step");
    inner_.adam_step(p, g, m, v, a);
  }
  void sgd_step(Tensor p, Tensor g, Tensor m, const SgdParams& a) override {
    SF_PROFILE_SCOPE("sgd_step");
    inner_.sgd_step(p, g, m, a);
  }
  void optimizer_step(const OptimizerStep& a, DType dt) override {
    SF_PROFILE_SCOPE("optimizer_step");
    inner_.optimizer_step(a, dt);
  }

 private:
  void record(Call c);

  Backend& inner_;
  std::mutex mutex_;
  int groups_ = 0;  // run_concurrently calls recorded
  std::vector<void*> kept_;
  std::unordered_set<void*> fresh_;  // allocated after the recorded step
};

// Runs a recorded GEMM again on `be`.
void replay(Backend& be, const RecordingBackend::Call& c);
// Runs recorded GEMMs again on `be`, those of one run_concurrently call side by side again, each
// worker's in order.
void replay(Backend& be, const std::vector<RecordingBackend::Call>& calls);
// Time per distinct GEMM shape of one step, slowest first (SEQFORGE_BENCH_GEMMS=1).
void print_gemm_breakdown(Backend& be, const std::vector<RecordingBackend::Call>& calls);

}  // namespace seqforge
