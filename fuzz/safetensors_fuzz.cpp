// libFuzzer target: SafetensorsFile::parse must either accept the bytes or throw seqforge::Error,
// and so must reading what a seqforge checkpoint keeps in its metadata: the stored config and a
// training state's loop counters. Any other exception, a crash, a sanitizer report or a broken
// invariant below is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "seqforge/core/dtype.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/train/config.hpp"
#include "train/loop_state.hpp"

namespace {

using seqforge::io::SafetensorsEntry;
using seqforge::io::SafetensorsFile;

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "safetensors_fuzz: invariant violated: %s\n", what);
  std::abort();
}

// Invariants of an accepted file: every span lies in the data buffer, matches shape * dtype size,
// and the spans cover the data buffer exactly.
void check_accepted(const SafetensorsFile& file, const uint8_t* data, size_t size) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  const size_t data_size = size - 8 - header_len;
  size_t total = 0;
  unsigned checksum = 0;
  for (const SafetensorsEntry& e : file.entries()) {
    const auto bytes = file.bytes(e);
    if (bytes.size() != e.end - e.begin) bug("span size");
    if (!bytes.empty()) {  // touch both ends so ASan sees any out-of-range span
      checksum += static_cast<unsigned>(bytes.front()) + static_cast<unsigned>(bytes.back());
    }
    uint64_t n = seqforge::dtype_size(e.dtype);
    for (int64_t d : e.shape) {
      if (d < 0) bug("negative dimension");
      n *= static_cast<uint64_t>(d);  // cannot overflow for an accepted entry
    }
    if (n != bytes.size()) bug("byte size differs from shape * dtype size");
    if (file.find(e.name) != &e) bug("find");
    if (e.name.empty() || e.name == "__metadata__") bug("name");
    total += bytes.size();
  }
  if (total != data_size) bug("tensors do not cover the data buffer");
  static volatile unsigned sink;
  sink = checksum;
}

// Writing an accepted file and reading it back must give the same tensors and metadata.
void check_round_trip(const SafetensorsFile& file) {
  static const std::string path = [] {
    std::error_code ec;
    std::filesystem::path dir = "/dev/shm";
    if (!std::filesystem::is_directory(dir, ec)) dir = std::filesystem::temp_directory_path();
    return (dir / ("seqforge_safetensors_fuzz_" + std::to_string(::getpid()))).string();
  }();
  std::vector<seqforge::io::SafetensorsTensor> tensors;
  for (const SafetensorsEntry& e : file.entries()) {
    tensors.push_back({e.name, e.dtype, e.shape, file.bytes(e).data()});
  }
  seqforge::io::write_safetensors(path, tensors, file.metadata());
  const SafetensorsFile back = SafetensorsFile::read(path);
  std::remove(path.c_str());
  if (back.entries().size() != file.entries().size()) bug("round trip: entry count");
  // Writing replaces the hashes with those of what it wrote, which must then check (the
  // header's when it is read back above).
  auto expected = file.metadata();
  auto written = back.metadata();
  if (written.erase(SafetensorsFile::kDataHashKey) != 1) bug("round trip: no data hash written");
  if (written.erase(SafetensorsFile::kHeaderHashKey) != 1)
    bug("round trip: no header hash written");
  expected.erase(SafetensorsFile::kDataHashKey);
  expected.erase(SafetensorsFile::kHeaderHashKey);
  if (written != expected) bug("round trip: metadata");
  back.check_data_hash();
  for (size_t i = 0; i < file.entries().size(); ++i) {
    const SafetensorsEntry& a = file.entries()[i];
    const SafetensorsEntry& b = back.entries()[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape) bug("round trip: entry");
    const auto x = file.bytes(a), y = back.bytes(b);
    if (x.size() != y.size() || (!x.empty() && std::memcmp(x.data(), y.data(), x.size()) != 0)) {
      bug("round trip: data");
    }
  }
}

// The data hash, the stored config and the loop state, read as `seqforge train --resume` reads
// them: accepted or refused with seqforge::Error.
void check_metadata(const SafetensorsFile& file) {
  const auto& meta = file.metadata();
  try {
    if (const auto it = meta.find("seqforge.config"); it != meta.end())
      seqforge::Config::parse(it->second, "fuzz-input (stored config)", {}).resolved_yaml();
  } catch (const seqforge::Error&) {
  }
  try {
    file.check_data_hash();
  } catch (const seqforge::Error&) {
  }
  try {
    if (const auto it = meta.find("seqforge.loop"); it != meta.end())
      seqforge::LoopState::from_json(it->second, "fuzz-input")
          .check("fuzz-input", file.entries().size(), 100);
  } catch (const seqforge::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<SafetensorsFile> file;
  try {
    file.emplace(SafetensorsFile::parse(std::string(reinterpret_cast<const char*>(data), size),
                                        "fuzz-input"));
  } catch (const seqforge::Error&) {
    return 0;  // rejected input: the expected outcome for most mutations
  }
  check_accepted(*file, data, size);
  check_metadata(*file);
  try {
    check_round_trip(*file);
  } catch (const seqforge::Error& e) {
    std::fprintf(stderr, "safetensors_fuzz: round trip of an accepted file failed: %s\n", e.what());
    std::abort();
  }
  return 0;
}
