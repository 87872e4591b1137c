#include "seqforge/bench/bench.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "bench/recording_backend.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/buffer.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/profiler.hpp"
#include "seqforge/optim/optimizer.hpp"
#include "train/run.hpp"
#include "train/step_graphs.hpp"

namespace seqforge {

namespace {

// A GPT-2 style character model: W5.
Workload make_gpt(std::string id, std::string name, int64_t vocab, int64_t width, int64_t layers,
                  int64_t heads, int64_t steps, int64_t batch,
                  AdapterKind adapter = AdapterKind::none, int64_t rank = 8) {
  Workload w;
  w.id = std::move(id);
  w.name = std::move(name);
  w.model.family = ModelFamily::transformer;
  w.model.vocab_size = vocab;
  w.model.embedding_dim = width;
  w.model.transformer = {.vocab_size = vocab,
                         .block_size = steps,
                         .n_layer = layers,
                         .n_head = heads,
                         .n_embd = width};
  w.model.adapter.kind = adapter;
  w.model.adapter.rank = rank;
  w.model.output_size = vocab;
  w.model.per_step = true;
  w.batch = batch;
  w.steps = steps;
  w.loss = Workload::Loss::cross_entropy;
  return w;
}

// A Llama-architecture decoder (RMS norm, rotary embeddings, grouped-query attention, a SiLU
// gated MLP, an untied head) with DoRA of rank 8 on every Linear of its blocks, the base frozen.
Workload make_llama(std::string id, std::string name, int64_t vocab, int64_t width, int64_t mlp,
                    int64_t layers, int64_t heads, int64_t kv_heads, int64_t steps, int64_t batch) {
  Workload w;
  w.id = std::move(id);
  w.name = std::move(name);
  w.model.family = ModelFamily::decoder;
  w.model.vocab_size = vocab;
  DecoderOptions& d = w.model.decoder;
  d.vocab_size = vocab, d.hidden_size = width, d.intermediate_size = mlp;
  d.num_layers = layers, d.num_heads = heads, d.num_kv_heads = kv_heads;
  d.head_dim = width / heads;
  d.max_positions = steps;
  d.adapter = {
      .kind = AdapterKind::dora,
      .rank = 8,
      .alpha = 16,
      .targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}};
  w.model.output_size = vocab;
  w.model.per_step = true;
  w.batch = batch;
  w.steps = steps;
  w.loss = Workload::Loss::cross_entropy;
  return w;
}

Workload make(std::string id, std::string name, int64_t vocab, int64_t embed, int64_t input,
              int64_t hidden, int64_t layers, bool bidirectional, int64_t output, bool per_step,
              int64_t batch, int64_t steps, Workload::Loss loss, CellKind cell = CellKind::lstm,
              int64_t proj = 0) {
  Workload w;
  w.id = std::move(id);
  w.name = std::move(name);
  w.model.vocab_size = vocab;
  w.model.embedding_dim = embed;
  w.model.rnn = {.cell = cell,
                 .input_size = input,
                 .hidden_size = hidden,
                 .num_layers = layers,
                 .bidirectional = bidirectional,
                 .batch_first = true,
                 .proj_size = proj};
  w.model.output_size = output;
  w.model.per_step = per_step;
  w.batch = batch;
  w.steps = steps;
  w.loss = loss;
  return w;
}

Workload make_attention(std::string id, std::string name, int64_t heads, int64_t head_dim,
                        int64_t seq, int64_t batch) {
  Workload w;
  w.id = std::move(id);
  w.name = std::move(name);
  w.batch = batch;
  w.steps = seq;
  w.heads = heads;
  w.head_dim = head_dim;
  return w;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
}

}  // namespace

double Workload::gflop() const {
  if (heads) {  // q.k and p.v over T/2 keys on average
    const double forward =
        2.0 * 2 * double(batch * heads) * double(steps) * double(steps) / 2 * double(head_dim);
    return 3.5 * forward / 1e9;
  }
  if (model.family == ModelFamily::decoder) {
    // Per token and layer: q, k, v and o (C (H + 2 KV) D + H D C), the gated MLP (3 C F), causal
    // attention over T/2 keys on average (2 T H D); the head once (C V). A frozen base: forward
    // and the input gradients, no dW.
    const DecoderOptions& d = model.decoder;
    const double C = double(d.hidden_size), HD = double(d.num_heads * d.head_dim);
    const double KVD = double(d.num_kv_heads * d.head_dim), N = double(batch * steps);
    const double layer = C * (HD + 2 * KVD) + HD * C + 3 * C * double(d.intermediate_size);
    const double forward = 2 * N * (double(d.num_layers) * layer + C * double(d.vocab_size)) +
                           2 * N * double(steps) * HD * double(d.num_layers);
    return (d.adapter.kind == AdapterKind::none ? 3 : 2) * forward / 1e9;
  }
  if (model.family == ModelFamily::transformer) {
    // Per token: the blocks' weights (12 C^2 per layer), the head (C V), and causal attention
    // (on average T/2 keys: 2 (T/2) C for q.k and as much for p.v, per layer).
    const TransformerOptions& t = model.transformer;
    const double C = double(t.n_embd), L = double(t.n_layer), N = double(batch * steps);
    const double forward =
        2 * N * (12 * L * C * C + C * double(t.vocab_size)) + 2 * N * double(steps) * C * L;
    if (t.adapter.kind == AdapterKind::none) return 3 * forward / 1e9;
    return 2 * forward / 1e9;  // a frozen base: forward and the input gradients, no dW
  }
  const int64_t D = model.rnn.bidirectional ? 2 : 1, H = model.rnn.hidden_size;
  const int64_t P = model.rnn.state_size(), G = cell_type(model.rnn.cell).gates;
  double forward = 0;
  for (int64_t l = 0; l < model.rnn.num_layers; ++l) {
    const int64_t in =
        l == 0 ? (model.vocab_size ? model.embedding_dim : model.rnn.input_size) : D * P;
    forward += D * 2.0 * batch * steps * ((in + P) * G * H + (P < H ? H * P : 0));
  }
  forward += 2.0 * batch * (model.per_step ? steps : 1) * D * P * model.output_size;
  return 3 * forward / 1e9;
}

const std::vector<Workload>& workloads() {
  using L = Workload::Loss;
  static const std::vector<Workload> all = {
      make("W1", "lstm_i8_h128_l2_t150_b256", 0, 0, 8, 128, 2, false, 1, false, 256, 150, L::mse),
      make("W2", "bilstm_i4_h128_l2_t105_b512_mae", 0, 0, 4, 128, 2, true, 4, true, 512, 105,
           L::mse_masked),
      make("W3", "lstm_i6_h64_l1_t24_b64", 0, 0, 6, 64, 1, false, 1, false, 64, 24, L::mse),
      make("W4", "charlm_v65_e64_h512_l2_t128_b64", 65, 64, 64, 512, 2, false, 65, true, 64, 128,
           L::cross_entropy),
      make("W1g", "gru_i8_h128_l2_t150_b256", 0, 0, 8, 128, 2, false, 1, false, 256, 150, L::mse,
           CellKind::gru),
      make("W4g", "chargru_v65_e64_h512_l2_t128_b64", 65, 64, 64, 512, 2, false, 65, true, 64, 128,
           L::cross_entropy, CellKind::gru),
      make("W1p", "lstm_i8_h128_p64_l2_t150_b256", 0, 0, 8, 128, 2, false, 1, false, 256, 150,
           L::mse, CellKind::lstm, 64),
      make("W4p", "charlm_v65_e64_h512_p256_l2_t128_b64", 65, 64, 64, 512, 2, false, 65, true, 64,
           128, L::cross_entropy, CellKind::lstm, 256),
      make_gpt("W5", "gpt_v65_d384_l6_h6_t256_b16", 65, 384, 6, 6, 256, 16),
      make_gpt("W6", "gpt_v65_d384_l6_h6_t256_b16_dora_r8", 65, 384, 6, 6, 256, 16,
               AdapterKind::dora, 8),
      make_llama("W9", "llama_v2048_d384_f1024_l6_h6_kv2_t256_b16_dora_r8", 2048, 384, 1024, 6, 6,
                 2, 256, 16),
      make_attention("A5", "attention_h6_d64_t256_b16", 6, 64, 256, 16),
      make_attention("A5k", "attention_h6_d64_t1024_b4", 6, 64, 1024, 4),
  };
  return all;
}

const Workload& find_workload(const std::string& id) {
  for (const auto& w : workloads())
    if (w.id == id || w.name == id) return w;
  std::string ids;
  for (const auto& w : workloads()) ids += w.id + ", ";
  fail("unknown workload '", id, "' (expected ", ids, "or all)");
}

namespace {

// Attention alone: forward and backward of causal self-attention, as a transformer's block runs
// it (bf16 products under bf16 precision), on random inputs in the backend's memory.
BenchResult run_attention_benchmark(const Workload& w, const BenchOptions& options) {
  auto be = make_run_backend(options.device, {Op::memory, Op::attention});
  std::string notice;
  const DType gemm_dtype = backend_precision(options.precision, *be, &notice);
  AttentionShape s{.batch = w.batch, .seq = w.steps, .heads = w.heads, .head_dim = w.head_dim};
  s.scale = 1.0 / std::sqrt(double(w.head_dim));
  s.bf16_products = gemm_dtype == DType::bf16;
  s.fp16_products = gemm_dtype == DType::f16;
  const int64_t B = w.batch, T = w.steps, C = w.heads * w.head_dim;
  Rng rng(4);
  std::vector<float> qkv(static_cast<size_t>(B * T * 3 * C)), dout(static_cast<size_t>(B * T * C));
  for (float& v : qkv) v = static_cast<float>(rng.normal());
  for (float& v : dout) v = static_cast<float>(rng.normal());
  Buffer qkv_buf, out_buf, lse_buf, dout_buf, dqkv_buf;
  const Tensor qkv_t = qkv_buf.get(*be, DType::f32, {B, T, 3 * C});
  const Tensor out_t = out_buf.get(*be, DType::f32, {B, T, C});
  const Tensor lse_t = lse_buf.get(*be, DType::f32, {B, w.heads, T});
  const Tensor dout_t = dout_buf.get(*be, DType::f32, {B, T, C});
  const Tensor dqkv_t = dqkv_buf.get(*be, DType::f32, {B, T, 3 * C});
  be->upload(qkv_t, qkv.data());
  be->upload(dout_t, dout.data());
  auto step = [&] {
    be->attention_forward(
        {.shape = s, .qkv = qkv_t.data(), .out = out_t.data(), .lse = lse_t.data()}, DType::f32);
    be->attention_backward({.shape = s,
                            .qkv = qkv_t.data(),
                            .out = out_t.data(),
                            .lse = lse_t.data(),
                            .dout = dout_t.data(),
                            .dqkv = dqkv_t.data()},
                           DType::f32);
  };
  for (int i = 0; i < options.warmup; ++i) step();
  be->synchronize();
  BenchResult r;
  r.id = w.id;
  r.name = w.name;
  r.precision = gemm_precision_name(gemm_dtype);
  r.notice = notice;
  for (int i = 0; i < options.steps; ++i) {
    const double t0 = now_ms();
    step();
    be->synchronize();
    r.step_ms.push_back(now_ms() - t0);
  }
  r.median_ms = percentile(r.step_ms, 0.5);
  r.p10_ms = percentile(r.step_ms, 0.1);
  r.p90_ms = percentile(r.step_ms, 0.9);
  r.samples_per_s = double(B) / (r.median_ms / 1e3);
  r.gflops = w.gflop() / (r.median_ms / 1e3);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  r.peak_mb = usage.ru_maxrss / 1024.0;
  return r;
}

}  // namespace

void check_bench_options(const BenchOptions& options) {
  if (options.steps < 1) fail("--steps must be at least 1, got ", options.steps);
  // The first step pays for first use (the autotuner's timings, pages faulted in): never timed.
  if (options.warmup < 1)
    fail(
        "--warmup must be at least 1 (the first step pays for first use: choices timed, memory "
        "faulted in), got ",
        options.warmup);
  const std::string& p = options.precision;
  if (p != "fp32" && p != "bf16" && p != "fp16" && p != "auto")
    fail("--precision must be fp32, bf16, fp16 or auto, got '", p, "'");
  if (options.matmul_precision != "highest" && options.matmul_precision != "high")
    fail("--matmul-precision must be highest or high, got '", options.matmul_precision, "'");
  if (options.device != "cpu" && options.device != "cuda" && options.device != "auto")
    fail("--device must be auto, cpu or cuda, got '", options.device, "'");
}

BenchResult run_benchmark(const Workload& w, const BenchOptions& options) {
  check_bench_options(options);
  if (w.heads) return run_attention_benchmark(w, options);
  auto device = make_run_backend(options.device, ops_needed(w.model));
  device->set_float32_matmul_precision(options.matmul_precision);
  std::string notice;
  const DType gemm_dtype = backend_precision(options.precision, *device, &notice);
  RecordingBackend be(*device);
  ModelOptions model_options = w.model;
  model_options.transformer.checkpoint_activations = options.checkpoint_activations;
  model_options.decoder.checkpoint_activations = options.checkpoint_activations;
  std::unique_ptr<Model> made = make_model(model_options);
  Model& model = *made;
  model.initialize(be, 1);
  model.set_gemm_dtype(gemm_dtype);
  model.set_input_grad(false);  // the input is data
  Optimizer optimizer(be, model.parameters(), {.kind = "adam", .lr = 1e-3, .weight_decay = 0});
  if (const std::vector<bool> frozen = model.frozen_parameters(); !frozen.empty())
    optimizer.set_frozen(frozen);  // adapters: only they step
  Rng rng(2), salts(3);

  // Random data of the workload's shape, made once.
  const int64_t B = w.batch, T = w.steps;
  std::vector<float> x;
  std::vector<int64_t> ids, targets;
  if (w.model.vocab_size) {
    ids.resize(B * T);
    targets.resize(B * T);
    for (auto& v : ids) v = static_cast<int64_t>(rng.next() % w.model.vocab_size);
    for (auto& v : targets) v = static_cast<int64_t>(rng.next() % w.model.vocab_size);
  } else {
    x.resize(B * T * w.model.rnn.input_size);
    for (auto& v : x) v = static_cast<float>(rng.normal());
  }
  const int64_t rows = w.model.per_step ? B * T : B;
  std::vector<float> target(rows * w.model.output_size), mask, dy(rows * w.model.output_size);
  for (auto& v : target) v = static_cast<float>(rng.normal());
  if (w.loss == Workload::Loss::mse_masked) {
    mask.resize(rows);
    for (auto& v : mask) v = rng.uniform() < w.mask_ratio ? 1.0f : 0.0f;
  }
  // In the backend's memory (a GPU's, say), uploaded once.
  Buffer input_buf, target_buf, targets_buf, mask_buf, dy_buf;
  auto on_device = [&](Buffer& buf, DType dtype, Shape shape, const void* host) {
    Tensor t = buf.get(be, dtype, shape);
    if (host) be.upload(t, host);
    return t;
  };
  const Tensor input = w.model.vocab_size ? on_device(input_buf, DType::i64, {B, T}, ids.data())
                                          : on_device(input_buf, DType::f32,
                                                      {B, T, w.model.rnn.input_size}, x.data());
  const Tensor target_t =
      on_device(target_buf, DType::f32, {rows, w.model.output_size}, target.data());
  const Tensor targets_t =
      targets.empty() ? Tensor() : on_device(targets_buf, DType::i64, {rows}, targets.data());
  const Tensor mask_t =
      mask.empty() ? Tensor() : on_device(mask_buf, DType::f32, {rows}, mask.data());
  const Tensor dy_t = on_device(dy_buf, DType::f32, {rows, w.model.output_size}, nullptr);

  model.parameters().zero_grad(be);
  // As train steps: the loss and the gradients' sum of squares read back once, at the end; fp16
  // with the loss's gradient scaled and the gradients checked and unscaled.
  std::unique_ptr<LossScaler> scaler;
  if (gemm_dtype == DType::f16) scaler = std::make_unique<LossScaler>();
  Buffer stats_buf;
  const Tensor stats = stats_buf.get(be, DType::f64, {2});
  Batch batch;
  batch.size = B;
  batch.input = input;
  batch.target = target_t;
  batch.labels = targets_t;
  batch.mask = mask_t;
  // The optimizer's pass leaves the gradients zeroed for the next step.
  auto enqueue = [&](const Batch& b) {
    salts.reseed(3);  // the same masks every step: a replayed graph's
    Tensor out = model.forward(be, b.input, {}, {}, true, salts);
    if (w.loss == Workload::Loss::cross_entropy)
      be.cross_entropy_loss(out, b.labels, {}, -100, dy_t, stats.slice(0, 1));
    else
      be.regression_loss({}, out, b.target, b.mask, dy_t, stats.slice(0, 1));
    if (scaler) be.scale(dy_t, scaler->scale());
    model.backward(be, dy_t);
    fused_step(be, model.parameters(), optimizer, /*max_norm=*/0.0, scaler.get(),
               stats.slice(1, 2));
  };
  // As training runs them: replayed from a captured graph where the backend captures.
  std::unique_ptr<StepGraphs> graphs;
  if (be.captures() && options.cuda_graphs) {
    StepGraphs::Hooks hooks;
    hooks.enqueue = enqueue;
    hooks.host_key = [&] { return std::to_string(scaler ? scaler->scale() : 1.0); };
    hooks.replayed = [&] { optimizer.count_step(); };
    hooks.save = hooks.restore = [] {};  // a failed capture ends the benchmark's graphs only
    graphs = std::make_unique<StepGraphs>(be, std::move(hooks));
  }
  auto step = [&] {
    if (graphs)
      graphs->step(batch);
    else
      enqueue(batch);
    double host[2];
    be.download(host, stats);
    finish_step(host[1], 0.0, scaler.get(), optimizer);
  };

  BenchResult r;
  r.id = w.id;
  r.name = w.name;
  r.precision = gemm_precision_name(gemm_dtype);
  r.checkpoint_activations =
      options.checkpoint_activations && w.model.family != ModelFamily::recurrent;
  r.notice = notice;
  // A recurrence whose backward may run as whole chains tries both schedules on its first four
  // backward calls: none of them is timed.
  const bool tries =
      w.model.family == ModelFamily::recurrent && device->fuses_recurrence(w.model.rnn.cell);
  // The GEMMs of one step are recorded for the floor: with graphs (the timed steps are replays)
  // the captured step's, otherwise those of one more step after the timed ones.
  int warmup = tries ? std::max(options.warmup, 4) : options.warmup;
  if (graphs) warmup = std::max(warmup, StepGraphs::kWarmupSteps + 1);
  for (int i = 0; i < warmup; ++i) {
    be.recording = graphs && i == StepGraphs::kWarmupSteps;
    step();
  }
  be.recording = false;
  const int64_t replayed_before = graphs ? graphs->replayed_steps() : 0;
  if (options.profile) profiler::start();
  for (int i = 0; i < options.steps; ++i) {
    const double t0 = now_ms();
    step();
    be.synchronize();  // a device's queued work counts
    r.step_ms.push_back(now_ms() - t0);
  }
  if (options.profile) profiler::stop();
  if (graphs) {
    r.graph_steps = graphs->replayed_steps() - replayed_before;
    r.graphs_off = graphs->off_reason();
  }
  r.median_ms = percentile(r.step_ms, 0.5);
  r.p10_ms = percentile(r.step_ms, 0.1);
  r.p90_ms = percentile(r.step_ms, 0.9);
  r.samples_per_s = B / (r.median_ms / 1e3);
  r.gflops = w.gflop() / (r.median_ms / 1e3);

  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  r.peak_mb = usage.ru_maxrss / 1024.0;

  // The GEMM floor: the recorded GEMMs of one step, replayed alone, same library, same buffers.
  // Each replay follows a step of its own, and the ratio is the median of those pairs' ratios: a
  // shared machine's speed drifts from second to second, and a step and a floor timed apart
  // would see it differently.
  if (!graphs) {
    be.recording = true;
    step();
    be.recording = false;
    be.synchronize();
  }
  std::vector<double> floor_ms, ratios;
  for (int i = 0; i < std::max(3, options.steps / 2); ++i) {
    double t0 = now_ms();
    step();
    be.synchronize();
    const double step_ms = now_ms() - t0;
    t0 = now_ms();
    replay(*device, be.calls);
    device->synchronize();
    floor_ms.push_back(now_ms() - t0);
    ratios.push_back(step_ms / floor_ms.back());
  }
  r.gemm_floor_ms = percentile(floor_ms, 0.5);
  if (std::getenv("SEQFORGE_BENCH_GEMMS")) print_gemm_breakdown(*device, be.calls);
  r.floor_ratio = percentile(ratios, 0.5);
  be.release();
  return r;
}

}  // namespace seqforge
