#pragma once
// Helpers shared by the tests: host tensors in any float dtype, the error metric, data files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/buffer.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/rng.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/safetensors.hpp"

namespace seqforge::test {

// Owned backend memory filled from doubles, converted to `dtype`.
struct HostTensor {
  Buffer buffer;
  Tensor t;
  HostTensor() = default;
  HostTensor(Backend& be, DType dtype, Shape shape, const std::vector<double>& values) {
    t = buffer.get(be, dtype, shape);
    SF_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "values for ", shape.str());
    std::vector<std::byte> host(t.nbytes());
    convert(values.data(), DType::f64, host.data(), dtype, values.size());
    be.upload(t, host.data());
  }
};

// An empty directory for the running test's files, `name` within it: seqforge_<suite>_<test>_<name>
// in the system's temporary directory, emptied first. Named by the test, so that tests running side
// by side never share one.
inline std::filesystem::path temp_dir(const std::string& name) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = "seqforge_";
  if (test) dir += std::string(test->test_suite_name()) + "_" + test->name() + "_";
  dir += name;
  std::replace(dir.begin(), dir.end(), '/', '_');  // parameterised tests' names
  const std::filesystem::path path = std::filesystem::temp_directory_path() / dir;
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
  return path;
}

// Whether the CPU backend can run bf16 GEMMs here (AVX512-BF16 or AMX-BF16, under the
// SEQFORGE_MAX_ISA cap); tests of its bf16 path skip at once elsewhere (an AVX2-only CPU, say).
inline bool cpu_runs_bf16() { return cpu_features().avx512_bf16 || cpu_features().amx_bf16; }
#define SF_SKIP_WITHOUT_BF16()                                                               \
  do {                                                                                       \
    if (!::seqforge::test::cpu_runs_bf16())                                                  \
      GTEST_SKIP() << "needs AVX512-BF16 or AMX-BF16 for bf16 GEMMs; dispatch here reaches " \
                   << ::seqforge::isa_tier_name(::seqforge::isa_tier());                     \
  } while (0)

// Whether this is the sanitizer build, which checks memory, not numbers: its tests may take
// fewer steps and leave quality bounds to the release build.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif

// Whether sweep case `index` runs: every case in the release build; under the sanitizers every
// third (3 is coprime to the 2 and 4 combinations of a sweep's innermost flags, so each value of
// each parameter is still reached).
inline bool sweep_case_runs(int index) { return !sanitized || index % 3 == 0; }

// The message of the seqforge::Error that f throws, or "" if it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline std::vector<double> to_doubles(Tensor t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  convert(t.data(), t.dtype(), out.data(), DType::f64, out.size());
  return out;
}
// The same for a tensor of `be`'s memory (downloaded first).
inline std::vector<double> to_doubles(Backend& be, Tensor t) {
  std::vector<std::byte> host(t.nbytes());
  be.download(host.data(), t);
  return to_doubles(Tensor(host.data(), t.dtype(), t.shape()));
}

// max_i |got_i - want_i| / max(|want_i|, floor), floor = floor_frac * max_j |want_j| (at least
// 1e-30): relative error, with values near zero measured against a tenth of the tensor's scale
// (sums that cancel to near zero carry the rounding of their large terms).
inline double max_rel_error(const std::vector<double>& got, const std::vector<double>& want,
                            double floor_frac = 0.1) {
  if (got.size() != want.size()) return INFINITY;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  const double floor = std::max(floor_frac * scale, 1e-30);
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]) / std::max(std::fabs(want[i]), floor);
    err = std::isnan(e) ? INFINITY : std::max(err, e);
  }
  return err;
}

// ||got - want|| / ||want||: where bf16's rounding of each operand (2^-9) spreads over the sums,
// a tensor's error as a whole rather than its worst element's.
inline double relative_l2(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(err / norm);
}

// max_rel_error of an optimizer step's result, each value also judged against the value the step
// started from (`before`): the result is the sum of the old value and the update, so a parameter
// the step moved to near zero keeps no more float32 digits than that sum gives.
inline double step_rel_error(const std::vector<double>& got, const std::vector<double>& want,
                             const std::vector<double>& before) {
  if (got.size() != want.size() || before.size() != want.size()) return INFINITY;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]) /
                     std::max({std::fabs(want[i]), std::fabs(before[i]), 0.1 * scale, 1e-30});
    err = std::isnan(e) ? INFINITY : std::max(err, e);
  }
  return err;
}

// Pairs of short texts over "abc,\"e" (commas and quotes exercise the CSV's quoting), of varied
// lengths: `yes` when the second holds a quote (the first's quotes do not count: the segments
// tell them apart). Without labels, the columns first and second only.
inline std::string write_text_pairs(const std::filesystem::path& path, int rows, uint64_t seed,
                                    bool labels = true) {
  std::ofstream f(path);
  f << "first,second" << (labels ? ",label" : "") << "\n";
  Rng rng(seed);
  const std::string alphabet = "abc,\"e";
  auto text = [&](int64_t n) {
    std::string t;
    for (int64_t i = 0; i < n; ++i) t += alphabet[rng.next() % alphabet.size()];
    return t;
  };
  for (int i = 0; i < rows; ++i) {
    const std::string a = text(2 + static_cast<int64_t>(rng.next() % 9));
    const std::string b = text(1 + static_cast<int64_t>(rng.next() % 9));
    f << io::csv_field(a) << "," << io::csv_field(b);
    if (labels) f << "," << (b.find('"') != std::string::npos ? "yes" : "no");
    f << "\n";
  }
  return path.string();
}

// The largest difference between the f32 tensors of two runs' checkpoints (run directories);
// infinity where their names, dtypes or shapes differ.
inline double max_checkpoint_difference(const std::filesystem::path& a_run,
                                        const std::filesystem::path& b_run) {
  const auto a = io::SafetensorsFile::read((a_run / "model.safetensors").string());
  const auto b = io::SafetensorsFile::read((b_run / "model.safetensors").string());
  if (a.entries().size() != b.entries().size()) return INFINITY;
  double worst = 0;
  for (const auto& e : a.entries()) {
    const io::SafetensorsEntry* f = b.find(e.name);
    if (!f || e.dtype != DType::f32 || f->dtype != DType::f32 || f->shape != e.shape)
      return INFINITY;
    const auto* p = reinterpret_cast<const float*>(a.bytes(e).data());
    const auto* q = reinterpret_cast<const float*>(b.bytes(*f).data());
    for (size_t i = 0; i < a.bytes(e).size() / sizeof(float); ++i)
      worst = std::max(worst, std::fabs(double(p[i]) - double(q[i])));
  }
  return worst;
}

}  // namespace seqforge::test
