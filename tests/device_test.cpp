// train.device: the CPU, a GPU, or whichever can run the model. Without a GPU the cuda tests skip
// with the reason; with one, a recurrent run on the GPU matches the same run on the CPU, and a
// GPU run's checkpoint resumes on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/file_util.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/train/trainer.hpp"
#include "test_util.hpp"

namespace seqforge {
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

TEST(Device, Fp16OnTheReferenceFollowsFp32) {
  const BackendOverride reference("reference");
  check_fp16_run("cpu", fresh_dir("fp16_reference"));
}

TEST(Device, Fp16OnTheGpuFollowsFp32) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  check_fp16_run("cuda", fresh_dir("fp16_gpu"));
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

}  // namespace
}  // namespace seqforge
