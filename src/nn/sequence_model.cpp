#include "seqforge/nn/sequence_model.hpp"

#include <algorithm>
#include <cmath>

#include "nn/dense.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/profiler.hpp"

namespace seqforge {

using nn::gemm;

// An adapter on one of the recurrent layer's weights W0 (out, in).
struct SequenceModel::Adapter {
  size_t base = 0, work = 0;  // W0 in params_, the weight the recurrence uses in work_
  size_t A = 0, B = 0;        // A (rank, in), B (out, rank)
  size_t m = SIZE_MAX;        // DoRA: magnitudes (out)
  int64_t out = 0, in = 0;
  Buffer v, scale, inv_norm;          // DoRA: V = W0 + s B A (out, in), m / ||V||, 1 / ||V|| (out)
  Buffer rows, cols, ones, row_sums;  // scratch: (out, in), (in, out), (in), (out)
  Buffer mask, a_dropped, a_grad;     // adapter dropout: M / (1 - p), A M / (1 - p), dA (rank, in)
};

namespace {

// y(R, C) = x with row r scaled by s(r) (y may be x), through a (C, R) scratch of s broadcast.
void scale_rows(Backend& be, Tensor y, Tensor x, Tensor s, Buffer& broadcast, Buffer& rows) {
  const int64_t R = x.dim(0), C = x.dim(1);
  Tensor t = broadcast.get(be, x.dtype(), {C, R});
  be.fill(t, 1.0);
  be.scale_columns(t, t, s, {});
  Tensor st = rows.get(be, x.dtype(), {R, C});  // s(r) at every column of row r
  be.copy_transposed(st.data(), C, t.data(), R, C, R, x.dtype());
  be.mul(y, x, st);
}

}  // namespace

SequenceModel::SequenceModel(const ModelOptions& options, DType dtype)
    : opt_(options), params_(dtype), work_(dtype) {
  if (opt_.vocab_size > 0) {
    embedding_ =
        std::make_unique<Embedding>(params_, "embedding", opt_.vocab_size, opt_.embedding_dim);
    opt_.rnn.input_size = opt_.embedding_dim;
  }
  rnn_first_ = params_.size();
  const std::string cell = cell_type(opt_.rnn.cell).name;
  if (opt_.adapter.kind == AdapterKind::none) {
    rnn_ = std::make_unique<Recurrent>(params_, cell, opt_.rnn);
  } else {  // the recurrence on work_; W0 in params_ under the same names
    rnn_ = std::make_unique<Recurrent>(work_, cell, opt_.rnn);
    for (size_t i = 0; i < work_.size(); ++i) {
      const auto& e = work_.values().entries()[i];
      params_.declare(e.name, e.shape, work_.init(i));
    }
  }
  head_first_ = params_.size();
  head_ = std::make_unique<Linear>(params_, "head", rnn_->output_size(), opt_.output_size);
  adapters_first_ = params_.size();
  declare_adapters();
}

SequenceModel::~SequenceModel() = default;

// After the model's own parameters, so that they keep PyTorch's order.
void SequenceModel::declare_adapters() {
  const AdapterOptions& a = opt_.adapter;
  if (a.kind == AdapterKind::none) return;
  SF_CHECK(a.rank > 0 && a.alpha > 0 && a.dropout >= 0 && a.dropout < 1, "recurrent adapter rank ",
           a.rank, ", alpha ", a.alpha, ", dropout ", a.dropout);
  for (size_t i = 0; i < head_first_; ++i)  // the base: no gradient, no state
    if (i >= rnn_first_ && a.bf16_base)
      params_.fix(i, DType::bf16);
    else
      params_.fix(i);
  for (const std::string& t : a.targets) {
    bool any = false;
    for (size_t i = 0; i < work_.size(); ++i) {
      const auto& e = work_.values().entries()[i];
      // "lstm.weight_ih" names weight_ih_l0, weight_ih_l1_reverse, ...
      if (e.name.rfind(t + "_l", 0) != 0 || e.shape.rank() != 2) continue;
      any = true;
      Adapter ad;
      ad.work = i;
      ad.base = rnn_first_ + i;
      ad.out = e.shape[0];
      ad.in = e.shape[1];
      const std::string name = "base_model.model." + e.name;
      ad.A = params_.declare(name + ".lora_A.weight", {a.rank, ad.in},
                             Init::Uniform(1.0 / std::sqrt(double(ad.in))));
      ad.B = params_.declare(name + ".lora_B.weight", {ad.out, a.rank}, Init::Constant(0.0));
      if (a.kind == AdapterKind::dora)
        ad.m = params_.declare(name + ".lora_magnitude_vector", {ad.out}, Init::Constant(1.0));
      adapters_.push_back(std::move(ad));
    }
    if (!any) {
      std::string names;
      for (const auto& e : work_.values().entries())
        if (e.shape.rank() == 2) names += (names.empty() ? "" : ", ") + e.name;
      fail("adapter target '", t, "' names none of the recurrent layer's weights (", names,
           "; a target is a name without its _l<layer> suffix, e.g. ",
           cell_type(opt_.rnn.cell).name, ".weight_ih)");
    }
  }
}

std::vector<bool> SequenceModel::frozen_parameters() const {
  if (adapters_.empty()) return {};
  std::vector<bool> frozen(params_.size(), false);
  std::fill(frozen.begin(), frozen.begin() + static_cast<std::ptrdiff_t>(head_first_), true);
  return frozen;
}

std::vector<std::string> SequenceModel::fresh_parameters() const {
  std::vector<std::string> out;
  for (size_t i = adapters_first_; i < params_.size(); ++i)
    out.push_back(params_.values().entries()[i].name);
  return out;
}

// m = ||W0 + s B A|| per row, for the magnitudes not in `loaded`.
void SequenceModel::init_adapters(Backend& be, const std::vector<std::string>& loaded) {
  const int64_t r = opt_.adapter.rank;
  const double s = opt_.adapter.alpha / double(r);
  for (Adapter& ad : adapters_) {
    if (ad.m == SIZE_MAX || std::find(loaded.begin(), loaded.end(),
                                      params_.values().entries()[ad.m].name) != loaded.end())
      continue;
    const std::vector<double> v = nn::adapted_weight(
        download_doubles(be, params_.value(ad.base)), download_doubles(be, params_.value(ad.A)),
        download_doubles(be, params_.value(ad.B)), ad.out, ad.in, r, s);
    upload_doubles(be, params_.value(ad.m),
                   nn::dora_magnitudes(v, ad.out, ad.in, params_.values().entries()[ad.base].name));
  }
}

void SequenceModel::initialize(Backend& be, uint64_t seed) {
  Rng rng(seed);
  params_.allocate(be, rng);
  if (adapters_.empty()) return;
  Rng unused(seed);
  work_.allocate(be, unused);  // made from params_ before every forward pass
  init_adapters(be, {});
}

// The recurrence's weights for this step: W0, or W0 + s B A, or DoRA's m V / ||V||. In training
// with adapter dropout, A is A M / (1 - p) for a mask M drawn per adapter and step (DropConnect,
// as AWD-LSTM's weight drop): the recurrence runs on these folded weights, so a dropout on the
// adapter's per-step input has nowhere to act.
void SequenceModel::prepare_weights(Backend& be, bool training, Rng& rng) {
  const DType dt = params_.dtype();
  for (size_t i = 0; i < work_.size(); ++i) {
    const Tensor w0 = params_.value(rnn_first_ + i);  // bf16 when the base is held so
    if (w0.dtype() == dt)
      be.copy(work_.value(i), w0);
    else
      be.convert(work_.value(i), w0);
  }
  const int64_t r = opt_.adapter.rank;
  const double s = opt_.adapter.alpha / double(r);
  a_dropped_ = training && opt_.adapter.dropout > 0;
  for (Adapter& ad : adapters_) {
    Tensor w = work_.value(ad.work);
    Tensor a = params_.value(ad.A);
    if (a_dropped_) {
      Tensor mask = ad.mask.get(be, dt, {r, ad.in});
      be.dropout_mask(mask, opt_.adapter.dropout, rng.next());
      Tensor dropped = ad.a_dropped.get(be, dt, {r, ad.in});
      be.mul(dropped, a, mask);
      a = dropped;
    }
    gemm(be, dt, false, false, ad.out, ad.in, r, s, 1.0, params_.value(ad.B), a, w);
    if (ad.m == SIZE_MAX) continue;
    Tensor v = ad.v.get(be, dt, {ad.out, ad.in});
    be.copy(v, w);
    be.dora_norm(ad.scale.get(be, dt, {ad.out}), ad.inv_norm.get(be, dt, {ad.out}), v,
                 params_.value(ad.m));
    scale_rows(be, w, v, ad.scale.tensor(), ad.cols, ad.rows);
  }
}

// The adapters' gradients from the gradient G (out, in) of each weight the recurrence used:
// LoRA dB += s G A^T, dA += s B^T G; DoRA, ||V|| a constant: dm = rowsum(G * V) / ||V||, then
// the same with G * m / ||V||. Under adapter dropout A is the dropped A and dA is masked.
void SequenceModel::adapter_backward(Backend& be) {
  const DType dt = params_.dtype();
  const int64_t r = opt_.adapter.rank;
  const double s = opt_.adapter.alpha / double(r);
  for (Adapter& ad : adapters_) {
    Tensor g = work_.grad(ad.work);
    if (ad.m != SIZE_MAX) {
      Tensor t = ad.rows.get(be, dt, {ad.out, ad.in});  // G * V
      be.mul(t, g, ad.v.tensor());
      Tensor ones = ad.ones.get(be, dt, {ad.in});
      be.fill(ones, 1.0);
      Tensor sums = ad.row_sums.get(be, dt, {ad.out});
      gemm(be, dt, false, false, ad.out, 1, ad.in, 1.0f, 0.0f, t, ones, sums);
      be.mul(sums, sums, ad.inv_norm.tensor());
      be.add(params_.grad(ad.m), sums);
      scale_rows(be, g, g, ad.scale.tensor(), ad.cols, ad.rows);  // dV = G m / ||V||
    }
    gemm(be, dt, false, true, ad.out, r, ad.in, s, 1.0f, g,
         a_dropped_ ? ad.a_dropped.tensor() : params_.value(ad.A), params_.grad(ad.B));
    if (!a_dropped_) {
      gemm(be, dt, true, false, r, ad.in, ad.out, s, 1.0f, params_.value(ad.B), g,
           params_.grad(ad.A));
      continue;
    }
    Tensor da = ad.a_grad.get(be, dt, {r, ad.in});
    gemm(be, dt, true, false, r, ad.in, ad.out, s, 0.0f, params_.value(ad.B), g, da);
    be.mul(da, da, ad.mask.tensor());
    be.add(params_.grad(ad.A), da);
  }
}

Tensor SequenceModel::forward(Backend& be, Tensor x, Tensor h0, Tensor c0, bool training,
                              Rng& rng) {
  SF_PROFILE_SCOPE("forward");
  const bool bf = opt_.rnn.batch_first;
  // An empty batch would pass for a perfect step: a loss of 0, and the weights still decayed.
  if (x.shape().rank() >= 2 && (x.dim(0) == 0 || x.dim(1) == 0))
    fail(x.dim(bf ? 0 : 1) == 0 ? "a batch of 0 sequences" : "sequence length is 0", " (input ",
         x.shape().str(), "): nothing to predict from");
  Tensor features = x;
  if (embedding_) {
    SF_PROFILE_SCOPE("embedding forward");
    if (x.shape().rank() != 2)
      fail("token ids must be ", bf ? "(B, T)" : "(T, B)", ", got ", x.shape().str());
    Tensor e = embedding_->forward(be, x.reshape({x.numel()}));
    features = e.reshape({x.dim(0), x.dim(1), opt_.embedding_dim});
  }
  if (!adapters_.empty()) prepare_weights(be, training, rng);
  Tensor y = rnn_->forward(be, features, h0, c0, training, rng);
  T_ = bf ? y.dim(1) : y.dim(0);
  B_ = bf ? y.dim(0) : y.dim(1);
  const int64_t F = rnn_->output_size();
  SF_PROFILE_SCOPE("head forward");
  if (opt_.per_step) return head_->forward(be, y.reshape({T_ * B_, F}));
  Tensor last = last_.get(be, params_.dtype(), {B_, F});  // (B, D*H)
  for (const Span& s : head_spans())
    if (s.cols > 0)
      be.copy_rows(at(last, 0, s.col), F, at(y, s.t, s.col), ld(), B_, s.cols, y.dtype());
  return head_->forward(be, last);
}

// Where the head's input comes from in the (B, T, F) or (T, B, F) output: the last step's row,
// or with final_states each direction's final step (the backward direction's is t = 0).
// A span of no columns is none.
std::array<SequenceModel::Span, 2> SequenceModel::head_spans() const {
  const int64_t F = rnn_->output_size();
  if (!opt_.final_states || rnn_->directions() == 1) return {{{T_ - 1, 0, F}, {0, 0, 0}}};
  return {{{T_ - 1, 0, F / 2}, {0, F / 2, F / 2}}};
}
// Element (b = 0, t, col) of an output-shaped tensor, or of the (B, F) head input (t = 0).
void* SequenceModel::at(Tensor x, int64_t t, int64_t col) const {
  const int64_t F = rnn_->output_size();
  const int64_t offset = (opt_.rnn.batch_first ? t : t * B_) * F + col;
  return static_cast<char*>(x.data()) + offset * dtype_size(x.dtype());
}
// The distance between batch rows of one step in the output.
int64_t SequenceModel::ld() const {
  return opt_.rnn.batch_first ? T_ * rnn_->output_size() : rnn_->output_size();
}

Tensor SequenceModel::backward(Backend& be, Tensor dy, Tensor dh_n, Tensor dc_n) {
  SF_PROFILE_SCOPE("backward");
  const bool bf = opt_.rnn.batch_first;
  const int64_t F = rnn_->output_size();
  const Shape y_shape = bf ? Shape{B_, T_, F} : Shape{T_, B_, F};
  if (B_ == 0) fail("backward before any forward: run forward on the batch first");
  const Shape expected = {opt_.per_step ? T_ * B_ : B_, head_->out_features()};
  if (dy.shape() != expected)
    fail("backward: dy is ", dy.shape().str(), " but the last forward's output is ", expected.str(),
         ": backward goes with the forward of the same batch");
  Tensor dfeat;
  {
    SF_PROFILE_SCOPE("head backward");
    dfeat = head_->backward(be, dy);  // (rows, F)
  }
  const bool adapted = !adapters_.empty();
  if (grad_ready_ && !adapted) grad_ready_(head_first_, params_.size());
  Tensor drnn;
  if (opt_.per_step) {
    drnn = dfeat.reshape(y_shape);
  } else if (rnn_->directions() == 1) {  // the last step and the final state are one
    // The last step's output is the top layer's final state: its gradient joins dh_n and no
    // (T, B, H) gradient is materialised.
    const int64_t L = opt_.rnn.num_layers;
    const Shape state_shape{L, B_, F};
    if (!dh_n.empty() && dh_n.shape() != state_shape)
      fail("recurrent layer backward: dh_n must be ", state_shape.str(), ", got ",
           dh_n.shape().str());
    Tensor dh = dh_n_.get(be, params_.dtype(), state_shape);
    if (dh_n.empty())
      be.fill(dh, 0.0);
    else
      be.copy(dh, dh_n);
    be.add(dh.slice(L - 1, L).reshape({B_, F}), dfeat);
    dh_n = dh;
  } else {
    drnn = dy_full_.get(be, params_.dtype(), y_shape);
    be.fill(drnn, 0.0);
    for (const Span& s : head_spans())
      if (s.cols > 0)
        be.copy_rows(at(drnn, s.t, s.col), ld(), at(dfeat, 0, s.col), F, B_, s.cols, drnn.dtype());
  }
  if (adapted) {  // the recurrence's weight gradients, turned into the adapters' below
    work_.zero_grad(be);
    Tensor dx = rnn_->backward(be, drnn, dh_n, dc_n);
    adapter_backward(be);
    if (grad_ready_) grad_ready_(0, params_.size());
    return embedding_ ? Tensor() : dx;  // a frozen embedding takes no gradient
  }
  Tensor dx = rnn_->backward(be, drnn, dh_n, dc_n);
  if (grad_ready_) grad_ready_(rnn_first_, head_first_);
  if (!embedding_) return dx;
  SF_PROFILE_SCOPE("embedding backward");
  embedding_->backward(be, dx.reshape({dx.dim(0) * dx.dim(1), opt_.embedding_dim}));
  if (grad_ready_) grad_ready_(0, rnn_first_);
  return Tensor();
}

}  // namespace seqforge
