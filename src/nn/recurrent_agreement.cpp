// The whole-chain kernels (RecurrentSchedule::whole_chains: a device's one launch per chain)
// checked against the steps (layered: a GEMM and a cell op per step, the path every backend
// shares) the first time a problem is tuned: forward on the same inputs and dropout masks,
// backward on the same forward and output gradients. So are the schedules that put independent
// chains on concurrent streams of a device (side_by_side, split_batch, one_worker: the steps'
// ops, ordered across streams by events), forward, and backward where forward chose one. Where they
// disagree the schedule is not used and a warning says so: a defect that only a real GPU shows then
// costs speed, not a silently wrong model.
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

// Copies of each tensor of `results`, in order.
std::vector<Buffer> copies_of(Backend& be, const Results& results) {
  std::vector<Buffer> copies(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    const Tensor t = results[i].second;
    be.copy(copies[i].get(be, t.dtype(), t.shape()), t);
  }
  return copies;
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

// What a schedule checked against the steps is, in the messages.
std::string checked_name(RecurrentSchedule schedule) {
  switch (schedule) {
    case RecurrentSchedule::whole_chains:
      return "whole-chain kernels";
    case RecurrentSchedule::side_by_side:
      return "side_by_side streams";
    case RecurrentSchedule::split_batch:
      return "split_batch streams";
    case RecurrentSchedule::one_worker:
      return "one_worker stream";
    default:
      return "steps";
  }
}

bool agree(Backend& be, const std::string& cell, const std::string& what, const char* pass,
           DType dtype, DType gemm, const std::vector<Buffer>& first, const Results& second) {
  double worst = 0.0;
  std::string where;
  for (size_t i = 0; i < second.size(); ++i) {
    const double d = relative_difference(be, first[i].tensor(), second[i].second);
    if (d > worst || where.empty()) {
      worst = std::max(worst, d);
      where = second[i].first;
    }
  }
  const double tol = tolerance(dtype, gemm);
  if (worst <= tol) {
    if (autotune::verbose())
      std::fprintf(stderr,
                   "seqforge: autotune: the %s's %s agree with its steps %s (relative "
                   "difference %.2g in %s, at most %.2g allowed)\n",
                   cell.c_str(), what.c_str(), pass, worst, where.c_str(), tol);
    return true;
  }
  std::fprintf(stderr,
               "seqforge: warning: the %s's %s disagree with its steps on this device (%s: %s off "
               "by %.3g relative, at most %.2g expected); they are not used. This is a defect: "
               "please report it with the output of `seqforge diagnose`\n",
               cell.c_str(), what.c_str(), pass, where.c_str(), worst, tol);
  return false;
}

// Whether the check's copies of `results` (and `extra` bytes more) fit: on a device within half
// its free memory (train.micro_batch_size auto leaves little), where they are made; on the host,
// always.
bool room_to_check(const Backend& be, const Results& results, size_t extra) {
  size_t free = 0, total = 0, largest = 0;
  std::string device;
  if (!be.device_memory(&free, &total, &device)) return true;
  for (const auto& [name, t] : results) {
    extra += t.nbytes();
    largest = std::max(largest, t.nbytes());
  }
  const bool room = extra + largest <= free / 2;
  if (!room && autotune::verbose())
    std::fprintf(stderr,
                 "seqforge: autotune: too little device memory free (%zu MiB) to check the "
                 "schedules against the steps\n",
                 free >> 20);
  return room;
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

// The gradients of this module's parameters (not the whole arena: under mpirun the head's may
// be summed across ranks while this backward runs).
Recurrent::Results Recurrent::parameter_grads() const {
  Results r;
  const auto& entries = params_.grads().entries();
  for (const Weights& w : weights_) {
    std::vector<size_t> all{w.w_ih, w.w_hh, w.b_ih, w.b_hh};
    if (projected()) all.push_back(w.w_hr);
    all.insert(all.end(), w.own.begin(), w.own.end());
    for (size_t k : all)
      if (const Tensor g = params_.grad(k); g.numel() > 0)  // fixed parameters have none
        r.emplace_back(entries[k].name + "'s gradient", g);
  }
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
  const Results grads = parameter_grads();
  r.insert(r.end(), grads.begin(), grads.end());
  return r;
}

// The whole chains, and on a device (memory the host cannot address) the schedules whose
// workers' ops run on streams of their own; the CPU's threads run the steps' ops as called.
bool Recurrent::checked_against_steps(const Backend& be, RecurrentSchedule schedule) {
  switch (schedule) {
    case RecurrentSchedule::whole_chains:
      return true;
    case RecurrentSchedule::side_by_side:
    case RecurrentSchedule::split_batch:
    case RecurrentSchedule::one_worker:
      return !be.host_addressable();
    default:
      return false;
  }
}

// Before a schedule's run in the check, what forward writes is made NaN: a step that reads its
// input before it is written (an event missing between streams) reads NaN, not the equal values
// the steps left.
void Recurrent::poison_forward(Backend& be) {
  auto poison = [&](const Buffer& b) {
    if (b.tensor().data()) be.fill(b.tensor(), std::numeric_limits<double>::quiet_NaN());
  };
  for (const std::vector<Buffer>* layers : {&out_, &out_low_, &dropped_, &dropped_low_})
    for (const Buffer& b : *layers) poison(b);
  for (const Chain& ch : chains_)
    for (const Buffer* b : {&ch.gates, &ch.c, &ch.saved, &ch.gates_low, &ch.m, &ch.m_low})
      poison(*b);
}

// Runs the steps, then each of `schedules` (the last runs last), and compares their forward
// results; returns those that disagree.
std::vector<RecurrentSchedule> Recurrent::disagree_forward(
    Backend& be, const std::vector<RecurrentSchedule>& schedules) {
  std::vector<RecurrentSchedule> wrong;
  if (!room_to_check(be, forward_results(), 0)) return wrong;
  run_forward(be, RecurrentSchedule::layered);
  const std::vector<Buffer> steps = copies_of(be, forward_results());
  for (RecurrentSchedule schedule : schedules) {
    poison_forward(be);
    run_forward(be, schedule);
    if (!agree(be, upper(cell_.name), checked_name(schedule), "forward", params_.dtype(),
               gemm_dtype_, steps, forward_results()))
      wrong.push_back(schedule);
  }
  return wrong;
}

// Before a backward trial: where there is room to check it, copies of the parameter gradients
// as they are before it.
std::optional<std::vector<Buffer>> Recurrent::grads_to_check_against(Backend& be) const {
  size_t bytes = 0;
  for (const auto& [name, g] : parameter_grads()) bytes += g.nbytes();
  if (!room_to_check(be, backward_results(), bytes)) return std::nullopt;
  return copies_of(be, parameter_grads());
}

// Called right after a backward by `schedule` (whole chains, or concurrent streams): its results
// are kept, the parameter gradients put back as they were before it (grads_before), the forward
// run again by the steps (the backward overwrote the saved gates), and the steps' backward
// compared.
bool Recurrent::agrees_backward(Backend& be, RecurrentSchedule schedule,
                                const std::vector<Buffer>& grads_before) {
  const std::vector<Buffer> checked = copies_of(be, backward_results());
  const Results grads = parameter_grads();
  for (size_t i = 0; i < grads.size(); ++i) be.copy(grads[i].second, grads_before[i].tensor());
  run_forward(be, RecurrentSchedule::layered);
  reset_backward_sums(be);
  run_backward(be, RecurrentSchedule::layered);
  return agree(be, upper(cell_.name), checked_name(schedule), "backward", params_.dtype(),
               gemm_dtype_, checked, backward_results());
}

}  // namespace seqforge
