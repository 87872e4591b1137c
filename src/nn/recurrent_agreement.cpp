// The whole-chain kernels (RecurrentSchedule::whole_chains: a device's one launch per chain)
// checked against the steps (layered: a GEMM and a cell op per step, the path every backend
// shares) the first time a problem is tuned: forward on the same inputs and dropout masks,
// backward on the same forward and output gradients. Where they disagree the steps are used and
// a warning says so: a defect that only a real GPU shows in those kernels then costs speed, not
// a silently wrong model.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "nn/recurrent_util.hpp"
#include "seqforge/core/autotune.hpp"
#include "seqforge/nn/recurrent.hpp"

namespace seqforge {

using recurrent::upper;

namespace {

using Results = std::vector<std::pair<std::string, Tensor>>;  // Recurrent::Results

// How far (relative, over a whole tensor) whole chains may lie from the steps: sums in other
// orders over hundreds of dependent steps, in f32 the steps' products on TF32 where matmul
// precision is high, in bf16 and fp16 an operand's rounding falling the other way. A defect (a
// tile reading a stale or missing operand) is off by far more.
double tolerance(DType dtype, DType gemm) {
  if (gemm != dtype) return 5e-2;
  return dtype == DType::f64 ? 1e-8 : 2e-2;
}

struct Snapshot {
  std::vector<std::string> names;
  std::vector<Buffer> copies;
};

Snapshot take(Backend& be, const Results& results) {
  Snapshot s;
  s.copies.resize(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    const Tensor t = results[i].second;
    s.names.push_back(results[i].first);
    be.copy(s.copies[i].get(be, t.dtype(), t.shape()), t);
  }
  return s;
}

// ||a - b|| / max(||a||, ||b||) (0 for two zero tensors); 0 where neither is finite (a diverged
// model: nothing to compare), infinite where one is and the other is not.
double relative_difference(Backend& be, Tensor a, Tensor b) {
  Buffer scratch;
  Tensor diff = scratch.get(be, a.dtype(), a.shape());
  be.copy(diff, a);
  be.scale(diff, -1.0);
  be.add(diff, b);
  const double na = be.sum_squares(a), nb = be.sum_squares(b), nd = be.sum_squares(diff);
  const bool fa = std::isfinite(na), fb = std::isfinite(nb);
  if (!fa && !fb) return 0.0;
  if (fa != fb || !std::isfinite(nd)) return std::numeric_limits<double>::infinity();
  const double scale = std::sqrt(std::max(na, nb));
  return scale > 0.0 ? std::sqrt(nd) / scale : 0.0;
}

bool agree(Backend& be, const std::string& cell, const char* pass, DType dtype, DType gemm,
           const Snapshot& first, const Results& second) {
  double worst = 0.0;
  std::string where;
  for (size_t i = 0; i < second.size(); ++i) {
    const double d = relative_difference(be, first.copies[i].tensor(), second[i].second);
    if (d > worst || where.empty()) {
      worst = std::max(worst, d);
      where = second[i].first;
    }
  }
  const double tol = tolerance(dtype, gemm);
  if (worst <= tol) {
    if (autotune::verbose())
      std::fprintf(stderr,
                   "seqforge: autotune: the %s's whole chains agree with its steps %s (relative "
                   "difference %.2g in %s, at most %.2g allowed)\n",
                   cell.c_str(), pass, worst, where.c_str(), tol);
    return true;
  }
  std::fprintf(stderr,
               "seqforge: warning: the %s's whole-chain kernels disagree with its steps on this "
               "device (%s: %s off by %.3g relative, at most %.2g expected); the steps run "
               "instead. This is a defect: please report it with the output of `seqforge "
               "diagnose`\n",
               cell.c_str(), pass, where.c_str(), worst, tol);
  return false;
}

}  // namespace

Recurrent::Results Recurrent::forward_results() const {
  Results r;
  for (int64_t l = 0; l < opt_.num_layers; ++l)
    r.emplace_back("layer " + std::to_string(l) + "'s output", out_[l].tensor());
  if (cell_.cell_state)
    for (size_t s = 0; s < chains_.size(); ++s)
      r.emplace_back("chain " + std::to_string(s) + "'s cell states", chains_[s].c.tensor());
  return r;
}

Recurrent::Results Recurrent::backward_results() const {
  Results r;
  for (int64_t l = input_grad_ ? 0 : 1; l < opt_.num_layers; ++l)
    r.emplace_back("layer " + std::to_string(l) + "'s input gradient", din_[l].tensor());
  for (size_t s = 0; s < chains_.size(); ++s) {
    r.emplace_back("chain " + std::to_string(s) + "'s dL/dh0", chains_[s].dh.tensor());
    if (cell_.cell_state)
      r.emplace_back("chain " + std::to_string(s) + "'s dL/dc0", chains_[s].dc.tensor());
  }
  r.emplace_back("the parameter gradients", params_.grads().flat());
  return r;
}

bool Recurrent::whole_chains_agree_forward(Backend& be) {
  run_forward(be, RecurrentSchedule::layered);
  const Snapshot steps = take(be, forward_results());
  run_forward(be, RecurrentSchedule::whole_chains);
  return agree(be, upper(cell_.name), "forward", params_.dtype(), gemm_dtype_, steps,
               forward_results());
}

// Called right after a whole-chain backward: its results are kept, the parameter gradients put
// back as they were before it (grads_before), the forward run again by the steps (the backward
// overwrote the saved gates), and the steps' backward compared.
bool Recurrent::whole_chains_agree_backward(Backend& be, Tensor grads_before) {
  const Snapshot chains = take(be, backward_results());
  be.copy(params_.grads().flat(), grads_before);
  run_forward(be, RecurrentSchedule::layered);
  reset_backward_sums(be);
  run_backward(be, RecurrentSchedule::layered);
  return agree(be, upper(cell_.name), "backward", params_.dtype(), gemm_dtype_, chains,
               backward_results());
}

}  // namespace seqforge
