// The autotuning cache's file: keys name the digest of the sources that timed them, a store keeps
// what other processes stored in the meantime, and the file keeps the choices of the four source
// trees that stored last (none of an earlier version's keys, which had no digest).
#include "seqforge/core/autotune.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

namespace seqforge {
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

  autotune::store(prefix + "gemm_f32|mine", "seqforge");
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
  autotune::store(prefix + "gemm_f32|second", "blis");
  EXPECT_EQ(read_json(path).value(prefix + "gemm_f32|mine", ""), "seqforge");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace seqforge
