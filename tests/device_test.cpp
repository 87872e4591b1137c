// train.device: the CPU, a GPU, or whichever can run the model. Without a GPU the cuda tests skip
// with the reason; with one, recurrent and transformer runs on the GPU match the same runs on the
// CPU, and a GPU run's checkpoint resumes on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>

#include "io/file_util.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/bench/bench.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/model.hpp"
#include "seqforge/text/tokenizer.hpp"
#include "seqforge/train/trainer.hpp"
#include "test_util.hpp"
#include "train/run.hpp"

namespace seqforge::device_test {
namespace {

namespace fs = std::filesystem;
using test::error_of;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("seqforge_device_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string write_series(const fs::path& dir) {
  const fs::path path = dir / "series.csv";
  std::ofstream f(path);
  f << "x,y\n";
  for (int i = 0; i < 400; ++i) f << std::sin(i * 0.2) << "," << std::cos(i * 0.07) << "\n";
  return path.string();
}

Config forecaster(const std::string& data, const fs::path& run, const std::string& cell,
                  const std::vector<std::string>& overrides = {}) {
  return Config::parse("data: {path: " + data +
                           ", targets: [x], lookback: 12}\nmodel: {cell: " + cell +
                           ", hidden: 16, layers: 2, dropout: 0.1}\ntrain: {epochs: 2, "
                           "batch_size: 16, precision: fp32, run_dir: " +
                           run.string() + "}\n",
                       "f.yaml", overrides);
}

TEST(Device, AnUnknownDeviceNamesTheKey) {
  const fs::path dir = fresh_dir("unknown");
  std::ostringstream log;
  EXPECT_EQ(error_of([&] {
              train(forecaster(write_series(dir), dir / "run", "lstm", {"train.device=tpu"}), log);
            }),
            "override 'train.device=tpu': train.device must be auto, cpu or cuda, got 'tpu'");
  EXPECT_EQ(
      error_of([&] {
        train(forecaster(write_series(dir), dir / "run", "lstm", {"train.matmul_precision=medium"}),
              log);
      }),
      "override 'train.matmul_precision=medium': train.matmul_precision must be highest or "
      "high, got 'medium'");
  EXPECT_FALSE(fs::exists(dir / "run"));
}

TEST(Device, CudaWithoutAGpuIsOneLineAndAutoTrainsOnTheCpu) {
  const std::string why = cuda_unavailable_reason();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is here: Device.GpuRunMatchesTheCpuRun runs";
  const fs::path dir = fresh_dir("no_gpu");
  const std::string data = write_series(dir);
  std::ostringstream log;
  EXPECT_EQ(
      error_of([&] { train(forecaster(data, dir / "cuda", "lstm", {"train.device=cuda"}), log); }),
      "override 'train.device=cuda': train.device cuda: " + why);
  EXPECT_FALSE(fs::exists(dir / "cuda"));
  train(forecaster(data, dir / "auto", "lstm", {"train.device=auto"}), log);
  EXPECT_NE(log.str().find("(cpu: "), std::string::npos) << log.str();
}

// Per cell, two epochs with dropout on the GPU and on the CPU from the same seed: the same masks
// (the counter hash) and float32 rounding apart, so the metrics agree closely; then the GPU run's
// checkpoint and training state continue on the CPU.
// train.device_check ran on the GPU run of `log` and found its first step agreeing with the
// CPU's; the line is printed, for its figures.
void expect_device_check_agrees(const std::string& log) {
  const size_t at = log.find(
      "device check: the first step's loss and gradients agree with the "
      "CPU's (");
  EXPECT_NE(at, std::string::npos) << log;
  EXPECT_EQ(log.find("differ from the CPU's"), std::string::npos) << log;
  if (at != std::string::npos) std::printf("%s\n", log.substr(at, log.find('\n', at) - at).c_str());
}

TEST(Device, GpuRunMatchesTheCpuRun) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const fs::path dir = fresh_dir("gpu");
  const std::string data = write_series(dir);
  for (const char* cell : {"lstm", "gru", "lnlstm"}) {
    std::ostringstream log;
    const TrainSummary cpu = train(
        forecaster(data, dir / (std::string(cell) + "_cpu"), cell, {"train.device=cpu"}), log);
    const fs::path gpu_run = dir / (std::string(cell) + "_gpu");
    const TrainSummary gpu = train(forecaster(data, gpu_run, cell, {"train.device=cuda"}), log);
    EXPECT_NE(log.str().find("(cuda: "), std::string::npos) << log.str();
    expect_device_check_agrees(log.str());
    // The LN-LSTM's layer norms of nearly constant rows amplify float32 rounding over the steps:
    // two host backends (cpu, reference) already end 1.4% apart on this run.
    const double tolerance = std::string(cell) == "lnlstm" ? 3e-2 : 1e-4;
    EXPECT_NEAR(gpu.best, cpu.best, tolerance * std::fabs(cpu.best)) << cell;
    // The GPU run's checkpoint and training state, continued for an epoch on the CPU.
    setenv("SEQFORGE_BACKEND", "cpu", 1);
    const TrainSummary resumed =
        train(Config::load((gpu_run / "config.resolved.yaml").string(), {"train.epochs=3"}), log,
              gpu_run.string());
    unsetenv("SEQFORGE_BACKEND");
    EXPECT_EQ(resumed.epochs, 3) << cell;
    EXPECT_TRUE(std::isfinite(resumed.last.at("val_loss"))) << cell;
  }
  // A bidirectional model whose head reads both directions' final states.
  std::ostringstream log;
  const std::vector<std::string> final_states = {"model.bidirectional=true",
                                                 "model.output=final_states"};
  auto on = [&](const char* device) {
    std::vector<std::string> o = final_states;
    o.push_back(std::string("train.device=") + device);
    return train(forecaster(data, dir / (std::string("final_") + device), "gru", o), log).best;
  };
  const double cpu = on("cpu");
  EXPECT_NEAR(on("cuda"), cpu, 1e-4 * std::fabs(cpu));
}

// The bytes of a run's model checkpoint's tensors.
std::string checkpoint_tensors(const fs::path& run) {
  const auto f = io::SafetensorsFile::read((run / "model.safetensors").string());
  std::string bytes;
  for (const auto& e : f.entries()) {
    const auto b = f.bytes(e);
    bytes.append(reinterpret_cast<const char*>(b.data()), b.size());
  }
  return bytes;
}

// The last epoch's line of a run's metrics.jsonl.
nlohmann::json last_metrics(const fs::path& run) {
  std::istringstream lines(io::read_file((run / "metrics.jsonl").string()));
  std::string line;
  nlohmann::json last;
  while (std::getline(lines, line))
    if (auto j = nlohmann::json::parse(line); j.contains("epoch")) last = j;
  return last;
}

// SEQFORGE_BACKEND=name for the guard's life.
struct BackendOverride {
  explicit BackendOverride(const char* name) { setenv("SEQFORGE_BACKEND", name, 1); }
  ~BackendOverride() { unsetenv("SEQFORGE_BACKEND"); }
};

// A character GPT on tiny Shakespeare (dropout on: the same masks), then DoRA adapters on it, on
// the GPU and on the CPU from the same seed: the validation losses agree to float32 rounding (and
// bf16 GEMMs on the GPU within 1%);
// the GPU's adapter run merges, resumes on the CPU, and samples on the GPU (the KV cache's
// decoding rows).
TEST(Device, GpuTransformerRunsMatchTheCpuRuns) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const fs::path dir = fresh_dir("gpu_transformer");
  const std::string text = (dir / "shakespeare.txt").string();
  std::ofstream(text)
      << io::read_file(SEQFORGE_SOURCE_DIR "/data/tinyshakespeare.txt").substr(0, 8000);
  const std::vector<std::string> small = {
      "data.path=" + text, "train.test_after=false", "model.embedding=32",  "model.layers=2",
      "model.heads=2",     "data.seq_len=32",        "train.batch_size=8",  "train.max_batches=6",
      "train.epochs=1",    "train.warmup_steps=2",   "train.precision=fp32"};
  auto config = [&](const std::string& device, const std::string& run,
                    std::vector<std::string> extra) {
    extra.insert(extra.begin(), small.begin(), small.end());
    extra.push_back("train.device=" + device);
    extra.push_back("train.run_dir=" + (dir / run).string());
    return Config::load(SEQFORGE_SOURCE_DIR "/examples/configs/shakespeare_gpt.yaml", extra);
  };
  std::ostringstream log;
  const TrainSummary cpu = train(config("cpu", "base_cpu", {}), log);
  const TrainSummary gpu = train(config("cuda", "base_gpu", {}), log);
  EXPECT_NE(log.str().find("(cuda: "), std::string::npos) << log.str();
  expect_device_check_agrees(log.str());
  EXPECT_NEAR(gpu.best, cpu.best, 1e-4 * std::fabs(cpu.best));
  std::ostringstream bf16_log;
  const TrainSummary bf16 = train(config("cuda", "bf16_gpu", {"train.precision=bf16"}), bf16_log);
  EXPECT_NE(bf16_log.str().find("bf16 GEMMs"), std::string::npos) << bf16_log.str();
  expect_device_check_agrees(bf16_log.str());
  EXPECT_NEAR(bf16.best, gpu.best, 0.01 * gpu.best);
  std::printf("val_loss: cpu %.7f, gpu %.7f, gpu bf16 %.7f\n", cpu.best, gpu.best, bf16.best);
  const std::vector<std::string> dora = {"adapter.kind=dora", "adapter.rank=4",
                                         "adapter.targets=[attn.c_attn, mlp.c_proj]",
                                         "model.init_from=" + (dir / "base_cpu").string()};
  const TrainSummary dora_cpu = train(config("cpu", "dora_cpu", dora), log);
  const TrainSummary dora_gpu = train(config("cuda", "dora_gpu", dora), log);
  EXPECT_NEAR(dora_gpu.best, dora_cpu.best, 1e-4 * std::fabs(dora_cpu.best));
  EXPECT_EQ(merge_adapters((dir / "dora_gpu").string(), (dir / "merged.safetensors").string()),
            2 * 2);
  {
    BackendOverride on_cpu("cpu");
    const TrainSummary resumed = train(
        Config::load((dir / "dora_gpu" / "config.resolved.yaml").string(), {"train.epochs=2"}), log,
        (dir / "dora_gpu").string());
    EXPECT_EQ(resumed.epochs, 2);
    EXPECT_TRUE(std::isfinite(resumed.last.at("val_loss")));
  }
  const std::string sample = generate((dir / "base_gpu").string(), "ROMEO:", 40, 1.0, 0, 7);
  EXPECT_EQ(sample.size(), std::string("ROMEO:").size() + 40) << sample;
}

// A Gemma 3 decoder (grouped-query attention, a local layer's sliding window shorter than the
// sequence, q/k norms) pre-trained from its config.json on tiny Shakespeare's BPE tokens, then
// DoRA on q and v from that run's folder, on the GPU and on the CPU from the same seed: the
// validation losses agree to float32 rounding (bf16 GEMMs on the GPU within 1%), and the GPU's
// run samples.
TEST(Device, GpuDecoderRunsMatchTheCpuRuns) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const fs::path dir = fresh_dir("gpu_decoder");
  const std::string text = (dir / "shakespeare.txt").string();
  const std::string sample = io::read_file(SEQFORGE_SOURCE_DIR "/data/tinyshakespeare.txt");
  std::ofstream(text) << sample.substr(0, 6000);
  const fs::path folder = dir / "gemma";
  fs::create_directories(folder);
  std::ofstream(folder / "tokenizer.json")
      << text::train_byte_level_bpe(sample.substr(0, 6000), {.vocab_size = 300});
  std::ofstream(folder / "config.json") << R"({
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 320,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "rope_scaling": null, "query_pre_attn_scalar": 8, "sliding_window": 9,
    "layer_types": ["sliding_attention", "full_attention"], "attn_logit_softcapping": null,
    "final_logit_softcapping": null, "attention_bias": false, "attention_dropout": 0.0,
    "tie_word_embeddings": true, "initializer_range": 0.02, "torch_dtype": "float32",
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0})";
  auto config = [&](const std::string& device, const std::string& run,
                    const std::vector<std::string>& extra) {
    std::vector<std::string> all = {
        "data.path=" + text,      "data.seq_len=32",
        "train.batch_size=8",     "train.max_batches=6",
        "train.epochs=1",         "train.warmup_steps=2",
        "train.test_after=false", "train.precision=fp32",
        "train.device=" + device, "train.run_dir=" + (dir / run).string()};
    all.insert(all.end(), extra.begin(), extra.end());  // the case's settings last
    return Config::load(SEQFORGE_SOURCE_DIR "/examples/configs/shakespeare_llama.yaml", all);
  };
  std::ostringstream log;
  const std::vector<std::string> base = {"model.init_from=" + folder.string()};
  const TrainSummary cpu = train(config("cpu", "base_cpu", base), log);
  const TrainSummary gpu = train(config("cuda", "base_gpu", base), log);
  EXPECT_NE(log.str().find("(cuda: "), std::string::npos) << log.str();
  expect_device_check_agrees(log.str());
  EXPECT_NEAR(gpu.best, cpu.best, 1e-4 * std::fabs(cpu.best));
  std::ostringstream bf16_log;
  std::vector<std::string> bf16_base = base;
  bf16_base.push_back("train.precision=bf16");
  const TrainSummary bf16 = train(config("cuda", "bf16_gpu", bf16_base), bf16_log);
  EXPECT_NE(bf16_log.str().find("bf16 GEMMs"), std::string::npos) << bf16_log.str();
  expect_device_check_agrees(bf16_log.str());
  EXPECT_NEAR(bf16.best, gpu.best, 0.01 * gpu.best);
  const std::vector<std::string> dora = {"adapter.kind=dora", "adapter.rank=4",
                                         "model.from_config=false",
                                         "model.init_from=" + (dir / "base_cpu").string()};
  const TrainSummary dora_cpu = train(config("cpu", "dora_cpu", dora), log);
  const TrainSummary dora_gpu = train(config("cuda", "dora_gpu", dora), log);
  EXPECT_NEAR(dora_gpu.best, dora_cpu.best, 1e-4 * std::fabs(dora_cpu.best));
  std::printf("val_loss: cpu %.7f, gpu %.7f, gpu bf16 %.7f; DoRA cpu %.7f, gpu %.7f\n", cpu.best,
              gpu.best, bf16.best, dora_cpu.best, dora_gpu.best);
  const std::string made = generate((dir / "base_gpu").string(), "ROMEO:", 20, 1.0, 0, 7);
  EXPECT_EQ(made.rfind("ROMEO:", 0), 0u) << made;
  EXPECT_GT(made.size(), std::string("ROMEO:").size()) << made;
}

// train.cuda_graphs: a run whose steps are replayed from a captured graph ends exactly where the
// eager run does (the same weights, bit for bit, and the same losses), with most steps replayed,
// dropout included (its masks drawn from a seed base in device memory); stateful runs stay eager
// with a note.
TEST(Device, GpuStepGraphsReplayTheEagerRun) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const fs::path dir = fresh_dir("gpu_graphs");
  const std::string data = write_series(dir);
  struct Case {
    std::string name, cell;
    std::vector<std::string> overrides;
    bool replays;
    const char* schedule;  // both runs held to one (other tests may tune the shape meanwhile)
  };
  const std::vector<Case> cases = {
      // Stacks of whole chains (wider than the cells' own input projection), on the emulated
      // GPU's 3 SMs a layer at a time (the LSTM's layers keep their weights resident alone) and
      // together (the GRU's keep them resident in neither).
      {"lstm", "lstm", {"model.dropout=0", "model.hidden=24"}, true, "whole_chains"},
      {"gru_stack", "gru", {"model.dropout=0", "model.hidden=40"}, true, "whole_chains"},
      {"gru_fp16",
       "gru",
       {"model.dropout=0", "train.precision=fp16", "train.clip_grad_norm=0.5"},
       true,
       "layered"},
      {"lnlstm_dropout", "lnlstm", {}, true, "layered"},
      // The stack's layers as a wavefront on streams of their own: forks, joins and the step
      // marks captured.
      {"lstm_streams", "lstm", {}, true, "side_by_side"},
      {"stateful", "lstm", {"model.dropout=0", "train.stateful=true"}, false, "layered"}};
  for (const Case& k : cases) {
    setenv("SEQFORGE_RECURRENT_SCHEDULE", k.schedule, 1);
    std::ostringstream eager_log, graph_log;
    auto run = [&](const std::string& graphs, std::ostream& log) {
      std::vector<std::string> o = k.overrides;
      o.push_back("train.device=cuda");
      o.push_back("train.cuda_graphs=" + graphs);
      return train(forecaster(data, dir / (k.name + "_" + graphs), k.cell, o), log);
    };
    const TrainSummary eager = run("off", eager_log);
    const TrainSummary graphed = run("auto", graph_log);
    EXPECT_EQ(graphed.best, eager.best) << k.name;
    EXPECT_EQ(graphed.last.at("train_loss"), eager.last.at("train_loss")) << k.name;
    EXPECT_TRUE(checkpoint_tensors(dir / (k.name + "_auto")) ==
                checkpoint_tensors(dir / (k.name + "_off")))
        << k.name << ": the weights differ";
    const nlohmann::json m = last_metrics(dir / (k.name + "_auto"));
    if (k.replays) {
      EXPECT_GE(m.value("graph_steps", 0), 5) << k.name << ": " << m.dump();
      EXPECT_EQ(graph_log.str().find("train.cuda_graphs"), std::string::npos) << graph_log.str();
    } else {
      EXPECT_EQ(m.value("graph_steps", 0), 0) << k.name << ": " << m.dump();
      EXPECT_NE(graph_log.str().find("note: train.cuda_graphs: "), std::string::npos)
          << graph_log.str();
    }
  }
  unsetenv("SEQFORGE_RECURRENT_SCHEDULE");
  // A character GPT without dropout: its steps replayed too, to the same weights.
  const std::string text = (dir / "shakespeare.txt").string();
  std::ofstream(text)
      << io::read_file(SEQFORGE_SOURCE_DIR "/data/tinyshakespeare.txt").substr(0, 6000);
  TrainSummary gpt[2];
  for (int i = 0; i < 2; ++i) {
    const std::string graphs = i ? "auto" : "off";
    std::ostringstream log;
    gpt[i] = train(
        Config::load(
            SEQFORGE_SOURCE_DIR "/examples/configs/shakespeare_gpt.yaml",
            {"data.path=" + text, "model.embedding=32", "model.layers=2", "model.heads=2",
             "model.dropout=0", "data.seq_len=32", "train.batch_size=8", "train.max_batches=9",
             "train.epochs=1", "train.test_after=false", "train.device=cuda",
             "train.cuda_graphs=" + graphs, "train.run_dir=" + (dir / ("gpt_" + graphs)).string()}),
        log);
  }
  EXPECT_EQ(gpt[1].best, gpt[0].best);
  EXPECT_TRUE(checkpoint_tensors(dir / "gpt_auto") == checkpoint_tensors(dir / "gpt_off"));
  EXPECT_EQ(last_metrics(dir / "gpt_auto").value("graph_steps", 0), 4);
}

// Micro-batches on the GPU: the step is the whole batch's, replayed as a graph where every
// micro-batch's weight is fixed by the batch's shape; mae's weights follow each batch's masks,
// so its micro-batched steps run eagerly, with a note.
TEST(Device, GpuMicroBatchesTakeTheWholeBatchStep) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const fs::path dir = fresh_dir("gpu_micro");
  const std::string data = write_series(dir);
  setenv("SEQFORGE_RECURRENT_SCHEDULE", "layered", 1);
  for (const std::string task : {"forecast", "mae"}) {
    auto run = [&](const std::string& name, const std::string& micro, std::ostream& log) {
      train(forecaster(data, dir / (task + name), "lstm",
                       {"data.task=" + task, "model.dropout=0", "train.device=cuda",
                        "train.cuda_graphs=auto", "train.micro_batch_size=" + micro}),
            log);
      return dir / (task + name);
    };
    std::ostringstream whole_log, micro_log;
    const fs::path whole = run("_whole", "0", whole_log);
    const fs::path micro = run("_micro", "6", micro_log);
    EXPECT_LT(test::max_checkpoint_difference(whole, micro), 1e-5) << task;
    EXPECT_NEAR(last_metrics(micro).at("val_loss").get<double>(),
                last_metrics(whole).at("val_loss").get<double>(), 1e-6)
        << task;
    const bool replays = task == "forecast";
    EXPECT_EQ(last_metrics(micro).value("graph_steps", 0) > 0, replays) << micro_log.str();
    EXPECT_EQ(micro_log.str().find("note: train.cuda_graphs: micro-batches") != std::string::npos,
              !replays)
        << micro_log.str();
  }
  unsetenv("SEQFORGE_RECURRENT_SCHEDULE");
}

// train.micro_batch_size auto on a GPU: the largest micro-batch whose step fits 90% of the free
// memory (the emulated GPU's set to hold the parameters' bytes and 6.5 examples' activations), the
// same steps as the whole batch's, the number in config.resolved.yaml; a GPU whose free memory
// cannot be set (a real one) holds the whole batch.
TEST(Device, GpuAutoMicroBatchFitsTheFreeMemory) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const fs::path dir = fresh_dir("gpu_auto_micro");
  const std::string data = write_series(dir);
  setenv("SEQFORGE_RECURRENT_SCHEDULE", "layered", 1);
  auto config = [&](const std::string& name, const std::string& micro) {
    return forecaster(data, dir / name, "lstm",
                      {"model.dropout=0", "train.device=cuda", "train.micro_batch_size=" + micro});
  };
  std::ostringstream whole_log, auto_log;
  train(config("whole", "0"), whole_log);
  const Task task = load_task(config("auto", "auto"));
  const double per_example = activation_bytes(task.model, task.steps(), 1, false);
  const double fixed = 16.0 * double(make_model(task.model)->parameters().count());
  const auto free = static_cast<size_t>((fixed + 6.5 * per_example) / 0.9);
  setenv("SEQFORGE_EMULATED_FREE_BYTES", std::to_string(free).c_str(), 1);
  size_t seen = 0, total = 0;
  std::string device;
  make_backend("cuda")->device_memory(&seen, &total, &device);
  const bool set = seen == free;
  train(config("auto", "auto"), auto_log);
  unsetenv("SEQFORGE_EMULATED_FREE_BYTES");
  unsetenv("SEQFORGE_RECURRENT_SCHEDULE");
  const std::string chosen =
      set ? "6 of each batch of 16 at once" : "the whole batch of 16 at once";
  EXPECT_NE(auto_log.str().find("note: train.micro_batch_size auto: " + chosen), std::string::npos)
      << auto_log.str();
  EXPECT_NE(io::read_file((dir / "auto" / "config.resolved.yaml").string())
                .find(set ? "micro_batch_size: 6\n" : "micro_batch_size: 0\n"),
            std::string::npos);
  EXPECT_LT(test::max_checkpoint_difference(dir / "whole", dir / "auto"), 1e-5);
}

// NCCL on this GPU as a job of one rank: loaded, joined, and a sum over the one rank leaves a
// tensor as it was (what a job of several GPUs runs, short of the other GPUs).
TEST(Device, GpuNcclSumsAsAJobOfOne) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  auto be = make_backend("cuda");
  if (const std::string why = be->collectives_unavailable(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_NE(be->device_identity(), 0u);
  be->join_collectives({.rank = 0, .size = 1, .broadcast = [](std::span<std::byte>) {}});
  EXPECT_NE(be->collectives_name().find("NCCL"), std::string::npos) << be->collectives_name();
  std::vector<double> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25 * double(i) - 7;
  test::HostTensor x(*be, DType::f32, {1000}, values);
  be->all_reduce_sum(x.t);
  EXPECT_EQ(test::to_doubles(*be, x.t), values);
}

// seqforge bench on a GPU times replayed steps, as training runs them; --no-cuda-graphs eager ones.
TEST(Device, GpuBenchTimesReplayedSteps) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  BenchOptions options;
  options.device = "cuda";
  options.steps = 3;
  const BenchResult graphed = run_benchmark(find_workload("W3"), options);
  EXPECT_EQ(graphed.graph_steps, 3);
  EXPECT_EQ(graphed.graphs_off, "");
  EXPECT_GT(graphed.gemm_floor_ms, 0);
  options.cuda_graphs = false;
  EXPECT_EQ(run_benchmark(find_workload("W3"), options).graph_steps, 0);
}

// fp16 GEMMs with GradScaler's loss scaling, on a backend that has them (cuda; the reference, as
// the oracle): the loss follows the fp32 run's, the scale is logged, kept in the training state
// and carried through a resume; the cell state, the master weights and the gradients stay f32.
void check_fp16_run(const std::string& device, const fs::path& dir) {
  const std::string data = write_series(dir);
  for (const char* cell : {"lstm", "gru"}) {
    std::ostringstream log;
    const TrainSummary fp32 = train(
        forecaster(data, dir / (std::string(cell) + "_fp32"), cell, {"train.device=" + device}),
        log);
    const fs::path run = dir / (std::string(cell) + "_fp16");
    const TrainSummary fp16 =
        train(forecaster(data, run, cell, {"train.device=" + device, "train.precision=fp16"}), log);
    EXPECT_NE(log.str().find("fp16 GEMMs with dynamic loss scaling"), std::string::npos)
        << log.str();
    EXPECT_NEAR(fp16.best, fp32.best, 1e-3 * std::fabs(fp32.best)) << cell;
    EXPECT_NE(fp16.best, fp32.best) << cell << ": the fp16 run rounded nothing";
    const nlohmann::json m = last_metrics(run);
    EXPECT_EQ(m.at("loss_scale"), 65536.0) << m.dump();  // 2 short epochs: no overflow, no growth
    EXPECT_EQ(m.at("skipped_steps"), 0) << m.dump();
    const auto state = io::SafetensorsFile::read((run / "training_state.safetensors").string());
    const auto loop = nlohmann::json::parse(state.metadata().at("seqforge.loop"));
    EXPECT_GT(loop.at("loss_scale_growth").get<int64_t>(), 0) << loop.dump();
    const TrainSummary resumed =
        train(Config::load((run / "config.resolved.yaml").string(), {"train.epochs=3"}), log,
              run.string());
    EXPECT_EQ(resumed.epochs, 3) << cell;
    EXPECT_TRUE(std::isfinite(resumed.last.at("val_loss"))) << cell;
    const auto after = nlohmann::json::parse(
        io::SafetensorsFile::read((run / "training_state.safetensors").string())
            .metadata()
            .at("seqforge.loop"));
    EXPECT_GT(after.at("loss_scale_growth").get<int64_t>(),
              loop.at("loss_scale_growth").get<int64_t>())
        << "the clean steps before the resume count on";
  }
}

// The same for a character GPT: fp16 GEMM operands (LayerNorm and GELU writing them directly,
// the weights' and adapters' copies), the loss scaled.
void check_fp16_transformer_run(const std::string& device, const fs::path& dir) {
  const std::string text = (dir / "shakespeare.txt").string();
  std::ofstream(text)
      << io::read_file(SEQFORGE_SOURCE_DIR "/data/tinyshakespeare.txt").substr(0, 6000);
  auto config = [&](const std::string& run, std::vector<std::string> extra) {
    for (const char* o : {"model.embedding=32", "model.layers=2", "model.heads=2",
                          "data.seq_len=32", "train.batch_size=8", "train.max_batches=5",
                          "train.epochs=1", "train.warmup_steps=0", "train.test_after=false"})
      extra.push_back(o);
    extra.push_back("data.path=" + text);
    extra.push_back("train.device=" + device);
    extra.push_back("train.run_dir=" + (dir / run).string());
    return Config::load(SEQFORGE_SOURCE_DIR "/examples/configs/shakespeare_gpt.yaml", extra);
  };
  std::ostringstream log;
  const TrainSummary fp32 = train(config("gpt_fp32", {"train.precision=fp32"}), log);
  const TrainSummary fp16 = train(config("gpt_fp16", {"train.precision=fp16"}), log);
  EXPECT_NE(log.str().find("fp16 GEMMs with dynamic loss scaling"), std::string::npos) << log.str();
  EXPECT_NEAR(fp16.best, fp32.best, 1e-2 * fp32.best);
  EXPECT_NE(fp16.best, fp32.best) << "the fp16 run rounded nothing";
  EXPECT_EQ(last_metrics(dir / "gpt_fp16").at("skipped_steps"), 0);
  const std::vector<std::string> lora = {"adapter.kind=lora", "adapter.rank=4",
                                         "model.init_from=" + (dir / "gpt_fp32").string()};
  std::vector<std::string> lora16 = lora;
  lora16.push_back("train.precision=fp16");
  const TrainSummary adapted32 = train(config("lora_fp32", lora), log);
  const TrainSummary adapted16 = train(config("lora_fp16", lora16), log);
  EXPECT_NEAR(adapted16.best, adapted32.best, 1e-2 * adapted32.best);
}

TEST(Device, Fp16OnTheReferenceFollowsFp32) {
  const BackendOverride reference("reference");
  check_fp16_run("cpu", fresh_dir("fp16_reference"));
  check_fp16_transformer_run("cpu", fresh_dir("fp16_reference_gpt"));
}

TEST(Device, Fp16OnTheGpuFollowsFp32) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  check_fp16_run("cuda", fresh_dir("fp16_gpu"));
  check_fp16_transformer_run("cuda", fresh_dir("fp16_gpu_gpt"));
}

// The CPU backend has no fp16 GEMMs: fp32, said once.
TEST(Device, Fp16OnTheCpuIsFp32WithANote) {
  const fs::path dir = fresh_dir("fp16_cpu");
  std::ostringstream log;
  train(forecaster(write_series(dir), dir / "run", "lstm",
                   {"train.device=cpu", "train.precision=fp16", "train.epochs=1"}),
        log);
  EXPECT_NE(log.str().find("fp32 GEMMs (cpu: "), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("note: train.precision fp16: the cpu backend runs no fp16 GEMMs (fp16 "
                           "is for GPUs: train.device cuda); fp32 GEMMs instead"),
            std::string::npos)
      << log.str();
  EXPECT_FALSE(last_metrics(dir / "run").contains("loss_scale"));
}

// The estimate against a device's free memory: the batch that fits is named, or the model is too
// big for any batch.
TEST(Device, ABatchTheDeviceCannotHoldNamesTheOneThatFits) {
  ModelOptions m;
  m.rnn.input_size = 4, m.rnn.hidden_size = 512, m.rnn.num_layers = 2, m.output_size = 1;
  auto model = make_model(m);
  const int64_t T = 200;
  double need = 0;
  EXPECT_EQ(step_fit_problem(1e12, "GPU 0, Test", *model, m, T, 256, false, &need), "");
  const double per_example = activation_bytes(m, T, 1, false);
  const double fixed = need - 256 * per_example;
  EXPECT_NEAR(fixed, 16.0 * double(model->parameters().count()), 1.0)
      << "values, gradients and two moments in f32";
  // What auto takes: 90% of the free memory for the parameters' and 100.5 examples' bytes.
  const std::string problem = step_fit_problem((fixed + 100.5 * per_example) / 0.9, "GPU 0, Test",
                                               *model, m, T, 256, false);
  EXPECT_NE(problem.find("on GPU 0, Test"), std::string::npos) << problem;
  EXPECT_TRUE(
      problem.ends_with(": train.micro_batch_size 100 fits (the same steps, run in "
                        "micro-batches; `auto` chooses it)"))
      << problem;
  std::string why;
  EXPECT_EQ(
      auto_micro_batch(*model, m, T, 256, false, (fixed + 100.5 * per_example) / 0.9, true, &why),
      100)
      << why;
  EXPECT_EQ(
      auto_micro_batch(*model, m, T, 64, false, (fixed + 100.5 * per_example) / 0.9, true, &why),
      64)
      << "the whole batch where it fits";
  EXPECT_NE(why.find("the whole batch of 64 at once"), std::string::npos) << why;
  EXPECT_EQ(auto_micro_batch(*model, m, T, 256, false, fixed / 2, true, &why), 0) << why;
  // On the CPU: the activations in half the available memory, the parameters apart, at least 1.
  EXPECT_EQ(auto_micro_batch(*model, m, T, 256, false, 2 * 40.5 * per_example, false, &why), 40)
      << why;
  EXPECT_EQ(auto_micro_batch(*model, m, T, 256, false, per_example / 4, false, &why), 1) << why;
  EXPECT_TRUE(step_fit_problem(fixed / 2, "GPU 0, Test", *model, m, T, 256, false)
                  .ends_with("even a batch of 1 does not fit; make the model (model.hidden, "
                             "model.layers) or the windows (data.lookback, data.seq_len) smaller"));
  // Half-precision copies of the gates and outputs cost more per example.
  EXPECT_GT(activation_bytes(m, T, 1, true), per_example);
}

// On the GPU (the emulated one offers 1 GiB), a batch that does not fit is refused before
// anything is allocated, naming the batch size that fits.
TEST(Device, TheGpuRefusesABatchItCannotHold) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  size_t free = 0, total = 0;
  std::string device;
  ASSERT_TRUE(make_cuda_backend()->device_memory(&free, &total, &device));
  if (free >= (size_t{4} << 30))
    GTEST_SKIP() << device << " has " << (free >> 20) << " MiB free: more than this test's "
                 << "largest batch needs";
  const fs::path dir = fresh_dir("gpu_batch");
  const fs::path path = dir / "long.csv";
  {
    std::ofstream f(path);
    f << "x,y\n";
    for (int i = 0; i < 3000; ++i) f << std::sin(i * 0.2) << "," << std::cos(i * 0.07) << "\n";
  }
  std::ostringstream log;
  const std::string error = error_of([&] {
    train(forecaster(path.string(), dir / "run", "lstm",
                     {"train.device=cuda", "model.hidden=1024", "data.lookback=200",
                      "train.batch_size=2000"}),
          log);
  });
  EXPECT_TRUE(
      error.starts_with("override 'train.batch_size=2000': train.batch_size 2000: a "
                        "training step needs about "))
      << error;
  EXPECT_NE(error.find(" fits"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir / "run" / "model.safetensors"));
}

}  // namespace
}  // namespace seqforge::device_test
