#include "seqforge/backend/host_access.hpp"

#include <algorithm>

namespace seqforge {

HostView::HostView(Backend& backend, Tensor t, Access access)
    : backend_(backend), t_(t), data_(t.data()) {
  if (backend.host_addressable()) return;
  copy_.resize(t.nbytes());
  data_ = copy_.data();
  if (access != Access::write) backend.download(data_, t);
}

void HostView::upload() {
  if (!copy_.empty()) backend_.upload(t_, data_);
}

Tensor StagedBuffer::get(Backend& backend, DType dtype, Shape shape) {
  backend_ = &backend;
  const Tensor t = buffer_.get(backend, dtype, shape);
  if (!backend.host_addressable()) copy_.resize(std::max<size_t>(t.nbytes(), 1));
  return t;
}

void StagedBuffer::upload() {
  if (!copy_.empty()) backend_->upload(tensor(), copy_.data());
}

}  // namespace seqforge
