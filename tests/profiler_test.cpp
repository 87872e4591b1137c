// The profiler (scopes, threads, counters, trace-event JSON, summary) and the resource monitor.
#include "seqforge/core/profiler.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "io/file_util.hpp"
#include "seqforge/core/resource_monitor.hpp"

namespace seqforge::profiler_test {
namespace {

namespace fs = std::filesystem;

void spin_for(double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  volatile double x = 0;
  while (std::chrono::steady_clock::now() < until) x = x + 1;
}

nlohmann::json write_and_read(const std::string& name) {
  const fs::path path = fs::temp_directory_path() / ("seqforge_profiler_test_" + name + ".json");
  profiler::write_trace(path.string());
  return nlohmann::json::parse(io::read_file(path.string()));
}

TEST(Profiler, OffByDefaultAndRecordsNothingWhenOff) {
  profiler::start();
  profiler::stop();
  EXPECT_FALSE(profiler::enabled());
  { SF_PROFILE_SCOPE("while off"); }
  profiler::counter("off counter", 1.0);
  EXPECT_TRUE(profiler::summary().empty());
}

TEST(Profiler, WritesChromeTraceWithThreadsAndCounters) {
  profiler::start();
  EXPECT_TRUE(profiler::enabled());
  {
    SF_PROFILE_SCOPE("outer");
    for (int i = 0; i < 3; ++i) {
      SF_PROFILE_SCOPE("inner", 1, 1);
      spin_for(0.002);
    }
  }
  std::thread writer([] {
    profiler::set_thread_name("checkpoint writer");
    SF_PROFILE_SCOPE("write");
    spin_for(0.001);
  });
  writer.join();
#pragma omp parallel num_threads(2)
  { SF_PROFILE_SCOPE("parallel"); }
  profiler::counter("rss MB", 12.5);
  profiler::stop();
  { SF_PROFILE_SCOPE("after stop"); }

  const nlohmann::json trace = write_and_read("trace");
  std::set<std::string> thread_names, complete, counters;
  std::map<std::string, int> calls;
  for (const auto& e : trace.at("traceEvents")) {
    const std::string ph = e.at("ph");
    if (ph == "M" && e.at("name") == "thread_name") thread_names.insert(e["args"]["name"]);
    if (ph == "X") {
      complete.insert(e.at("name").get<std::string>());
      ++calls[e.at("name").get<std::string>()];
      EXPECT_GE(e.at("ts").get<double>(), 0);
      EXPECT_GE(e.at("dur").get<double>(), 0);
      EXPECT_TRUE(e.contains("pid") && e.contains("tid"));
    }
    if (ph == "C") {
      counters.insert(e.at("name").get<std::string>());
      EXPECT_EQ(e["args"]["value"].get<double>(), 12.5);
    }
  }
  EXPECT_TRUE(thread_names.count("main"));
  EXPECT_TRUE(thread_names.count("checkpoint writer"));
  if (omp_get_max_threads() >= 2) {
    EXPECT_TRUE(thread_names.count("omp worker 1"));
  }
  EXPECT_EQ(calls["inner L1 reverse"], 3);
  EXPECT_EQ(calls["outer"], 1);
  EXPECT_EQ(calls["write"], 1);
  EXPECT_GE(calls["parallel"], 1);
  EXPECT_FALSE(complete.count("after stop"));
  EXPECT_TRUE(counters.count("rss MB"));

  const auto rows = profiler::summary();
  ASSERT_GE(rows.size(), 3u);
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_GE(rows[i - 1].total_ms, rows[i].total_ms);
  EXPECT_EQ(rows[0].name, "outer");
  EXPECT_GE(rows[0].total_ms, 6.0);
  EXPECT_GT(rows[0].share, 0.0);
  EXPECT_LE(rows[0].share, 1.0);
  std::ostringstream table;
  profiler::print_summary(table);
  EXPECT_NE(table.str().find("inner L1 reverse"), std::string::npos) << table.str();
}

TEST(Profiler, NewSessionDropsOldEvents) {
  profiler::start();
  { SF_PROFILE_SCOPE("first session"); }
  profiler::stop();
  profiler::start();
  { SF_PROFILE_SCOPE("second session"); }
  profiler::stop();
  const auto rows = profiler::summary();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].name, "second session");
}

TEST(Profiler, ManyEventsFromManyThreads) {
  profiler::start();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < 5000; ++i) SF_PROFILE_SCOPE("tiny");
    });
  for (auto& t : threads) t.join();
  profiler::stop();
  const auto rows = profiler::summary();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].calls, 20000);
}

TEST(ProfilerResourceMonitor, MeasuresCpuAndMemory) {
  EXPECT_GT(process_rss_bytes(), 1e6);
  EXPECT_GE(process_peak_rss_bytes(), process_rss_bytes() * 0.5);
  profiler::start();
  const auto wall = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  const double cpu0 = process_cpu_seconds(), wall0 = wall();
  ResourceMonitor monitor(0.05);
  spin_for(0.3);  // one core busy, as far as other processes let it
  const auto m = monitor.interval_summary();
  const double expected = 100.0 * (process_cpu_seconds() - cpu0) / (wall() - wall0);
  profiler::stop();
  EXPECT_GT(expected, 5.0);
  EXPECT_NEAR(m.at("cpu_percent"), expected, 0.1 * expected + 3.0);
  EXPECT_GT(m.at("rss_mb"), 1.0);
  EXPECT_GE(m.at("peak_rss_mb"), m.at("rss_mb") * 0.9);
  GpuSample g;
  EXPECT_EQ(m.count("gpu_util_percent"), gpu_sample(&g) ? 1u : 0u);
  int cpu_counters = 0;
  const nlohmann::json trace = write_and_read("monitor");
  for (const auto& e : trace.at("traceEvents"))
    cpu_counters += e.at("ph") == "C" && e.at("name") == "cpu % (100 = one core)";
  EXPECT_GE(cpu_counters, 2);
}

}  // namespace
}  // namespace seqforge::profiler_test
