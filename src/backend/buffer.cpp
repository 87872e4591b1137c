#include "seqforge/backend/buffer.hpp"

#include <utility>

#include "seqforge/backend/backend.hpp"

namespace seqforge {

Buffer::Buffer(Buffer&& o) noexcept { *this = std::move(o); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (data_) backend_->free(data_);
    backend_ = std::exchange(o.backend_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
    view_ = std::exchange(o.view_, Tensor());
  }
  return *this;
}

Buffer::~Buffer() {
  if (data_) backend_->free(data_);
}

Tensor Buffer::get(Backend& backend, DType dtype, Shape shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (!data_ || bytes > capacity_ || &backend != backend_) {
    if (data_) backend_->free(std::exchange(data_, nullptr));  // not freed again if alloc throws
    capacity_ = 0;
    backend_ = &backend;
    data_ = backend.alloc(bytes);
    capacity_ = bytes;
  }
  view_ = Tensor(data_, dtype, shape);
  return view_;
}

}  // namespace seqforge
