#pragma once
// Host access to backend tensors, for host code (train/, data/, io/, dist/). Where the backend's
// memory is host memory (the CPU backends) the host works on the tensor itself and nothing is
// copied; elsewhere through a host copy moved by Backend::upload / download.
#include <cstddef>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/buffer.hpp"

namespace seqforge {

// A backend tensor seen from the host. read / read_write: data() holds the tensor's values on
// construction. write / read_write: upload() makes data() the tensor's values.
class HostView {
 public:
  enum class Access { read, write, read_write };
  HostView(Backend& backend, Tensor t, Access access = Access::read);
  template <typename T>
  T* data() const {
    SF_CHECK(t_.dtype() == dtype_of<T>(), "tensor holds ", dtype_name(t_.dtype()));
    return static_cast<T*>(data_);
  }
  void* bytes() const { return data_; }
  void upload();

 private:
  Backend& backend_;
  Tensor t_;
  void* data_;
  std::vector<std::byte> copy_;  // empty where the host addresses the tensor itself
};

// A backend tensor filled on the host and reused like a Buffer (a loader's batch): get() gives
// the tensor, host<T>() the memory to fill (the backend's staging memory, Backend::alloc_host),
// upload() sends what was filled; host<T>() keeps it.
class StagedBuffer {
 public:
  StagedBuffer() = default;
  StagedBuffer(const StagedBuffer&) = delete;
  StagedBuffer& operator=(const StagedBuffer&) = delete;
  StagedBuffer(StagedBuffer&& o) noexcept;
  StagedBuffer& operator=(StagedBuffer&& o) noexcept;
  ~StagedBuffer();

  Tensor get(Backend& backend, DType dtype, Shape shape);
  Tensor tensor() const { return buffer_.tensor(); }
  template <typename T>
  T* host() {
    SF_CHECK(tensor().dtype() == dtype_of<T>(), "tensor holds ", dtype_name(tensor().dtype()));
    return static_cast<T*>(staging_ ? staging_ : tensor().data());
  }
  // What was filled (and uploaded), still on the host.
  template <typename T>
  const T* host() const {
    return const_cast<StagedBuffer*>(this)->host<T>();
  }
  void upload();

 private:
  void release();

  Backend* backend_ = nullptr;
  Buffer buffer_;
  void* staging_ = nullptr;  // null where the host addresses the tensor itself
  size_t staging_bytes_ = 0;
};

// A float tensor's values as doubles on the host, and the reverse (converted to its dtype).
std::vector<double> download_doubles(Backend& backend, Tensor t);
void upload_doubles(Backend& backend, Tensor t, const std::vector<double>& values);

// A new backend tensor's values, copied to the host.
template <typename T>
std::vector<T> download_vector(Backend& backend, Tensor t) {
  SF_CHECK(t.dtype() == dtype_of<T>(), "tensor holds ", dtype_name(t.dtype()));
  std::vector<T> v(static_cast<size_t>(t.numel()));
  backend.download(v.data(), t);
  return v;
}

}  // namespace seqforge
