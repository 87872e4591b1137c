#include "seqforge/core/tensor.hpp"

#include <algorithm>

namespace seqforge {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(const std::vector<int64_t>& dims) {
  SF_CHECK(static_cast<int>(dims.size()) <= kMaxRank, "rank ", dims.size(), " > ", kMaxRank);
  rank_ = static_cast<int>(dims.size());
  for (int i = 0; i < rank_; ++i) {
    SF_CHECK(dims[i] >= 0, "negative dimension ", dims[i]);
    dims_[i] = dims[i];
  }
  // The element count, and its bytes at 8 per element, fit in int64: numel() and nbytes() never
  // overflow.
  if (std::find(dims.begin(), dims.end(), 0) != dims.end()) {
    numel_ = 0;
    return;
  }
  int64_t bytes = 8;
  for (int i = 0; i < rank_; ++i)
    if (__builtin_mul_overflow(bytes, dims_[i], &bytes))
      fail("a tensor of shape ", str(), " holds more elements than any memory can");
  numel_ = bytes / 8;
}

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + ")";
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

Tensor Tensor::reshape(Shape s) const {
  SF_CHECK(s.numel() == numel(), "reshape ", shape_.str(), " to ", s.str());
  return Tensor(data_, dtype_, s);
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  SF_CHECK(shape_.rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "slice [", begin,
           ", ", end, ") of ", shape_.str());
  std::vector<int64_t> dims = shape_.to_vector();
  const int64_t row = dims[0] ? numel() / dims[0] : 0;
  dims[0] = end - begin;
  return Tensor(static_cast<char*>(data_) + begin * row * dtype_size(dtype_), dtype_, Shape(dims));
}

}  // namespace seqforge
