// Attention's GPU kernels against the scalar reference on one slice (attention_agreement.hpp).
// The slice's rows are copied into host buffers of the call's layout (the earlier batch rows left
// zero), so that the reference indexes them, and draws their dropout masks, as the kernels do.
#include "backend/cuda/attention_agreement.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cuda/cuda_error.hpp"
#include "kernels/attention.hpp"
#include "kernels/counter_hash.hpp"
#include "seqforge/core/autotune.hpp"
#include "seqforge/core/dtype.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::cuda {

namespace {

// Rows past the start of a long forward are left out beyond this many multiply-adds of the
// reference (about a second on one core); backward's gradients sum over every row.
constexpr double kForwardWork = 3e8;

// Elements [offset, offset + n) of a device tensor of `dtype` (f32 or f64), as doubles, written
// at `at` of a host buffer of `size` zeros.
std::vector<double> download(const void* device, DType dtype, int64_t offset, int64_t n, int64_t at,
                             int64_t size, cudaStream_t stream) {
  std::vector<double> host(static_cast<size_t>(size), 0.0);
  const size_t element = dtype_size(dtype);
  std::vector<unsigned char> bytes(static_cast<size_t>(n) * element);
  check_cuda(
      cudaMemcpyAsync(bytes.data(), static_cast<const unsigned char*>(device) + offset * element,
                      bytes.size(), cudaMemcpyDeviceToHost, stream),
      "a download for attention's check");
  check_cuda(cudaStreamSynchronize(stream), "a synchronisation for attention's check");
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::f64) {
      std::memcpy(&host[static_cast<size_t>(at + i)], bytes.data() + i * 8, 8);
    } else {
      float f;
      std::memcpy(&f, bytes.data() + i * 4, 4);
      host[static_cast<size_t>(at + i)] = f;
    }
  }
  return host;
}

// The slice: batch row b (the second, unless it has no keys and the first has), key/value head g
// (the last) with its query heads. `ref` is the reference's shape: batch rows [0, b], the dropout
// seed with the device's seed base mixed in (as the kernels mix it).
struct Slice {
  AttentionShape s, ref;
  std::vector<int64_t> lengths;  // of batch rows [0, b], where the call has them
  int64_t b = 0, g, T, H, D, W, C;
  Slice(const AttentionShape& shape, const void* device_lengths, cudaStream_t stream)
      : s(shape),
        ref(shape),
        g(shape.kv() - 1),
        T(shape.seq),
        H(shape.heads),
        D(shape.head_dim),
        W(shape.qkv_width()),
        C(shape.heads * shape.head_dim) {
    const int64_t rows = std::min<int64_t>(2, s.batch);
    if (device_lengths) {
      lengths.resize(static_cast<size_t>(rows));
      check_cuda(cudaMemcpyAsync(lengths.data(), device_lengths, lengths.size() * 8,
                                 cudaMemcpyDeviceToHost, stream),
                 "a download of the lengths for attention's check");
    }
    if (s.seed_base) {
      uint64_t base = 0;
      check_cuda(cudaMemcpyAsync(&base, s.seed_base, 8, cudaMemcpyDeviceToHost, stream),
                 "a download of the seed base for attention's check");
      check_cuda(cudaStreamSynchronize(stream), "a synchronisation for attention's check");
      ref.seed = ref::seed_with_base(&base, s.seed);
      ref.seed_base = nullptr;
    }
    check_cuda(cudaStreamSynchronize(stream), "a synchronisation for attention's check");
    b = rows - 1;
    if (b == 1 && !lengths.empty() && lengths[1] <= 0 && lengths[0] > 0) b = 0;
    if (!lengths.empty()) lengths.resize(static_cast<size_t>(b + 1));
    ref.batch = b + 1;
  }
  int64_t first_head() const { return g * s.group(); }
  const void* ref_lengths() const { return lengths.empty() ? nullptr : lengths.data(); }
};

bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}
// Each value rounded to the tensor cores' operand type (bf16 or fp16).
std::vector<double> rounded_operands(std::vector<double> v, const AttentionShape& s) {
  for (double& x : v) {
    const float f = static_cast<float>(x);
    x = s.fp16_products ? from_f16(to_f16(f)) : from_bf16(to_bf16(f));
  }
  return v;
}

// The largest |got - want| / max(|want|, a tenth of the largest |want|, `least`); -inf (an lse of
// a row without keys) must stand at the same places.
double relative_error(const std::vector<double>& got, const std::vector<double>& want,
                      double least) {
  double scale = 0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
  const double floor = std::max({0.1 * scale, least, 1e-300});
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) && got[i] == want[i]) continue;
    const double e = std::fabs(got[i] - want[i]) / std::max(std::fabs(want[i]), floor);
    worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(worst, e);
  }
  return worst;
}
double largest_magnitude(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Tensors of the slice: the kernels', the reference's, and with tensor cores the reference's on
// operands rounded to their 16-bit type.
// `least`: the size below which a difference is rounding even where the reference is 0 (a
// query's gradient with one key), a ten-thousandth of what the operands make.
struct Compared {
  const char* tensor;
  double least = 0;
  std::vector<double> got, want, rounded;
};

AttentionAgreement agreement(const std::vector<Compared>& tensors, DType dtype,
                             AttentionKernels kernels) {
  AttentionAgreement r;
  r.compared = true;
  double worst_ratio = -1;
  for (const Compared& t : tensors) {
    const double error = relative_error(t.got, t.want, t.least);
    // Sums in other orders: far below these in f32 and f64. Tensor cores: within 4x what rounding
    // the operands to bf16 (fp16) alone brings, as their test holds them (attention_problems.hpp).
    const double bound = kernels == AttentionKernels::tensor_cores
                             ? 4 * relative_error(t.rounded, t.want, t.least) + 2e-3
                             : (dtype == DType::f64 ? 1e-8 : 1e-3);
    const double ratio = error / bound;
    if (ratio > worst_ratio || std::isnan(ratio)) {
      worst_ratio = std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio;
      r.error = error;
      r.bound = bound;
      r.tensor = t.tensor;
    }
  }
  return r;
}

// The first query row of the reference's forward: from `first_row`, or later where the rows
// from there would cost more than kForwardWork.
int64_t first_checked_row(const Slice& sl, int64_t first_row) {
  double work = 0;
  int64_t i = sl.T;
  while (i > first_row) {
    const double keys = double(sl.s.last_key(i - 1, sl.T) - sl.s.first_key(i - 1));
    if (work > 0 && work + keys * double(sl.D * sl.s.group()) > kForwardWork) break;
    work += keys * double(sl.D * sl.s.group());
    --i;
  }
  return i;
}

}  // namespace

AttentionAgreement check_attention_forward(const AttentionForward& a, DType dtype,
                                           AttentionKernels kernels, cudaStream_t stream) {
  if (a.shape.batch == 0 || a.first_row >= a.shape.seq) return {};
  const Slice sl(a.shape, a.lengths, stream);
  const int64_t rows = (sl.b + 1) * sl.T;
  const std::vector<double> qkv = download(a.qkv, dtype, sl.b * sl.T * sl.W, sl.T * sl.W,
                                           sl.b * sl.T * sl.W, rows * sl.W, stream);
  const std::vector<double> out =
      download(a.out, dtype, sl.b * sl.T * sl.C, sl.T * sl.C, 0, sl.T * sl.C, stream);
  const std::vector<double> lse =
      download(a.lse, dtype, sl.b * sl.H * sl.T, sl.H * sl.T, 0, sl.H * sl.T, stream);
  if (!all_finite(qkv)) return {};
  const int64_t first = first_checked_row(sl, a.first_row);
  const int64_t p0 = sl.b * sl.H + sl.first_head(), p1 = p0 + sl.s.group();
  // The reference's out and lse of the slice from `first` on, on these operands.
  auto reference = [&](const std::vector<double>& operands, std::vector<double>& o,
                       std::vector<double>& l) {
    std::vector<double> full_out(static_cast<size_t>(rows * sl.C)),
        full_lse(static_cast<size_t>((sl.b + 1) * sl.H * sl.T));
    kernels::attention_forward_reference<double>({.shape = sl.ref,
                                                  .qkv = operands.data(),
                                                  .lengths = sl.ref_lengths(),
                                                  .out = full_out.data(),
                                                  .lse = full_lse.data(),
                                                  .first_row = first},
                                                 p0, p1);
    for (int64_t t = first; t < sl.T; ++t)
      for (int64_t h = sl.first_head(); h < sl.first_head() + sl.s.group(); ++h) {
        for (int64_t d = 0; d < sl.D; ++d)
          o.push_back(full_out[static_cast<size_t>((sl.b * sl.T + t) * sl.C + h * sl.D + d)]);
        l.push_back(full_lse[static_cast<size_t>((sl.b * sl.H + h) * sl.T + t)]);
      }
  };
  const double least = 1e-4 * largest_magnitude(qkv);
  Compared o{"out", least, {}, {}, {}}, l{"lse", least, {}, {}, {}};
  for (int64_t t = first; t < sl.T; ++t)
    for (int64_t h = sl.first_head(); h < sl.first_head() + sl.s.group(); ++h) {
      for (int64_t d = 0; d < sl.D; ++d)
        o.got.push_back(out[static_cast<size_t>(t * sl.C + h * sl.D + d)]);
      l.got.push_back(lse[static_cast<size_t>(h * sl.T + t)]);
    }
  reference(qkv, o.want, l.want);
  if (kernels == AttentionKernels::tensor_cores)
    reference(rounded_operands(qkv, sl.s), o.rounded, l.rounded);
  return agreement({o, l}, dtype, kernels);
}

AttentionAgreement check_attention_backward(const AttentionBackward& a, DType dtype,
                                            AttentionKernels kernels, cudaStream_t stream) {
  if (a.shape.batch == 0 || a.shape.seq == 0) return {};
  const Slice sl(a.shape, a.lengths, stream);
  const int64_t rows = (sl.b + 1) * sl.T;
  const std::vector<double> qkv = download(a.qkv, dtype, sl.b * sl.T * sl.W, sl.T * sl.W,
                                           sl.b * sl.T * sl.W, rows * sl.W, stream);
  const std::vector<double> dout = download(a.dout, dtype, sl.b * sl.T * sl.C, sl.T * sl.C,
                                            sl.b * sl.T * sl.C, rows * sl.C, stream);
  const std::vector<double> dqkv =
      download(a.dqkv, dtype, sl.b * sl.T * sl.W, sl.T * sl.W, 0, sl.T * sl.W, stream);
  if (!all_finite(qkv) || !all_finite(dout)) return {};
  // Columns of a qkv row: the group's query heads, then its key and value heads.
  const int64_t q0 = sl.first_head() * sl.D, k0 = (sl.H + sl.g) * sl.D,
                v0 = (sl.H + sl.s.kv() + sl.g) * sl.D;
  auto columns = [&](const std::vector<double>& m, int64_t row0, Compared& dq, Compared& dk,
                     Compared& dv, std::vector<double> Compared::*into) {
    for (int64_t t = 0; t < sl.T; ++t) {
      const double* row = m.data() + (row0 + t) * sl.W;
      (dq.*into).insert((dq.*into).end(), row + q0, row + q0 + sl.s.group() * sl.D);
      (dk.*into).insert((dk.*into).end(), row + k0, row + k0 + sl.D);
      (dv.*into).insert((dv.*into).end(), row + v0, row + v0 + sl.D);
    }
  };
  const double least = 1e-4 * largest_magnitude(qkv) * largest_magnitude(dout);
  Compared dq{"dq", least, {}, {}, {}}, dk{"dk", least, {}, {}, {}}, dv{"dv", least, {}, {}, {}};
  columns(dqkv, 0, dq, dk, dv, &Compared::got);
  // The reference recomputes the probabilities: it reads neither out nor lse.
  auto reference = [&](const std::vector<double>& q, const std::vector<double>& d,
                       std::vector<double> Compared::*into) {
    std::vector<double> grads(static_cast<size_t>(rows * sl.W));
    const int64_t group = sl.b * sl.s.kv() + sl.g;
    kernels::attention_backward_reference<double>({.shape = sl.ref,
                                                   .qkv = q.data(),
                                                   .lengths = sl.ref_lengths(),
                                                   .dout = d.data(),
                                                   .dqkv = grads.data()},
                                                  group, group + 1);
    columns(grads, sl.b * sl.T, dq, dk, dv, into);
  };
  reference(qkv, dout, &Compared::want);
  if (kernels == AttentionKernels::tensor_cores)
    reference(rounded_operands(qkv, sl.s), rounded_operands(dout, sl.s), &Compared::rounded);
  // The three gradients are one tensor's parts (dqkv): each measured against the whole's size,
  // so that a part summed with cancellation (dk, with dS's rows summing to 0) is not held to
  // rounding below the others'.
  const double whole = 0.1 * std::max({largest_magnitude(dq.want), largest_magnitude(dk.want),
                                       largest_magnitude(dv.want)});
  for (Compared* t : {&dq, &dk, &dv}) t->least = std::max(t->least, whole);
  return agreement({dq, dk, dv}, dtype, kernels);
}

AttentionKernels AttentionChecks::kernels(const AttentionShape& s, DType dtype) const {
  return tensor_cores_dropped_ ? AttentionKernels::tiles : attention_kernels(s, dtype);
}

std::string AttentionChecks::unchecked(const char* pass, AttentionKernels kernels,
                                       const AttentionShape& s, DType dtype,
                                       int64_t first_row) const {
  const std::string kind =
      std::string(pass) +
      (kernels == AttentionKernels::tensor_cores ? " tensor_cores " : " tiles ") +
      std::string(dtype_name(dtype)) + " D" + std::to_string(s.head_dim) + " group" +
      std::to_string(s.group()) + (s.causal ? " causal" : "") + (s.window ? " window" : "") +
      (s.softcap > 0 ? " softcap" : "") + (s.dropout > 0 ? " dropout" : "") +
      (s.fp16_products   ? " fp16_products"
       : s.bf16_products ? " bf16_products"
                         : "") +
      (first_row > 0 ? " decoding" : "");
  return checked_.count(kind) ? "" : kind;
}

bool AttentionChecks::agrees(const std::string& kind, AttentionKernels kernels,
                             const AttentionAgreement& r) {
  if (!r.compared) return true;
  checked_.insert(kind);
  const bool tensor_cores = kernels == AttentionKernels::tensor_cores;
  const char* what = tensor_cores ? "tensor-core kernels" : "kernels";
  const std::string pass = kind.substr(0, kind.find(' '));
  if (r.agrees()) {
    if (autotune::verbose())
      std::fprintf(stderr,
                   "seqforge: cuda: attention's %s agree with the reference %s (%s: relative "
                   "error %.2g, at most %.2g allowed)\n",
                   what, pass.c_str(), r.tensor.c_str(), r.error, r.bound);
    return true;
  }
  if (!tensor_cores)
    fail("cuda: attention's ", what, " disagree with the reference on this device (", pass, ": ",
         r.tensor, " off by ", r.error, " relative, at most ", r.bound, " expected; ", kind,
         "). This is a defect: please report it with the output of `seqforge diagnose`, and "
         "train on the CPU (train.device: cpu) until it is fixed");
  std::fprintf(stderr,
               "seqforge: warning: attention's %s disagree with the reference on this device "
               "(%s: %s off by %.3g relative, at most %.2g expected); they are not used. This "
               "is a defect: please report it with the output of `seqforge diagnose`\n",
               what, pass.c_str(), r.tensor.c_str(), r.error, r.bound);
  tensor_cores_dropped_ = true;
  return false;
}

}  // namespace seqforge::cuda
