#include "seqforge/backend/arena.hpp"

#include <algorithm>
#include <utility>

#include "seqforge/backend/backend.hpp"

namespace seqforge {

Arena::Arena(Arena&& o) noexcept { *this = std::move(o); }

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    if (data_) backend_->free(data_);
    dtype_ = o.dtype_;
    entries_ = std::move(o.entries_);
    index_of_ = std::move(o.index_of_);
    elements_ = std::exchange(o.elements_, 0);
    backend_ = std::exchange(o.backend_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
  }
  return *this;
}

Arena::~Arena() {
  if (data_) backend_->free(data_);
}

size_t Arena::add(std::string name, Shape shape) {
  SF_CHECK(!data_, "arena already allocated; cannot add ", name);
  const size_t index = entries_.size();
  SF_CHECK(index_of_.emplace(name, index).second, "duplicate arena entry ", name);
  entries_.push_back({std::move(name), shape, 0, dtype_});
  layout(index);
  return index;
}

void Arena::set_dtype(size_t index, DType dtype) {
  SF_CHECK(!data_ && index < entries_.size(), "arena entry ", index, " set to ", dtype_name(dtype),
           " after allocation");
  entries_[index].dtype = dtype;
  layout(index);
}

void Arena::layout(size_t from) {
  const size_t unit = dtype_size(dtype_), align = 64 / unit;
  const auto end_of = [&](const Entry& e) {
    return e.offset +
           (static_cast<size_t>(e.shape.numel()) * dtype_size(e.dtype) + unit - 1) / unit;
  };
  elements_ = from == 0 ? 0 : end_of(entries_[from - 1]);
  for (size_t i = from; i < entries_.size(); ++i) {
    entries_[i].offset = (elements_ + align - 1) / align * align;
    elements_ = end_of(entries_[i]);
  }
}

void Arena::allocate(Backend& backend) {
  SF_CHECK(!data_, "arena allocated twice");
  backend_ = &backend;
  data_ = backend.alloc(std::max<size_t>(elements_, 1) * dtype_size(dtype_));
}

Arena Arena::like(Backend& backend) const {
  Arena out(dtype_);
  out.entries_ = entries_;
  out.index_of_ = index_of_;
  out.elements_ = elements_;
  out.allocate(backend);
  return out;
}

const Arena::Entry* Arena::find(std::string_view name) const {
  const auto it = index_of_.find(name);
  return it == index_of_.end() ? nullptr : &entries_[it->second];
}

Tensor Arena::view(size_t index) const {
  SF_CHECK(data_ && index < entries_.size(), "arena view ", index);
  const Entry& e = entries_[index];
  return Tensor(static_cast<char*>(data_) + e.offset * dtype_size(dtype_), e.dtype, e.shape);
}

Tensor Arena::view(std::string_view name) const {
  const auto it = index_of_.find(name);
  if (it == index_of_.end()) fail("no parameter named '", name, "'");
  return view(it->second);
}

Tensor Arena::flat() const {
  SF_CHECK(data_, "arena not allocated");
  return Tensor(data_, dtype_, Shape{static_cast<int64_t>(elements_)});
}

}  // namespace seqforge
