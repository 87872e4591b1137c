// The CPU backend runs the recurrence's chains (LSTM, GRU) concurrently (bidirectional layers side
// by side, stacks as a wavefront), one op at a time on all threads, or all on one thread; the
// reference backend runs them one after another. Every schedule must give the same outputs, states
// and gradients, with dropout between layers, initial states, and in bf16.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/recording_backend.hpp"
#include "nn/recurrent_util.hpp"
#include "seqforge/core/autotune.hpp"
#include "seqforge/nn/recurrent.hpp"
#include "test_util.hpp"

namespace seqforge::lstm_concurrency_test {
namespace {

using test::HostTensor;
using test::max_rel_error;
using test::to_doubles;

struct Case {
  const char* name;
  RecurrentOptions opt;
  int64_t T, B;
  DType gemm;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// chunk: steps per chunk of the weight-gradient GEMMs; 0 sizes them (and tunes their layout) as
// training does.
std::map<std::string, std::vector<double>> run(Backend& be, const Case& c,
                                               RecurrentSchedule schedule, int64_t chunk = 3) {
  Rng rng(21);
  Parameters params(DType::f32);
  Recurrent lstm(params, "rnn", c.opt);
  const bool cell_state = lstm.cell().cell_state;
  params.allocate(be, rng);
  lstm.set_gemm_dtype(c.gemm);
  lstm.set_schedule(schedule);
  lstm.set_weight_grad_chunk(chunk);  // 3: several chunks of K-major copies, h0's in the first
                                      // or the last
  const int64_t D = lstm.directions(), L = c.opt.num_layers, H = c.opt.hidden_size;
  const Shape x_shape =
      c.opt.batch_first ? Shape{c.B, c.T, c.opt.input_size} : Shape{c.T, c.B, c.opt.input_size};
  const Shape s_shape{D * L, c.B, c.opt.state_size()}, c_shape{D * L, c.B, H};
  auto values = [&](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& x : v) x = static_cast<float>(rng.uniform(-1, 1));
    return v;
  };
  HostTensor x(be, DType::f32, x_shape, values(x_shape.numel()));
  HostTensor h0(be, DType::f32, s_shape, values(s_shape.numel()));
  HostTensor c0(be, DType::f32, c_shape, values(c_shape.numel()));
  Rng dropout_rng(5);
  Tensor y = lstm.forward(be, x.t, h0.t, cell_state ? c0.t : Tensor(), true, dropout_rng);
  if (schedule == RecurrentSchedule::whole_chains && !lstm.whole_chains_apply())
    schedule = RecurrentSchedule::layered;
  if (schedule != RecurrentSchedule::tuned) {
    EXPECT_EQ(lstm.schedule(), schedule);
  }
  EXPECT_NE(lstm.schedule(), RecurrentSchedule::tuned);
  std::map<std::string, std::vector<double>> out = {{"y", to_doubles(be, y)},
                                                    {"h_n", to_doubles(be, lstm.h_n())}};
  if (cell_state) out["c_n"] = to_doubles(be, lstm.c_n());
  HostTensor dy(be, DType::f32, y.shape(), values(y.numel()));
  HostTensor dhn(be, DType::f32, s_shape, values(s_shape.numel()));
  HostTensor dcn(be, DType::f32, c_shape, values(c_shape.numel()));
  out["dx"] = to_doubles(be, lstm.backward(be, dy.t, dhn.t, cell_state ? dcn.t : Tensor()));
  out["dh0"] = to_doubles(be, lstm.dh0());
  if (cell_state) out["dc0"] = to_doubles(be, lstm.dc0());
  out["grads"] = to_doubles(be, params.grads().flat());
  return out;
}

// How far a backend's run may lie from the reference's (`want`), per result.
std::map<std::string, double> tolerances(Backend& ref, const Case& c,
                                         const std::map<std::string, std::vector<double>>& want) {
  // In bf16 the GRU keeps both dG and dR in bf16, and its dx differs from the reference's by up
  // to about one bf16 rounding (2^-8) relative.
  const double bf16_tol = c.opt.cell == CellKind::gru ? 4e-3 : 2e-3;
  // Layer norms amplify float32 rounding (PyTorch's own float32 LN-LSTM is 3e-5 to 1e-4 off its
  // float64 in the parity fixtures).
  const double f32_tol = c.opt.cell == CellKind::lnlstm ? 1e-4 : 2e-5;
  const double tol = c.gemm == DType::bf16 ? bf16_tol : f32_tol;
  // bf16 on an ill-conditioned stack (the LN-LSTM's: bf16 activations through the layer norms'
  // cancellations put its bf16 result 10-40% from its f32 one) lands anywhere within that spread
  // when its sums round at other points (AMX tiles): there, within a tenth of it.
  std::map<std::string, double> tols;
  for (const auto& [name, w] : want) tols[name] = tol;
  if (c.gemm == DType::bf16) {
    Case f32 = c;
    f32.gemm = DType::f32;
    for (const auto& [name, w] : run(ref, f32, RecurrentSchedule::layered))
      tols[name] = std::max(tol, 0.1 * max_rel_error(want.at(name), w));
  }
  return tols;
}

class LstmConcurrency : public ::testing::TestWithParam<Case> {};

// An autotune cache directory of the test's own (ctest runs tests in parallel processes), made
// empty and set as SEQFORGE_CACHE_DIR; removed at the end.
struct OwnCacheDir {
  std::filesystem::path dir;
  explicit OwnCacheDir(const std::string& name)
      : dir(std::filesystem::temp_directory_path() / name) {
    std::filesystem::remove_all(dir);
    setenv("SEQFORGE_CACHE_DIR", dir.c_str(), 1);
  }
  ~OwnCacheDir() { std::filesystem::remove_all(dir); }
};

TEST_P(LstmConcurrency, MatchesSequentialReference) {
  if (GetParam().gemm == DType::bf16) SF_SKIP_WITHOUT_BF16();
  auto cpu = make_cpu_backend();
  auto ref = make_reference_backend();
  ASSERT_GE(cpu->concurrency(), 1);
  const auto want = run(*ref, GetParam(), RecurrentSchedule::layered);
  const std::map<std::string, double> tols = tolerances(*ref, GetParam(), want);
  for (RecurrentSchedule schedule :
       {RecurrentSchedule::layered, RecurrentSchedule::side_by_side, RecurrentSchedule::one_worker,
        RecurrentSchedule::split_batch, RecurrentSchedule::tuned}) {
    const auto got = run(*cpu, GetParam(), schedule);
    for (const auto& [name, w] : want)
      EXPECT_LE(max_rel_error(got.at(name), w), tols.at(name))
          << GetParam().name << " " << name << " schedule " << static_cast<int>(schedule);
  }
}

// Each layer's chains in one backend call (RecurrentSchedule::whole_chains): on a GPU one
// cooperative kernel for both directions, elsewhere the steps as the Backend defines them.
// Every usable backend gives the reference's outputs, states and gradients. (Stacks it does not
// apply to, projections, dropout on the state, the LN-LSTM, take the steps.) On a GPU, with the
// kernels' steps waiting on grid syncs and on their row groups' progress counters.
TEST_P(LstmConcurrency, WholeChainsMatchTheReferenceOnEveryBackend) {
  const Case& c = GetParam();
  if (c.opt.cell == CellKind::lnlstm || c.opt.proj_size > 0 ||
      (c.opt.variational_dropout && c.opt.dropout > 0))
    GTEST_SKIP() << c.name << ": whole chains are for LSTM and GRU stacks without projections "
                 << "or dropout on the state";
  auto ref = make_reference_backend();
  const auto want = run(*ref, c, RecurrentSchedule::layered);
  const double bf16_tol = c.opt.cell == CellKind::gru ? 4e-3 : 2e-3, f32_tol = 2e-5;
  int ran = 0;
  for (const BackendEntry& entry : registered_backends()) {
    if (!entry.usable()) continue;
    auto be = entry.make();
    if (!be->supports(Op::gemm, c.gemm)) continue;  // bf16 on a CPU without bf16 dot products
    const bool gpu = entry.name == std::string("cuda");
    for (const char* sync : {"grid", "row_groups"}) {
      if (!gpu && sync != std::string("grid")) continue;
      if (gpu) setenv("SEQFORGE_CUDA_CHAIN_SYNC", sync, 1);
      const auto got = run(*be, c, RecurrentSchedule::whole_chains);
      unsetenv("SEQFORGE_CUDA_CHAIN_SYNC");
      ++ran;
      for (const auto& [name, w] : want)
        EXPECT_LE(max_rel_error(got.at(name), w), c.gemm == DType::bf16 ? bf16_tol : f32_tol)
            << c.name << " " << name << " on " << entry.name
            << (gpu ? std::string(" ") + sync : "");
    }
  }
  EXPECT_GE(ran, 2);
}

// On a GPU the schedules that run chains concurrently (directions side by side, a stack as a
// wavefront, the batch split) put each worker's ops on a stream of its own, ordered by events
// (forks, joins, the wavefront's step marks). The emulated GPU runs a stream's work only when an
// event or a synchronisation asks for it, so a missing event shows as a wrong result here. They
// must give what the steps on one stream give (layered; in f32 the reference's too) but for the
// order of sums. (In bf16 the ill-conditioned LN-LSTM's GPU run lands elsewhere within its bf16
// spread than the reference's.)
TEST_P(LstmConcurrency, ConcurrentSchedulesOnTheGpu) {
  const Case& c = GetParam();
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  auto ref = make_reference_backend();
  const auto want = run(*ref, c, RecurrentSchedule::layered);
  const std::map<std::string, double> tols = tolerances(*ref, c, want);
  auto gpu = make_backend("cuda");
  ASSERT_GE(gpu->concurrency(), 2);
  const auto steps = run(*gpu, c, RecurrentSchedule::layered);
  if (c.gemm == DType::f32) {
    for (const auto& [name, w] : want)
      EXPECT_LE(max_rel_error(steps.at(name), w), tols.at(name)) << c.name << " " << name;
  }
  for (RecurrentSchedule schedule : {RecurrentSchedule::side_by_side, RecurrentSchedule::one_worker,
                                     RecurrentSchedule::split_batch}) {
    const auto got = run(*gpu, c, schedule);
    for (const auto& [name, w] : steps)
      EXPECT_LE(max_rel_error(got.at(name), w), tols.at(name))
          << c.name << " " << name << " schedule " << static_cast<int>(schedule);
  }
}

// Weight gradients after the loop, with bf16 GEMMs over at least 1024 rows, run on K-major
// copies or on the row-major originals, whichever was faster when timed (into scratch
// gradients) on first use. The trial leaves the gradients exact, the choice is cached, and
// either choice gives the reference's gradients.
class WeightGradientLayout : public ::testing::TestWithParam<CellKind> {};

TEST_P(WeightGradientLayout, TunedLayoutKeepsTheGradients) {
  SF_SKIP_WITHOUT_BF16();
  const CellType& cell = cell_type(GetParam());
  const OwnCacheDir cache_dir("seqforge_weight_grad_layout_" + std::string(cell.name));
  const Case c{"bi_bf16_1200_rows",
               {.cell = cell.kind, .input_size = 20, .hidden_size = 16, .bidirectional = true},
               6,
               200,
               DType::bf16};
  auto cpu = make_cpu_backend();
  auto ref = make_reference_backend();
  const auto want = run(*ref, c, RecurrentSchedule::layered);
  auto check = [&](const char* when) {
    const auto got = run(*cpu, c, RecurrentSchedule::layered, 0);
    for (const auto& [name, w] : want)
      EXPECT_LE(max_rel_error(got.at(name), w), cell.kind == CellKind::gru ? 4e-3 : 2e-3)
          << name << " " << when;
  };
  check("timing the layouts");
  std::string key;
  const nlohmann::json cache = nlohmann::json::parse(std::ifstream(autotune::cache_path()));
  for (const auto& [k, v] : cache.items())
    if (k.find(std::string(cell.name) + " weight gradients|h16_i20_t6_b200_workers1_bf16") !=
        std::string::npos)
      key = k;
  ASSERT_FALSE(key.empty()) << "no weight-gradient layout in " << autotune::cache_path();
  for (const char* layout : {"k_major", "row_major"}) {
    autotune::store(key, layout, autotune::Timing());
    check(layout);
  }
}
INSTANTIATE_TEST_SUITE_P(Cells, WeightGradientLayout,
                         ::testing::Values(CellKind::lstm, CellKind::gru),
                         [](const auto& info) { return std::string(cell_type(info.param).name); });

INSTANTIATE_TEST_SUITE_P(
    Chains, LstmConcurrency,
    ::testing::Values(
        Case{"uni_1_layer", {.input_size = 6, .hidden_size = 16}, 6, 5, DType::f32},
        Case{"uni_2_layers_dropout",
             {.input_size = 3,
              .hidden_size = 20,
              .num_layers = 2,
              .dropout = 0.3,
              .batch_first = true},
             9,
             5,
             DType::f32},
        Case{"uni_3_layers_dropout",
             {.input_size = 4, .hidden_size = 17, .num_layers = 3, .dropout = 0.5},
             7,
             3,
             DType::f32},
        Case{
            "uni_4_layers", {.input_size = 2, .hidden_size = 8, .num_layers = 4}, 5, 2, DType::f32},
        Case{"bi_2_layers_dropout",
             {.input_size = 5,
              .hidden_size = 12,
              .num_layers = 2,
              .bidirectional = true,
              .dropout = 0.25,
              .batch_first = true},
             6,
             4,
             DType::f32},
        Case{"uni_2_layers_bf16",
             {.input_size = 6, .hidden_size = 32, .num_layers = 2, .dropout = 0.2},
             8,
             4,
             DType::bf16},
        Case{"bi_3_layers_bf16",
             {.input_size = 6,
              .hidden_size = 16,
              .num_layers = 3,
              .bidirectional = true,
              .batch_first = true},
             5,
             3,
             DType::bf16},
        // Several tiles of batch rows, and hidden sizes that are neither whole vectors nor
        // whole chunks of the staged recurrent product (a GPU's whole-chain kernels).
        Case{"uni_2_layers_wide_batch",
             {.input_size = 5, .hidden_size = 45, .num_layers = 2},
             4,
             37,
             DType::f32},
        Case{"bi_wide_batch",
             {.input_size = 4, .hidden_size = 45, .bidirectional = true},
             5,
             37,
             DType::f32},
        Case{"gru_uni_wide_batch",
             {.cell = CellKind::gru, .input_size = 3, .hidden_size = 37, .num_layers = 2},
             3,
             34,
             DType::f32},
        Case{"gru_bi_wide_batch_bf16",
             {.cell = CellKind::gru,
              .input_size = 7,
              .hidden_size = 37,
              .bidirectional = true,
              .batch_first = true},
             3,
             34,
             DType::bf16},
        // Stacks of whole chains (layers paired as a wavefront: no dropout between them, layers
        // above the first wider than the cells' own input projection), an odd layer left over.
        Case{"stack_3_layers",
             {.input_size = 24, .hidden_size = 20, .num_layers = 3, .batch_first = true},
             5,
             33,
             DType::f32},
        Case{"stack_2_layers_bf16",
             {.input_size = 5, .hidden_size = 24, .num_layers = 2},
             6,
             9,
             DType::bf16},
        Case{"gru_stack_2_layers_bf16",
             {.cell = CellKind::gru, .input_size = 3, .hidden_size = 19, .num_layers = 2},
             4,
             35,
             DType::bf16},
        Case{"gru_uni_1_layer_narrow",
             {.cell = CellKind::gru, .input_size = 6, .hidden_size = 16},
             6,
             5,
             DType::f32},
        Case{"gru_uni_3_layers_dropout",
             {.cell = CellKind::gru,
              .input_size = 20,
              .hidden_size = 17,
              .num_layers = 3,
              .dropout = 0.5,
              .batch_first = true},
             7,
             3,
             DType::f32},
        Case{"gru_bi_2_layers_dropout",
             {.cell = CellKind::gru,
              .input_size = 5,
              .hidden_size = 12,
              .num_layers = 2,
              .bidirectional = true,
              .dropout = 0.25},
             6,
             4,
             DType::f32},
        Case{"gru_uni_2_layers_bf16",
             {.cell = CellKind::gru,
              .input_size = 24,
              .hidden_size = 32,
              .num_layers = 2,
              .dropout = 0.2},
             8,
             4,
             DType::bf16},
        Case{"gru_bi_2_layers_bf16",
             {.cell = CellKind::gru,
              .input_size = 6,
              .hidden_size = 16,
              .num_layers = 2,
              .bidirectional = true,
              .batch_first = true},
             5,
             3,
             DType::bf16},
        Case{"variational_uni_3_layers",
             {.input_size = 20,
              .hidden_size = 16,
              .num_layers = 3,
              .dropout = 0.3,
              .variational_dropout = true},
             7,
             5,
             DType::f32},
        Case{"variational_gru_bi_bf16",
             {.cell = CellKind::gru,
              .input_size = 6,
              .hidden_size = 16,
              .num_layers = 2,
              .bidirectional = true,
              .dropout = 0.25,
              .batch_first = true,
              .variational_dropout = true},
             6,
             4,
             DType::bf16},
        Case{"variational_proj_uni_bf16",
             {.input_size = 24,
              .hidden_size = 32,
              .num_layers = 2,
              .dropout = 0.2,
              .proj_size = 12,
              .variational_dropout = true},
             8,
             4,
             DType::bf16},
        Case{"lnlstm_uni_3_layers_dropout",
             {.cell = CellKind::lnlstm,
              .input_size = 20,
              .hidden_size = 24,
              .num_layers = 3,
              .dropout = 0.3},
             7,
             3,
             DType::f32},
        Case{"lnlstm_bi_2_layers_bf16",
             {.cell = CellKind::lnlstm,
              .input_size = 24,
              .hidden_size = 16,
              .num_layers = 2,
              .bidirectional = true,
              .batch_first = true},
             6,
             4,
             DType::bf16},
        Case{"proj_uni_3_layers_dropout",
             {.input_size = 20,
              .hidden_size = 24,
              .num_layers = 3,
              .dropout = 0.3,
              .batch_first = true,
              .proj_size = 7},
             7,
             3,
             DType::f32},
        Case{"proj_bi_2_layers",
             {.input_size = 5,
              .hidden_size = 12,
              .num_layers = 2,
              .bidirectional = true,
              .proj_size = 5},
             6,
             4,
             DType::f32},
        Case{"proj_uni_2_layers_bf16",
             {.input_size = 6, .hidden_size = 32, .num_layers = 2, .proj_size = 16},
             8,
             4,
             DType::bf16},
        Case{"proj_bi_2_layers_bf16",
             {.input_size = 24,
              .hidden_size = 16,
              .num_layers = 2,
              .bidirectional = true,
              .dropout = 0.2,
              .batch_first = true,
              .proj_size = 9},
             5,
             3,
             DType::bf16}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace seqforge::lstm_concurrency_test

namespace seqforge::lstm_concurrency_test {
namespace {

// A GPU whose whole-chain kernels compute something else than its steps: after each forward
// (or backward) call, the first chain's first row of h (or of dL/dh0) is overwritten.
class MisleadingChains final : public RecordingBackend {
 public:
  enum class Wrong { nothing, forward, backward };
  MisleadingChains(Backend& inner, Wrong wrong) : RecordingBackend(inner), wrong_(wrong) {}
  void recurrence_forward(CellKind cell, std::span<const RecurrenceForward> chains,
                          DType dt) override {
    RecordingBackend::recurrence_forward(cell, chains, dt);
    if (wrong_ == Wrong::forward) fill(Tensor(chains[0].cell.h, dt, {chains[0].cell.hidden}), 0.5);
  }
  void recurrence_backward(CellKind cell, std::span<const RecurrenceBackward> chains,
                           DType dt) override {
    RecordingBackend::recurrence_backward(cell, chains, dt);
    if (wrong_ == Wrong::backward) fill(Tensor(chains[0].dh, dt, {chains[0].cell.hidden}), 0.5);
  }

 private:
  Wrong wrong_;
};

// The first time a problem is tuned, the whole chains are checked against the steps, forward
// and backward: where they disagree the steps run, with the reference's results, a warning, and
// that choice kept; where they agree, nothing is said. (Each case another sequence length: a
// problem is tuned once per process.)
TEST(WholeChains, ThatDisagreeWithTheStepsAreNotUsed) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  // A directory per process: ctest runs this test under several emulated GPUs at once.
  const OwnCacheDir cache_dir("seqforge_whole_chains_check_" + std::to_string(getpid()));
  using Wrong = MisleadingChains::Wrong;
  int64_t T = 6;
  for (Wrong wrong : {Wrong::nothing, Wrong::forward, Wrong::backward}) {
    const char* name = wrong == Wrong::nothing   ? "nothing"
                       : wrong == Wrong::forward ? "forward"
                                                 : "backward";
    const Case c{
        "uni_2_layers", {.input_size = 3, .hidden_size = 16, .num_layers = 2}, T++, 5, DType::f32};
    auto ref = make_reference_backend();
    const auto want = run(*ref, c, RecurrentSchedule::layered);
    auto gpu = make_backend("cuda");
    MisleadingChains be(*gpu, wrong);
    ASSERT_TRUE(be.fuses_recurrence(CellKind::lstm));
    testing::internal::CaptureStderr();
    const auto got = run(be, c, RecurrentSchedule::tuned);
    const std::string said = testing::internal::GetCapturedStderr();
    for (const auto& [what, w] : want)
      EXPECT_LE(max_rel_error(got.at(what), w), 2e-5) << what << ", wrong " << name;
    const std::string key =
        recurrent::tuning_prefix(be) + "lstm|i3_h16_l2_d1_t" + std::to_string(c.T) + "_b5_f32";
    const auto forward = autotune::lookup(key), backward = autotune::lookup(key + "|backward");
    ASSERT_TRUE(forward) << key;
    if (wrong == Wrong::nothing) {
      EXPECT_EQ(said.find("disagree"), std::string::npos) << said;
      EXPECT_FALSE(backward) << "chosen after four calls, not one";
    } else {
      EXPECT_NE(said.find("seqforge: warning: the LSTM's whole-chain kernels disagree with its "
                          "steps on this device (" +
                          std::string(name) + ": "),
                std::string::npos)
          << said;
      // After a forward disagreement the tuning chooses among the others (the steps, or the
      // steps on streams); after a backward one the steps are kept both ways.
      EXPECT_NE(*forward, "whole_chains");
      if (wrong == Wrong::backward) {
        EXPECT_EQ(*forward, "layered");
      }
      EXPECT_EQ(backward.value_or(""), "layered");
    }
  }
}

// A GPU backend whose wavefront workers do not wait for each other's steps (a missing event):
// in every pass, or from backward's first cell on. Its steps on one stream are slowed, so that
// the tuning picks the concurrent schedule.
class UnorderedStreams final : public RecordingBackend {
 public:
  enum class Wrong { forward, backward };
  UnorderedStreams(Backend& inner, Wrong wrong) : RecordingBackend(inner), wrong_(wrong) {}
  bool fuses_recurrence(CellKind) const override { return false; }
  void run_concurrently(int n, const std::function<void(int)>& fn) override {
    concurrent_ = true;
    RecordingBackend::run_concurrently(n, fn);
    concurrent_ = false;
  }
  void cell_forward(CellKind cell, const CellForward& a, DType dt) override {
    if (!concurrent_) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    RecordingBackend::cell_forward(cell, a, dt);
  }
  void cell_backward(CellKind cell, const CellBackward& a, DType dt) override {
    backward_ = true;
    RecordingBackend::cell_backward(cell, a, dt);
  }
  void wait_for_worker(int worker, int64_t marks) override {
    if (wrong_ == Wrong::backward && !backward_) RecordingBackend::wait_for_worker(worker, marks);
  }

 private:
  Wrong wrong_;
  bool concurrent_ = false, backward_ = false;
};

// So are the schedules that run a GPU's independent chains on streams of their own, forward and
// (where forward's tuning chose one) backward: one whose workers are not ordered as they should
// be is not used, with a warning. (Only where the defect shows for sure: on the emulated GPU.)
TEST(ConcurrentStreams, ThatDisagreeWithTheStepsAreNotUsed) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const OwnCacheDir cache_dir("seqforge_streams_check_" + std::to_string(getpid()));
  using Wrong = UnorderedStreams::Wrong;
  int64_t T = 7;
  for (Wrong wrong : {Wrong::forward, Wrong::backward}) {
    const char* name = wrong == Wrong::forward ? "forward" : "backward";
    const Case c{
        "uni_3_layers", {.input_size = 3, .hidden_size = 16, .num_layers = 3}, T++, 4, DType::f32};
    auto ref = make_reference_backend();
    const auto want = run(*ref, c, RecurrentSchedule::layered);
    auto gpu = make_backend("cuda");
    if (gpu->description().find("host emulation") == std::string::npos)
      GTEST_SKIP() << "a real GPU may run unordered streams in order by chance: the emulated one "
                      "runs a stream's work only when it is waited for";
    UnorderedStreams be(*gpu, wrong);
    testing::internal::CaptureStderr();
    const auto got = run(be, c, RecurrentSchedule::tuned);
    const std::string said = testing::internal::GetCapturedStderr();
    for (const auto& [what, w] : want)
      EXPECT_LE(max_rel_error(got.at(what), w), 2e-5) << what << ", wrong " << name;
    EXPECT_NE(said.find("seqforge: warning: the LSTM's side_by_side streams disagree with its "
                        "steps on this device (" +
                        std::string(name) + ": "),
              std::string::npos)
        << said;
    const auto forward = autotune::lookup(recurrent::tuning_prefix(be) + "lstm|i3_h16_l3_d1_t" +
                                          std::to_string(c.T) + "_b4_f32");
    ASSERT_TRUE(forward);
    EXPECT_EQ(*forward, "layered") << name;
  }
}

// SEQFORGE_RECURRENT_SCHEDULE holds every recurrence to one schedule; a name it does not know is
// one line naming the variable and the schedules.
TEST(RecurrentSchedule, TheEnvironmentHoldsOne) {
  unsetenv("SEQFORGE_RECURRENT_SCHEDULE");
  EXPECT_EQ(schedule_from_environment(), RecurrentSchedule::tuned);
  setenv("SEQFORGE_RECURRENT_SCHEDULE", "whole_chains", 1);
  EXPECT_EQ(schedule_from_environment(), RecurrentSchedule::whole_chains);
  setenv("SEQFORGE_RECURRENT_SCHEDULE", "fastest", 1);
  EXPECT_EQ(test::error_of([] { schedule_from_environment(); }),
            "SEQFORGE_RECURRENT_SCHEDULE: unknown schedule 'fastest' (expected layered, "
            "side_by_side, one_worker, split_batch or whole_chains)");
  unsetenv("SEQFORGE_RECURRENT_SCHEDULE");
}

}  // namespace
}  // namespace seqforge::lstm_concurrency_test
