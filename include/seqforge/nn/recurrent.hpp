#pragma once
// The recurrence engine: a multi-layer, optionally bidirectional recurrent layer of any
// registered cell (backend/ops.hpp: LSTM, GRU, LN-LSTM), with PyTorch's nn.LSTM / nn.GRU
// semantics and parameter names. The engine owns what is common to the cells: the input and
// recurrent projections as GEMMs, the schedules that run the chains on the backend's workers, their
// autotuning, the weight-gradient layouts, dropout between layers and mixed precision; a cell
// brings only its pointwise step, forward and backward.
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/buffer.hpp"
#include "seqforge/backend/ops.hpp"
#include "seqforge/core/autotune.hpp"
#include "seqforge/nn/parameters.hpp"

namespace seqforge {

struct RecurrentOptions {
  CellKind cell = CellKind::lstm;
  int64_t input_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 1;
  bool bidirectional = false;
  double dropout = 0.0;  // on every layer's output but the last, in training
  bool batch_first = false;
  // LSTM only, PyTorch's proj_size: h = W_hr (o tanh(c)) is P < H wide (weight_hr_l{k} (P, H)),
  // and so are h0, h_n and each direction's output. 0: no projection.
  int64_t proj_size = 0;
  // Variational (locked) dropout, Gal & Ghahramani 2016 (Keras' dropout and recurrent_dropout):
  // masks of rate `dropout` drawn once per sequence and shared by all its steps, on every layer's
  // input (the first layer's too) and on the state h_{t-1} that feeds W_hh.
  bool variational_dropout = false;
  int64_t state_size() const { return proj_size > 0 ? proj_size : hidden_size; }  // h's width
};

// How the recurrences use the backend's workers. `tuned` (the default) measures the candidates
// on first use of a problem and keeps the fastest (the autotune cache); the others force one.
enum class RecurrentSchedule {
  tuned,
  layered,       // one op at a time, each on all workers
  side_by_side,  // chains side by side, one worker each: a bidirectional layer's directions, a
                 // stack's layers as a wavefront
  one_worker,    // everything on one worker: small problems, whose data fit one core's caches
                 // and whose ops cost more split over workers than they save
  split_batch,   // each worker runs every step for its own rows of the batch: small problems
  whole_chains,  // each chain's steps in one backend call (a device's recurrence kernel)
};

// SEQFORGE_RECURRENT_SCHEDULE=layered | side_by_side | one_worker | split_batch | whole_chains
// holds every recurrence to one schedule (to profile or compare one); unset, they are tuned.
RecurrentSchedule schedule_from_environment();

class Recurrent {
 public:
  // Declares weight_ih_l{k}[_reverse], weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k} under `prefix`:
  // (G*H, I_l), (G*H, P), (G*H), (G*H) for a cell of G gates; with a projection weight_hr_l{k}
  // (P, H) too.
  Recurrent(Parameters& params, const std::string& prefix, const RecurrentOptions& options);

  // x (T, B, I), or (B, T, I) with batch_first. h0 (D*L, B, P), c0 (D*L, B, H), or empty for
  // zeros; c0 only for cells with a cell state; P = state_size(). Returns y (T, B, D*P) or
  // (B, T, D*P). Final states in h_n(), c_n() (empty without a cell state).
  Tensor forward(Backend& be, Tensor x, Tensor h0, Tensor c0, bool training, Rng& rng);
  Tensor h_n() const { return h_n_.tensor(); }
  Tensor c_n() const { return cell_.cell_state ? c_n_.tensor() : Tensor(); }

  // dy like y, or empty when no gradient flows through y (only through dh_n); dh_n, dc_n like h_n
  // or empty. Returns dx like x (empty when input gradients are off); dh0(), dc0() (D*L, B, H).
  // Parameter gradients accumulate.
  Tensor backward(Backend& be, Tensor dy, Tensor dh_n, Tensor dc_n);
  Tensor dh0() const { return dh0_.tensor(); }
  Tensor dc0() const { return cell_.cell_state ? dc0_.tensor() : Tensor(); }

  // GEMM operand dtype: the parameters' dtype (default), or bf16 for mixed precision (f32 master
  // weights, cell state and accumulation; bf16 copies of weights and activations feed the GEMMs).
  void set_gemm_dtype(DType dtype);
  // Whether backward computes dx (on by default; off saves a GEMM when the input is data).
  void set_input_grad(bool on) { input_grad_ = on; }
  void set_schedule(RecurrentSchedule schedule) { schedule_ = schedule; }
  // Whether whole_chains runs as such (LSTM and GRU stacks without projections or dropout on the
  // state; others take the steps).
  bool whole_chains_apply() const;
  // Steps per chunk of the weight-gradient GEMMs; 0 (the default) sizes the chunks by their
  // K-major copies. Tests set small chunks, which also take bf16 GEMMs through K-major copies
  // at any size.
  void set_weight_grad_chunk(int64_t steps) { weight_grad_chunk_ = steps; }
  RecurrentSchedule schedule() const { return chosen_; }  // the one the last forward used
  DType gemm_dtype() const { return gemm_dtype_; }

  // The dropout masks the last training forward drew: of layer l's input (T, B, I_l; empty for
  // the first layer unless variational), and with variational dropout of chain s's recurrent
  // state (B, P) (empty otherwise).
  Tensor input_dropout_mask(int64_t l) const { return input_mask(l); }
  Tensor state_dropout_mask(int64_t s) const {
    return locked_dropout() ? chains_[s].rec_mask.tensor() : Tensor();
  }

  const RecurrentOptions& options() const { return opt_; }
  const CellType& cell() const { return cell_; }
  int64_t directions() const { return opt_.bidirectional ? 2 : 1; }
  int64_t output_size() const { return directions() * opt_.state_size(); }

 private:
  struct Weights {
    size_t w_ih, w_hh, b_ih, b_hh;  // (G*H, I_l), (G*H, P), (G*H), (G*H)
    size_t w_hr = 0;                // (P, H) with a projection
    std::vector<size_t> own;        // the cell's own parameters (CellType::params)
  };
  // One chain: the recurrence of one layer and direction, and everything only it touches, so
  // that chains can run concurrently.
  struct Chain {
    Buffer gates;      // (T, B, G*H) input projection + bias, then (f32 GEMMs) gate
                       // activations, which backward overwrites with dG[t]
    Buffer c;          // (T, B, H) cell state (cells that have one)
    Buffer saved;      // (T, B, saved_columns) what the cell keeps for backward (LSTM tanh(c))
    Buffer rec;        // (B, G*H) one step's recurrent GEMM output
    Buffer gates_low;  // (T, B, G*H) with bf16 GEMMs: the gate activations in bf16,
                       // which backward overwrites with dG[t] (bf16 only)
    Buffer rec_grads;  // (T, B, G*H) cells with recurrent_grads: dR[t] in the GEMM dtype
    Buffer dh, dc;     // (B, P), (B, H) gradients flowing to the previous step
    // With a projection: m = o tanh(c) before it, (T, B, H), and its bf16 copy; dL/dh of every
    // step (T, B, P) and its bf16 copy, for dW_hr; dL/dm of a step (B, H); a step's projected h
    // (B, P) and its bf16 copy when the output's rows are strided (bidirectional, bf16).
    Buffer m, m_low, dh_all, dh_all_low, dm, h_step, h_step_low;
    Buffer w_hr_low;  // bf16 copy of W_hr
    // Variational dropout of the recurrent state: the mask (B, P); every step's masked h_{t-1}
    // (T, B, P) in the GEMM dtype, the recurrent GEMM's operand forward and for dW_hh; a step's
    // masked state in f32 (B, P), and its gradient through the recurrent GEMM (B, P).
    Buffer rec_mask, h_masked, h_masked_f32, dh_masked;
    Buffer bias;         // (G*H) b_ih + the folded part of b_hh
    Buffer own;          // (cell_param_columns) the cell's own parameters, concatenated
    Buffer dbias;        // (bias_grad_columns) the bias gradients and the cell's own parameters',
                         // summed by the backward cells
    Buffer dbias_split;  // (workers, dbias columns) each split_batch worker's sums
    Buffer w_ih_low, w_hh_low;  // bf16 copies of the weights
    Buffer w_ih_t;              // (I, G*H) W_ih transposed, when the cell projects the input
    // W_hh (of the GEMM dtype) packed for the recurrent GEMMs forward and backward, repacked
    // every forward; empty for short sequences, where packing would not pay.
    std::unique_ptr<PackedB> w_hh_forward, w_hh_backward;
    // W_ih packed for the wavefront's per-step input projection and input gradient GEMMs.
    std::unique_ptr<PackedB> w_ih_step, w_ih_din;
  };

  bool low() const { return gemm_dtype_ != params_.dtype(); }
  bool projected() const { return opt_.proj_size > 0; }
  bool locked_dropout() const { return dropout_active_ && opt_.variational_dropout; }
  Tensor input_mask(int64_t l) const;  // the dropout mask of layer l's input (T, B, I_l), or none
  // The recurrent GEMM's operand at step t, rows [b0, b0 + nb): h_{t-1} times the chain's mask.
  void mask_state(Backend& be, int64_t s, int64_t t, const void* h_prev, int64_t ld, int64_t b0,
                  int64_t nb);
  Tensor projection_weights(int64_t s) const;  // W_hr of chain s as GEMM operand
  // h[t] = m[t] W_hr^T into the layer output (and its bf16 copy), rows [b0, b0 + nb).
  void project_state(Backend& be, int64_t l, int64_t d, int64_t t, int64_t b0, int64_t nb);
  // dL/dh[t] = dout[t] + dh_rec, kept for dW_hr, then dL/dm[t] = dL/dh[t] W_hr.
  void state_grad(Backend& be, int64_t l, int64_t d, int64_t t, Tensor dout, int64_t b0,
                  int64_t nb);
  Tensor input_grads(int64_t s) const;      // dG of chain s (T, B, G*H) as GEMM operand
  Tensor recurrent_grads(int64_t s) const;  // dR of chain s: dG unless the cell has its own
  int64_t k_major_rows(int64_t l) const;    // rows of a K-major copy per step and batch row
  int64_t bias_grad_columns() const {       // CellBackward::dbias's columns
    return ::seqforge::bias_grad_columns(cell_, opt_.hidden_size);
  }
  // Whether layer l's input is narrow enough for the cells to project it themselves (no GEMM).
  bool cell_projects_input(int64_t l) const;
  Tensor layer_input(int64_t l) const;  // (T, B, I_l) in f32: x, or the layer below's output
  int64_t layer_input_size(int64_t layer) const;
  int wavefront_width(const Backend& be) const;  // layers side by side; 1 = layer by layer
  Tensor chain_h0(int64_t s) const;              // GEMM operand of the initial state of chain s
  Tensor recurrent_weights(int64_t s) const;     // W_hh of chain s as GEMM operand
  Tensor input_weights(int64_t s) const;         // W_ih of chain s as GEMM operand
  GemmShape project_step_shape(int64_t l) const;
  GemmShape din_step_shape(int64_t l) const;
  void pack_weights(Backend& be, const GemmShape& s, Tensor w,
                    std::unique_ptr<PackedB>* packed) const;
  void pack_step_weights(Backend& be, int64_t l0, int64_t l1, bool backward);
  void project_all(Backend& be, int64_t l, int64_t d);
  void project_step(Backend& be, int64_t l, int64_t d, int64_t step);
  void finish_output_step(Backend& be, int64_t l, int64_t t);
  // Rows [b0, b0 + nb) of the batch; packed weights only when that is the whole batch.
  void step_forward(Backend& be, int64_t l, int64_t d, int64_t step, int64_t b0, int64_t nb);
  void step_backward(Backend& be, int64_t l, int64_t d, int64_t step, Tensor dout, int64_t b0,
                     int64_t nb, void* dbias);
  // Layer l's whole chains, every direction in one backend call (a GPU steps them together).
  void chains_forward(Backend& be, int64_t l);
  void chains_backward(Backend& be, int64_t l, Tensor dout);
  // Whether layers l and l + 1 run as a stack of whole chains (ops.hpp: one backend call, a GPU
  // steps them together as a wavefront): unidirectional, no dropout between them, and a layer
  // l + 1 whose cell does not project its own input.
  bool stacks_with_next(int64_t l) const;
  void stack_forward(Backend& be, int64_t l);
  void stack_backward(Backend& be, int64_t l, Tensor dout);
  RecurrenceForward chain_forward_args(int64_t l, int64_t d);
  RecurrenceBackward chain_backward_args(int64_t l, int64_t d, Tensor dout, void* dbias);
  int split_workers(const Backend& be) const;
  void din_step(Backend& be, int64_t l, int64_t t);
  void din_all(Backend& be, int64_t l);
  // The bias gradients of chain (l, d), and its weight gradients unless summed already.
  void weight_grads(Backend& be, int64_t l, int64_t d, RecurrentSchedule schedule, bool weights);
  void weight_grads_split(Backend& be, int64_t l, int64_t d, int n, Tensor copies, Tensor dw_hh,
                          Tensor dw_ih);
  bool k_major_pays(Backend& be, int64_t l, int64_t d, int n, Tensor copies);
  Tensor weight_grad_copies(Backend& be, int64_t l0, int64_t l1, int64_t n, bool in_loop);
  void weight_grads_as_done(Backend& be, int64_t l, int64_t d, int64_t step, Tensor copies);
  int64_t weight_grad_chunk(int64_t l, bool in_loop) const;
  int64_t k_major_pad() const;
  void weight_grads_row_major(Backend& be, int64_t l, int64_t d, int64_t t0, int64_t t1,
                              void* dw_hh, void* dw_ih, bool accumulate);
  void weight_grads_steps(Backend& be, int64_t l, int64_t d, int64_t t0, int64_t t1, void* dw_hh,
                          void* dw_ih, bool accumulate, Tensor copies);
  void wait_for(Backend& be, int worker, int64_t layer, int64_t steps) const;
  void signal_progress(Backend& be, int64_t layer, int64_t steps);
  void compute_forward(Backend& be, RecurrentSchedule schedule);
  void compute_backward(Backend& be, RecurrentSchedule schedule);
  void run_forward(Backend& be, RecurrentSchedule schedule);
  void run_backward(Backend& be, RecurrentSchedule schedule);
  void run_tuned_forward(Backend& be);
  void run_tuned_backward(Backend& be);
  // forward's parts: h0/c0 checked and copied (zeros when empty), per-chain constants, the
  // buffers and dropout masks of the steps, h_n/c_n from the last steps.
  void take_initial_states(Backend& be, Tensor h0, Tensor c0);
  void prepare_chains(Backend& be);
  void prepare_step_buffers(Backend& be, bool training, Rng& rng);
  void write_final_states(Backend& be);
  void reset_state_grads(Backend& be);
  void reset_backward_sums(Backend& be);  // the chains' bias-gradient sums and state gradients
  // The whole-chain kernels, and a device's schedules on concurrent streams, checked against the
  // steps on first use (recurrent_agreement.cpp): what each pass computes for the rest of the
  // step, named; which schedules disagree (with a warning), or whether the whole chains' backward
  // agrees.
  using Results = std::vector<std::pair<std::string, Tensor>>;
  Results forward_results() const;
  Results backward_results() const;
  Results parameter_grads() const;
  static bool checked_against_steps(const Backend& be, RecurrentSchedule schedule);
  void poison_forward(Backend& be);
  std::vector<RecurrentSchedule> disagree_forward(Backend& be,
                                                  const std::vector<RecurrentSchedule>& schedules);
  std::optional<std::vector<Buffer>> grads_to_check_against(Backend& be) const;
  bool agrees_backward(Backend& be, RecurrentSchedule schedule,
                       const std::vector<Buffer>& grads_before);

  Parameters& params_;
  RecurrentOptions opt_;
  const CellType& cell_;
  const int64_t G_;  // the cell's gates
  // Profiler scope names: "<cell> forward", ...
  const char *scope_forward_, *scope_backward_, *scope_projection_, *scope_input_grad_,
      *scope_weight_grads_, *scope_copies_;
  DType gemm_dtype_;
  bool input_grad_ = true;
  std::vector<Weights> weights_;  // [layer * D + dir]
  std::vector<Chain> chains_;     // [layer * D + dir]
  int64_t T_ = 0, B_ = 0;
  bool dropout_active_ = false;
  RecurrentSchedule schedule_ = schedule_from_environment();
  int64_t weight_grad_chunk_ = 0;
  RecurrentSchedule chosen_ = RecurrentSchedule::layered;  // what forward ran
  // The last problem's tuned schedule: (T, B, GEMM dtype, dropout, workers) -> schedule.
  std::optional<std::pair<std::tuple<int64_t, int64_t, DType, bool, int>, RecurrentSchedule>>
      tuned_;
  // Backward's own choice for that problem when whole chains were a candidate (its cache key, the
  // trial calls' times), else none: backward follows forward.
  struct BackwardTuning {
    std::string key;
    std::vector<double> ms;
    std::optional<autotune::Timing> timing;  // from the first trial
    std::optional<RecurrentSchedule> choice;
    // Where forward's tuning chose a schedule on a device's concurrent streams: forward's cache
    // key, until backward's first call has checked that schedule against the steps.
    std::string streams_key;
  } backward_tuning_;
  std::unique_ptr<std::atomic<int64_t>[]> progress_;  // [layer] steps done, for the wavefront
  std::atomic<bool> failed_{false};                   // a wavefront worker threw

  Tensor x_;                         // (T, B, I) time-major input
  Tensor x_in_;                      // (T, B, I) the first layer's input: x_, or x_dropped_
  Buffer x_tm_, x_low_;              // batch_first input made time-major; its bf16 copy
  Buffer x_mask_, x_dropped_;        // variational dropout of x: (T, B, I) mask, x times it
  std::vector<Tensor> in_gemm_;      // [layer] the layer's input as GEMM operand (T, B, I_l)
  std::vector<Buffer> out_;          // [layer] (T, B, D*H)
  std::vector<Buffer> out_low_;      // [layer] bf16 copy of out_
  std::vector<Buffer> mask_;         // [layer < L-1] dropout masks (T, B, D*H)
  std::vector<Buffer> dropped_;      // [layer < L-1] masked outputs (T, B, D*H)
  std::vector<Buffer> dropped_low_;  // [layer < L-1] their bf16 copies
  Buffer h0_, c0_, h0_low_;          // (D*L, B, H) initial states used (c0: cells with c); bf16 h0
  Buffer h_n_, c_n_;                 // (D*L, B, H)
  Buffer y_bf_;                      // batch_first output
  Buffer dy_tm_, dx_bf_;             // time-major dy, batch_first dx
  std::vector<Buffer> din_;          // [layer] gradient of the layer's input (T, B, I_l)
  Buffer dh0_, dc0_;                 // (D*L, B, H)
  Buffer dw_split_;                  // (workers, G*H (H + I)) split_batch's weight gradient parts
  Buffer dw_trial_;                  // (G*H (H + I)) weight gradients of autotuning trials
  Buffer k_major_;  // (workers, chunk*B k_major_rows) K-major copies for the weight-gradient GEMMs
  Tensor dout_, dh_n_, dc_n_;  // backward's inputs (time-major dout)
};

}  // namespace seqforge
