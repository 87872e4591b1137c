#include "seqforge/backend/host_access.hpp"

#include <algorithm>
#include <utility>

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

std::vector<double> download_doubles(Backend& backend, Tensor t) {
  std::vector<std::byte> raw(t.nbytes());
  backend.download(raw.data(), t);
  std::vector<double> out(static_cast<size_t>(t.numel()));
  convert(raw.data(), t.dtype(), out.data(), DType::f64, out.size());
  return out;
}

void upload_doubles(Backend& backend, Tensor t, const std::vector<double>& values) {
  SF_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "values for ", t.shape().str());
  std::vector<std::byte> raw(t.nbytes());
  convert(values.data(), DType::f64, raw.data(), t.dtype(), values.size());
  backend.upload(t, raw.data());
}

StagedBuffer::StagedBuffer(StagedBuffer&& o) noexcept
    : backend_(o.backend_),
      buffer_(std::move(o.buffer_)),
      staging_(std::exchange(o.staging_, nullptr)),
      staging_bytes_(std::exchange(o.staging_bytes_, 0)) {}

StagedBuffer& StagedBuffer::operator=(StagedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    backend_ = o.backend_;
    buffer_ = std::move(o.buffer_);
    staging_ = std::exchange(o.staging_, nullptr);
    staging_bytes_ = std::exchange(o.staging_bytes_, 0);
  }
  return *this;
}

StagedBuffer::~StagedBuffer() { release(); }

void StagedBuffer::release() {
  if (staging_) backend_->free_host(staging_);
  staging_ = nullptr;
  staging_bytes_ = 0;
}

Tensor StagedBuffer::get(Backend& backend, DType dtype, Shape shape) {
  if (backend_ != &backend) release();
  backend_ = &backend;
  const Tensor t = buffer_.get(backend, dtype, shape);
  if (!backend.host_addressable() && staging_bytes_ < t.nbytes()) {
    release();
    staging_ = backend.alloc_host(std::max<size_t>(t.nbytes(), 1));
    staging_bytes_ = std::max<size_t>(t.nbytes(), 1);
  }
  return t;
}

void StagedBuffer::upload() {
  if (staging_) backend_->upload(tensor(), staging_);
}

}  // namespace seqforge
