#pragma once
// Buffer: owned backend memory that grows on demand and is reused, so a training step that
// repeats a shape allocates nothing.
#include "seqforge/core/tensor.hpp"

namespace seqforge {

class Backend;

class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  ~Buffer();

  // A view of `shape`; reallocates (zeroed) only when the capacity is too small.
  Tensor get(Backend& backend, DType dtype, Shape shape);
  // The view handed out by the last get().
  Tensor tensor() const { return view_; }
  // Bytes allocated (0 before the first get()).
  size_t capacity() const { return capacity_; }

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t capacity_ = 0;
  Tensor view_;
};

}  // namespace seqforge
