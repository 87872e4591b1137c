// The recurrence engine, forward and backward, for any registered cell of G gates.
//
// Per layer l and direction d (chain s = l * D + d), time-major:
//   forward:  G = in W_ih^T + (b_ih + folded b_hh)      one GEMM over all T*B rows
//             for each step t (t = 0..T-1, or T-1..0 reversed):
//               R = h_prev W_hh^T;  cell: (G[t], R, h_prev, c_prev) -> (c[t], h[t])
//   backward: for each step in reverse processing order:
//               cell': (dh_out[t] + dh_rec, dc) -> dG[t], dR[t], dc;  dh_rec = dR[t] W_hh
//               (+ the cell's direct term)
//             dW_ih += dG^T in;  dW_hh += dR^T H_prev;  db_ih += colsum(dG), db_hh += colsum(dR)
//             din (=, += for the second direction) = dG W_ih   one GEMM each
// (The weight-gradient GEMMs and their layouts are in recurrent_weight_grads.cpp.)
// dR is dG except for cells with recurrent_grads (GRU, LN-LSTM), which write it apart. Cells
// with bias_in_cell (LN-LSTM) add the bias themselves, after normalising G and R.
// h[t] is written straight into the layer output (T, B, D*H) at column d*H, so H_prev for all
// steps is the output shifted by one step (two GEMMs: the initial state, then the rest). dG[t]
// overwrites the saved gate activations of step t, which backward no longer needs. Inputs of up
// to kCellProjectionMaxInput features skip the G GEMM: the cell computes in[t] W_ih^T + bias.
//
// Concurrency, where the backend runs several op sequences at once: the two directions of a
// bidirectional layer run side by side; a unidirectional stack runs as a wavefront, layer l at
// step t alongside layer l-1 at step t+1, the lower layer's worker computing the upper layer's
// input projection for each step it finishes (and in backward the upper layer's worker computing
// the lower layer's output gradient). Each worker's GEMMs then run on one core, which on the
// small recurrent shapes beats one GEMM split over all cores. Timings quoted below are the
// LSTM's. Whole chains (a backend that runs a chain's recurrence in one call) pair a
// unidirectional stack's layers the same way: each pair is one call, the upper layer's input
// projection (forward) and the lower layer's output gradient (backward) computed step by step
// inside it.
//
// With bf16 GEMMs the cells keep the gate activations in bf16 (backward overwrites them with dG
// in bf16) and also write bf16 copies of h; every GEMM reads those and bf16 copies of the
// weights. Cell state, the input projection and all other gradients stay in f32. The backward
// cells sum dG's columns (the bias gradient) as they go.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include "seqforge/nn/recurrent.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <mutex>
#include <span>
#include <thread>

#include "nn/recurrent_util.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/core/autotune.hpp"
#include "seqforge/core/profiler.hpp"

namespace seqforge {

using recurrent::at;
using recurrent::upper;

namespace {

// Dropout mask (T, B, F) of rate p; `locked`: one (B, F) mask shared by every step.
void draw_mask(Backend& be, Tensor mask, double p, uint64_t seed, bool locked) {
  if (!locked) return be.dropout_mask(mask, p, seed);
  if (mask.dim(0) == 0) return;
  const Tensor first = mask.slice(0, 1);
  be.dropout_mask(first, p, seed);
  for (int64_t t = 1; t < mask.dim(0); ++t) be.copy(mask.slice(t, t + 1), first);
}

// Sequences at least this long get their per-step GEMMs' weights packed (repacked every training
// step).
constexpr int64_t kPackMinSteps = 4;

// Inputs up to this wide are projected inside the cell kernel: as a GEMM, K this small runs far
// below the GEMM rate and writes the (T, B, G*H) projection only for the cells to read it back.
constexpr int64_t kCellProjectionMaxInput = 16;

// R(B, G*H) = h_prev(B, P) W_hh^T, h_prev rows lda apart.
GemmShape recurrent_forward_shape(int64_t B, int64_t G, int64_t H, int64_t P, int64_t lda) {
  return {.trans_b = true, .m = B, .n = G * H, .k = P, .lda = lda, .ldb = P, .ldc = G * H};
}
// dh(B, P) = dR(B, G*H) W_hh(G*H, P), added to dh's direct term when the cell has one.
GemmShape recurrent_backward_shape(int64_t B, int64_t G, int64_t H, int64_t P, bool accumulate) {
  GemmShape s{.m = B, .n = P, .k = G * H, .lda = G * H, .ldb = P, .ldc = P};
  s.beta = accumulate ? 1.0f : 0.0f;
  return s;
}

// "<cell> <what>", kept for the process's lifetime (the profiler holds the pointer).
const char* scope_name(const CellType& cell, const char* what) {
  static std::mutex mutex;
  static std::deque<std::string> names;
  const std::string name = std::string(cell.name) + " " + what;
  std::lock_guard<std::mutex> lock(mutex);
  for (const std::string& n : names)
    if (n == name) return n.c_str();
  return names.emplace_back(name).c_str();
}

}  // namespace

Recurrent::Recurrent(Parameters& params, const std::string& prefix, const RecurrentOptions& options)
    : params_(params),
      opt_(options),
      cell_(cell_type(options.cell)),
      G_(cell_.gates),
      scope_forward_(scope_name(cell_, "forward")),
      scope_backward_(scope_name(cell_, "backward")),
      scope_projection_(scope_name(cell_, "input projection")),
      scope_input_grad_(scope_name(cell_, "input gradient")),
      scope_weight_grads_(scope_name(cell_, "weight gradients")),
      scope_copies_(scope_name(cell_, "K-major copies")),
      gemm_dtype_(params.dtype()) {
  const std::string where = prefix.empty() ? cell_.name : prefix;
  if (opt_.input_size <= 0) fail(where, ": input_size must be positive, got ", opt_.input_size);
  if (opt_.hidden_size < cell_.min_hidden)
    fail(where, ": hidden_size must be at least ", cell_.min_hidden, " for the ", cell_.name,
         " cell, got ", opt_.hidden_size);
  if (opt_.num_layers <= 0) fail(where, ": num_layers must be positive, got ", opt_.num_layers);
  if (!(opt_.dropout >= 0.0 && opt_.dropout < 1.0))
    fail(where, ": dropout ", opt_.dropout, " outside [0, 1)");
  if (opt_.proj_size < 0 || opt_.proj_size >= opt_.hidden_size)
    fail(where, ": proj_size must be in [0, hidden_size ", opt_.hidden_size, "), got ",
         opt_.proj_size);
  if (opt_.proj_size > 0 && cell_.kind != CellKind::lstm)
    fail(where, ": proj_size is for the lstm cell only, not ", cell_.name);
  const int64_t H = opt_.hidden_size, P = opt_.state_size(), L = opt_.num_layers;
  const Init init = Init::Uniform(1.0 / std::sqrt(double(H)));
  const std::string base = prefix.empty() ? "" : prefix + ".";
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t d = 0; d < directions(); ++d) {
      const std::string sfx = "_l" + std::to_string(l) + (d ? "_reverse" : "");
      Weights w;
      w.w_ih = params.declare(base + "weight_ih" + sfx, {G_ * H, layer_input_size(l)}, init);
      w.w_hh = params.declare(base + "weight_hh" + sfx, {G_ * H, P}, init);
      w.b_ih = params.declare(base + "bias_ih" + sfx, {G_ * H}, init);
      w.b_hh = params.declare(base + "bias_hh" + sfx, {G_ * H}, init);
      if (projected()) w.w_hr = params.declare(base + "weight_hr" + sfx, {P, H}, init);
      for (int k = 0; k < cell_.num_params; ++k) {
        const CellParam& own = cell_.params[k];
        w.own.push_back(
            params.declare(base + own.name + sfx, {own.per_hidden * H}, Init::Constant(own.init)));
      }
      weights_.push_back(w);
    }
  }
  chains_.resize(weights_.size());
  progress_ = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(L));
  in_gemm_.resize(L);
  out_.resize(L);
  out_low_.resize(L);
  mask_.resize(L);
  dropped_.resize(L);
  dropped_low_.resize(L);
  din_.resize(L);
}

void Recurrent::set_gemm_dtype(DType dtype) {
  const bool half = dtype == DType::bf16 || dtype == DType::f16;
  if (dtype != params_.dtype() && !(half && params_.dtype() == DType::f32))
    fail(upper(cell_.name), " GEMMs in ", dtype_name(dtype), " need f32 parameters, have ",
         dtype_name(params_.dtype()));
  gemm_dtype_ = dtype;
}

int64_t Recurrent::layer_input_size(int64_t layer) const {
  return layer == 0 ? opt_.input_size : output_size();
}

bool Recurrent::cell_projects_input(int64_t l) const {
  if (cell_.bias_in_cell) return false;
  return layer_input_size(l) <= kCellProjectionMaxInput;
}

Tensor Recurrent::layer_input(int64_t l) const {
  if (l == 0) return x_in_;
  return dropout_active_ ? dropped_[l - 1].tensor() : out_[l - 1].tensor();
}

Tensor Recurrent::recurrent_weights(int64_t s) const {
  return low() ? chains_[s].w_hh_low.tensor() : params_.value(weights_[s].w_hh);
}

Tensor Recurrent::chain_h0(int64_t s) const {
  return (low() ? h0_low_ : h0_).tensor().slice(s, s + 1);
}

// Layers of a unidirectional stack that run side by side: one per worker the backend offers.
int Recurrent::wavefront_width(const Backend& be) const {
  if (directions() == 2 || opt_.num_layers < 2) return 1;
  return static_cast<int>(std::min<int64_t>(be.concurrency(), opt_.num_layers));
}

// A wavefront's workers: `layer` (on worker `worker`) has done `steps` of them, on the host
// (progress_) and on the device (the backend's marks, where its ops run asynchronously).
void Recurrent::wait_for(Backend& be, int worker, int64_t layer, int64_t steps) const {
  for (int spins = 0; progress_[layer].load(std::memory_order_acquire) < steps; ++spins) {
    if (failed_.load(std::memory_order_relaxed))
      fail(upper(cell_.name), " wavefront: another worker failed");
    if (spins < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
  be.wait_for_worker(worker, steps);
}

void Recurrent::signal_progress(Backend& be, int64_t layer, int64_t steps) {
  be.signal_worker();
  progress_[layer].store(steps, std::memory_order_release);
}

// ---- forward ---------------------------------------------------------------------------------

Tensor Recurrent::forward(Backend& be, Tensor x, Tensor h0, Tensor c0, bool training, Rng& rng) {
  const DType dt = params_.dtype();
  const std::string label = upper(cell_.name);
  SF_CHECK(x.dtype() == dt, label, " input dtype ", dtype_name(x.dtype()), ", parameters ",
           dtype_name(dt));
  if (x.shape().rank() != 3 || x.dim(2) != opt_.input_size)
    fail(label, " input must be ", opt_.batch_first ? "(B, T, " : "(T, B, ", opt_.input_size,
         "), got ", x.shape().str());
  T_ = opt_.batch_first ? x.dim(1) : x.dim(0);
  B_ = opt_.batch_first ? x.dim(0) : x.dim(1);
  if (opt_.batch_first) {
    x_ = x_tm_.get(be, dt, {T_, B_, opt_.input_size});
    be.transpose01(x_, x);
  } else {
    x_ = x;
  }
  take_initial_states(be, h0, c0);
  prepare_chains(be);
  prepare_step_buffers(be, training, rng);
  if (T_ > 0 && B_ > 0) run_tuned_forward(be);
  write_final_states(be);

  Tensor y = out_[opt_.num_layers - 1].tensor();
  if (!opt_.batch_first) return y;
  Tensor y_bf = y_bf_.get(be, dt, {B_, T_, output_size()});
  be.transpose01(y_bf, y);
  return y_bf;
}

void Recurrent::take_initial_states(Backend& be, Tensor h0, Tensor c0) {
  const DType dt = params_.dtype();
  const std::string label = upper(cell_.name);
  const int64_t H = opt_.hidden_size, P = opt_.state_size(), DL = directions() * opt_.num_layers;
  const Shape state_shape{DL, B_, P}, c_shape{DL, B_, H};
  for (auto [t, shape, name] : {std::tuple{h0, state_shape, "h0"}, std::tuple{c0, c_shape, "c0"}}) {
    if (!t.empty() && t.shape() != shape)
      fail(label, " ", name, " must be ", shape.str(), ", got ", t.shape().str());
  }
  if (!c0.empty() && !cell_.cell_state) fail(label, " has no cell state, but c0 was given");
  Tensor h_init = h0_.get(be, dt, state_shape);
  if (h0.empty())
    be.fill(h_init, 0.0);
  else
    be.copy(h_init, h0);
  h_n_.get(be, dt, state_shape);
  if (cell_.cell_state) {
    Tensor c_init = c0_.get(be, dt, c_shape);
    c_n_.get(be, dt, c_shape);
    if (c0.empty())
      be.fill(c_init, 0.0);
    else
      be.copy(c_init, c0);
  }
}

// Per-chain constants: the input projection's bias, the cell's own parameters, bf16 weights.
void Recurrent::prepare_chains(Backend& be) {
  const DType dt = params_.dtype(), gt = gemm_dtype_;
  const int64_t H = opt_.hidden_size, D = directions();
  const int64_t folded = cell_.folded_hh_bias_gates * H;
  for (size_t s = 0; s < chains_.size(); ++s) {
    Chain& ch = chains_[s];
    const Weights& w = weights_[s];
    Tensor bias = ch.bias.get(be, dt, {G_ * H});
    be.copy(bias, params_.value(w.b_ih));
    be.add(bias.slice(0, folded), params_.value(w.b_hh).slice(0, folded));
    if (cell_.num_params > 0) {  // the cell's own parameters, side by side
      Tensor own = ch.own.get(be, dt, {cell_param_columns(cell_, H)});
      int64_t col = 0;
      for (size_t k : w.own) {
        const Tensor v = params_.value(k);
        be.copy(own.slice(col, col + v.numel()), v);
        col += v.numel();
      }
    }
    if (low()) {
      Tensor w_ih = params_.value(w.w_ih), w_hh = params_.value(w.w_hh);
      be.convert(ch.w_ih_low.get(be, gt, w_ih.shape()), w_ih);
      be.convert(ch.w_hh_low.get(be, gt, w_hh.shape()), w_hh);
      if (projected()) {
        Tensor w_hr = params_.value(w.w_hr);
        be.convert(ch.w_hr_low.get(be, gt, w_hr.shape()), w_hr);
      }
    }
    if (cell_projects_input(s / D)) {
      const int64_t I = layer_input_size(s / D);
      be.transpose01(ch.w_ih_t.get(be, dt, {I, G_ * H, 1}),
                     params_.value(w.w_ih).reshape({G_ * H, I, 1}));
    }
  }
}

// Layer buffers, dropout masks (drawn up front so steps can apply them), GEMM inputs, and the
// chains' step buffers.
void Recurrent::prepare_step_buffers(Backend& be, bool training, Rng& rng) {
  const DType dt = params_.dtype(), gt = gemm_dtype_;
  const int64_t H = opt_.hidden_size, P = opt_.state_size(), D = directions(), L = opt_.num_layers;
  dropout_active_ = training && opt_.dropout > 0.0;
  x_in_ = x_;
  if (locked_dropout()) {
    draw_mask(be, x_mask_.get(be, dt, x_.shape()), opt_.dropout, rng.next(), true);
    x_in_ = x_dropped_.get(be, dt, x_.shape());
    be.mul(x_in_, x_, x_mask_.tensor());
  }
  if (low()) {
    be.convert(x_low_.get(be, gt, x_.shape()), x_in_);
    be.convert(h0_low_.get(be, gt, h0_.tensor().shape()), h0_.tensor());
  }
  in_gemm_[0] = low() ? x_low_.tensor() : x_in_;
  for (int64_t l = 0; l < L; ++l) {
    const Shape out_shape{T_, B_, D * P};
    Tensor out = out_[l].get(be, dt, out_shape);
    Tensor out_g = low() ? out_low_[l].get(be, gt, out_shape) : out;
    if (l + 1 == L) break;
    if (dropout_active_) {
      draw_mask(be, mask_[l].get(be, dt, out_shape), opt_.dropout, rng.next(), locked_dropout());
      Tensor dropped = dropped_[l].get(be, dt, out_shape);
      in_gemm_[l + 1] = low() ? dropped_low_[l].get(be, gt, out_shape) : dropped;
    } else {
      in_gemm_[l + 1] = out_g;
    }
  }
  for (int64_t l = 0; l < L; ++l)
    for (int64_t d = 0; d < D; ++d) {
      Chain& ch = chains_[l * D + d];
      // With bf16 GEMMs the activations are kept in bf16, and f32 gates only hold the input
      // projection, which narrow inputs do without.
      if (!low() || !cell_projects_input(l)) ch.gates.get(be, dt, {T_, B_, G_ * H});
      if (low()) ch.gates_low.get(be, gt, {T_, B_, G_ * H});
      if (cell_.cell_state) ch.c.get(be, dt, {T_, B_, H});
      if (locked_dropout()) {
        be.dropout_mask(ch.rec_mask.get(be, dt, {B_, P}), opt_.dropout, rng.next());
        ch.h_masked.get(be, gt, {T_, B_, P});
        if (low()) ch.h_masked_f32.get(be, dt, {B_, P});
      }
      ch.saved.get(be, dt, {T_, B_, saved_columns(cell_, H)});
      ch.rec.get(be, dt, {B_, G_ * H});
      if (projected()) {
        ch.m.get(be, dt, {T_, B_, H});
        if (low()) ch.m_low.get(be, gt, {T_, B_, H});
        if (low() && D == 2) {
          ch.h_step.get(be, dt, {B_, P});
          ch.h_step_low.get(be, gt, {B_, P});
        }
      }
    }
}

// Final states: the last step each chain processed (t = T-1 forward, t = 0 reversed).
void Recurrent::write_final_states(Backend& be) {
  const DType dt = params_.dtype();
  const int64_t H = opt_.hidden_size, P = opt_.state_size(), D = directions();
  Tensor hn = h_n_.tensor(), h_init = h0_.tensor();
  for (int64_t s = 0; s < D * opt_.num_layers; ++s) {
    const int64_t l = s / D, d = s % D;
    if (T_ == 0) {
      be.copy(hn.slice(s, s + 1), h_init.slice(s, s + 1));
      if (cell_.cell_state) be.copy(c_n_.tensor().slice(s, s + 1), c0_.tensor().slice(s, s + 1));
      continue;
    }
    const int64_t t_last = d == 0 ? T_ - 1 : 0;
    be.copy_rows(at(hn, s * B_ * P), P, at(out_[l].tensor(), t_last * B_ * D * P + d * P), D * P,
                 B_, P, dt);
    if (cell_.cell_state)
      be.copy(c_n_.tensor().slice(s, s + 1).reshape({B_, H}),
              chains_[s].c.tensor().slice(t_last, t_last + 1).reshape({B_, H}));
  }
}

// Workers of the split_batch schedule: each takes rows [B j / n, B (j + 1) / n).
int Recurrent::split_workers(const Backend& be) const {
  return static_cast<int>(std::min<int64_t>(be.concurrency(), B_));
}

// The layers' recurrences, all steps, as `schedule` says (not one_worker: see run_forward).
void Recurrent::compute_forward(Backend& be, RecurrentSchedule schedule) {
  const int64_t D = directions(), L = opt_.num_layers;
  const bool concurrent = schedule == RecurrentSchedule::side_by_side;
  {
    const int width = concurrent ? wavefront_width(be) : 1;
    for (int64_t l0 = 0; l0 < L;) {
      const bool stack = schedule == RecurrentSchedule::whole_chains && stacks_with_next(l0);
      const int64_t group = stack ? 2 : std::min<int64_t>(width, L - l0);
      if (stack) {
        project_all(be, l0, 0);
        SF_PROFILE_SCOPE(scope_forward_, static_cast<int>(l0), 0);
        stack_forward(be, l0);
      } else if (group == 1) {
        // Bidirectional layers project their input a step at a time: the step's pre-activations
        // are then still in cache for the cell (W2 bf16, layered: 260-270 against 286-293 ms;
        // a unidirectional W4 gains nothing, its per-step GEMMs have 64 rows).
        const bool whole = schedule == RecurrentSchedule::whole_chains;
        const bool per_step = D == 2 && schedule != RecurrentSchedule::split_batch && !whole;
        if (!per_step)
          for (int64_t d = 0; d < D; ++d) project_all(be, l0, d);
        auto run_chain = [&](int64_t d) {
          SF_PROFILE_SCOPE(scope_forward_, static_cast<int>(l0), static_cast<int>(d));
          // W_ih packed by the worker that runs the chain: the layout depends on its threads.
          if (per_step && !cell_projects_input(l0))
            pack_weights(be, project_step_shape(l0), input_weights(l0 * D + d),
                         &chains_[l0 * D + d].w_ih_step);
          for (int64_t step = 0; step < T_; ++step) {
            if (per_step) project_step(be, l0, d, step);
            step_forward(be, l0, d, step, 0, B_);
          }
        };
        if (schedule == RecurrentSchedule::split_batch) {
          const int n = split_workers(be);
          be.run_concurrently(n, [&](int j) {
            SF_PROFILE_SCOPE(scope_forward_, static_cast<int>(l0), 0);
            const int64_t b0 = B_ * j / n, nb = B_ * (j + 1) / n - b0;
            for (int64_t d = 0; d < D; ++d)
              for (int64_t step = 0; step < T_; ++step) step_forward(be, l0, d, step, b0, nb);
          });
        } else if (D == 2 && concurrent) {
          be.run_concurrently(2, [&](int d) { run_chain(d); });
        } else if (whole) {
          SF_PROFILE_SCOPE(scope_forward_, static_cast<int>(l0), 0);
          chains_forward(be, l0);
        } else {
          for (int64_t d = 0; d < D; ++d) run_chain(d);
        }
      } else {  // layers l0 .. l0+group-1 as a wavefront, one worker each
        project_all(be, l0, 0);
        pack_step_weights(be, l0, l0 + group, false);
        for (int64_t l = l0; l < l0 + group; ++l) progress_[l].store(0);
        failed_.store(false);
        be.run_concurrently(static_cast<int>(group), [&](int j) {
          const int64_t l = l0 + j;
          SF_PROFILE_SCOPE(scope_forward_, static_cast<int>(l), 0);
          try {
            // The next layer's input projection at step t is its own GEMM: the layer below does
            // it at even steps, the layer itself at odd ones, so the workers' loads match.
            for (int64_t t = 0; t < T_; ++t) {
              if (j > 0) wait_for(be, j - 1, l - 1, t + 1);
              if (j > 0 && t % 2 == 1) project_step(be, l, 0, t);
              step_forward(be, l, 0, t, 0, B_);
              if (j + 1 < group) {
                finish_output_step(be, l, t);
                if (t % 2 == 0) project_step(be, l + 1, 0, t);
              }
              signal_progress(be, l, t + 1);
            }
          } catch (...) {
            failed_.store(true);
            throw;
          }
        });
      }
      l0 += group;
      if (l0 < L)  // the next layer's input, whole
        for (int64_t t = 0; t < T_; ++t) finish_output_step(be, l0 - 1, t);
    }
  }
}

// dL/dh and dL/dc flowing into the last step of every chain: dh_n, dc_n, or zeros.
void Recurrent::reset_state_grads(Backend& be) {
  for (int64_t s = 0; s < static_cast<int64_t>(chains_.size()); ++s) {
    Tensor dh = chains_[s].dh.tensor(), dc = chains_[s].dc.tensor();
    if (dh_n_.empty())
      be.fill(dh, 0.0);
    else
      be.copy(dh, dh_n_.slice(s, s + 1));
    if (!cell_.cell_state) continue;
    if (dc_n_.empty())
      be.fill(dc, 0.0);
    else
      be.copy(dc, dc_n_.slice(s, s + 1));
  }
}

void Recurrent::reset_backward_sums(Backend& be) {
  for (Chain& ch : chains_) be.fill(ch.dbias.tensor(), 0.0);
  reset_state_grads(be);
}

namespace {
const char* schedule_name(RecurrentSchedule s) {
  switch (s) {
    case RecurrentSchedule::tuned:
      return "tuned";
    case RecurrentSchedule::layered:
      return "layered";
    case RecurrentSchedule::side_by_side:
      return "side_by_side";
    case RecurrentSchedule::one_worker:
      return "one_worker";
    case RecurrentSchedule::split_batch:
      return "split_batch";
    case RecurrentSchedule::whole_chains:
      return "whole_chains";
  }
  return "?";
}
}  // namespace

RecurrentSchedule schedule_from_environment() {
  const char* name = std::getenv("SEQFORGE_RECURRENT_SCHEDULE");
  if (!name || !*name) return RecurrentSchedule::tuned;
  for (RecurrentSchedule s :
       {RecurrentSchedule::layered, RecurrentSchedule::side_by_side, RecurrentSchedule::one_worker,
        RecurrentSchedule::split_batch, RecurrentSchedule::whole_chains})
    if (std::string_view(name) == schedule_name(s)) return s;
  fail("SEQFORGE_RECURRENT_SCHEDULE: unknown schedule '", name,
       "' (expected layered, side_by_side, one_worker, split_batch or whole_chains)");
}

void Recurrent::run_forward(Backend& be, RecurrentSchedule schedule) {
  if (schedule == RecurrentSchedule::whole_chains && !whole_chains_apply())
    schedule = RecurrentSchedule::layered;
  chosen_ = schedule;
  if (schedule == RecurrentSchedule::one_worker)
    return be.run_concurrently(1, [&](int) { compute_forward(be, RecurrentSchedule::layered); });
  compute_forward(be, schedule);
}

void Recurrent::run_backward(Backend& be, RecurrentSchedule schedule) {
  if (schedule == RecurrentSchedule::one_worker)
    return be.run_concurrently(1, [&](int) { compute_backward(be, RecurrentSchedule::layered); });
  compute_backward(be, schedule);
}

// Runs the forward recurrences with the schedule autotuned for this problem (RecurrentSchedule).
// The first time a problem is seen, every candidate runs (a warm-up and two timed runs each) and
// the fastest is kept on disk. Backward, which overwrites the saved gates with their gradients and
// so runs once, follows the choice.
void Recurrent::run_tuned_forward(Backend& be) {
  if (schedule_ != RecurrentSchedule::tuned) return run_forward(be, schedule_);
  // With independent chains (a stack, two directions) they run side by side or each op on all
  // workers; a single chain's batch may be split over the workers or the chain kept on one.
  // (Splitting the batch of W1's and W2's stacks came within a few percent of side by side, so
  // close that one noisy trial could pick the slower.)
  std::vector<RecurrentSchedule> candidates{RecurrentSchedule::layered};
  const bool chains = be.concurrency() >= 2 && (directions() == 2 || opt_.num_layers >= 2);
  if (chains) {
    candidates.push_back(RecurrentSchedule::side_by_side);
  } else if (be.concurrency() >= 2) {
    candidates.push_back(RecurrentSchedule::one_worker);
    if (B_ >= 2) candidates.push_back(RecurrentSchedule::split_batch);
  }
  if (be.fuses_recurrence(cell_.kind) && whole_chains_apply())
    candidates.push_back(RecurrentSchedule::whole_chains);
  const RecurrentSchedule fallback =
      chains ? RecurrentSchedule::side_by_side : RecurrentSchedule::layered;
  // The choice for the problem of the previous call, without building its key again.
  const std::tuple<int64_t, int64_t, DType, bool, int> problem{T_, B_, gemm_dtype_, dropout_active_,
                                                               be.concurrency()};
  if (tuned_ && tuned_->first == problem) return run_forward(be, tuned_->second);
  backward_tuning_ = {};
  if (candidates.size() == 1 || !autotune::enabled()) return run_forward(be, fallback);
  const std::string key =
      recurrent::tuning_prefix(be) + cell_.name + "|i" + std::to_string(opt_.input_size) + "_h" +
      std::to_string(opt_.hidden_size) +
      (projected() ? "_p" + std::to_string(opt_.proj_size) : "") + "_l" +
      std::to_string(opt_.num_layers) + "_d" + std::to_string(directions()) + "_t" +
      std::to_string(T_) + "_b" + std::to_string(B_) + "_" + std::string(dtype_name(gemm_dtype_)) +
      (dropout_active_ ? (locked_dropout() ? "_vdropout" : "_dropout") : "");
  if (candidates.back() == RecurrentSchedule::whole_chains) {
    backward_tuning_.key = key + "|backward";
    if (const auto cached = autotune::lookup(backward_tuning_.key))
      for (RecurrentSchedule c : {RecurrentSchedule::layered, RecurrentSchedule::whole_chains})
        if (*cached == schedule_name(c)) backward_tuning_.choice = c;
  }
  if (const auto cached = autotune::lookup(key)) {
    for (RecurrentSchedule c : candidates) {
      if (*cached != schedule_name(c)) continue;
      tuned_.emplace(problem, c);
      return run_forward(be, c);
    }
  }
  autotune::announce_first_use("the " + upper(cell_.name) +
                               "'s schedules and weight-gradient layouts");
  const autotune::Timing timing;
  std::vector<double> ms = recurrent::time_candidates(
      be, candidates.size(), [&](size_t i) { run_forward(be, candidates[i]); });
  std::vector<RecurrentSchedule> to_check;
  for (RecurrentSchedule c : candidates)
    if (checked_against_steps(be, c)) to_check.push_back(c);
  if (!to_check.empty()) {
    for (RecurrentSchedule wrong : disagree_forward(be, to_check)) {
      const size_t i = std::find(candidates.begin(), candidates.end(), wrong) - candidates.begin();
      candidates.erase(candidates.begin() + i);
      ms.erase(ms.begin() + i);
      if (wrong != RecurrentSchedule::whole_chains) continue;
      backward_tuning_.choice = RecurrentSchedule::layered;
      autotune::store(backward_tuning_.key, schedule_name(RecurrentSchedule::layered), timing);
    }
  }
  const size_t best = std::min_element(ms.begin(), ms.end()) - ms.begin();
  if (!to_check.empty() || candidates[best] != candidates.back())  // leave its results
    run_forward(be, candidates[best]);
  autotune::store(key, schedule_name(candidates[best]), timing);
  tuned_.emplace(problem, candidates[best]);
  if (backward_tuning_.key.empty() && candidates[best] != RecurrentSchedule::layered &&
      checked_against_steps(be, candidates[best])) {
    backward_tuning_.streams_key = key;
    backward_tuning_.timing.emplace(timing);
  }
  if (autotune::verbose()) {
    std::string times;
    for (size_t i = 0; i < candidates.size(); ++i) {
      char one[64];
      std::snprintf(one, sizeof one, "%s%s %.2f ms", i ? ", " : "", schedule_name(candidates[i]),
                    ms[i]);
      times += one;
    }
    std::fprintf(stderr, "seqforge: autotune %s: forward %s -> %s (%s)\n", key.c_str(),
                 times.c_str(), schedule_name(candidates[best]), autotune::where_kept(key).c_str());
  }
}

// Backward with forward's schedule, but where whole chains were a candidate: then its own choice
// between them and the steps (either reads what either forward wrote), tried on the first four
// calls (whole chains, steps, whole chains, steps; the warm pair decides) and kept on disk. A
// backward overwrites what it reads, so it is timed as training calls it, once per step. The
// first trial is checked against the steps (recurrent_agreement.cpp), from the parameter
// gradients as they were before it; so is the first call of a schedule on a device's concurrent
// streams that forward's tuning chose.
void Recurrent::run_tuned_backward(Backend& be) {
  BackwardTuning& tuning = backward_tuning_;
  if (tuning.key.empty() && !tuning.streams_key.empty() && tuned_ && chosen_ == tuned_->second) {
    const std::string key = std::exchange(tuning.streams_key, {});
    const std::optional<std::vector<Buffer>> grads_before = grads_to_check_against(be);
    run_backward(be, chosen_);
    if (grads_before && !agrees_backward(be, chosen_, *grads_before)) {
      autotune::store(key, schedule_name(RecurrentSchedule::layered), *tuning.timing);
      tuned_->second = RecurrentSchedule::layered;
    }
    return;
  }
  if (tuning.key.empty()) return run_backward(be, chosen_);
  if (tuning.choice) return run_backward(be, *tuning.choice);
  const RecurrentSchedule trial =
      tuning.ms.size() % 2 == 0 ? RecurrentSchedule::whole_chains : RecurrentSchedule::layered;
  std::optional<std::vector<Buffer>> grads_before;
  if (tuning.ms.empty()) {
    tuning.timing.emplace();
    grads_before = grads_to_check_against(be);
  }
  be.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  run_backward(be, trial);
  be.synchronize();
  tuning.ms.push_back(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  if (grads_before && !agrees_backward(be, RecurrentSchedule::whole_chains, *grads_before)) {
    // The fault may lie in what the whole chains' forward saved for backward: the steps run both
    // ways from now on.
    const std::string layered = schedule_name(RecurrentSchedule::layered);
    tuning.choice = RecurrentSchedule::layered;
    autotune::store(tuning.key, layered, *tuning.timing);
    autotune::store(tuning.key.substr(0, tuning.key.rfind("|backward")), layered, *tuning.timing);
    if (tuned_) tuned_->second = RecurrentSchedule::layered;
    return;
  }
  if (tuning.ms.size() < 4) return;
  tuning.choice =
      tuning.ms[2] <= tuning.ms[3] ? RecurrentSchedule::whole_chains : RecurrentSchedule::layered;
  autotune::store(tuning.key, schedule_name(*tuning.choice), *tuning.timing);
  if (autotune::verbose())
    std::fprintf(stderr,
                 "seqforge: autotune %s: whole_chains %.2f ms, layered %.2f ms -> %s (%s)\n",
                 tuning.key.c_str(), tuning.ms[2], tuning.ms[3], schedule_name(*tuning.choice),
                 autotune::where_kept(tuning.key).c_str());
}

// G(T*B, G*H) = in(T*B, I) W_ih^T + bias, for chain (l, d); the cells do it for narrow inputs.
void Recurrent::project_all(Backend& be, int64_t l, int64_t d) {
  if (cell_projects_input(l)) return;  // a scope of its own only where it is a GEMM
  SF_PROFILE_SCOPE(scope_projection_, static_cast<int>(l));
  const int64_t H = opt_.hidden_size, I = layer_input_size(l), s = l * directions() + d;
  Chain& ch = chains_[s];
  const Tensor w_ih = input_weights(s);
  GemmShape proj{.trans_b = true, .m = T_ * B_, .n = G_ * H, .k = I, .lda = I, .ldb = I};
  proj.ldc = G_ * H;
  proj.bias = !cell_.bias_in_cell;
  be.gemm(proj, gemm_dtype_, in_gemm_[l].data(), w_ih.data(), ch.gates.tensor().data(),
          proj.bias ? ch.bias.tensor().data() : nullptr);
}

GemmShape Recurrent::project_step_shape(int64_t l) const {
  const int64_t H = opt_.hidden_size, I = layer_input_size(l);
  GemmShape proj{.trans_b = true, .m = B_, .n = G_ * H, .k = I, .lda = I, .ldb = I};
  proj.ldc = G_ * H;
  proj.bias = !cell_.bias_in_cell;
  return proj;
}

GemmShape Recurrent::din_step_shape(int64_t l) const {
  const int64_t H = opt_.hidden_size, I = layer_input_size(l);
  return {.m = B_, .n = I, .k = G_ * H, .lda = G_ * H, .ldb = I, .ldc = I};
}

// B = w packed for GEMMs of shape s, or nothing for short sequences, where packing does not pay.
void Recurrent::pack_weights(Backend& be, const GemmShape& s, Tensor w,
                             std::unique_ptr<PackedB>* packed) const {
  if (T_ < kPackMinSteps) return packed->reset();
  be.pack_b(s, gemm_dtype_, w.data(), packed);
}

Tensor Recurrent::input_grads(int64_t s) const {
  return low() ? chains_[s].gates_low.tensor() : chains_[s].gates.tensor();
}

Tensor Recurrent::recurrent_grads(int64_t s) const {
  return cell_.recurrent_grads ? chains_[s].rec_grads.tensor() : input_grads(s);
}

// Rows of the K-major copies per step and batch row: dG, dR when apart, h_prev and the input.
int64_t Recurrent::k_major_rows(int64_t l) const {
  const int64_t GH = G_ * opt_.hidden_size;
  return GH + (cell_.recurrent_grads ? GH : 0) + opt_.state_size() + layer_input_size(l);
}

Tensor Recurrent::input_weights(int64_t s) const {
  return low() ? chains_[s].w_ih_low.tensor() : params_.value(weights_[s].w_ih);
}

// W_ih of the wavefront's layers l0+1 .. l1-1 packed for the per-step GEMMs that run on one
// worker (the input projection forward, the input gradient backward); packed on one thread so
// that the layout is the one those GEMMs want.
void Recurrent::pack_step_weights(Backend& be, int64_t l0, int64_t l1, bool backward) {
  be.run_concurrently(1, [&](int) {
    for (int64_t l = l0 + 1; l < l1; ++l) {
      if (backward)
        pack_weights(be, din_step_shape(l), input_weights(l), &chains_[l].w_ih_din);
      else if (!cell_projects_input(l))
        pack_weights(be, project_step_shape(l), input_weights(l), &chains_[l].w_ih_step);
    }
  });
}

// G[t](B, G*H) = in[t](B, I) W_ih^T + bias, for chain (l, d) at step `step` of its direction, on
// W_ih packed as ch.w_ih_step (or plain where it is empty).
void Recurrent::project_step(Backend& be, int64_t l, int64_t d, int64_t step) {
  if (cell_projects_input(l)) return;
  const int64_t H = opt_.hidden_size, I = layer_input_size(l), s = l * directions() + d;
  const int64_t t = d == 0 ? step : T_ - 1 - step;
  Chain& ch = chains_[s];
  be.gemm(project_step_shape(l), gemm_dtype_, at(in_gemm_[l], t * B_ * I), input_weights(s).data(),
          ch.w_ih_step.get(), at(ch.gates.tensor(), t * B_ * G_ * H),
          cell_.bias_in_cell ? nullptr : ch.bias.tensor().data());
}

// Layer l's output at step t as the next layer's input: dropout, and its bf16 copy.
void Recurrent::finish_output_step(Backend& be, int64_t l, int64_t t) {
  if (!dropout_active_) return;  // the cell already wrote out_ (and out_low_)
  Tensor dropped = dropped_[l].tensor().slice(t, t + 1);
  be.mul(dropped, out_[l].tensor().slice(t, t + 1), mask_[l].tensor().slice(t, t + 1));
  if (low()) be.convert(dropped_low_[l].tensor().slice(t, t + 1), dropped);
}

bool Recurrent::whole_chains_apply() const {
  return (cell_.kind == CellKind::lstm || cell_.kind == CellKind::gru) && !projected() &&
         !locked_dropout();
}

void Recurrent::chains_forward(Backend& be, int64_t l) {
  std::array<RecurrenceForward, 2> chains;
  for (int64_t d = 0; d < directions(); ++d) chains[d] = chain_forward_args(l, d);
  be.recurrence_forward(cell_.kind, std::span(chains.data(), directions()), params_.dtype());
}

bool Recurrent::stacks_with_next(int64_t l) const {
  return whole_chains_apply() && directions() == 1 && l + 1 < opt_.num_layers && !dropout_active_ &&
         !cell_projects_input(l + 1);
}

void Recurrent::stack_forward(Backend& be, int64_t l) {
  std::array<RecurrenceForward, 2> chains{chain_forward_args(l, 0), chain_forward_args(l + 1, 0)};
  RecurrenceForward& upper = chains[1];
  upper.w_ih = input_weights(l + 1).data();
  upper.x = in_gemm_[l + 1].data();
  upper.ld_x = opt_.hidden_size;
  upper.bias = chains_[l + 1].bias.tensor().data();
  be.recurrence_forward(cell_.kind, chains, params_.dtype());
}

void Recurrent::stack_backward(Backend& be, int64_t l, Tensor dout) {
  std::array<RecurrenceBackward, 2> chains{
      chain_backward_args(l, 0, Tensor(), chains_[l].dbias.tensor().data()),
      chain_backward_args(l + 1, 0, dout, chains_[l + 1].dbias.tensor().data())};
  chains[1].w_ih = input_weights(l + 1).data();
  chains[1].dx = din_[l + 1].tensor().data();
  be.recurrence_backward(cell_.kind, chains, params_.dtype());
}

// step_forward's arguments for every step at once: pointers at time 0, the initial state.
RecurrenceForward Recurrent::chain_forward_args(int64_t l, int64_t d) {
  const int64_t H = opt_.hidden_size, D = directions(), s = l * D + d;
  Chain& ch = chains_[s];
  const Tensor out = out_[l].tensor();
  RecurrenceForward a;
  a.steps = T_;
  a.reverse = d == 1;
  a.gemm = gemm_dtype_;
  a.w_hh = recurrent_weights(s).data();
  a.h0 = chain_h0(s).data();
  a.ld_h0 = H;
  CellForward& cell = a.cell;
  if (low()) cell.low = gemm_dtype_;
  cell.batch = B_;
  cell.hidden = H;
  cell.gates = low() && cell_projects_input(l) ? nullptr : ch.gates.tensor().data();
  cell.gates_low = low() ? ch.gates_low.tensor().data() : nullptr;
  if (cell_.cell_state) {
    cell.c_prev = c0_.tensor().slice(s, s + 1).data();
    cell.c = ch.c.tensor().data();
  } else {
    cell.h_prev = h0_.tensor().slice(s, s + 1).data();
    cell.ld_h_prev = H;
  }
  if (cell_.folded_hh_bias_gates < G_)
    cell.bias_rec = at(params_.value(weights_[s].b_hh), cell_.folded_hh_bias_gates * H);
  cell.saved = ch.saved.tensor().data();
  cell.h = at(out, d * H);
  cell.ldh = D * H;
  cell.h_low = low() ? at(out_low_[l].tensor(), d * H) : nullptr;
  if (cell_projects_input(l)) {
    const int64_t I = layer_input_size(l);
    cell.x = layer_input(l).data();
    cell.input = I;
    cell.ldx = I;
    cell.w_ih_t = ch.w_ih_t.tensor().data();
    cell.bias = ch.bias.tensor().data();
  }
  return a;
}

void Recurrent::step_forward(Backend& be, int64_t l, int64_t d, int64_t step, int64_t b0,
                             int64_t nb) {
  const DType dt = params_.dtype();
  const int64_t H = opt_.hidden_size, P = opt_.state_size(), D = directions(), s = l * D + d;
  const int64_t t = d == 0 ? step : T_ - 1 - step, t_prev = d == 0 ? t - 1 : t + 1;
  Chain& ch = chains_[s];
  const Tensor out = out_[l].tensor();
  const Tensor out_g = low() ? out_low_[l].tensor() : out;
  const bool whole = nb == B_;
  // W_hh packed at the first step, by the worker that runs the chain: the layout depends on the
  // threads a GEMM runs on.
  if (whole && step == 0)
    pack_weights(be, recurrent_forward_shape(B_, G_, H, P, D * P), recurrent_weights(s),
                 &ch.w_hh_forward);
  const int64_t row = t * B_ + b0, row_prev = t_prev * B_ + b0;  // (T, B) rows of this step
  // R(nb, G*H) = h_prev(nb, P) W_hh^T, h_prev masked with variational dropout
  GemmShape rec = recurrent_forward_shape(nb, G_, H, P, step == 0 ? P : D * P);
  const void* h_prev = step == 0 ? at(chain_h0(s), b0 * P) : at(out_g, row_prev * D * P + d * P);
  if (locked_dropout()) {
    mask_state(
        be, s, t,
        step == 0 ? at(h0_.tensor().slice(s, s + 1), b0 * P) : at(out, row_prev * D * P + d * P),
        step == 0 ? P : D * P, b0, nb);
    h_prev = at(ch.h_masked.tensor(), row * P);
    rec.lda = P;
  }
  void* rec_out = at(ch.rec.tensor(), b0 * G_ * H);
  be.gemm(rec, gemm_dtype_, h_prev, recurrent_weights(s).data(),
          whole ? ch.w_hh_forward.get() : nullptr, rec_out);
  CellForward cell;
  if (low()) cell.low = gemm_dtype_;
  cell.batch = nb;
  cell.hidden = H;
  cell.gates = low() && cell_projects_input(l) ? nullptr : at(ch.gates.tensor(), row * G_ * H);
  cell.gates_low = low() ? at(ch.gates_low.tensor(), row * G_ * H) : nullptr;
  cell.gates_rec = rec_out;
  if (cell_.cell_state) {
    cell.c_prev =
        step == 0 ? at(c0_.tensor().slice(s, s + 1), b0 * H) : at(ch.c.tensor(), row_prev * H);
    cell.c = at(ch.c.tensor(), row * H);
  } else {
    cell.h_prev =
        step == 0 ? at(h0_.tensor().slice(s, s + 1), b0 * P) : at(out, row_prev * D * P + d * P);
    cell.ld_h_prev = step == 0 ? P : D * P;
  }
  if (cell_.folded_hh_bias_gates < G_)
    cell.bias_rec = at(params_.value(weights_[s].b_hh), cell_.folded_hh_bias_gates * H);
  cell.saved = at(ch.saved.tensor(), row * saved_columns(cell_, H));
  if (cell_.num_params > 0) cell.params = ch.own.tensor().data();
  if (cell_.bias_in_cell) cell.bias = ch.bias.tensor().data();
  if (projected()) {  // the cell's h is m, projected below
    cell.h = at(ch.m.tensor(), row * H);
    cell.ldh = H;
    cell.h_low = low() ? at(ch.m_low.tensor(), row * H) : nullptr;
  } else {
    cell.h = at(out, row * D * H + d * H);
    cell.ldh = D * H;
    cell.h_low = low() ? at(out_g, row * D * H + d * H) : nullptr;
  }
  if (cell_projects_input(l)) {
    const int64_t I = layer_input_size(l);
    cell.x = at(layer_input(l), row * I);
    cell.input = I;
    cell.ldx = I;
    cell.w_ih_t = ch.w_ih_t.tensor().data();
    cell.bias = ch.bias.tensor().data();
  }
  be.cell_forward(cell_.kind, cell, dt);
  if (projected()) project_state(be, l, d, t, b0, nb);
}

void Recurrent::mask_state(Backend& be, int64_t s, int64_t t, const void* h_prev, int64_t ld,
                           int64_t b0, int64_t nb) {
  const DType dt = params_.dtype();
  const int64_t P = opt_.state_size(), row = t * B_ + b0;
  Chain& ch = chains_[s];
  const Tensor mask(at(ch.rec_mask.tensor(), b0 * P), dt, {nb, P});
  const Tensor masked(at((low() ? ch.h_masked_f32 : ch.h_masked).tensor(), (low() ? b0 : row) * P),
                      dt, {nb, P});
  be.copy_rows(masked.data(), P, h_prev, ld, nb, P, dt);
  be.mul(masked, masked, mask);
  if (low()) be.convert(Tensor(at(ch.h_masked.tensor(), row * P), gemm_dtype_, {nb, P}), masked);
}

Tensor Recurrent::input_mask(int64_t l) const {
  if (!dropout_active_) return {};
  if (l > 0) return mask_[l - 1].tensor();
  return locked_dropout() ? x_mask_.tensor() : Tensor();
}

Tensor Recurrent::projection_weights(int64_t s) const {
  return low() ? chains_[s].w_hr_low.tensor() : params_.value(weights_[s].w_hr);
}

void Recurrent::project_state(Backend& be, int64_t l, int64_t d, int64_t t, int64_t b0,
                              int64_t nb) {
  const DType dt = params_.dtype();
  const int64_t H = opt_.hidden_size, P = opt_.proj_size, D = directions(), s = l * D + d;
  Chain& ch = chains_[s];
  const int64_t row = t * B_ + b0;
  const Tensor m_g = low() ? ch.m_low.tensor() : ch.m.tensor();
  void* h = at(out_[l].tensor(), row * D * P + d * P);
  // h(nb, P) = m(nb, H) W_hr^T, rows D*P apart in the output
  const GemmShape proj{.trans_b = true, .m = nb, .n = P, .k = H, .lda = H, .ldb = H, .ldc = D * P};
  be.gemm(proj, gemm_dtype_, at(m_g, row * H), projection_weights(s).data(), h);
  if (!low()) return;
  void* h_low = at(out_low_[l].tensor(), row * D * P + d * P);
  if (D == 1) return be.convert(Tensor(h_low, gemm_dtype_, {nb, P}), Tensor(h, dt, {nb, P}));
  const Tensor h_step(at(ch.h_step.tensor(), b0 * P), dt, {nb, P});
  const Tensor h_step_low(at(ch.h_step_low.tensor(), b0 * P), gemm_dtype_, {nb, P});
  be.copy_rows(h_step.data(), P, h, D * P, nb, P, dt);
  be.convert(h_step_low, h_step);
  be.copy_rows(h_low, D * P, h_step_low.data(), P, nb, P, gemm_dtype_);
}

void Recurrent::state_grad(Backend& be, int64_t l, int64_t d, int64_t t, Tensor dout, int64_t b0,
                           int64_t nb) {
  const DType dt = params_.dtype();
  const int64_t H = opt_.hidden_size, P = opt_.proj_size, D = directions(), s = l * D + d;
  Chain& ch = chains_[s];
  const int64_t row = t * B_ + b0;
  const Tensor dh(at(ch.dh_all.tensor(), row * P), dt, {nb, P});
  const Tensor dh_rec(at(ch.dh.tensor(), b0 * P), dt, {nb, P});
  if (dout.empty()) {
    be.copy(dh, dh_rec);
  } else {
    be.copy_rows(dh.data(), P, at(dout, row * D * P + d * P), D * P, nb, P, dt);
    be.add(dh, dh_rec);
  }
  const void* dh_g = dh.data();
  if (low()) {
    const Tensor dh_low(at(ch.dh_all_low.tensor(), row * P), gemm_dtype_, {nb, P});
    be.convert(dh_low, dh);
    dh_g = dh_low.data();
  }
  // dm(nb, H) = dh(nb, P) W_hr(P, H)
  const GemmShape back{.m = nb, .n = H, .k = P, .lda = P, .ldb = H, .ldc = H};
  be.gemm(back, gemm_dtype_, dh_g, projection_weights(s).data(), at(ch.dm.tensor(), b0 * H));
}

// ---- backward --------------------------------------------------------------------------------

Tensor Recurrent::backward(Backend& be, Tensor dy, Tensor dh_n, Tensor dc_n) {
  const DType dt = params_.dtype();
  const int64_t H = opt_.hidden_size, P = opt_.state_size(), D = directions(), L = opt_.num_layers;
  const Shape y_shape = opt_.batch_first ? Shape{B_, T_, D * P} : Shape{T_, B_, D * P};
  if (!dy.empty() && dy.shape() != y_shape)
    fail(upper(cell_.name), " backward: dy must be ", y_shape.str(), ", got ", dy.shape().str());
  const Shape state_shape{D * L, B_, P}, c_shape{D * L, B_, H};
  for (auto [t, shape, name] :
       {std::tuple{dh_n, state_shape, "dh_n"}, std::tuple{dc_n, c_shape, "dc_n"}}) {
    if (!t.empty() && t.shape() != shape)
      fail(upper(cell_.name), " backward: ", name, " must be ", shape.str(), ", got ",
           t.shape().str());
  }
  if (!dc_n.empty() && !cell_.cell_state)
    fail(upper(cell_.name), " has no cell state, but dc_n was given");
  Tensor dout = dy;
  if (!dy.empty() && opt_.batch_first) {
    dout = dy_tm_.get(be, dt, {T_, B_, D * P});
    be.transpose01(dout, dy);
  }
  dh_n_ = dh_n;
  dc_n_ = dc_n;
  for (int64_t s = 0; s < D * L; ++s) {
    Chain& ch = chains_[s];
    ch.dh.get(be, dt, {B_, P});
    if (locked_dropout()) ch.dh_masked.get(be, dt, {B_, P});
    if (cell_.cell_state) ch.dc.get(be, dt, {B_, H});
    if (projected()) {
      ch.dh_all.get(be, dt, {T_, B_, P});
      if (low()) ch.dh_all_low.get(be, gemm_dtype_, {T_, B_, P});
      ch.dm.get(be, dt, {B_, H});
    }
    if (cell_.recurrent_grads) ch.rec_grads.get(be, gemm_dtype_, {T_, B_, G_ * H});
    ch.dbias.get(be, dt, {bias_grad_columns()});
  }
  reset_backward_sums(be);
  for (int64_t l = 0; l < L; ++l) din_[l].get(be, dt, {T_, B_, layer_input_size(l)});

  if (T_ > 0 && B_ > 0) {
    dout_ = dout;
    run_tuned_backward(be);
  } else {
    for (int64_t l = 0; l < L; ++l) be.fill(din_[l].tensor(), 0.0);
  }
  Tensor dh0 = dh0_.get(be, dt, state_shape);
  Tensor dc0 = cell_.cell_state ? dc0_.get(be, dt, c_shape) : Tensor();
  for (int64_t s = 0; s < D * L; ++s) {
    be.copy(dh0.slice(s, s + 1), chains_[s].dh.tensor());
    if (cell_.cell_state) be.copy(dc0.slice(s, s + 1), chains_[s].dc.tensor());
  }
  if (!input_grad_) return Tensor();
  Tensor dx = din_[0].tensor();
  if (!opt_.batch_first) return dx;
  Tensor dx_bf = dx_bf_.get(be, dt, {B_, T_, opt_.input_size});
  be.transpose01(dx_bf, dx);
  return dx_bf;
}

// The layers' backward recurrences and weight gradients, as `schedule` says (not one_worker).
void Recurrent::compute_backward(Backend& be, RecurrentSchedule schedule) {
  const int64_t D = directions(), L = opt_.num_layers;
  const bool concurrent = schedule == RecurrentSchedule::side_by_side;
  {
    const int width = concurrent ? wavefront_width(be) : 1;
    for (int64_t l1 = L; l1 > 0;) {  // layers l0 .. l1-1, from the top
      const bool stack =
          schedule == RecurrentSchedule::whole_chains && l1 >= 2 && stacks_with_next(l1 - 2);
      const int64_t group = stack ? 2 : std::min<int64_t>(width, l1), l0 = l1 - group;
      const Tensor group_dout = l1 == L ? dout_ : din_[l1].tensor();
      // Chains on workers of their own (directions side by side, a wavefront's layers) sum their
      // weight gradients as they go, a chunk of steps at a time, while the chunk's dG is still
      // in cache.
      const bool in_loop = concurrent && (group > 1 || D == 2);
      const int64_t workers = std::max<int64_t>(group, D);
      const Tensor copies = in_loop ? weight_grad_copies(be, l0, l1, workers, true) : Tensor();
      auto own_copies = [&](int64_t j) { return copies.empty() ? copies : copies.slice(j, j + 1); };
      if (stack) {
        SF_PROFILE_SCOPE(scope_backward_, static_cast<int>(l0), 0);
        stack_backward(be, l0, group_dout);
      } else if (group == 1) {
        auto run_chain = [&](int64_t d) {
          SF_PROFILE_SCOPE(scope_backward_, static_cast<int>(l0), static_cast<int>(d));
          for (int64_t step = T_ - 1; step >= 0; --step) {
            step_backward(be, l0, d, step, group_dout, 0, B_,
                          chains_[l0 * D + d].dbias.tensor().data());
            if (in_loop) weight_grads_as_done(be, l0, d, step, own_copies(d));
          }
        };
        if (schedule == RecurrentSchedule::split_batch) {
          // Each worker sums its rows' bias gradient apart; the sums are added in worker order.
          const int n = split_workers(be);
          for (int64_t d = 0; d < D; ++d)
            be.fill(
                chains_[l0 * D + d].dbias_split.get(be, params_.dtype(), {n, bias_grad_columns()}),
                0.0);
          be.run_concurrently(n, [&](int j) {
            SF_PROFILE_SCOPE(scope_backward_, static_cast<int>(l0), 0);
            const int64_t b0 = B_ * j / n, nb = B_ * (j + 1) / n - b0;
            for (int64_t d = 0; d < D; ++d) {
              void* dbias = at(chains_[l0 * D + d].dbias_split.tensor(), j * bias_grad_columns());
              for (int64_t step = T_ - 1; step >= 0; --step)
                step_backward(be, l0, d, step, group_dout, b0, nb, dbias);
            }
          });
          for (int64_t d = 0; d < D; ++d)
            for (int j = 0; j < n; ++j)
              be.add(chains_[l0 * D + d].dbias.tensor(),
                     chains_[l0 * D + d].dbias_split.tensor().slice(j, j + 1).reshape(
                         {bias_grad_columns()}));
        } else if (D == 2 && concurrent) {
          be.run_concurrently(2, [&](int d) { run_chain(d); });
        } else if (schedule == RecurrentSchedule::whole_chains) {
          SF_PROFILE_SCOPE(scope_backward_, static_cast<int>(l0), 0);
          chains_backward(be, l0, group_dout);
        } else {
          for (int64_t d = 0; d < D; ++d) run_chain(d);
        }
      } else {  // wavefront: worker j runs layer l1-1-j; progress counts steps from the end
        pack_step_weights(be, l0, l1, true);
        for (int64_t l = l0; l < l1; ++l) progress_[l].store(0);
        failed_.store(false);
        be.run_concurrently(static_cast<int>(group), [&](int j) {
          const int64_t l = l1 - 1 - j;
          SF_PROFILE_SCOPE(scope_backward_, static_cast<int>(l), 0);
          try {
            // The gradient flowing down at step t, one GEMM, is computed by the layer it flows
            // into: the layer above has the wider input, so the larger weight gradients.
            for (int64_t t = T_ - 1; t >= 0; --t) {
              if (j > 0) {
                wait_for(be, j - 1, l + 1, T_ - t);
                din_step(be, l + 1, t);
              }
              step_backward(be, l, 0, t, l == l1 - 1 ? group_dout : din_[l + 1].tensor(), 0, B_,
                            chains_[l].dbias.tensor().data());
              signal_progress(be, l, T_ - t);
              weight_grads_as_done(be, l, 0, t, own_copies(j));
            }
          } catch (...) {
            failed_.store(true);
            throw;
          }
        });
      }
      for (int64_t l = l0; l < l1; ++l)
        for (int64_t d = 0; d < D; ++d) weight_grads(be, l, d, schedule, !in_loop);
      if (l0 > 0 || input_grad_) din_all(be, l0);
      l1 = l0;
    }
  }
}

// One step of chain (l, d) backward: the cell, then dh_rec = dR[t] W_hh (+ the cell's direct term).
void Recurrent::step_backward(Backend& be, int64_t l, int64_t d, int64_t step, Tensor dout,
                              int64_t b0, int64_t nb, void* dbias) {
  const DType dt = params_.dtype();
  const int64_t H = opt_.hidden_size, P = opt_.state_size(), D = directions(), s = l * D + d;
  const int64_t t = d == 0 ? step : T_ - 1 - step, t_prev = d == 0 ? t - 1 : t + 1;
  Chain& ch = chains_[s];
  const Tensor dg_g = input_grads(s), dr_g = recurrent_grads(s);
  if (projected()) state_grad(be, l, d, t, dout, b0, nb);
  const bool whole = nb == B_;
  const int64_t row = t * B_ + b0, row_prev = t_prev * B_ + b0;  // (T, B) rows of this step
  CellBackward cell;
  if (low()) cell.low = gemm_dtype_;
  cell.batch = nb;
  cell.hidden = H;
  cell.gates = low() ? nullptr : at(ch.gates.tensor(), row * G_ * H);
  cell.gates_low = low() ? at(dg_g, row * G_ * H) : nullptr;
  cell.saved = at(ch.saved.tensor(), row * saved_columns(cell_, H));
  if (cell_.num_params > 0) cell.params = ch.own.tensor().data();
  if (cell_.cell_state) {
    cell.c_prev =
        step == 0 ? at(c0_.tensor().slice(s, s + 1), b0 * H) : at(ch.c.tensor(), row_prev * H);
    cell.dc = at(ch.dc.tensor(), b0 * H);
  } else {
    cell.h_prev = step == 0 ? at(h0_.tensor().slice(s, s + 1), b0 * P)
                            : at(out_[l].tensor(), row_prev * D * P + d * P);
    cell.ld_h_prev = step == 0 ? P : D * P;
  }
  if (projected()) {  // dL/dm, with both of dL/dh's parts
    cell.dh_out = at(ch.dm.tensor(), b0 * H);
    cell.ld_dh_out = H;
  } else {
    cell.dh_out = dout.empty() ? nullptr : at(dout, row * D * H + d * H);
    cell.ld_dh_out = D * H;
    cell.dh_rec = at(ch.dh.tensor(), b0 * H);
  }
  cell.dgates = low() ? nullptr : at(ch.gates.tensor(), row * G_ * H);
  cell.dgates_low = low() ? at(dg_g, row * G_ * H) : nullptr;
  if (cell_.recurrent_grads)
    (low() ? cell.dgates_rec_low : cell.dgates_rec) = at(dr_g, row * G_ * H);
  if (cell_.direct_state_grad) cell.dh_direct = at(ch.dh.tensor(), b0 * H);
  cell.dbias = dbias;
  be.cell_backward(cell_.kind, cell, dt);
  // dh(nb, P) (+)= dR[t](nb, G*H) W_hh(G*H, P), through the state's dropout mask if any
  const bool masked = locked_dropout(), direct = cell_.direct_state_grad && !masked;
  if (whole && step == T_ - 1)  // the chain's first step back, packed as forward does
    pack_weights(be, recurrent_backward_shape(B_, G_, H, P, direct), recurrent_weights(s),
                 &ch.w_hh_backward);
  const Tensor dh(at(ch.dh.tensor(), b0 * P), dt, {nb, P});
  const Tensor through(masked ? at(ch.dh_masked.tensor(), b0 * P) : dh.data(), dt, {nb, P});
  be.gemm(recurrent_backward_shape(nb, G_, H, P, direct), gemm_dtype_, at(dr_g, row * G_ * H),
          recurrent_weights(s).data(), whole ? ch.w_hh_backward.get() : nullptr, through.data());
  if (!masked) return;
  be.mul(through, through, Tensor(at(ch.rec_mask.tensor(), b0 * P), dt, {nb, P}));
  if (cell_.direct_state_grad)
    be.add(dh, through);
  else
    be.copy(dh, through);
}

// step_backward's arguments for every step at once: pointers at time 0, the initial state.
void Recurrent::chains_backward(Backend& be, int64_t l, Tensor dout) {
  std::array<RecurrenceBackward, 2> chains;
  for (int64_t d = 0; d < directions(); ++d)
    chains[d] =
        chain_backward_args(l, d, dout, chains_[l * directions() + d].dbias.tensor().data());
  be.recurrence_backward(cell_.kind, std::span(chains.data(), directions()), params_.dtype());
}

RecurrenceBackward Recurrent::chain_backward_args(int64_t l, int64_t d, Tensor dout, void* dbias) {
  const int64_t H = opt_.hidden_size, D = directions(), s = l * D + d;
  Chain& ch = chains_[s];
  const Tensor dg_g = input_grads(s), dr_g = recurrent_grads(s);
  RecurrenceBackward a;
  a.steps = T_;
  a.reverse = d == 1;
  a.gemm = gemm_dtype_;
  a.w_hh = recurrent_weights(s).data();
  a.dh = ch.dh.tensor().data();
  a.c = cell_.cell_state ? ch.c.tensor().data() : nullptr;
  a.h = at(out_[l].tensor(), d * H);
  a.ldh = D * H;
  CellBackward& cell = a.cell;
  if (low()) cell.low = gemm_dtype_;
  cell.batch = B_;
  cell.hidden = H;
  cell.gates = low() ? nullptr : ch.gates.tensor().data();
  cell.gates_low = low() ? dg_g.data() : nullptr;
  cell.saved = ch.saved.tensor().data();
  if (cell_.cell_state) {
    cell.c_prev = c0_.tensor().slice(s, s + 1).data();
    cell.dc = ch.dc.tensor().data();
  } else {
    cell.h_prev = h0_.tensor().slice(s, s + 1).data();
    cell.ld_h_prev = H;
  }
  cell.dh_out = dout.empty() ? nullptr : at(dout, d * H);
  cell.ld_dh_out = D * H;
  cell.dgates = low() ? nullptr : ch.gates.tensor().data();
  cell.dgates_low = low() ? dg_g.data() : nullptr;
  if (cell_.recurrent_grads) (low() ? cell.dgates_rec_low : cell.dgates_rec) = dr_g.data();
  cell.dbias = dbias;
  return a;
}

// din[t](B, I) = dG[t](B, G*H) W_ih(G*H, I) for unidirectional layer l, times the dropout mask of
// the layer below: the next lower layer's output gradient at step t.
void Recurrent::din_step(Backend& be, int64_t l, int64_t t) {
  const int64_t H = opt_.hidden_size;
  Chain& ch = chains_[l];
  const Tensor dg_g = input_grads(l);
  Tensor din = din_[l].tensor().slice(t, t + 1);
  be.gemm(din_step_shape(l), gemm_dtype_, at(dg_g, t * B_ * G_ * H), input_weights(l).data(),
          ch.w_ih_din.get(), din.data());
  if (dropout_active_) be.mul(din, din, mask_[l - 1].tensor().slice(t, t + 1));
}

// din(T*B, I) = sum over directions of dG(T*B, G*H) W_ih(G*H, I), times the dropout mask below.
void Recurrent::din_all(Backend& be, int64_t l) {
  SF_PROFILE_SCOPE(scope_input_grad_, static_cast<int>(l));
  const int64_t H = opt_.hidden_size, I = layer_input_size(l), D = directions();
  Tensor din = din_[l].tensor();
  for (int64_t d = 0; d < D; ++d) {
    const int64_t s = l * D + d;
    const Tensor dg_g = input_grads(s);
    const Tensor w_ih = input_weights(s);
    GemmShape dx{.m = T_ * B_, .n = I, .k = G_ * H, .lda = G_ * H, .ldb = I, .ldc = I};
    dx.beta = d == 0 ? 0.0f : 1.0f;
    be.gemm(dx, gemm_dtype_, dg_g.data(), w_ih.data(), din.data());
  }
  if (const Tensor mask = input_mask(l); !mask.empty()) be.mul(din, din, mask);
}

}  // namespace seqforge
