#pragma once
// Tensor: a typed, shaped, non-owning view of contiguous row-major memory.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "seqforge/core/dtype.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

class Shape {
 public:
  static constexpr int kMaxRank = 4;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);
  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t numel() const { return numel_; }
  std::vector<int64_t> to_vector() const { return {dims_.begin(), dims_.begin() + rank_}; }
  std::string str() const;  // "(4, 8, 16)"
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
  int64_t numel_ = 1;  // counted once, with overflow checked, by the constructor
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, DType dtype, Shape shape) : data_(data), dtype_(dtype), shape_(shape) {}

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    SF_CHECK(dtype_ == dtype_of<T>(), "tensor holds ", dtype_name(dtype_));
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool empty() const { return data_ == nullptr; }

  // Same memory, new shape with the same element count.
  Tensor reshape(Shape s) const;
  // Rows [begin, end) of the outermost dimension.
  Tensor slice(int64_t begin, int64_t end) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Shape shape_;
};

}  // namespace seqforge
