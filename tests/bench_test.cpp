// The benchmark's own bookkeeping: the GEMM floor replays one step's recorded GEMMs on the
// buffers they ran on, which must still be alive then (the sanitizer build checks it).
#include "seqforge/bench/bench.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "bench/recording_backend.hpp"

namespace seqforge::bench_test {
namespace {

// W9's kind (a Llama-style decoder with DoRA on every Linear), shrunk: its adapters' GEMMs read
// temporaries that the step frees.
Workload small_dora_decoder() {
  Workload w = find_workload("W9");
  DecoderOptions& d = w.model.decoder;
  d.vocab_size = w.model.vocab_size = w.model.output_size = 40;
  d.hidden_size = 24, d.intermediate_size = 40, d.num_layers = 2;
  d.num_heads = 4, d.num_kv_heads = 2, d.head_dim = 6;
  d.max_positions = w.steps = 12;
  w.batch = 2;
  return w;
}

TEST(Bench, GemmFloorReplaysOnBuffersThatOutliveTheStep) {
  for (const int warmup : {1, 2}) {
    BenchOptions options;
    options.steps = 2;
    options.warmup = warmup;
    const BenchResult r = run_benchmark(small_dora_decoder(), options);
    ASSERT_EQ(r.step_ms.size(), 2u);
    EXPECT_GT(r.gemm_floor_ms, 0) << "warmup " << warmup;
    EXPECT_TRUE(std::isfinite(r.floor_ratio)) << "warmup " << warmup;
    EXPECT_GT(r.peak_mb, 0);
  }
}

// The floor replays a step's GEMMs with the step's concurrency: those of one run_concurrently
// call side by side again, each worker's in order (W3's batch split ran its halves' GEMMs on
// two threads at once, and the floor replayed them one after another: a floor above the step).
TEST(Bench, GemmFloorKeepsTheStepsConcurrency) {
  auto cpu = make_cpu_backend();
  RecordingBackend be(*cpu);
  const GemmShape s{.m = 3, .n = 2, .k = 2, .lda = 2, .ldb = 2, .ldc = 2};
  const std::array<float, 6> a = {1, 2, 3, 4, 5, 6};
  const std::array<float, 4> b = {1, 0, 0, 1};  // identity: C = A
  std::array<std::array<float, 6>, 7> c{};      // the outputs: one per GEMM
  be.recording = true;
  be.gemm(s, DType::f32, a.data(), b.data(), c[0].data(), nullptr);
  be.run_concurrently(2, [&](int w) {
    be.gemm(s, DType::f32, a.data(), b.data(), c[1 + w].data(), nullptr);
    be.run_concurrently(2, [&](int v) {  // nested: still the outer worker's
      be.gemm(s, DType::f32, a.data(), b.data(), c[3 + 2 * w + v].data(), nullptr);
    });
  });
  be.recording = false;
  ASSERT_EQ(be.calls.size(), 7u);
  EXPECT_EQ(be.calls[0].group, -1);
  std::array<int, 2> per_worker{};
  for (size_t i = 1; i < be.calls.size(); ++i) {
    EXPECT_EQ(be.calls[i].group, 0);
    EXPECT_EQ(be.calls[i].workers, 2);
    ++per_worker.at(be.calls[i].worker);
  }
  EXPECT_EQ(per_worker, (std::array<int, 2>{3, 3}));
  c = {};
  replay(*cpu, be.calls);
  for (int out = 0; out < 7; ++out)
    EXPECT_EQ(std::vector<float>(c[out].begin(), c[out].end()),
              std::vector<float>(a.begin(), a.end()))
        << out;
  be.release();
}

// A timed step never pays for first use, and options no benchmark runs with are refused before
// anything is printed.
TEST(Bench, OptionsAreCheckedBeforeAnyWork) {
  const auto error = [](auto change) {
    BenchOptions options;
    change(options);
    try {
      check_bench_options(options);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error([](BenchOptions& o) { o.warmup = 0; }).find("--warmup must be at least 1"),
            std::string::npos);
  EXPECT_EQ(error([](BenchOptions& o) { o.precision = "fp64"; }),
            "--precision must be fp32, bf16, fp16 or auto, got 'fp64'");
  EXPECT_EQ(error([](BenchOptions& o) { o.matmul_precision = "low"; }),
            "--matmul-precision must be highest or high, got 'low'");
  EXPECT_EQ(error([](BenchOptions& o) { o.device = "tpu"; }),
            "--device must be auto, cpu or cuda, got 'tpu'");
  EXPECT_EQ(error([](BenchOptions&) {}), "");
}

}  // namespace
}  // namespace seqforge::bench_test
