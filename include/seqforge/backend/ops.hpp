#pragma once
// Op descriptions: the arguments of the backend's ops, shared by the backends and the kernels
// that implement them (which need no backend to build).
#include <cstdint>
#include <span>
#include <string_view>

#include "seqforge/core/dtype.hpp"
#include "seqforge/core/host_device.hpp"

namespace seqforge {

// C(m, n) = alpha * op(A) * op(B) + beta * C, row-major; op(A) is (m, k), op(B) is (k, n).
// Leading dimensions are in elements; A with trans_a is stored (k, m). A and B are of the GEMM's
// dtype; C is f32 when they are bf16 (mixed precision: bf16 operands, f32 accumulation).
// With `bias`, C += bias(n) broadcast over rows (same dtype as C; alpha must be 1).
struct GemmShape {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  double alpha = 1.0, beta = 0.0;  // double, so that an f64 GEMM scales exactly
  bool bias = false;
};

// The recurrent cells. A cell is its pointwise step, forward and backward, between the input
// projection G = x W_ih^T + bias and the recurrent projection R = h_prev W_hh^T, which the
// recurrence engine computes as GEMMs; each cell registers its kernels in kernels/cells.cpp.
enum class CellKind { lstm, gru, lnlstm };

// A parameter of a cell's own, beside W_ih, W_hh, b_ih and b_hh: `<name>_l{k}[_reverse]`,
// per_hidden * H values, all `init` to begin with.
struct CellParam {
  const char* name;
  int per_hidden;
  double init;
};

// What the recurrence engine needs to know of a cell.
struct CellType {
  CellKind kind;
  const char* name;  // "lstm", "gru", "lnlstm": the module's attribute name (nn.LSTM, nn.GRU)
  int gates;         // G: W_ih is (G*H, I), W_hh (G*H, H)
  int min_hidden;    // the smallest H the cell is defined for (a layer norm needs 2 values)
  bool cell_state;   // carries c beside h (LSTM)
  // Leading gates whose recurrent bias b_hh is folded into the input projection's bias; the
  // others get it in the cell (GRU's n gate: r * (W_hn h + b_hn)).
  int folded_hh_bias_gates;
  // Whether the recurrent projection's gradient dR differs from the input projection's dG (GRU:
  // the reset gate scales W_hn h + b_hn; LN-LSTM: each is normalised apart). Backward then writes
  // both, and the bias gradient has d b_ih and d b_hh apart.
  bool recurrent_grads;
  // Whether dL/dh_{t-1} has a term besides dR W_hh (GRU: z h_{t-1}), which the cell writes
  // before the recurrent GEMM adds to it.
  bool direct_state_grad;
  // Whether the cell adds the bias itself (LN-LSTM: after normalising the projections): the
  // input projection then has none, and no cell projects its input.
  bool bias_in_cell;
  int saved_per_hidden, saved_scalars;  // per row, what forward keeps for backward: n H + m
  const CellParam* params;              // the cell's own parameters, num_params of them
  int num_params;
};
const CellType& cell_type(CellKind kind);
// By name ("lstm", "gru", "lnlstm"); throws naming the known cells otherwise.
CellKind cell_kind(std::string_view name);

// Width of a row of CellForward::saved.
inline int64_t saved_columns(const CellType& c, int64_t hidden) {
  return c.saved_per_hidden * hidden + c.saved_scalars;
}
// Values of the cell's own parameters, concatenated in order (CellForward::params).
inline int64_t cell_param_columns(const CellType& c, int64_t hidden) {
  int64_t n = 0;
  for (int i = 0; i < c.num_params; ++i) n += c.params[i].per_hidden * hidden;
  return n;
}
// Columns of CellBackward::dbias: d b_ih, d b_hh when apart, the cell's own parameters'.
inline int64_t bias_grad_columns(const CellType& c, int64_t hidden) {
  return (c.recurrent_grads ? 2 : 1) * c.gates * hidden + cell_param_columns(c, hidden);
}

// One time step of a cell for a batch, forward. Pointers are of the step's dtype, but the *_low
// copies (the operands of half-precision GEMMs), which are of `low`: bf16 or f16. Rows are G*H
// (gates) or H wide, packed unless a leading dimension is given.
//   LSTM, gates i, f, g, o:  c = f c_prev + i g,  h = o tanh(c);  saved: tanh(c)
//   GRU, gates r, z, n (PyTorch's nn.GRU):  n = tanh(G_n + r (R_n + b_hn)),  h = (1 - z) n + z
//   h_prev;  saved: R_n + b_hn
//   LN-LSTM, gates i, f, g, o (Ba et al. 2016): pre = g_ih LN(G) + g_hh LN(R) + b, c as the
//   LSTM's, h = o tanh(g_c LN(c) + b_c);  saved: LN(G), LN(R), LN(c), tanh(..), 3 1/stddev
struct CellForward {
  int64_t batch = 0, hidden = 0;
  void* gates = nullptr;            // (B, G*H) input projection in, activations out
  void* gates_low = nullptr;        // optional (B, G*H): the activations go here instead, in
                                    // `low`, and gates is left as scratch (may be null when x is
                                    // given)
  const void* gates_rec = nullptr;  // (B, G*H) R; optional for the LSTM (then zero)
  const void* bias_rec = nullptr;   // GRU: (H) b_hn
  const void* h_prev = nullptr;     // GRU: (B, H) rows ld_h_prev apart
  int64_t ld_h_prev = 0;
  const void* c_prev = nullptr;  // LSTM: (B, H)
  void* c = nullptr;             // LSTM: (B, H) out
  void* saved = nullptr;         // (B, saved_columns) out: what backward needs besides the
                                 // activations
  const void* params = nullptr;  // the cell's own parameters (cell_param_columns), if any
  void* h = nullptr;             // (B, H) out, rows ldh apart
  int64_t ldh = 0;
  void* h_low = nullptr;  // optional copy of h in `low` for the GEMMs, rows ldh apart
  DType low = DType::bf16;
  // Optional, for narrow inputs: the input projection is made here, bias + x W_ih^T, and `gates`
  // is output only. x (B, input) rows ldx apart; w_ih_t (input, G*H); bias (G*H). With
  // bias_in_cell, bias (G*H) is the one the cell adds (and x is never given).
  const void* x = nullptr;
  int64_t input = 0, ldx = 0;
  const void* w_ih_t = nullptr;
  const void* bias = nullptr;
};

// The matching backward step.
struct CellBackward {
  int64_t batch = 0, hidden = 0;
  const void* gates = nullptr;      // (B, G*H) activations saved by forward
  const void* gates_low = nullptr;  // or saved in `low` (then gates is null)
  const void* c_prev = nullptr;     // LSTM: (B, H)
  const void* saved = nullptr;      // (B, saved_columns) forward's saved values
  const void* params = nullptr;     // the cell's own parameters
  const void* h_prev = nullptr;     // GRU: (B, H) rows ld_h_prev apart
  int64_t ld_h_prev = 0;
  const void* dh_out = nullptr;  // (B, H) gradient from the layer output, rows ld_dh_out apart
  int64_t ld_dh_out = 0;
  const void* dh_rec = nullptr;    // (B, H) gradient from step t+1, or null
  void* dc = nullptr;              // LSTM: (B, H) in: dL/dc_t from later steps; out: dL/dc_{t-1}
  void* dgates = nullptr;          // (B, G*H) out: gradient of the input projection (may be gates);
                                   // null when only dgates_low is wanted
  void* dgates_low = nullptr;      // optional copy of dgates in `low` for the GEMMs
  void* dgates_rec = nullptr;      // recurrent_grads: (B, G*H) out, gradient of R
  void* dgates_rec_low = nullptr;  // or its copy in `low`
  void* dh_direct = nullptr;  // direct_state_grad: (B, H) out, dL/dh_prev but for R (may be dh_rec)
  void* dbias = nullptr;      // optional (bias_grad_columns): += d b_ih, d b_hh when apart, and the
                              // cell's own parameters' gradients, summed over the rows
  DType low = DType::bf16;    // of the *_low copies: bf16 or f16
};

// A chain's whole recurrence, all its steps in one call (Backend::recurrence_forward and
// recurrence_backward; LSTM and GRU without projections): what T cell steps with their recurrent
// GEMMs compute, R_t = h_{t-1} W_hh^T forward and dh_{t-1} (+)= dR_t W_hh backward. The cell
// arguments describe time 0: every per-step buffer is (steps * B) rows, time t at row t * B of
// its own width (gates and dgates G*H, c and saved H, h ldh, x ldx, dh_out ld_dh_out). A reverse
// chain walks t = steps-1 .. 0. c_prev and h_prev (and h0) hold the initial state.
//
// A stack: two chains of one direction where the second, given w_ih, is the layer above the
// first, whose h is its input (the cell's own input projection, x, unused). Forward, its
// pre-activations at step t are x[t] W_ih^T + bias as the lower chain's step t writes x[t] (the
// cell overwrites cell.gates with its activations as usual; cell.gates must be given). Backward,
// the lower chain's output gradient at step t is the upper chain's dG[t] W_ih (dgates, or their
// low copies where given), in place of its cell.dh_out (null). So both layers can step together,
// the upper one a step behind forward and the lower one a step behind backward.
struct RecurrenceForward {
  CellForward cell;  // gates_rec is unused
  int64_t steps = 0;
  bool reverse = false;
  DType gemm = DType::f32;     // the product's operands: h (h_low when the cell writes one), w_hh
  const void* w_hh = nullptr;  // (G*H, H) in `gemm`
  const void* h0 = nullptr;    // (B, H) in `gemm`, rows ld_h0 apart: the product's first h
  int64_t ld_h0 = 0;
  const void* w_ih = nullptr;  // a stack's upper chain: (G*H, H) in `gemm`
  const void* x = nullptr;  // its input, the lower chain's h (h_low), (steps * B) rows ld_x apart
  int64_t ld_x = 0;
  const void* bias = nullptr;  // (G*H) in the cell's dtype, or none
};
// dh (B, H) is dL/dh into the chain's first step back (read) and dL/dh_0 after its last
// (written), in place of cell.dh_rec and cell.dh_direct; cell.dc likewise carries dL/dc. dgates
// may be null when dgates_low is given; dbias, when given, gets every step's column sums.
struct RecurrenceBackward {
  CellBackward cell;
  int64_t steps = 0;
  bool reverse = false;
  DType gemm = DType::f32;  // the product's operands: dgates (dgates_rec) or their low copies, w_hh
  const void* w_hh = nullptr;
  void* dh = nullptr;
  const void* c = nullptr;  // LSTM: the forward's c, (steps * B, H)
  const void* h = nullptr;  // GRU: the forward's h, (steps * B) rows ldh apart
  int64_t ldh = 0;
  const void* w_ih = nullptr;  // a stack's upper chain: (G*H, H) in `gemm`
  void* dx = nullptr;  // and (steps * B, H) of memory where its layers run one at a time, for the
                       // lower chain's output gradient (contents undefined after)
};

// Whether chains are a stack (above), checked: two chains of one batch, width, length and
// direction, the second with w_ih.
bool is_stack(std::span<const RecurrenceForward> chains);
bool is_stack(std::span<const RecurrenceBackward> chains);

// Multi-head scaled dot-product attention over the packed projections of a (B, T, 3C) c_attn
// output, C = heads * head_dim: for batch row b and head h, q, k and v are the columns
// [h*D, (h+1)*D) of the first, second and third C-block of each row (nanoGPT's layout), and
//   out_i = sum_j softmax_j(scale * q_i . k_j) v_j
// over the keys j < lengths[b] (all T without lengths), and j <= i when causal. A row with no key
// gets out 0 and lse -inf. out is (B, T, C), heads side by side.
//
// Dropout on the probabilities (nanoGPT's attn_dropout), as in FlashAttention: with dropout p > 0,
//   out_i = sum_j P_ij M_ij / (1 - p) v_j,   P_ij = softmax_j(scale * q_i . k_j),
// where the keep-mask M_ij in {0, 1} is a pure function of (seed, b, h, i, j), a counter-based
// hash: backward regenerates it without storing anything, and it depends on neither the tiling
// nor the threads. lse stays the log-sum-exp of the undropped scores.
//
// Rows of qkv (and dqkv) hold the query heads, then the key heads, then the value heads, head_dim
// values each: (heads + 2 kv_heads) head_dim wide. Grouped-query attention (kv_heads < heads):
// query head h reads key/value head h / (heads / kv_heads), and that head's gradient sums over
// its group. A sliding window (causal only) lets query row i see keys j with i - window < j <= i,
// Hugging Face's sliding_window.
struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  bool causal = true;
  int64_t kv_heads = 0;  // 0: heads (one key/value head per query head)
  int64_t window = 0;    // 0: none
  double scale = 0;      // usually 1 / sqrt(head_dim)
  // > 0: each score x = scale q.k becomes softcap tanh(x / softcap) before the mask and softmax
  // (Gemma's attn_logit_softcapping); 0: none.
  double softcap = 0;
  double dropout = 0.0;  // in [0, 1): the probability of dropping each P_ij; 0 is none
  uint64_t seed = 0;     // of the dropout mask
  // Set by a device backend: its seed base (Backend::set_seed_base), which the kernels mix in.
  const uint64_t* seed_base = nullptr;
  // Mixed precision: the products may round their operands (q, k, v, dO and the probabilities)
  // to bf16, summing in f32, where the backend has bf16 dot products; tensors stay in the dtype.
  bool bf16_products = false;
  // The same with fp16 operands, where the backend has fp16 dot products (a GPU's tensor cores;
  // a CPU has none and takes f32 products).
  bool fp16_products = false;

  SF_HOST_DEVICE int64_t kv() const { return kv_heads ? kv_heads : heads; }
  SF_HOST_DEVICE int64_t group() const { return heads / kv(); }  // query heads per kv head
  SF_HOST_DEVICE int64_t qkv_width() const { return (heads + 2 * kv()) * head_dim; }
  // Keys [first_key(i), last_key(i, keys)) are query row i's, of the keys [0, keys) its row has.
  SF_HOST_DEVICE int64_t first_key(int64_t i) const {
    return window > 0 && i >= window ? i - window + 1 : 0;
  }
  SF_HOST_DEVICE int64_t last_key(int64_t i, int64_t keys) const {
    return causal ? (i + 1 < keys ? i + 1 : keys) : keys;
  }
};

struct AttentionForward {
  AttentionShape shape;
  const void* qkv = nullptr;      // (B, T, qkv_width())
  const void* lengths = nullptr;  // optional (B) i64: valid keys per batch row (padding)
  void* out = nullptr;            // (B, T, C)
  void* lse = nullptr;            // (B, heads, T), the dtype's: log sum_j exp(scale q_i . k_j),
                                  // all backward keeps besides qkv and out
  // Query rows [first_row, T) only, against every key their mask allows; the earlier rows' out
  // and lse are left as they are (decoding new tokens against cached keys and values).
  int64_t first_row = 0;
};

// Gradients of the same; dqkv is assigned (rows of padded keys get 0).
struct AttentionBackward {
  AttentionShape shape;
  const void* qkv = nullptr;      // (B, T, qkv_width())
  const void* lengths = nullptr;  // as forward
  const void* out = nullptr;      // (B, T, C) forward's
  const void* lse = nullptr;      // (B, heads, T) forward's
  const void* dout = nullptr;     // (B, T, C)
  void* dqkv = nullptr;           // (B, T, qkv_width()) out
};

// Rotary position embeddings in place, Hugging Face's rotate-half layout: in each of `heads`
// heads of head_dim values (even) starting at x, element i < head_dim / 2 pairs with
// i + head_dim / 2 and the pair turns by the angle of row r's position, first_pos + r % seq;
// cos and sin (positions, head_dim / 2) of the dtype hold those angles. `inverse` turns the other
// way, which is the backward of the forward (the rotation is orthogonal).
struct Rotary {
  void* x = nullptr;  // rows ld elements apart; rows = batch * seq
  int64_t ld = 0, rows = 0, seq = 0, first_pos = 0, heads = 0, head_dim = 0;
  const void* cos = nullptr;
  const void* sin = nullptr;
  bool inverse = false;
};

// The activation of a gated MLP's gate: Llama's and Qwen's SiLU, Gemma's tanh-form GELU.
enum class GluKind { silu, gelu_tanh };

// A regression loss over selected rows, PyTorch's mean reductions of the error d = pred - target:
// mse (d^2), mae (|d|, F.l1_loss; gradient sign(d)) or huber (F.huber_loss: d^2 / 2 within
// delta, delta (|d| - delta / 2) beyond; gradient d clamped to [-delta, delta]).
// quantile: the pinball loss of quantile q, max(q (y - p), (q - 1) (y - p)), where a row's value j
// is for quantile quantiles[j % num_quantiles] (its outputs are (..., num_quantiles)).
enum class LossKind { mse, mae, huber, quantile };
constexpr int kMaxQuantiles = 16;
struct RegressionLoss {
  LossKind kind = LossKind::mse;
  double delta = 1.0;  // huber
  int num_quantiles = 0;
  double quantiles[kMaxQuantiles] = {};
};

// Unscaling and clipping of the gradients by their norm, decided where they are: from the sum of
// squares an earlier sum_squares wrote into backend memory (kernels/grad_clip.hpp), so that no
// value travels to the host inside a step.
struct GradClip {
  const double* sum_squares = nullptr;  // backend memory; null: no unscaling nor clipping
  double loss_scale = 1.0;              // the factor the gradients carry (fp16's loss scaling)
  double max_norm = 0.0;                // the unscaled norm clipped to this; 0: no clipping
  bool skip_nonfinite = false;          // an inf or NaN norm skips the update (grads still zeroed)
};

struct AdamParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled = true;    // AdamW: p -= lr*wd*p; Adam: g += wd*p
  int64_t step = 1;         // 1-based, for bias correction
  double grad_scale = 1.0;  // gradients are multiplied by this first (unscaling, clipping)
  GradClip clip{};          // and then by what this decides
  bool zero_grads = false;  // leave the gradients zeroed
};

struct SgdParams {
  double lr = 1e-2, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = true;  // momentum buffer starts as the gradient itself
  double grad_scale = 1.0;
  GradClip clip{};
};

// One optimizer update of every parameter in one pass: flat arenas described segment by segment,
// with the learning rate and each segment's update count in backend memory, so that nothing of a
// step is decided on the host (a later step can replay the same launches).
struct OptimizerSegment {
  int64_t value_offset = 0;  // into params
  int64_t grad_offset = 0;   // into grads and the state; segments ascend by it, gaps are skipped
  int64_t numel = 0;
  int64_t flags = 0;                     // kFrozen and kDecays
  static constexpr int64_t kFrozen = 1;  // nothing updated, gradients still zeroed (zero_grads)
  static constexpr int64_t kDecays = 2;  // weight_decay applies (else 0)
};
enum class OptimizerKind { adam, adamw, sgd };
struct OptimizerStep {
  OptimizerKind kind = OptimizerKind::adamw;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam, AdamW
  double momentum = 0.0, dampening = 0.0;         // SGD
  bool nesterov = false;
  double weight_decay = 0.0;  // for kDecays segments
  double grad_scale = 1.0;
  GradClip clip;
  bool zero_grads = false;  // leave every segment's gradients zeroed
  void* params = nullptr;   // flat arenas of the dtype
  void* grads = nullptr;
  void* m = nullptr;                           // Adam's exp_avg, SGD's momentum buffer
  void* v = nullptr;                           // Adam's exp_avg_sq
  int64_t grad_elements = 0;                   // of grads, m and v
  const OptimizerSegment* segments = nullptr;  // backend memory
  int64_t segment_count = 0;
  int64_t* steps = nullptr;  // backend memory: each segment's updates so far; one is added to each
                             // segment updated (not frozen, not a skipped step)
  const double* lr = nullptr;  // backend memory
};

}  // namespace seqforge
