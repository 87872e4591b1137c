// LSTM forward and backward.
//
// Per layer l and direction d (state index s = l * D + d), time-major:
//   forward:  G = in W_ih^T + b_ih + b_hh                       one GEMM over all T*B rows
//             for each step t (t = 0..T-1, or T-1..0 reversed):
//               G[t] += h_prev W_hh^T;  cell: (G[t], c_prev) -> (c[t], h[t])
//   backward: for each step in reverse processing order:
//               cell': (dh_out[t] + dh_rec, dc) -> dG[t], dc;  dh_rec = dG[t] W_hh
//             dW_ih += dG^T in;  dW_hh += dG^T H_prev;  db_ih, db_hh += colsum(dG)
//             din (=, += for the second direction) = dG W_ih   one GEMM each
// h[t] is written straight into the layer output (T, B, D*H) at column d*H, so H_prev for all
// steps is the output shifted by one step (two GEMMs: the initial state, then the rest).
// With bf16 GEMMs, the cell kernels also write bf16 copies of h and dG, and every GEMM reads
// those and bf16 copies of the weights; cell state, gates and all gradients stay f32.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include "seqforge/nn/lstm.hpp"

#include <cmath>

#include "seqforge/backend/backend.hpp"

namespace seqforge {

namespace {
char* at(Tensor t, int64_t elements) {
  return static_cast<char*>(t.data()) + elements * static_cast<int64_t>(dtype_size(t.dtype()));
}
}  // namespace

Lstm::Lstm(Parameters& params, const std::string& prefix, const LstmOptions& options)
    : params_(params), opt_(options), gemm_dtype_(params.dtype()) {
  const std::string where = prefix.empty() ? "lstm" : prefix;
  if (opt_.input_size <= 0) fail(where, ": input_size must be positive, got ", opt_.input_size);
  if (opt_.hidden_size <= 0) fail(where, ": hidden_size must be positive, got ", opt_.hidden_size);
  if (opt_.num_layers <= 0) fail(where, ": num_layers must be positive, got ", opt_.num_layers);
  if (!(opt_.dropout >= 0.0 && opt_.dropout < 1.0))
    fail(where, ": dropout ", opt_.dropout, " outside [0, 1)");
  const int64_t H = opt_.hidden_size;
  const Init init = Init::Uniform(1.0 / std::sqrt(double(H)));
  const std::string base = prefix.empty() ? "" : prefix + ".";
  for (int64_t l = 0; l < opt_.num_layers; ++l) {
    for (int64_t d = 0; d < directions(); ++d) {
      const std::string sfx = "_l" + std::to_string(l) + (d ? "_reverse" : "");
      Weights w;
      w.w_ih = params.declare(base + "weight_ih" + sfx, {4 * H, layer_input_size(l)}, init);
      w.w_hh = params.declare(base + "weight_hh" + sfx, {4 * H, H}, init);
      w.b_ih = params.declare(base + "bias_ih" + sfx, {4 * H}, init);
      w.b_hh = params.declare(base + "bias_hh" + sfx, {4 * H}, init);
      weights_.push_back(w);
    }
  }
  saved_.resize(weights_.size());
  out_.resize(opt_.num_layers);
  din_.resize(opt_.num_layers);
  mask_.resize(opt_.num_layers);
  dropped_.resize(opt_.num_layers);
  in_gemm_.resize(opt_.num_layers);
  out_low_.resize(opt_.num_layers);
  dropped_low_.resize(opt_.num_layers);
}

void Lstm::set_gemm_dtype(DType dtype) {
  if (dtype != params_.dtype() && !(dtype == DType::bf16 && params_.dtype() == DType::f32))
    fail("LSTM GEMMs in ", dtype_name(dtype), " need f32 parameters, have ",
         dtype_name(params_.dtype()));
  gemm_dtype_ = dtype;
}

int64_t Lstm::layer_input_size(int64_t layer) const {
  return layer == 0 ? opt_.input_size : output_size();
}

Tensor Lstm::forward(Backend& be, Tensor x, Tensor h0, Tensor c0, bool training, Rng& rng) {
  const DType dt = params_.dtype();
  SF_CHECK(x.dtype() == dt, "LSTM input dtype ", dtype_name(x.dtype()), ", parameters ",
           dtype_name(dt));
  if (x.shape().rank() != 3 || x.dim(2) != opt_.input_size)
    fail("LSTM input must be ", opt_.batch_first ? "(B, T, " : "(T, B, ", opt_.input_size,
         "), got ", x.shape().str());
  T_ = opt_.batch_first ? x.dim(1) : x.dim(0);
  B_ = opt_.batch_first ? x.dim(0) : x.dim(1);
  const int64_t H = opt_.hidden_size, D = directions(), L = opt_.num_layers;
  const Shape state_shape{D * L, B_, H};
  for (auto [t, name] : {std::pair{h0, "h0"}, std::pair{c0, "c0"}}) {
    if (!t.empty() && t.shape() != state_shape)
      fail("LSTM ", name, " must be ", state_shape.str(), ", got ", t.shape().str());
  }
  if (opt_.batch_first) {
    x_ = x_tm_.get(be, dt, {T_, B_, opt_.input_size});
    be.transpose01(x_, x);
  } else {
    x_ = x;
  }
  Tensor zeros = zeros_.get(be, dt, {B_, H});
  be.fill(zeros, 0.0);
  Tensor h_init = h0_.get(be, dt, state_shape), c_init = c0_.get(be, dt, state_shape);
  if (h0.empty())
    be.fill(h_init, 0.0);
  else
    be.copy(h_init, h0);
  if (c0.empty())
    be.fill(c_init, 0.0);
  else
    be.copy(c_init, c0);
  Tensor hn = h_n_.get(be, dt, state_shape), cn = c_n_.get(be, dt, state_shape);

  if (low()) {
    for (size_t s = 0; s < weights_.size(); ++s) {
      Tensor w_ih = params_.value(weights_[s].w_ih), w_hh = params_.value(weights_[s].w_hh);
      be.convert(saved_[s].w_ih_low.get(be, gemm_dtype_, w_ih.shape()), w_ih);
      be.convert(saved_[s].w_hh_low.get(be, gemm_dtype_, w_hh.shape()), w_hh);
    }
    be.convert(x_low_.get(be, gemm_dtype_, x_.shape()), x_);
    be.convert(h0_low_.get(be, gemm_dtype_, state_shape), h_init);
  }

  dropout_active_ = training && opt_.dropout > 0.0;
  in_gemm_[0] = low() ? x_low_.tensor() : x_;
  for (int64_t l = 0; l < L; ++l) {
    Tensor out = out_[l].get(be, dt, {T_, B_, D * H});  // (T, B, D*H)
    if (low()) out_low_[l].get(be, gemm_dtype_, {T_, B_, D * H});
    for (int64_t d = 0; d < D; ++d) {
      const int64_t s = l * D + d;
      forward_direction(be, l, d, h_init.slice(s, s + 1), c_init.slice(s, s + 1));
      // Final states: the last step processed (t = T-1 forward, t = 0 reversed).
      const int64_t t_last = T_ == 0 ? 0 : (d == 0 ? T_ - 1 : 0);
      if (T_ > 0) {
        be.copy_rows(at(hn, s * B_ * H), H, at(out, t_last * B_ * D * H + d * H), D * H, B_, H, dt);
        be.copy(cn.slice(s, s + 1).reshape({B_, H}),
                saved_[s].c.tensor().slice(t_last, t_last + 1).reshape({B_, H}));
      } else {
        be.copy(hn.slice(s, s + 1), h_init.slice(s, s + 1));
        be.copy(cn.slice(s, s + 1), c_init.slice(s, s + 1));
      }
    }
    if (l + 1 == L) break;
    Tensor in_gemm = low() ? out_low_[l].tensor() : out;
    if (dropout_active_) {
      Tensor mask = mask_[l].get(be, dt, out.shape());
      be.dropout_mask(mask, opt_.dropout, rng.next());
      Tensor dropped = dropped_[l].get(be, dt, out.shape());
      be.mul(dropped, out, mask);
      in_gemm = dropped;
      if (low()) {
        in_gemm = dropped_low_[l].get(be, gemm_dtype_, out.shape());
        be.convert(in_gemm, dropped);
      }
    }
    in_gemm_[l + 1] = in_gemm;
  }
  Tensor y = out_[L - 1].tensor();
  if (!opt_.batch_first) return y;
  Tensor y_bf = y_bf_.get(be, dt, {B_, T_, D * H});
  be.transpose01(y_bf, y);
  return y_bf;
}

void Lstm::forward_direction(Backend& be, int64_t l, int64_t d, Tensor h0, Tensor c0) {
  const DType dt = params_.dtype(), gt = gemm_dtype_;
  const int64_t H = opt_.hidden_size, D = directions(), I = layer_input_size(l);
  const int64_t s = l * D + d, rows = T_ * B_;
  const Weights& w = weights_[s];
  Saved& sv = saved_[s];
  Tensor gates = sv.gates.get(be, dt, {T_, B_, 4 * H});  // (T, B, 4H)
  Tensor c = sv.c.get(be, dt, {T_, B_, H});              // (T, B, H)
  Tensor tanh_c = sv.tanh_c.get(be, dt, {T_, B_, H});    // (T, B, H)
  Tensor out = out_[l].tensor();                         // (T, B, D*H)
  if (T_ == 0 || B_ == 0) return;
  // GEMM operands: the f32 tensors, or their bf16 copies.
  const Tensor in_g = in_gemm_[l];  // (T, B, I)
  const Tensor w_ih = low() ? sv.w_ih_low.tensor() : params_.value(w.w_ih);
  const Tensor w_hh = low() ? sv.w_hh_low.tensor() : params_.value(w.w_hh);
  const Tensor out_g = low() ? out_low_[l].tensor() : out;
  const Tensor h0_g = low() ? h0_low_.tensor().slice(s, s + 1) : h0;

  // G(T*B, 4H) = in(T*B, I) W_ih^T + (b_ih + b_hh)
  Tensor bias = sv.bias.get(be, dt, {4 * H});
  be.copy(bias, params_.value(w.b_ih));
  be.add(bias, params_.value(w.b_hh));
  GemmShape proj{.trans_b = true, .m = rows, .n = 4 * H, .k = I, .lda = I, .ldb = I};
  proj.ldc = 4 * H;
  proj.bias = true;
  be.gemm(proj, gt, in_g.data(), w_ih.data(), gates.data(), bias.data());
  Tensor rec_out = sv.rec.get(be, dt, {B_, 4 * H});  // (B, 4H) recurrent GEMM output

  for (int64_t step = 0; step < T_; ++step) {
    const int64_t t = d == 0 ? step : T_ - 1 - step;
    const int64_t t_prev = d == 0 ? t - 1 : t + 1;
    const void* h_prev = step == 0 ? h0_g.data() : at(out_g, t_prev * B_ * D * H + d * H);
    void* g_t = at(gates, t * B_ * 4 * H);
    // R(B, 4H) = h_prev(B, H) W_hh^T; the cell adds it to G[t]
    GemmShape rec{.trans_b = true, .m = B_, .n = 4 * H, .k = H, .ldb = H, .ldc = 4 * H};
    rec.lda = step == 0 ? H : D * H;
    be.gemm(rec, gt, h_prev, w_hh.data(), rec_out.data());
    LstmCellForward cell;
    cell.batch = B_;
    cell.hidden = H;
    cell.gates = g_t;
    cell.gates_rec = rec_out.data();
    cell.c_prev = step == 0 ? c0.data() : at(c, t_prev * B_ * H);
    cell.c = at(c, t * B_ * H);
    cell.tanh_c = at(tanh_c, t * B_ * H);
    cell.h = at(out, t * B_ * D * H + d * H);
    cell.ldh = D * H;
    cell.h_bf16 = low() ? at(out_g, t * B_ * D * H + d * H) : nullptr;
    be.lstm_cell_forward(cell, dt);
  }
}

Tensor Lstm::backward(Backend& be, Tensor dy, Tensor dh_n, Tensor dc_n) {
  const DType dt = params_.dtype();
  const int64_t H = opt_.hidden_size, D = directions(), L = opt_.num_layers;
  const Shape y_shape = opt_.batch_first ? Shape{B_, T_, D * H} : Shape{T_, B_, D * H};
  if (dy.shape() != y_shape)
    fail("LSTM backward: dy must be ", y_shape.str(), ", got ", dy.shape().str());
  const Shape state_shape{D * L, B_, H};
  for (auto [t, name] : {std::pair{dh_n, "dh_n"}, std::pair{dc_n, "dc_n"}}) {
    if (!t.empty() && t.shape() != state_shape)
      fail("LSTM backward: ", name, " must be ", state_shape.str(), ", got ", t.shape().str());
  }
  Tensor dout = dy;
  if (opt_.batch_first) {
    dout = dy_tm_.get(be, dt, {T_, B_, D * H});
    be.transpose01(dout, dy);
  }
  dh0_.get(be, dt, state_shape);
  dc0_.get(be, dt, state_shape);
  for (int64_t l = L - 1; l >= 0; --l) {
    Tensor din = din_[l].get(be, dt, {T_, B_, layer_input_size(l)});  // (T, B, I_l)
    for (int64_t d = 0; d < D; ++d) {
      const int64_t s = l * D + d;
      backward_direction(be, l, d, dout, din, dh_n.empty() ? Tensor() : dh_n.slice(s, s + 1),
                         dc_n.empty() ? Tensor() : dc_n.slice(s, s + 1));
    }
    dout = din;
    if (l > 0 && dropout_active_) be.mul(din, din, mask_[l - 1].tensor());
  }
  if (!input_grad_) return Tensor();
  if (!opt_.batch_first) return dout;
  Tensor dx = dx_bf_.get(be, dt, {B_, T_, opt_.input_size});
  be.transpose01(dx, dout);
  return dx;
}

void Lstm::backward_direction(Backend& be, int64_t l, int64_t d, Tensor dout, Tensor din,
                              Tensor dh_n, Tensor dc_n) {
  const DType dt = params_.dtype(), gt = gemm_dtype_;
  const int64_t H = opt_.hidden_size, D = directions(), I = layer_input_size(l);
  const int64_t s = l * D + d, rows = T_ * B_;
  const Weights& w = weights_[s];
  Saved& sv = saved_[s];
  Tensor gates = sv.gates.tensor(), c = sv.c.tensor(), tanh_c = sv.tanh_c.tensor();
  Tensor dgates = sv.dgates.get(be, dt, {T_, B_, 4 * H});  // (T, B, 4H)
  Tensor c_init = c0_.tensor().slice(s, s + 1);           // (1, B, H)
  Tensor dh = dh_.get(be, dt, {B_, H}), dc = dc_.get(be, dt, {B_, H});  // (B, H)
  // GEMM operands: the f32 tensors, or their bf16 copies.
  const Tensor dg_g = low() ? sv.dgates_low.get(be, gt, {T_, B_, 4 * H}) : dgates;
  const Tensor in_g = in_gemm_[l];  // (T, B, I)
  const Tensor w_ih = low() ? sv.w_ih_low.tensor() : params_.value(w.w_ih);
  const Tensor w_hh = low() ? sv.w_hh_low.tensor() : params_.value(w.w_hh);
  const Tensor out_g = low() ? out_low_[l].tensor() : out_[l].tensor();  // (T, B, D*H)
  const Tensor h_init_g = low() ? h0_low_.tensor().slice(s, s + 1) : h0_.tensor().slice(s, s + 1);
  if (dh_n.empty()) be.fill(dh, 0.0); else be.copy(dh, dh_n);
  if (dc_n.empty()) be.fill(dc, 0.0); else be.copy(dc, dc_n);

  for (int64_t step = T_ - 1; step >= 0; --step) {
    const int64_t t = d == 0 ? step : T_ - 1 - step;
    const int64_t t_prev = d == 0 ? t - 1 : t + 1;
    LstmCellBackward cell;
    cell.batch = B_;
    cell.hidden = H;
    cell.gates = at(gates, t * B_ * 4 * H);
    cell.c_prev = step == 0 ? c_init.data() : at(c, t_prev * B_ * H);
    cell.tanh_c = at(tanh_c, t * B_ * H);
    cell.dh_out = at(dout, t * B_ * D * H + d * H);
    cell.ld_dh_out = D * H;
    cell.dh_rec = dh.data();
    cell.dc = dc.data();
    cell.dgates = at(dgates, t * B_ * 4 * H);
    cell.dgates_bf16 = low() ? at(dg_g, t * B_ * 4 * H) : nullptr;
    be.lstm_cell_backward(cell, dt);
    // dh(B, H) = dG[t](B, 4H) W_hh(4H, H)
    const GemmShape rec{.m = B_, .n = H, .k = 4 * H, .lda = 4 * H, .ldb = H, .ldc = H};
    be.gemm(rec, gt, at(dg_g, t * B_ * 4 * H), w_hh.data(), dh.data());
  }
  be.copy(dh0_.tensor().slice(s, s + 1).reshape({B_, H}), dh);
  be.copy(dc0_.tensor().slice(s, s + 1).reshape({B_, H}), dc);
  if (T_ == 0 || B_ == 0) {
    if (d == 0) be.fill(din, 0.0);
    return;
  }

  // dW_hh(4H, H) += dG[first step]^T h_init + dG[other steps]^T out[their previous steps]
  const int64_t t_first = d == 0 ? 0 : T_ - 1;
  GemmShape first{.trans_a = true, .m = 4 * H, .n = H, .k = B_, .lda = 4 * H, .ldb = H, .ldc = H};
  first.beta = 1.0f;
  be.gemm(first, gt, at(dg_g, t_first * B_ * 4 * H), h_init_g.data(), params_.grad(w.w_hh).data());
  if (T_ > 1) {
    const int64_t dg_start = d == 0 ? 1 : 0, h_start = d == 0 ? 0 : 1;
    GemmShape rest{.trans_a = true, .m = 4 * H, .n = H, .k = (T_ - 1) * B_, .lda = 4 * H};
    rest.ldb = D * H;
    rest.ldc = H;
    rest.beta = 1.0f;
    be.gemm(rest, gt, at(dg_g, dg_start * B_ * 4 * H), at(out_g, h_start * B_ * D * H + d * H),
            params_.grad(w.w_hh).data());
  }
  // dW_ih(4H, I) += dG^T(4H, T*B) in(T*B, I)
  GemmShape dwih{.trans_a = true, .m = 4 * H, .n = I, .k = rows, .lda = 4 * H, .ldb = I, .ldc = I};
  dwih.beta = 1.0f;
  be.gemm(dwih, gt, dg_g.data(), in_g.data(), params_.grad(w.w_ih).data());
  Tensor dg_rows = dgates.reshape({rows, 4 * H});
  // d(b_ih) = d(b_hh) = colsum(dG): summed once, added to both.
  Tensor db = sv.bias.get(be, dt, {4 * H});
  be.fill(db, 0.0);
  be.sum_rows_acc(db, dg_rows);
  be.add(params_.grad(w.b_ih), db);
  be.add(params_.grad(w.b_hh), db);
  if (l == 0 && !input_grad_) return;
  // din(T*B, I) (=, += for the reverse direction) = dG(T*B, 4H) W_ih(4H, I)
  GemmShape dx{.m = rows, .n = I, .k = 4 * H, .lda = 4 * H, .ldb = I, .ldc = I};
  dx.beta = d == 0 ? 0.0f : 1.0f;
  be.gemm(dx, gt, dg_g.data(), w_ih.data(), din.data());
}

}  // namespace seqforge
