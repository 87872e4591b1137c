// Hostile run directories: a run directory held by another process, damaged training states and
// checkpoints with non-finite values, each refused with one line naming the file and the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/file_util.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/train/trainer.hpp"
#include "test_util.hpp"

namespace seqforge {
namespace {

namespace fs = std::filesystem;
using test::error_of;

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("seqforge_hostile_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string write_series(const fs::path& dir, int rows) {
  const fs::path path = dir / "series.csv";
  std::ofstream f(path);
  f << "when,signal,other\n";
  for (int i = 0; i < rows; ++i) {
    char date[32];
    std::snprintf(date, sizeof date, "2020-01-%02dT%02d:00:00", 1 + i / 24, i % 24);
    f << date << "," << std::sin(i * 0.3) << "," << std::cos(i * 0.05) << "\n";
  }
  return path.string();
}

Config forecast(const std::string& data, const fs::path& run,
                const std::vector<std::string>& overrides = {}) {
  return Config::parse("data:\n  path: " + data +
                           "\n  date_column: when\n  features: [signal, other]\n"
                           "  targets: [signal]\n  lookback: 8\nmodel: {hidden: 8}\n"
                           "train: {epochs: 2, batch_size: 16" +
                           (run.empty() ? "" : ", run_dir: " + run.string()) + "}\n",
                       "f.yaml", overrides);
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(HostileRuns, ARunDirectoryHeldByAnotherProcessIsRefusedAndLeftAlone) {
  const fs::path dir = temp_dir("lock");
  const std::string data = write_series(dir, 200);
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(data, run, {"train.epochs=1"}), log);
  const std::string metrics = io::read_file((run / "metrics.jsonl").string());
  const auto model_time = fs::last_write_time(run / "model.safetensors");
  io::DirLock other;  // as another process's train would hold it
  long holder = 0;
  ASSERT_TRUE(other.try_lock(run.string(), &holder));
  io::DirLock second;
  EXPECT_FALSE(second.try_lock(run.string(), &holder));
  EXPECT_EQ(holder, static_cast<long>(getpid()));
  const std::string held = "pid " + std::to_string(getpid());
  for (int how = 0; how < 3; ++how) {  // plain, --overwrite, --resume
    const std::string e = error_of([&] {
      if (how == 2)
        train(Config::load((run / "config.resolved.yaml").string()), log, run.string());
      else
        train(forecast(data, run, {"train.epochs=1"}), log, "", {}, how == 1);
    });
    EXPECT_HAS(e, run.string() + ": in use");
    EXPECT_HAS(e, held);
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_EQ(io::read_file((run / "metrics.jsonl").string()), metrics);
    EXPECT_EQ(fs::last_write_time(run / "model.safetensors"), model_time);
  }
  // Reading a run needs no lock: eval runs beside a training.
  EXPECT_GT(evaluate(run.string(), "test").at("samples"), 0);
  other.release();
  train(forecast(data, run, {"train.epochs=1"}), log, "", {}, /*overwrite=*/true);
  // A default directory held by a run under way is passed over for the next one.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  ASSERT_TRUE(other.try_lock("runs/f", &holder));
  const TrainSummary s = train(forecast(data, "", {"train.epochs=1"}), log);
  fs::current_path(cwd);
  EXPECT_EQ(s.run_dir, "runs/f-2");
  other.release();
  // A directory the lock created for a run that failed before writing anything goes again.
  EXPECT_FALSE(fs::exists(dir / "runs" / "f"));
  const fs::path fresh = dir / "fresh";
  EXPECT_HAS(error_of([&] { train(forecast(data, fresh, {"optim.decay_params=none"}), log); }),
             "optim.decay_params");
  EXPECT_FALSE(fs::exists(fresh));
}

}  // namespace
}  // namespace seqforge
