// The autotuning cache's file: keys name the digest of the sources that timed them, a store keeps
// what other processes stored in the meantime, and the file keeps the choices of the four source
// trees that stored last (none of an earlier version's keys, which had no digest); a choice timed
// while other processes ran on the CPUs stays in memory.
#include "seqforge/core/autotune.hpp"

#include <gtest/gtest.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace seqforge::autotune_test {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(1) << "\n";
}

TEST(Autotune, CacheKeysNameTheSourcesAndStoresMergeAndKeepFourTrees) {
  // Each test runs in a process of its own under ctest: the cache is first loaded here.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("seqforge_autotune_test_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  setenv("SEQFORGE_CACHE_DIR", dir.c_str(), 1);
  setenv("SEQFORGE_AUTOTUNE", "always_cache", 1);  // whatever else runs beside this test
  const std::string path = autotune::cache_path();
  ASSERT_EQ(path, (dir / "autotune.json").string());

  const std::string prefix = autotune::machine_prefix(2);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      prefix, m, std::regex(R"(\|2 threads\|seqforge \S+ sources ([0-9a-f]{12})\|$)")))
      << prefix;
  const std::string here = m[1];
  // The same machine's prefix as other source trees (id1 the most recent) would write it.
  auto prefix_of = [&](int i) {
    const std::string id = "00000000000" + std::to_string(i);
    return std::regex_replace(prefix, std::regex(" sources " + here), " sources " + id);
  };
  nlohmann::json seeded = {
      {"#sources", "000000000001 000000000002 000000000003 000000000004 000000000005"},
      {"AMD EPYC up to avx2|2 threads|seqforge 0.1.0|gemm_f32|legacy", "onednn"},
      {prefix + "gemm_f32|earlier", "openblas"}};
  for (int i = 1; i <= 5; ++i) seeded[prefix_of(i) + "gemm_f32|shape"] = "blis";
  write_json(path, seeded);

  EXPECT_EQ(autotune::lookup(prefix + "gemm_f32|earlier").value_or("none"), "openblas");
  EXPECT_FALSE(autotune::lookup(prefix + "gemm_f32|shape").has_value());

  // Another process stores a choice after this one has loaded the cache.
  nlohmann::json theirs = read_json(path);
  theirs[prefix + "gemm_f32|theirs"] = "blis";
  write_json(path, theirs);

  autotune::store(prefix + "gemm_f32|mine", "seqforge", autotune::Timing());
  const nlohmann::json stored = read_json(path);
  EXPECT_EQ(stored.value("#sources", ""), here + " 000000000001 000000000002 000000000003");
  EXPECT_EQ(stored.value(prefix + "gemm_f32|mine", ""), "seqforge");
  EXPECT_EQ(stored.value(prefix + "gemm_f32|theirs", ""), "blis");
  EXPECT_EQ(stored.value(prefix + "gemm_f32|earlier", ""), "openblas");
  for (int i = 1; i <= 3; ++i) EXPECT_TRUE(stored.contains(prefix_of(i) + "gemm_f32|shape")) << i;
  for (int i = 4; i <= 5; ++i) EXPECT_FALSE(stored.contains(prefix_of(i) + "gemm_f32|shape")) << i;
  EXPECT_FALSE(stored.contains("AMD EPYC up to avx2|2 threads|seqforge 0.1.0|gemm_f32|legacy"));
  EXPECT_EQ(stored.size(), 7u);
  EXPECT_EQ(autotune::lookup(prefix + "gemm_f32|theirs").value_or("none"), "blis");

  // This process's own choices stay over another process's later ones.
  nlohmann::json overwritten = read_json(path);
  overwritten[prefix + "gemm_f32|mine"] = "onednn";
  write_json(path, overwritten);
  autotune::store(prefix + "gemm_f32|second", "blis", autotune::Timing());
  EXPECT_EQ(read_json(path).value(prefix + "gemm_f32|mine", ""), "seqforge");
  unsetenv("SEQFORGE_AUTOTUNE");
  std::filesystem::remove_all(dir);
}

// Timing looks at this process's threads; one that ends between the listing and the read is
// skipped (the read's error once escaped from the timing and ended the run).
TEST(Autotune, TimingSurvivesThreadsEndingWhileItLooks) {
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    while (!stop) {
      std::vector<std::thread> brief;
      for (int i = 0; i < 16; ++i) brief.emplace_back([] {});
      for (std::thread& t : brief) t.join();
    }
  });
  int looks = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < end) {
    EXPECT_NO_THROW({
      const autotune::Timing timing;
      EXPECT_GE(timing.other_work(), 0);
    });
    ++looks;
  }
  stop = true;
  churn.join();
  EXPECT_GT(looks, 10);
}

TEST(Autotune, ChoicesTimedOnSharedCpusServeThisRunOnly) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("seqforge_autotune_shared_test_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  setenv("SEQFORGE_CACHE_DIR", dir.c_str(), 1);
  unsetenv("SEQFORGE_AUTOTUNE");
  const std::string prefix = autotune::machine_prefix(2);

  // Other processes, one more than there are CPUs, spinning while a choice is timed.
  std::vector<pid_t> spinners;
  for (int i = 0; i <= get_nprocs(); ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      volatile unsigned long spins = 0;
      for (;;) spins = spins + 1;
    }
    spinners.push_back(pid);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const autotune::Timing busy;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_GE(busy.other_work(), 1);
  autotune::store(prefix + "gemm_f32|busy", "blis", busy);
  EXPECT_EQ(autotune::lookup(prefix + "gemm_f32|busy").value_or("none"), "blis");
  EXPECT_FALSE(std::filesystem::exists(autotune::cache_path()) &&
               read_json(autotune::cache_path()).contains(prefix + "gemm_f32|busy"));
  // Test suites that run in parallel keep them.
  setenv("SEQFORGE_AUTOTUNE", "always_cache", 1);
  EXPECT_TRUE(autotune::enabled());
  autotune::store(prefix + "gemm_f32|busy_kept", "blis", busy);
  const nlohmann::json stored = read_json(autotune::cache_path());
  EXPECT_EQ(stored.value(prefix + "gemm_f32|busy_kept", ""), "blis");
  EXPECT_FALSE(stored.contains(prefix + "gemm_f32|busy"));
  for (pid_t pid : spinners) kill(pid, SIGKILL);
  for (pid_t pid : spinners) waitpid(pid, nullptr, 0);
  unsetenv("SEQFORGE_AUTOTUNE");
  std::filesystem::remove_all(dir);
}

// A cache that cannot be written (SEQFORGE_CACHE_DIR names a file, a read-only mount) is said
// once, and the choices say they serve this run only; a writable one keeps them again.
TEST(Autotune, ACacheThatCannotBeWrittenIsSaid) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("seqforge_autotune_unwritable_test_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "file") << "x";
  setenv("SEQFORGE_CACHE_DIR", (dir / "file").c_str(), 1);
  setenv("SEQFORGE_AUTOTUNE", "always_cache", 1);
  const std::string key = autotune::machine_prefix(2) + "gemm_f32|unwritable";
  testing::internal::CaptureStderr();
  autotune::store(key, "onednn", autotune::Timing());
  autotune::store(key + "2", "onednn", autotune::Timing());
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("autotune: cannot write " + (dir / "file" / "autotune.json").string() +
                      " (Not a directory): the choices serve this run only"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("cannot write", said.find("cannot write") + 1), std::string::npos) << said;
  EXPECT_EQ(autotune::lookup(key).value_or("none"), "onednn");
  EXPECT_EQ(autotune::where_kept(key).rfind("this run only: cannot write ", 0), 0u);
  setenv("SEQFORGE_CACHE_DIR", dir.c_str(), 1);
  autotune::store(key, "onednn", autotune::Timing());
  EXPECT_EQ(autotune::where_kept(key), "cached in " + autotune::cache_path());
  unsetenv("SEQFORGE_AUTOTUNE");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace seqforge::autotune_test
