// libFuzzer target: parse_npy must either accept the bytes or throw seqforge::Error. An accepted
// array must have exactly numel * item size bytes and survive write_npy + read_npy unchanged. Any
// other exception, a crash, a sanitizer report or a broken invariant is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "seqforge/core/dtype.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/npy.hpp"

namespace {

using seqforge::io::NpyArray;

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "npy_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void check_accepted(const NpyArray& a) {
  uint64_t n = seqforge::dtype_size(a.dtype);
  for (int64_t d : a.shape) {
    if (d < 0) bug("negative dimension");
    n *= static_cast<uint64_t>(d);  // cannot overflow for an accepted array
  }
  if (n != a.data.size()) bug("data size differs from numel * item size");
  if (!a.data.empty()) {  // touch both ends so ASan sees a short buffer
    static volatile unsigned sink;
    sink = static_cast<unsigned>(a.data.front()) + static_cast<unsigned>(a.data.back());
  }
}

void check_round_trip(const NpyArray& a) {
  static const std::string path = [] {
    std::error_code ec;
    std::filesystem::path dir = "/dev/shm";
    if (!std::filesystem::is_directory(dir, ec)) dir = std::filesystem::temp_directory_path();
    return (dir / ("seqforge_npy_fuzz_" + std::to_string(::getpid()) + ".npy")).string();
  }();
  seqforge::io::write_npy(path, a.dtype, a.shape, a.data.data());
  const NpyArray back = seqforge::io::read_npy(path);
  std::remove(path.c_str());
  if (back.dtype != a.dtype || back.shape != a.shape) bug("round trip: dtype or shape");
  if (back.data != a.data) bug("round trip: data");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<NpyArray> array;
  try {
    array.emplace(seqforge::io::parse_npy(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz-input"));
  } catch (const seqforge::Error&) {
    return 0;  // rejected input: the expected outcome for most mutations
  }
  check_accepted(*array);
  try {
    check_round_trip(*array);
  } catch (const seqforge::Error& e) {
    std::fprintf(stderr, "npy_fuzz: round trip of an accepted array failed: %s\n", e.what());
    std::abort();
  }
  return 0;
}
