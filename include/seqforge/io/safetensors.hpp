#pragma once
// safetensors: u64 LE header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// optional "__metadata__" (string -> string), then the byte buffer. Reader rejects every
// malformed file with a seqforge::Error naming the file and the problem.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "seqforge/core/dtype.hpp"

namespace seqforge::io {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  size_t begin = 0;  // byte offset into the data buffer
  size_t end = 0;
};

class SafetensorsFile {
 public:
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;

  // Maps (a regular file) or reads a file and validates it. Throws
  // seqforge::Error("<path>: <problem>"). A mapped file's tensors are read from the page cache
  // when they are used, so a file only asked for its metadata costs its header.
  static SafetensorsFile read(const std::string& path);
  // Validates bytes already in memory; `source` names them in errors.
  static SafetensorsFile parse(std::string bytes, const std::string& source);

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in file order
  const SafetensorsEntry* find(std::string_view name) const;
  std::span<const std::byte> bytes(const SafetensorsEntry& e) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& source() const { return source_; }
  // The metadata key under which write_safetensors records a hash of the tensors' bytes.
  static constexpr const char* kDataHashKey = "seqforge.data_hash";
  // Where the metadata holds kDataHashKey (files seqforge wrote), hashes the tensors' bytes and
  // throws when they differ from it: a file damaged after it was written (a disk, a copy) would
  // otherwise load as other numbers. Files without it (PyTorch's, Hugging Face's) pass.
  void check_data_hash() const;
  // The metadata key under which write_safetensors records a hash of the header's meaning: each
  // tensor's name, dtype and shape and every other metadata entry (a normaliser, a stored config,
  // a vocabulary). Where a file holds it, read() checks it: a changed byte there would load as
  // other predictions without a word.
  static constexpr const char* kHeaderHashKey = "seqforge.header_hash";

 private:
  // Validates the file's `size` bytes at `data`, which `owner` keeps alive.
  static SafetensorsFile parse(const std::byte* data, size_t size,
                               std::shared_ptr<const void> owner, const std::string& source);
  std::string source_;
  const std::byte* data_ = nullptr;  // the whole file: mapped, or a string `owner_` holds
  size_t size_ = 0;
  std::shared_ptr<const void> owner_;
  size_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // shape.numel() * dtype_size(dtype) bytes
};

// Writes atomically: a temporary file in the same directory, fsync, rename, fsync of the directory.
// The metadata gains kDataHashKey, the hash of the tensors' bytes (check_data_hash), and
// kHeaderHashKey, that of the rest of the header.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace seqforge::io
