#pragma once
// NumPy .npy: "\x93NUMPY", major and minor version bytes, the header length (u16 LE for 1.0,
// u32 LE for 2.0 and 3.0), a Python dict literal {'descr': '<f4', 'fortran_order': False,
// 'shape': (3, 4), } padded with spaces and '\n', then the array data. seqforge reads
// little-endian f2, f4, f8, i4, i8, in C order or in Fortran order (reordered into C order as it
// is read); every other file is rejected with a seqforge::Error naming the file and the problem.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "seqforge/core/dtype.hpp"

namespace seqforge::io {

struct NpyArray {
  DType dtype = DType::f32;     // f16, f32, f64, i32 or i64
  std::vector<int64_t> shape;   // () for a scalar
  std::vector<std::byte> data;  // C order, numel(shape) * dtype_size(dtype) bytes
};

// A file mapped read-only: pages are read on demand, so an array larger than memory can be used
// (a Fortran-order file's array is reordered into memory instead).
struct MappedNpy {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;      // C order, numel(shape) * dtype_size(dtype) bytes
  std::shared_ptr<const void> mapping;  // unmaps when the last copy goes
};

// Maps and validates a file (the same checks as read_npy; the data itself is not read), or
// returns the in-memory array registered under `path`.
MappedNpy map_npy(const std::string& path);

// An array in memory (a caller's buffer, not copied) that map_npy, and so every reader of .npy
// data, takes for a file while this object lives: path() is its name ("<NAME>.npy"), which
// errors show. The buffer must outlive the object.
class MemoryNpy {
 public:
  MemoryNpy(const std::string& name, MappedNpy array);
  ~MemoryNpy();
  MemoryNpy(const MemoryNpy&) = delete;
  MemoryNpy& operator=(const MemoryNpy&) = delete;
  const std::string& path() const { return path_; }
  // Whether `path` names a registered array (then it has no file stamp to check).
  static bool is_registered(const std::string& path);

 private:
  std::string path_;
};

// Reads and validates a file. Throws seqforge::Error("<path>: <problem>").
NpyArray read_npy(const std::string& path);
// Validates bytes already in memory; `source` names them in errors.
NpyArray parse_npy(std::string_view bytes, const std::string& source);

// Writes format 1.0 (2.0 if the header needs more than 65535 bytes) atomically: a temporary file
// in the same directory, fsync, rename, fsync of the directory. dtype must be f32, f64, i32 or
// i64; `data` holds numel(shape) elements in C order.
void write_npy(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
               const void* data);

}  // namespace seqforge::io
