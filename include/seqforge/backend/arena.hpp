#pragma once
// Arena: one flat buffer with a table of named views. Parameters, gradients and optimizer moments
// each live in one arena with identical layouts, so the optimizer, clipping, checkpointing and
// all-reduce each touch one buffer. An entry may be stored in a narrower dtype than the arena's
// (a frozen base weight in bf16); offsets count elements of the arena's dtype.
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "seqforge/core/tensor.hpp"

namespace seqforge {

class Backend;

class Arena {
 public:
  struct Entry {
    std::string name;
    Shape shape;
    size_t offset = 0;  // in elements of the arena's dtype; every view starts 64-byte aligned
    DType dtype = DType::f32;
  };

  Arena() = default;
  explicit Arena(DType dtype) : dtype_(dtype) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& o) noexcept;
  Arena& operator=(Arena&& o) noexcept;
  ~Arena();

  // Reserves a view; returns its index. Only before allocate().
  size_t add(std::string name, Shape shape);
  // Stores entry `index` in `dtype` instead of the arena's. Only before allocate().
  void set_dtype(size_t index, DType dtype);
  // Allocates the buffer (zeroed) on `backend`.
  void allocate(Backend& backend);
  // A new, zeroed arena with the same layout and dtype (gradients, optimizer moments).
  Arena like(Backend& backend) const;

  DType dtype() const { return dtype_; }
  const std::vector<Entry>& entries() const { return entries_; }
  Tensor view(size_t index) const;
  Tensor view(std::string_view name) const;  // throws if unknown
  const Entry* find(std::string_view name) const;
  // The whole buffer as the arena's dtype, padding included (padding stays zero); entries of
  // another dtype are raw bytes there.
  Tensor flat() const;
  size_t elements() const { return elements_; }
  bool allocated() const { return data_ != nullptr; }

 private:
  void layout(size_t from);  // the offsets of entries [from, end) and elements_

  DType dtype_ = DType::f32;
  std::vector<Entry> entries_;
  std::map<std::string, size_t, std::less<>> index_of_;  // by name: a model may hold thousands
  size_t elements_ = 0;
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
};

}  // namespace seqforge
