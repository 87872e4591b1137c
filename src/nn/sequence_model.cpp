#include "seqforge/nn/sequence_model.hpp"

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/profiler.hpp"

namespace seqforge {

SequenceModel::SequenceModel(const ModelOptions& options, DType dtype)
    : opt_(options), params_(dtype) {
  if (opt_.vocab_size > 0) {
    embedding_ =
        std::make_unique<Embedding>(params_, "embedding", opt_.vocab_size, opt_.embedding_dim);
    opt_.rnn.input_size = opt_.embedding_dim;
  }
  rnn_first_ = params_.size();
  rnn_ = std::make_unique<Recurrent>(params_, cell_type(opt_.rnn.cell).name, opt_.rnn);
  head_first_ = params_.size();
  head_ = std::make_unique<Linear>(params_, "head", rnn_->output_size(), opt_.output_size);
}

void SequenceModel::initialize(Backend& be, uint64_t seed) {
  Rng rng(seed);
  params_.allocate(be, rng);
}

Tensor SequenceModel::forward(Backend& be, Tensor x, Tensor h0, Tensor c0, bool training,
                              Rng& rng) {
  SF_PROFILE_SCOPE("forward");
  const bool bf = opt_.rnn.batch_first;
  Tensor features = x;
  if (embedding_) {
    SF_PROFILE_SCOPE("embedding forward");
    if (x.shape().rank() != 2)
      fail("token ids must be ", bf ? "(B, T)" : "(T, B)", ", got ", x.shape().str());
    Tensor e = embedding_->forward(be, x.reshape({x.numel()}));
    features = e.reshape({x.dim(0), x.dim(1), opt_.embedding_dim});
  }
  Tensor y = rnn_->forward(be, features, h0, c0, training, rng);
  T_ = bf ? y.dim(1) : y.dim(0);
  B_ = bf ? y.dim(0) : y.dim(1);
  const int64_t F = rnn_->output_size();
  SF_PROFILE_SCOPE("head forward");
  if (opt_.per_step) return head_->forward(be, y.reshape({T_ * B_, F}));
  if (T_ == 0) fail("sequence length is 0: no last step to predict from");
  Tensor last = last_.get(be, params_.dtype(), {B_, F});  // (B, D*H)
  if (bf) {
    be.copy_rows(last.data(), F,
                 static_cast<char*>(y.data()) + (T_ - 1) * F * dtype_size(y.dtype()), T_ * F, B_, F,
                 y.dtype());
  } else {
    be.copy(last, y.slice(T_ - 1, T_));
  }
  return head_->forward(be, last);
}

Tensor SequenceModel::backward(Backend& be, Tensor dy, Tensor dh_n, Tensor dc_n) {
  SF_PROFILE_SCOPE("backward");
  const bool bf = opt_.rnn.batch_first;
  const int64_t F = rnn_->output_size();
  const Shape y_shape = bf ? Shape{B_, T_, F} : Shape{T_, B_, F};
  Tensor dfeat;
  {
    SF_PROFILE_SCOPE("head backward");
    dfeat = head_->backward(be, dy);  // (rows, F)
  }
  if (grad_ready_) grad_ready_(head_first_, params_.size());
  Tensor drnn;
  if (opt_.per_step) {
    drnn = dfeat.reshape(y_shape);
  } else if (rnn_->directions() == 1) {
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
    if (bf) {
      be.copy_rows(static_cast<char*>(drnn.data()) + (T_ - 1) * F * dtype_size(drnn.dtype()),
                   T_ * F, dfeat.data(), F, B_, F, drnn.dtype());
    } else {
      be.copy(drnn.slice(T_ - 1, T_), dfeat);
    }
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
