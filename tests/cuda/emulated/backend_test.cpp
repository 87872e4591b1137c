// The CUDA backend itself (src/backend/cuda: memory, read-backs, scratch, the cuBLASLt calls and
// their mapping), compiled against the host emulation beside this file, with the emulated
// cuBLASLt loaded by its own dlopen: its ops against the reference backend, and recurrent models
// forward and backward (LSTM, GRU, LN-LSTM; embedding, dropout, projection, adapters) giving the
// reference's outputs and gradients; data-parallel gradient sums through the emulated NCCL.
#include "seqforge/backend/backend.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "seqforge/backend/buffer.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/rng.hpp"
#include "seqforge/dist/communicator.hpp"
#include "seqforge/dist/gradient_sync.hpp"
#include "seqforge/nn/model.hpp"
#include "test_util.hpp"
#include "train/run.hpp"

namespace seqforge {
namespace {

std::vector<double> random(Rng& rng, size_t n, double lo = -1, double hi = 1) {
  std::vector<double> v(n);
  for (double& x : v) x = rng.uniform(lo, hi);
  return v;
}

// A tensor of `be` holding `values` in `dtype`.
struct Held {
  Buffer buffer;
  Tensor t;
  Held(Backend& be, DType dtype, Shape shape, const std::vector<double>& values) {
    t = buffer.get(be, dtype, shape);
    upload_doubles(be, t, values);
  }
};

double max_rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double scale = 0, error = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) error = std::max(error, std::fabs(got[i] - want[i]));
  return error / std::max(scale, 1e-30);
}

TEST(CudaBackendEmulated, MakesItselfAndSaysWhatRuns) {
  auto be = make_cuda_backend();
  EXPECT_EQ(be->name(), "cuda");
  EXPECT_NE(be->description().find("host emulation"), std::string::npos) << be->description();
  EXPECT_FALSE(be->host_addressable());
  EXPECT_TRUE(be->supports(Op::cell, DType::f32));
  EXPECT_TRUE(be->supports(Op::gemm, DType::bf16));
  for (Op op : kAllOps)
    for (DType dt : {DType::f32, DType::f64}) EXPECT_TRUE(be->supports(op, dt)) << op_name(op);
  EXPECT_FALSE(be->supports(Op::decoder, DType::bf16));
  EXPECT_FALSE(be->supports(Op::attention, DType::bf16));
  EXPECT_FALSE(be->supports(Op::cell, DType::bf16));
}

// A GPU without cooperative launches takes a recurrence's steps, even where whole chains are
// asked for.
TEST(CudaBackendEmulated, WithoutCooperativeLaunchesTheRecurrenceTakesItsSteps) {
  EXPECT_TRUE(make_cuda_backend()->fuses_recurrence(CellKind::lstm));
  setenv("SEQFORGE_EMULATED_COOPERATIVE", "0", 1);
  auto be = make_cuda_backend();
  unsetenv("SEQFORGE_EMULATED_COOPERATIVE");
  EXPECT_FALSE(be->fuses_recurrence(CellKind::lstm));
  EXPECT_FALSE(be->fuses_recurrence(CellKind::gru));
  auto ref = make_reference_backend();
  Rng rng(3);
  const int64_t B = 3, H = 5, T = 4, G = 4;
  const auto w_hh = random(rng, G * H * H), gates = random(rng, T * B * G * H);
  const auto h0 = random(rng, B * H), c0 = random(rng, B * H);
  auto run = [&](Backend& b) {
    Held w(b, DType::f32, {G * H, H}, w_hh), g(b, DType::f32, {T * B, G * H}, gates);
    Held h_init(b, DType::f32, {B, H}, h0), c_init(b, DType::f32, {B, H}, c0);
    Held h(b, DType::f32, {T * B, H}, std::vector<double>(T * B * H));
    Held c(b, DType::f32, {T * B, H}, std::vector<double>(T * B * H));
    Held saved(b, DType::f32, {T * B, H}, std::vector<double>(T * B * H));
    RecurrenceForward a;
    a.steps = T, a.w_hh = w.t.data(), a.h0 = h_init.t.data(), a.ld_h0 = H;
    a.cell.batch = B, a.cell.hidden = H, a.cell.gates = g.t.data();
    a.cell.c_prev = c_init.t.data(), a.cell.c = c.t.data(), a.cell.saved = saved.t.data();
    a.cell.h = h.t.data(), a.cell.ldh = H;
    b.recurrence_forward(CellKind::lstm, std::span(&a, 1), DType::f32);
    return test::to_doubles(b, h.t);
  };
  EXPECT_LE(max_rel_error(run(*be), run(*ref)), 1e-5);
}

// SEQFORGE_CUDA_CHAIN_SYNC names how the whole-chain kernels' steps wait: a value it does not
// know is one line naming the variable and the values it takes.
TEST(CudaBackendEmulated, AnUnknownChainSyncNamesTheValues) {
  auto be = make_cuda_backend();
  const int64_t B = 2, H = 3, T = 2, G = 4;
  Held w(*be, DType::f32, {G * H, H}, std::vector<double>(G * H * H));
  Held g(*be, DType::f32, {T * B, G * H}, std::vector<double>(T * B * G * H));
  Held state(*be, DType::f32, {B, H}, std::vector<double>(B * H));
  Held h(*be, DType::f32, {T * B, H}, std::vector<double>(T * B * H));
  Held c(*be, DType::f32, {T * B, H}, std::vector<double>(T * B * H));
  Held saved(*be, DType::f32, {T * B, H}, std::vector<double>(T * B * H));
  RecurrenceForward a;
  a.steps = T, a.w_hh = w.t.data(), a.h0 = state.t.data(), a.ld_h0 = H;
  a.cell.batch = B, a.cell.hidden = H, a.cell.gates = g.t.data();
  a.cell.c_prev = state.t.data(), a.cell.c = c.t.data(), a.cell.saved = saved.t.data();
  a.cell.h = h.t.data(), a.cell.ldh = H;
  setenv("SEQFORGE_CUDA_CHAIN_SYNC", "rows", 1);
  std::string error;
  try {
    be->recurrence_forward(CellKind::lstm, std::span(&a, 1), DType::f32);
  } catch (const std::exception& e) {
    error = e.what();
  }
  unsetenv("SEQFORGE_CUDA_CHAIN_SYNC");
  EXPECT_EQ(error, "SEQFORGE_CUDA_CHAIN_SYNC: unknown value 'rows' (expected grid or row_groups)");
}

// As on a GPU, host code that reads or writes the device's memory fails (here, faults), while
// uploads and downloads reach it: the emulated device memory is closed to the host outside the
// device's own work.
TEST(CudaBackendEmulated, HostCodeCannotTouchDeviceMemory) {
  auto be = make_cuda_backend();
  Buffer buffer;
  const Tensor t = buffer.get(*be, DType::f32, {4});
  const std::vector<float> values{1, 2, 3, 4};
  be->upload(t, values.data());
  std::vector<float> back(4);
  be->download(back.data(), t);
  EXPECT_EQ(back, values);
  EXPECT_DEATH({ std::printf("%f\n", static_cast<volatile float*>(t.data())[0]); }, "");
  EXPECT_DEATH({ static_cast<volatile float*>(t.data())[1] = 5; }, "");
}

// bf16 and fp16 GEMMs where the GPU has the tensor cores, whatever the host CPU's instructions,
// for every model family; a CPU runs no fp16 GEMMs.
TEST(CudaBackendEmulated, PrecisionFollowsTheGpu) {
  auto be = make_cuda_backend();
  std::string notice;
  EXPECT_EQ(backend_precision("auto", *be, &notice), DType::bf16);
  EXPECT_EQ(backend_precision("bf16", *be, &notice), DType::bf16);
  EXPECT_EQ(backend_precision("fp16", *be, &notice), DType::f16);
  EXPECT_EQ(backend_precision("fp32", *be, &notice), DType::f32);
  EXPECT_TRUE(notice.empty()) << notice;
  EXPECT_EQ(backend_precision("fp16", *make_cpu_backend(), &notice), DType::f32);
  EXPECT_EQ(notice,
            "train.precision fp16: the cpu backend runs no fp16 GEMMs (fp16 is for GPUs: "
            "train.device cuda); fp32 GEMMs instead");
}

// GEMMs of random shapes on the emulated CUDA backend against the reference.
void check_gemms() {
  auto cuda = make_cuda_backend();
  auto ref = make_reference_backend();
  Rng rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    GemmShape s;
    s.trans_a = trial % 2, s.trans_b = trial / 2 % 2;
    s.m = 1 + rng.next() % 7, s.n = 1 + rng.next() % 7, s.k = trial % 7 == 6 ? 0 : rng.next() % 7;
    s.lda = std::max<int64_t>(1, (s.trans_a ? s.m : s.k) + rng.next() % 2);
    s.ldb = (s.trans_b ? s.k : s.n) + rng.next() % 2;
    s.ldb = std::max<int64_t>(s.ldb, 1);
    s.ldc = s.n + rng.next() % 2;
    s.bias = trial % 3 == 0;
    s.alpha = s.bias ? 1.0 : 0.75;
    s.beta = trial % 4 == 1 ? 0.5 : 0.0;
    for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      const DType out = dt == DType::bf16 || dt == DType::f16 ? DType::f32 : dt;
      const auto a = random(rng, (s.trans_a ? s.k : s.m) * s.lda + 1);
      const auto b = random(rng, (s.trans_b ? s.n : s.k) * s.ldb + 1);
      const auto c = random(rng, s.m * s.ldc), bias = random(rng, s.n);
      std::vector<double> results[2];
      int i = 0;
      for (Backend* be : {cuda.get(), ref.get()}) {
        Held ha(*be, dt, {int64_t(a.size())}, a), hb(*be, dt, {int64_t(b.size())}, b),
            hc(*be, out, {int64_t(c.size())}, c), hbias(*be, out, {s.n}, bias);
        be->gemm(s, dt, ha.t.data(), hb.t.data(), hc.t.data(), s.bias ? hbias.t.data() : nullptr);
        results[i++] = download_doubles(*be, hc.t);
      }
      EXPECT_LE(max_rel_error(results[0], results[1]), dt == DType::f64 ? 1e-14 : 1e-6)
          << "trial " << trial << " " << dtype_name(dt) << " m " << s.m << " n " << s.n << " k "
          << s.k << " trans " << s.trans_a << s.trans_b << " bias " << s.bias;
    }
  }
}

// GEMMs through cuBLASLt's column-major API: every transpose, padded leading dimensions, alpha,
// beta, the bias epilogue (f32, bf16, f16) or the bias added after (f64), and k = 0; and where
// cuBLASLt offers no algorithm with the epilogue, or none at all, the bias added after and the
// backend's own GEMM kernel.
TEST(CudaBackendEmulated, GemmsMatchTheReference) {
  for (const char* offer : {"", "no_epilogue", "none"}) {
    SCOPED_TRACE(std::string("SEQFORGE_EMULATED_CUBLASLT=") + offer);
    setenv("SEQFORGE_EMULATED_CUBLASLT", offer, 1);
    check_gemms();
    unsetenv("SEQFORGE_EMULATED_CUBLASLT");
  }
}

// A recurrent model on the emulated CUDA backend and on the reference: the same parameters
// (the same seed), outputs and every parameter's gradient, with GEMMs in `gemm` (f32, or half
// operands: both backends round them alike, but a value at a rounding boundary may round apart).
void check_model(const ModelOptions& o, const std::string& what, DType gemm = DType::f32) {
  std::vector<double> out[3], grads[3];
  int i = 0;
  auto cuda = make_cuda_backend();
  auto ref = make_reference_backend();
  // The third run, the reference in f32, shows that half operands were rounded.
  for (Backend* be : {cuda.get(), ref.get(), ref.get()}) {
    if (i == 2 && gemm == DType::f32) break;
    auto model = make_model(o);
    model->initialize(*be, 5);
    model->set_gemm_dtype(i == 2 ? DType::f32 : gemm);
    model->set_input_grad(false);
    Rng data(9), drop(3);
    const int64_t B = 3, T = 6;
    const int64_t rows = o.per_step ? B * T : B;
    Buffer x_buf, dy_buf;
    Tensor x;
    if (o.vocab_size) {
      std::vector<double> ids(B * T);
      for (double& id : ids) id = double(data.next() % o.vocab_size);
      x = x_buf.get(*be, DType::i64, {B, T});
      std::vector<int64_t> raw(ids.begin(), ids.end());
      be->upload(x, raw.data());
    } else {
      x = x_buf.get(*be, DType::f32, {B, T, o.rnn.input_size});
      upload_doubles(*be, x, random(data, B * T * o.rnn.input_size));
    }
    model->parameters().zero_grad(*be);
    const Tensor y = model->forward(*be, x, {}, {}, true, drop);
    out[i] = download_doubles(*be, y);
    Tensor dy = dy_buf.get(*be, DType::f32, {rows, o.output_size});
    upload_doubles(*be, dy, random(data, rows * o.output_size));
    model->backward(*be, dy);
    const Parameters& p = model->parameters();
    for (size_t k = 0; k < p.size(); ++k)
      for (double g : download_doubles(*be, p.grad(k))) grads[i].push_back(g);
    ++i;
  }
  const double half = gemm == DType::f16 ? 4e-3 : 3e-2;
  EXPECT_LE(max_rel_error(out[0], out[1]), gemm == DType::f32 ? 2e-6 : half) << what << " outputs";
  EXPECT_LE(max_rel_error(grads[0], grads[1]), gemm == DType::f32 ? 2e-5 : half)
      << what << " gradients";
  if (gemm != DType::f32)
    EXPECT_GT(max_rel_error(out[1], out[2]), gemm == DType::f16 ? 1e-5 : 1e-4)
        << what << ": no different from f32 GEMMs";
}

TEST(CudaBackendEmulated, RecurrentModelsMatchTheReference) {
  for (CellKind cell : {CellKind::lstm, CellKind::gru, CellKind::lnlstm}) {
    ModelOptions o;
    o.rnn.cell = cell, o.rnn.input_size = 4, o.rnn.hidden_size = 6, o.rnn.num_layers = 2;
    o.rnn.batch_first = true, o.output_size = 2;
    const std::string name = cell_type(cell).name;
    check_model(o, name);
    ModelOptions bi = o;
    bi.rnn.bidirectional = true, bi.rnn.dropout = 0.3, bi.per_step = true;
    check_model(bi, name + " bidirectional, dropout, every step");
    ModelOptions lm = o;
    lm.vocab_size = 11, lm.embedding_dim = 4, lm.per_step = true, lm.output_size = 11;
    check_model(lm, name + " character model");
    ModelOptions adapted = o;
    adapted.adapter.kind = AdapterKind::dora, adapted.adapter.rank = 2;
    adapted.adapter.targets = {name + ".weight_ih", name + ".weight_hh"};
    check_model(adapted, name + " DoRA");
    check_model(bi, name + " bidirectional, fp16 GEMMs", DType::f16);
    check_model(lm, name + " character model, fp16 GEMMs", DType::f16);
    check_model(bi, name + " bidirectional, bf16 GEMMs", DType::bf16);
  }
  ModelOptions proj;
  proj.rnn.input_size = 4, proj.rnn.hidden_size = 6, proj.rnn.proj_size = 3;
  proj.rnn.num_layers = 2, proj.rnn.batch_first = true, proj.output_size = 2;
  check_model(proj, "lstm projection");
  check_model(proj, "lstm projection, fp16 GEMMs", DType::f16);
}

// Losses as the reference's; a target class or token id out of range is one line, as on the CPU,
// raised at the next synchronisation (no step waits for it), after which the backend goes on.
TEST(CudaBackendEmulated, LossesAndBadIdsAsTheReference) {
  auto cuda = make_cuda_backend();
  auto ref = make_reference_backend();
  Rng rng(2);
  const int64_t N = 9, K = 4;
  const auto logits = random(rng, N * K, -2, 2), target = random(rng, N * K);
  std::vector<int64_t> classes(N);
  for (auto& c : classes) c = int64_t(rng.next() % K);
  double loss[2][2];
  int i = 0;
  for (Backend* be : {cuda.get(), ref.get()}) {
    Held x(*be, DType::f32, {N, K}, logits), t(*be, DType::f32, {N, K}, target),
        d(*be, DType::f32, {N, K}, std::vector<double>(N * K));
    Buffer ids;
    Tensor y = ids.get(*be, DType::i64, {N});
    be->upload(y, classes.data());
    loss[i][0] = be->mse_loss(x.t, t.t, {}, d.t);
    loss[i][1] = be->cross_entropy_loss(x.t, y, {}, -100, d.t);
    ++i;
  }
  EXPECT_NEAR(loss[0][0], loss[1][0], 1e-6 * loss[1][0]);
  EXPECT_NEAR(loss[0][1], loss[1][1], 1e-6 * loss[1][1]);
  classes[5] = K + 3;
  Held x(*cuda, DType::f32, {N, K}, logits), d(*cuda, DType::f32, {N, K}, logits);
  Buffer ids;
  Tensor y = ids.get(*cuda, DType::i64, {N});
  cuda->upload(y, classes.data());
  EXPECT_EQ(test::error_of([&] { cuda->cross_entropy_loss(x.t, y, {}, -100, d.t); }),
            "target class 7 at row 5 outside [0, 4)");
  Held table(*cuda, DType::f32, {K, 3}, random(rng, K * 3)),
      out(*cuda, DType::f32, {N, 3}, random(rng, N * 3));
  EXPECT_EQ(test::error_of([&] {
              cuda->embedding_forward(out.t, table.t, y);
              cuda->synchronize();
            }),
            "token id 7 at position 5 outside [0, 4)");
  // Of two bad ids the first is named; of two ops with one each, the first op's, with its own
  // range; a bad target before a bad id, the target.
  classes[2] = -1;
  cuda->upload(y, classes.data());
  Held small(*cuda, DType::f32, {2, 3}, random(rng, 2 * 3));
  Buffer more;
  Tensor z = more.get(*cuda, DType::i64, {N});
  std::vector<int64_t> zeros(N);
  zeros[0] = K;
  cuda->upload(z, zeros.data());
  EXPECT_EQ(test::error_of([&] {
              cuda->embedding_forward(out.t, table.t, y);
              cuda->embedding_forward(out.t, small.t, z);
              cuda->synchronize();
            }),
            "token id -1 at position 2 outside [0, 4)");
  EXPECT_EQ(test::error_of([&] {
              cuda->embedding_forward(out.t, small.t, z);
              cuda->embedding_forward(out.t, table.t, y);
              cuda->synchronize();
            }),
            "token id 4 at position 0 outside [0, 2)");
  Buffer loss_buffer;
  const Tensor ce_loss = loss_buffer.get(*cuda, DType::f64, {1});
  EXPECT_EQ(test::error_of([&] {
              cuda->cross_entropy_loss(x.t, y, {}, -100, d.t, ce_loss);
              cuda->embedding_forward(out.t, small.t, z);
              cuda->synchronize();
            }),
            "target class -1 at row 2 outside [0, 4)");
  classes[2] = 0, classes[5] = 1;
  cuda->upload(y, classes.data());
  cuda->embedding_forward(out.t, table.t, y);
  EXPECT_EQ(test::error_of([&] { cuda->synchronize(); }), "") << "a report outlived its error";
}

// Two ranks' host collectives between two threads: sums and broadcasts meet at a barrier. Floats
// are never summed through the host here (the device sums them).
class ThreadCommunicator final : public dist::Communicator {
 public:
  struct Shared {
    std::barrier<> meet{2};
    std::vector<double> parts[2];
    std::vector<std::byte> bytes;
  };
  ThreadCommunicator(Shared& shared, int rank) : s_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  int local_size() const override { return 2; }
  std::string name() const override { return "two threads"; }
  void set_timeout(double, std::string) override {}
  Request all_reduce_start(std::span<float>, dist::ReduceOp) override {
    ADD_FAILURE() << "gradients summed through the host";
    return 0;
  }
  bool test(Request) override { return true; }
  void wait(Request) override {}
  void all_reduce_sum(std::span<double> v) override {
    s_.parts[rank_].assign(v.begin(), v.end());
    s_.meet.arrive_and_wait();
    for (size_t i = 0; i < v.size(); ++i) v[i] = s_.parts[0][i] + s_.parts[1][i];
    s_.meet.arrive_and_wait();
  }
  void broadcast(std::span<std::byte> data) override {
    if (rank_ == 0) s_.bytes.assign(data.begin(), data.end());
    s_.meet.arrive_and_wait();
    if (rank_ != 0) std::copy(s_.bytes.begin(), s_.bytes.end(), data.begin());
    s_.meet.arrive_and_wait();
  }
  void barrier() override { s_.meet.arrive_and_wait(); }
  [[noreturn]] void abort(const std::string& message) override {
    throw std::runtime_error(message);
  }

 private:
  Shared& s_;
  int rank_;
};

// One rank: a backend on emulated GPU `device` and three parameters.
struct Rank {
  std::unique_ptr<Backend> be;
  Parameters params;
  explicit Rank(int device) {
    cudaSetDevice(device);
    be = make_cuda_backend();
    cudaSetDevice(0);
    for (int64_t n : {7, 300, 1000})
      params.declare("w" + std::to_string(n), {n}, Init::Constant(0));
    Rng rng(1);
    params.allocate(*be, rng);
  }
  Tensor grads() const { return params.grads().flat(); }
};

// The current device is per thread: a thread other than the backend's maker (a loader's worker)
// allocates, uploads and frees on the backend's GPU, not the process's first.
TEST(CudaBackendEmulated, OtherThreadsWorkOnTheBackendsDevice) {
  Rank r1(1);
  int seen[3] = {-1, -1, -1};
  std::thread worker([&] {
    void* host = r1.be->alloc_host(64);
    cudaGetDevice(&seen[0]);
    cudaSetDevice(0);
    Buffer buffer;
    const Tensor t = buffer.get(*r1.be, DType::f32, {16});
    cudaGetDevice(&seen[1]);
    cudaSetDevice(0);
    std::memset(host, 0, 64);
    r1.be->upload(t, host);
    r1.be->free_host(host);
    cudaGetDevice(&seen[2]);
  });
  worker.join();
  EXPECT_EQ(seen[0], 1);
  EXPECT_EQ(seen[1], 1);
  EXPECT_EQ(seen[2], 1);
}

// Both ranks' GradientSync made at once (they agree through the host as they are made).
std::pair<std::unique_ptr<dist::GradientSync>, std::unique_ptr<dist::GradientSync>> syncs(Rank& a,
                                                                                          Rank& b) {
  ThreadCommunicator::Shared shared;
  ThreadCommunicator ca(shared, 0), cb(shared, 1);
  std::unique_ptr<dist::GradientSync> sa, sb;
  std::thread other([&] { sb = std::make_unique<dist::GradientSync>(cb, *b.be, b.params, 1024); });
  sa = std::make_unique<dist::GradientSync>(ca, *a.be, a.params, 1024);
  other.join();
  return {std::move(sa), std::move(sb)};
}

// Data-parallel sums on the device: two ranks on two GPUs join NCCL (the emulated one) and each
// bucket of the gradient arena is summed in place on both; two ranks on one GPU, or NCCL turned
// off, are told to sum through the host, with the reason.
TEST(CudaBackendEmulated, NcclSumsTheGradientBucketsOnTheDevice) {
  Rank r0(0), r1(1);
  const size_t n = size_t(r0.grads().numel());
  Rng rng(5);
  std::vector<double> g0(n), g1(n);
  for (size_t i = 0; i < n; ++i) {
    g0[i] = static_cast<float>(rng.uniform(-1, 1));
    g1[i] = static_cast<float>(rng.uniform(-1, 1));
  }
  upload_doubles(*r0.be, r0.grads(), g0);
  upload_doubles(*r1.be, r1.grads(), g1);
  auto [s0, s1] = syncs(r0, r1);
  ASSERT_TRUE(s0->on_device()) << s0->why_host();
  ASSERT_TRUE(s1->on_device()) << s1->why_host();
  ASSERT_GE(s0->buckets(), 2u);
  EXPECT_NE(r0.be->collectives_name().find("NCCL 2.28.0"), std::string::npos)
      << r0.be->collectives_name();
  s0->begin_step();
  s0->ready(1, 3);  // the last two parameters' buckets go out first, the rest at finish
  s0->finish();
  s1->begin_step();
  s1->finish();
  const std::vector<double> got0 = download_doubles(*r0.be, r0.grads());
  const std::vector<double> got1 = download_doubles(*r1.be, r1.grads());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got0[i], double(float(g0[i] + g1[i]))) << i;
    ASSERT_EQ(got1[i], got0[i]) << i;
  }

  Rank same(0);
  auto [h0, h1] = syncs(r0, same);
  EXPECT_FALSE(h0->on_device());
  EXPECT_EQ(h0->why_host(), "ranks 0 and 1 share a device");
  EXPECT_EQ(h1->why_host(), "ranks 0 and 1 share a device");

  setenv("SEQFORGE_NCCL", "0", 1);
  Rank off(1);
  auto [o0, o1] = syncs(r0, off);
  unsetenv("SEQFORGE_NCCL");
  EXPECT_EQ(o0->why_host(), "SEQFORGE_NCCL=0");
  EXPECT_EQ(o1->why_host(), "rank 0 cannot join them");
}

}  // namespace
}  // namespace seqforge
