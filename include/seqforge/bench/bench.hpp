#pragma once
// The benchmark workloads (W1-W5 of WORKLOADS.md, and W1 and W4 with GRU cells or LSTM
// projections, W6 and W9 with adapters; A5 and A5k attention alone) and a runner that times
// training steps.
#include <string>
#include <vector>

#include "seqforge/nn/model.hpp"

namespace seqforge {

struct Workload {
  std::string id;    // "W1"
  std::string name;  // compact problem string, e.g. "lstm_i8_h128_l2_t150_b256"
  ModelOptions model;
  int64_t batch = 0, steps = 0;  // B, T
  // Attention alone (A5, A5k): causal self-attention of B rows of T tokens in `heads` heads of
  // head_dim, forward and backward; `model` unused.
  int64_t heads = 0, head_dim = 0;
  enum class Loss { mse, mse_masked, cross_entropy } loss = Loss::mse;
  double mask_ratio = 0.15;  // mse_masked: share of time steps in the loss
  double gflop() const;      // per training step: 3x the forward pass, multiply-add = 2
                             // (attention alone: 3.5x, backward's five products to two)
};

const std::vector<Workload>& workloads();
const Workload& find_workload(const std::string& id);  // "W1" or its name; throws if unknown

struct BenchOptions {
  std::string precision = "fp32";            // fp32 | bf16 | fp16 | auto
  std::string matmul_precision = "highest";  // highest | high (f32 GEMMs on TF32 tensor cores)
  int steps = 10;                            // timed steps
  int warmup = 2;                            // untimed steps first
  bool profile = false;                 // profile the timed steps (profiler::summary() afterwards)
  bool checkpoint_activations = false;  // transformers and decoders: activation checkpointing
  std::string device = "cpu";           // cpu | cuda (SEQFORGE_BACKEND overrides)
  bool cuda_graphs = true;              // steps replayed from a captured graph where one can be
};
// Throws a one-line error for options no benchmark can run with (--steps 0, --warmup 0, an
// unknown precision or device).
void check_bench_options(const BenchOptions& options);

struct BenchResult {
  std::string id, name, precision;  // precision actually used
  bool checkpoint_activations = false;
  std::string notice;           // why it differs from the one asked for
  std::vector<double> step_ms;  // every timed step
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  double samples_per_s = 0, gflops = 0;
  double gemm_floor_ms = 0;  // the step's GEMMs alone, replayed in order (median)
  double floor_ratio = 0;    // median of (a step / the floor replayed right after it)
  double peak_mb = 0;        // process peak resident memory after the run
  int64_t graph_steps = 0;   // timed steps replayed from a captured graph
  std::string graphs_off;    // why the steps stayed eager though the backend captures, or ""
};

BenchResult run_benchmark(const Workload& w, const BenchOptions& options);

}  // namespace seqforge
