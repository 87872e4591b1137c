// The optimizer's one-pass update against the reference backend's on samples
// (optimizer_agreement.hpp). The samples are packed into host arenas, a segment per run of them
// with its segment's flags and update count, so that the reference updates them as the kernel
// updates their elements: every rule is elementwise, given the gradients' sum of squares.
#include "backend/cuda/optimizer_agreement.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "backend/cuda/cuda_error.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/core/dtype.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::cuda {

namespace {

constexpr int64_t kEnds = 16;  // elements sampled at each end of a segment

template <typename T>
void download(T* host, const void* device, size_t count, cudaStream_t stream) {
  check_cuda(cudaMemcpyAsync(host, device, count * sizeof(T), cudaMemcpyDeviceToHost, stream),
             "a download for the optimizer's check");
}

std::vector<double> doubles(const std::vector<unsigned char>& bytes, DType dtype) {
  std::vector<double> out(bytes.size() / dtype_size(dtype));
  convert(bytes.data(), dtype, out.data(), DType::f64, out.size());
  return out;
}

}  // namespace

OptimizerSample::OptimizerSample(const OptimizerStep& a, DType dtype, cudaStream_t stream)
    : a_(a), dtype_(dtype), stream_(stream) {
  const size_t S = static_cast<size_t>(a.segment_count);
  segments_.resize(S);
  steps_.resize(S);
  download(segments_.data(), a.segments, S, stream);
  download(steps_.data(), a.steps, S, stream);
  download(&lr_, a.lr, 1, stream);
  if (a.clip.sum_squares) download(&sum_squares_, a.clip.sum_squares, 1, stream);
  check_cuda(cudaStreamSynchronize(stream), "a synchronisation for the optimizer's check");
  for (size_t s = 0; s < S; ++s) {
    const OptimizerSegment& seg = segments_[s];
    const int64_t head = std::min(seg.numel, kEnds), tail = std::min(seg.numel - head, kEnds);
    ranges_.push_back({int64_t(s), seg.value_offset, seg.grad_offset, head, samples_});
    samples_ += head;
    if (tail > 0) {
      const int64_t skip = seg.numel - tail;
      ranges_.push_back(
          {int64_t(s), seg.value_offset + skip, seg.grad_offset + skip, tail, samples_});
      samples_ += tail;
    }
  }
  p_ = read(a.params, true);
  g_ = read(a.grads, false);
  m_ = read(a.m, false);
  v_ = read(a.v, false);
  check_cuda(cudaStreamSynchronize(stream), "a synchronisation for the optimizer's check");
}

std::vector<unsigned char> OptimizerSample::read(const void* base, bool values) const {
  if (!base) return {};
  const size_t size = dtype_size(dtype_);
  std::vector<unsigned char> bytes(static_cast<size_t>(samples_) * size);
  for (const Range& r : ranges_)
    download(
        bytes.data() + r.at * size,
        static_cast<const unsigned char*>(base) + (values ? r.value_offset : r.grad_offset) * size,
        r.n * size, stream_);
  return bytes;
}

std::string OptimizerSample::disagreement() const {
  // The kernel's update.
  std::vector<int64_t> steps(segments_.size());
  download(steps.data(), a_.steps, steps.size(), stream_);
  const std::vector<unsigned char> p = read(a_.params, true), g = read(a_.grads, false),
                                   m = read(a_.m, false), v = read(a_.v, false);
  check_cuda(cudaStreamSynchronize(stream_), "a synchronisation for the optimizer's check");

  // The reference's, on packed copies of the samples from before it.
  std::vector<unsigned char> rp = p_, rg = g_, rm = m_, rv = v_;
  std::vector<OptimizerSegment> packed;
  std::vector<int64_t> rsteps;
  for (const Range& r : ranges_) {
    packed.push_back({r.at, r.at, r.n, segments_[r.segment].flags});
    rsteps.push_back(steps_[r.segment]);
  }
  double lr = lr_, sum_squares = sum_squares_;
  OptimizerStep h = a_;
  h.params = rp.data();
  h.grads = rg.data();
  h.m = rm.empty() ? nullptr : rm.data();
  h.v = rv.empty() ? nullptr : rv.data();
  h.grad_elements = samples_;
  h.segments = packed.data();
  h.segment_count = static_cast<int64_t>(packed.size());
  h.steps = rsteps.data();
  h.lr = &lr;
  if (a_.clip.sum_squares) h.clip.sum_squares = &sum_squares;
  make_reference_backend()->optimizer_step(h, dtype_);

  for (size_t i = 0; i < ranges_.size(); ++i)
    if (steps[ranges_[i].segment] != rsteps[i]) {
      std::ostringstream o;
      o << "segment " << ranges_[i].segment << "'s update count is " << steps[ranges_[i].segment]
        << ", the reference's " << rsteps[i];
      return o.str();
    }
  // Rounding: a few units in the last place of a value, and a thousandth of an update (a
  // parameter's; a state's or gradient's change is its value) beside the largest's tenth.
  const double ulp = dtype_ == DType::f64 ? 0x1p-52 : 0x1p-23;
  auto first_wrong = [&](const char* what, const std::vector<unsigned char>& got_bytes,
                         const std::vector<unsigned char>& want_bytes,
                         const std::vector<unsigned char>& before_bytes, bool change) {
    if (got_bytes.empty()) return std::string();
    const std::vector<double> got = doubles(got_bytes, dtype_), want = doubles(want_bytes, dtype_),
                              before = doubles(before_bytes, dtype_);
    auto moved = [&](size_t i) { return change ? want[i] - before[i] : want[i]; };
    double largest = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (std::isfinite(moved(i))) largest = std::max(largest, std::fabs(moved(i)));
    for (const Range& r : ranges_)
      for (int64_t e = 0; e < r.n; ++e) {
        const size_t i = static_cast<size_t>(r.at + e);
        const double allowed = 1e-3 * std::max(std::fabs(moved(i)), 0.1 * largest) +
                               16 * ulp * std::max(std::fabs(before[i]), std::fabs(want[i]));
        const bool same = got[i] == want[i] || std::fabs(got[i] - want[i]) <= allowed;
        if (same) continue;
        const OptimizerSegment& seg = segments_[r.segment];
        std::ostringstream o;
        o.precision(9);
        o << "segment " << r.segment << "'s " << what << ": element "
          << (r.grad_offset - seg.grad_offset + e) << " of " << seg.numel << " is " << got[i]
          << ", the reference's " << want[i] << " (from " << before[i] << ")";
        return o.str();
      }
    return std::string();
  };
  for (const std::string& wrong :
       {first_wrong("parameters", p, rp, p_, true), first_wrong("gradients", g, rg, g_, false),
        first_wrong("first moments", m, rm, m_, false),
        first_wrong("second moments", v, rv, v_, false)})
    if (!wrong.empty()) return wrong;
  return "";
}

}  // namespace seqforge::cuda
