#pragma once
// File helpers shared by the readers and writers of src/io.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "seqforge/io/file_stamp.hpp"

namespace seqforge::io {

struct ByteSpan {
  const void* data;
  size_t size;
};

// Writes `parts` one after another to `path` atomically: a temporary file in the same directory,
// fsync, rename over `path`, fsync of the directory. On any failure the temporary file is removed
// and a seqforge::Error names `path`, the step and the system's reason.
void write_file_atomically(const std::string& path, const std::vector<ByteSpan>& parts);

// A file mapped read-only; unmapped when the last copy of `mapping` goes.
struct MappedFile {
  const std::byte* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> mapping;
};
MappedFile map_file(const std::string& path);

// The whole file; errors name `path` and the system's reason.
std::string read_file(const std::string& path);

// Text from an untrusted file, fit for a one-line error message: control bytes, quotes and
// backslashes escaped as \xNN, at most `max_shown` bytes (never half a UTF-8 sequence), then "...".
std::string printable(std::string_view s, size_t max_shown = 80);
// printable(s) in single quotes.
std::string quoted(std::string_view s, size_t max_shown = 80);

}  // namespace seqforge::io
