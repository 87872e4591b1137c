// Core: dtype conversions (checked against values PyTorch 1.13 produces), shapes, tensors,
// arenas, buffers and the random generator.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "seqforge/backend/arena.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/buffer.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/rng.hpp"
#include "seqforge/core/threads.hpp"
#include "test_util.hpp"

namespace seqforge::core_test {
namespace {

// float -> (bf16 bits, f16 bits), from torch.tensor(v).to(torch.bfloat16 / torch.float16).
struct Rounding {
  float value;
  uint16_t bf16_bits, f16_bits;
};
constexpr Rounding kRoundings[] = {
    {1.0f, 16256, 15360},        {1.00390625f, 16256, 15364},  // ties to even
    {1.01171875f, 16258, 15372}, {3.14159265f, 16457, 16968},
    {-2.5e-39f, 32795, 32768},   {65504.0f, 18304, 31743},  // f16 max
    {65520.0f, 18304, 31744},    {1e-8f, 12844, 0},         // f16 overflow, underflow
    {6e-8f, 13185, 1},           {3e38f, 32610, 31744},     // f16 smallest subnormal
    {3.3961e38f, 32639, 31744},  {INFINITY, 32640, 31744},
};

TEST(DType, RoundsLikePyTorch) {
  for (const auto& r : kRoundings) {
    EXPECT_EQ(to_bf16(r.value).bits, r.bf16_bits) << r.value;
    EXPECT_EQ(to_f16(r.value), r.f16_bits) << r.value;
  }
}

TEST(DType, RoundTripsAndNaN) {
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(from_f16(to_f16(NAN))));
  for (float v : {0.0f, -1.5f, 0.15625f, 1024.0f}) EXPECT_EQ(from_bf16(to_bf16(v)), v);
  for (float v : {0.0f, -1.5f, 0.15625f, 1024.0f, -65504.0f}) EXPECT_EQ(from_f16(to_f16(v)), v);
  EXPECT_EQ(from_f16(1), std::ldexp(1.0f, -24));
  EXPECT_EQ(from_f16(31744), INFINITY);
  std::vector<float> src = {1.0f, -2.0f, 0.5f};
  std::vector<uint16_t> half(3);
  std::vector<double> back(3);
  convert(src.data(), DType::f32, half.data(), DType::bf16, 3);
  convert(half.data(), DType::bf16, back.data(), DType::f64, 3);
  EXPECT_EQ(back, (std::vector<double>{1.0, -2.0, 0.5}));
}

TEST(DType, SafetensorsNames) {
  DType t;
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    ASSERT_TRUE(dtype_from_safetensors_name(dtype_safetensors_name(d), &t));
    EXPECT_EQ(t, d);
  }
  EXPECT_FALSE(dtype_from_safetensors_name("BOOL", &t));
}

// Errors quote data (cells, column names, file contents): printed, a message stays one line and
// never sends the terminal a control sequence; UTF-8 text is kept as it is.
TEST(Errors, MessagesEscapeControlCharactersAndBytesThatAreNotUtf8) {
  const std::string cell("a\x1b[2J\nb\0c\xff\t\xc3\xa9\xe2\x82\xac\xed\xa0\x80", 19);
  EXPECT_EQ(test::error_of([&] { fail("no column '", cell, "'"); }),
            "no column 'a\\x1b[2J\\nb\\0c\\xff\\x09\xc3\xa9\xe2\x82\xac\\xed\\xa0\\x80'");
  EXPECT_EQ(printable("plain, \xf0\x9f\x98\x80 and \x7f"), "plain, \xf0\x9f\x98\x80 and \\x7f");
  // Bidirectional controls, which would turn the rest of the line around, as their codes.
  EXPECT_EQ(printable("a\u202e 3.994 \u2066b\u2069\u061c"),
            "a\\u202e 3.994 \\u2066b\\u2069\\u061c");
  const std::string check = test::error_of([] { SF_CHECK(false, "bad\nline"); });
  EXPECT_EQ(check.find('\n'), std::string::npos) << check;
}

TEST(Tensor, ShapeSliceReshape) {
  std::vector<float> data(24);
  Tensor t(data.data(), DType::f32, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.shape().str(), "(2, 3, 4)");
  Tensor s = t.slice(1, 2);
  EXPECT_EQ(s.data(), data.data() + 12);
  EXPECT_EQ(s.shape(), Shape({1, 3, 4}));
  EXPECT_EQ(t.reshape({6, 4}).shape(), Shape({6, 4}));
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_THROW(t.slice(1, 3), Error);
  EXPECT_THROW(Shape({1, 2, 3, 4, 5}), Error);
  // Sizes whose product overflows are refused, not wrapped (a hostile file's shape, say).
  EXPECT_NE(test::error_of([] {
              Shape({int64_t{1} << 40, int64_t{1} << 30});
            }).find("a tensor of shape (1099511627776, 1073741824) holds more elements"),
            std::string::npos);
  EXPECT_EQ(Shape({int64_t{1} << 62, int64_t{1} << 62, 0}).numel(), 0);
  EXPECT_THROW(t.data_as<double>(), Error);
}

TEST(Arena, AlignedNamedViews) {
  auto be = make_cpu_backend();
  Arena arena(DType::f32);
  arena.add("a", {3});
  arena.add("b", {5, 7});
  EXPECT_THROW(arena.add("a", {1}), Error);
  arena.allocate(*be);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.view("b").data()) % 64, 0u);
  EXPECT_EQ(arena.view(1).shape(), Shape({5, 7}));
  EXPECT_THROW(arena.view("c"), Error);
  EXPECT_THROW(arena.add("c", {1}), Error);
  Arena twin = arena.like(*be);
  EXPECT_EQ(twin.elements(), arena.elements());
  EXPECT_EQ(twin.entries()[1].offset, arena.entries()[1].offset);
  EXPECT_EQ(arena.entries()[1].offset, 16u);  // 3 floats, then the next 64-byte boundary
  EXPECT_EQ(arena.elements(), 16u + 35u);
  ASSERT_NE(twin.find("b"), nullptr);
  EXPECT_EQ(twin.find("b")->shape, Shape({5, 7}));
  EXPECT_EQ(twin.find("c"), nullptr);
  for (double v : std::vector<float>(static_cast<float*>(twin.flat().data()),
                                     static_cast<float*>(twin.flat().data()) + twin.elements()))
    EXPECT_EQ(v, 0.0);
  Arena moved = std::move(twin);
  EXPECT_EQ(moved.view("b").shape(), Shape({5, 7}));
}

TEST(Arena, EntriesOfANarrowerDtypeTakeTheirOwnBytes) {
  auto be = make_cpu_backend();
  Arena wide(DType::f32), mixed(DType::f32);
  for (Arena* a : {&wide, &mixed}) {
    a->add("w", {64, 33});
    a->add("b", {64});
  }
  mixed.set_dtype(0, DType::bf16);
  EXPECT_EQ(mixed.entries()[0].dtype, DType::bf16);
  EXPECT_EQ(wide.entries()[0].dtype, DType::f32);
  wide.allocate(*be);
  mixed.allocate(*be);
  EXPECT_EQ(mixed.view(0).dtype(), DType::bf16);
  EXPECT_EQ(mixed.view(0).shape(), Shape({64, 33}));
  EXPECT_EQ(mixed.view(1).dtype(), DType::f32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mixed.view(1).data()) % 64, 0u);
  // 64 x 33 bf16 values take 1056 f32 slots; b starts at the next 64-byte boundary.
  EXPECT_EQ(mixed.entries()[1].offset, 1056u);
  EXPECT_EQ(mixed.elements(), 1056u + 64u);
  EXPECT_EQ(wide.elements(), 64u * 33u + 64u);
  EXPECT_THROW(mixed.set_dtype(1, DType::bf16), Error);  // after allocation
}

TEST(Buffer, ReusesMemoryForRepeatedShapes) {
  auto be = make_cpu_backend();
  Buffer buf;
  void* first = buf.get(*be, DType::f32, {64, 32}).data();
  EXPECT_EQ(buf.get(*be, DType::f32, {32, 64}).data(), first);
  EXPECT_EQ(buf.get(*be, DType::f32, {10}).data(), first);
  EXPECT_EQ(buf.tensor().shape(), Shape({10}));
}

// Per OpenMP thread: whether a denormal input reads as zero (DAZ) and a denormal result is
// flushed to zero (FTZ).
std::vector<std::pair<bool, bool>> denormal_modes() {
  std::vector<std::pair<bool, bool>> modes(omp_get_max_threads());
#pragma omp parallel num_threads(omp_get_max_threads())
  {
    volatile float denormal = 1e-39f, small = 1e-30f, scale = 1e-9f, one = 1.0f;
    const float read = denormal * one, product = small * scale;
    modes[omp_get_thread_num()] = {read == 0.0f, product == 0.0f};
  }
  return modes;
}

TEST(Threads, FlushDenormalsOnEveryPoolThread) {
  if (!set_flush_denormals(false)) GTEST_SKIP() << "no flush-to-zero mode on this CPU";
  EXPECT_FALSE(flushes_denormals());
  for (auto [daz, ftz] : denormal_modes()) {
    EXPECT_FALSE(daz);
    EXPECT_FALSE(ftz);
  }
  ASSERT_TRUE(flush_denormals_wanted()) << "SEQFORGE_FLUSH_DENORMALS=0 in the test environment";
  auto be = make_cpu_backend();  // turns the mode on
  EXPECT_TRUE(flushes_denormals());
  EXPECT_NE(be->description().find("denormals flushed to zero"), std::string::npos);
  for (auto [daz, ftz] : denormal_modes()) {
    EXPECT_TRUE(daz);
    EXPECT_TRUE(ftz);
  }
}

TEST(Rng, DeterministicAndResumable) {
  Rng a(123), b(123);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next(), b.next());
  const auto state = a.state();
  const double u = a.uniform();
  Rng c;
  c.set_state(state);
  EXPECT_EQ(c.uniform(), u);
  double sum = 0, sq = 0;
  for (int i = 0; i < 100000; ++i) {
    const double n = a.normal();
    sum += n;
    sq += n * n;
  }
  EXPECT_NEAR(sum / 100000, 0.0, 0.02);
  EXPECT_NEAR(sq / 100000, 1.0, 0.02);
}

// A container's memory limit bounds what is available: cgroup v2 and v1 hierarchies written
// under a temporary root, each level's limit, usage and reclaimable page cache.
TEST(Memory, CgroupLimitsBoundTheAvailableMemory) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "cgroup_memory_test";
  fs::remove_all(root);
  auto write = [](const fs::path& file, const std::string& text) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  };
  const double mib = 1 << 20;
  // v2: a limit of 512 MiB on the slice, 300 MiB used of which 100 MiB file cache; the
  // process's own cgroup below it has no limit ("max").
  write(root / "v2/memory.max", "max\n");  // the root's: none
  write(root / "v2/app.slice/memory.max", std::to_string(int64_t(512 * mib)) + "\n");
  write(root / "v2/app.slice/memory.current", std::to_string(int64_t(300 * mib)) + "\n");
  write(root / "v2/app.slice/memory.stat",
        "anon 1\ninactive_file " + std::to_string(int64_t(60 * mib)) + "\nactive_file " +
            std::to_string(int64_t(40 * mib)) + "\nactive_anon 7\n");
  write(root / "v2/app.slice/run/memory.max", "max\n");
  write(root / "v2/app.slice/run/memory.current", "4096\n");
  write(root / "cgroup_v2", "0::/app.slice/run\n");
  const auto v2 = cgroup_memory_room((root / "cgroup_v2").string(), (root / "v2").string());
  ASSERT_TRUE(v2.has_value());
  EXPECT_DOUBLE_EQ(*v2, (512 - 300 + 100) * mib);

  // v1 mounted as the container's own cgroup (its path in /proc/self/cgroup absent under the
  // mount): 2 GiB, 1.5 GiB used, no cache; the cpu controller's line is not memory's.
  write(root / "v1/memory/memory.limit_in_bytes", std::to_string(int64_t(2048 * mib)) + "\n");
  write(root / "v1/memory/memory.usage_in_bytes", std::to_string(int64_t(1536 * mib)) + "\n");
  write(root / "cgroup_v1", "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n");
  const auto v1 = cgroup_memory_room((root / "cgroup_v1").string(), (root / "v1").string());
  ASSERT_TRUE(v1.has_value());
  EXPECT_DOUBLE_EQ(*v1, 512 * mib);

  // A cgroup below the container's own, its path given from the host's root: the limit of the
  // part under the mount counts (256 MiB, 56 used), and the container's above it.
  write(root / "v1/memory/job/memory.limit_in_bytes", std::to_string(int64_t(256 * mib)) + "\n");
  write(root / "v1/memory/job/memory.usage_in_bytes", std::to_string(int64_t(56 * mib)) + "\n");
  write(root / "cgroup_job", "4:memory:/docker/abc/job\n");
  EXPECT_DOUBLE_EQ(*cgroup_memory_room((root / "cgroup_job").string(), (root / "v1").string()),
                   200 * mib);
  write(root / "v1/memory/memory.usage_in_bytes", std::to_string(int64_t(1940 * mib)) + "\n");
  EXPECT_DOUBLE_EQ(*cgroup_memory_room((root / "cgroup_job").string(), (root / "v1").string()),
                   108 * mib);

  // No limit anywhere (v1's "unlimited" is about 2^63), or no cgroup file: none.
  write(root / "v1/memory/memory.limit_in_bytes", "9223372036854771712\n");
  write(root / "v1/memory/job/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_FALSE(
      cgroup_memory_room((root / "cgroup_job").string(), (root / "v1").string()).has_value());
  EXPECT_FALSE(
      cgroup_memory_room((root / "cgroup_v1").string(), (root / "v1").string()).has_value());
  EXPECT_FALSE(cgroup_memory_room((root / "absent").string(), (root / "v2").string()).has_value());
  // Over the limit (usage above it): no room, not a negative one.
  write(root / "v2/app.slice/memory.current", std::to_string(int64_t(900 * mib)) + "\n");
  write(root / "v2/app.slice/memory.stat", "inactive_file 0\n");
  EXPECT_DOUBLE_EQ(*cgroup_memory_room((root / "cgroup_v2").string(), (root / "v2").string()), 0.0);
  // The machine's own bound, read on either side: other processes move it meanwhile (a few MiB).
  const double before = meminfo_mb("MemAvailable");
  const int64_t available = available_memory_bytes();
  const double after = meminfo_mb("MemAvailable");
  EXPECT_LE(available, int64_t((std::max(before, after) + 64) * mib));
  fs::remove_all(root);
}

}  // namespace
}  // namespace seqforge::core_test
