// The benchmark's own bookkeeping: the GEMM floor replays one step's recorded GEMMs on the
// buffers they ran on, which must still be alive then (the sanitizer build checks it).
#include "seqforge/bench/bench.hpp"

#include <gtest/gtest.h>

#include <cmath>

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
  for (const int warmup : {0, 1}) {
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

}  // namespace
}  // namespace seqforge::bench_test
