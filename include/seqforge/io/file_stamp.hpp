#pragma once
#include <cstdint>
#include <string>

namespace seqforge::io {

// What identifies a file's contents cheaply: a change to any field means the file changed.
struct FileStamp {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t modified_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

// Throws a seqforge::Error naming `path` when it cannot be examined (missing, say).
FileStamp stamp_of(const std::string& path);

}  // namespace seqforge::io
