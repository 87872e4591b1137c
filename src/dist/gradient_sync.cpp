#include "seqforge/dist/gradient_sync.hpp"

#include <algorithm>

#include "seqforge/core/error.hpp"
#include "seqforge/core/profiler.hpp"

namespace seqforge::dist {

GradientSync::GradientSync(Communicator& comm, Backend& backend, Parameters& params,
                           size_t bucket_bytes)
    : comm_(comm), backend_(backend), params_(params) {
  const Arena& grads = params.grads();
  if (grads.dtype() != DType::f32) fail("data-parallel training needs f32 gradients");
  if (comm.size() > 1) join_device_collectives();
  if (!on_device_ && !backend.host_addressable()) host_.resize(grads.elements());
  const auto& entries = grads.entries();
  const size_t n = entries.size(), per = dtype_size(grads.dtype());
  bucket_of_.assign(n, 0);
  ready_.assign(n, 0);
  // Parameter i spans [offset(i), offset(i + 1)) with its padding; the last one runs to the end.
  auto offset = [&](size_t i) { return i < n ? entries[i].offset : grads.elements(); };
  size_t end_param = n;
  while (end_param > 0) {
    size_t first = end_param - 1;
    while (first > 0 && (offset(end_param) - offset(first - 1)) * per <= bucket_bytes) --first;
    Bucket b;
    b.begin = offset(first);
    b.end = offset(end_param);
    b.pending = end_param - first;
    for (size_t i = first; i < end_param; ++i) bucket_of_[i] = buckets_.size();
    buckets_.push_back(b);
    end_param = first;
  }
  if (!buckets_.empty()) buckets_.back().begin = 0;
}

// The ranks agree before any joins, so that none waits on the device for one that went through
// the host: every rank has the collectives, and each its own device.
void GradientSync::join_device_collectives() {
  const size_t n = size_t(comm_.size()), r = size_t(comm_.rank());
  const std::string why = backend_.collectives_unavailable();
  std::vector<double> votes(2 * n, 0.0);  // per rank: 1 if it can join, and its device
  votes[r] = why.empty() ? 1 : 0;
  votes[n + r] = double(backend_.device_identity());
  comm_.all_reduce_sum(votes);
  for (size_t k = 0; k < n; ++k) {
    if (votes[k] != 1) {
      why_host_ = k == r ? why : "rank " + std::to_string(k) + " cannot join them";
      return;
    }
    for (size_t o = 0; o < k; ++o)
      if (votes[n + k] == votes[n + o]) {
        why_host_ = "ranks " + std::to_string(o) + " and " + std::to_string(k) + " share a device";
        return;
      }
  }
  backend_.join_collectives({.rank = comm_.rank(),
                             .size = comm_.size(),
                             .broadcast = [this](std::span<std::byte> b) { comm_.broadcast(b); }});
  on_device_ = true;
}

void GradientSync::begin_step() {
  std::fill(ready_.begin(), ready_.end(), 0);
  for (Bucket& b : buckets_) b.pending = 0;
  for (size_t i = 0; i < bucket_of_.size(); ++i) ++buckets_[bucket_of_[i]].pending;
  started_ = 0;
}

void GradientSync::start_ready_buckets() {
  const Tensor flat = params_.grads().flat();
  float* data = host_.empty() ? static_cast<float*>(flat.data()) : host_.data();
  // In bucket order on every rank: MPI needs the same collectives in the same order everywhere.
  for (; started_ < buckets_.size() && buckets_[started_].pending == 0; ++started_) {
    Bucket& b = buckets_[started_];
    if (on_device_) {  // queued behind the backward ops that made it
      backend_.all_reduce_sum(flat.slice(b.begin, b.end));
      continue;
    }
    if (!host_.empty()) backend_.download(data + b.begin, flat.slice(b.begin, b.end));
    b.request = comm_.all_reduce_start({data + b.begin, b.end - b.begin}, ReduceOp::sum);
  }
}

void GradientSync::ready(size_t first, size_t end) {
  SF_PROFILE_SCOPE("all-reduce start");
  for (size_t i = first; i < end && i < ready_.size(); ++i)
    if (!ready_[i]) {
      ready_[i] = 1;
      --buckets_[bucket_of_[i]].pending;
    }
  start_ready_buckets();
  if (on_device_) return;
  for (size_t k = 0; k < started_; ++k) comm_.test(buckets_[k].request);
}

void GradientSync::finish() {
  SF_PROFILE_SCOPE("all-reduce wait");
  for (Bucket& b : buckets_) b.pending = 0;
  start_ready_buckets();
  if (on_device_) return;  // the sums are queued before whatever reads the gradients next
  for (Bucket& b : buckets_) comm_.wait(b.request);
  if (host_.empty()) return;
  const Tensor flat = params_.grads().flat();
  for (const Bucket& b : buckets_)
    backend_.upload(flat.slice(b.begin, b.end), host_.data() + b.begin);
}

}  // namespace seqforge::dist
