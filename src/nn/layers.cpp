#include "seqforge/nn/layers.hpp"

#include <cmath>

#include "seqforge/backend/backend.hpp"

namespace seqforge {

// ---- Linear ----------------------------------------------------------------------------------

Linear::Linear(Parameters& params, const std::string& prefix, int64_t in, int64_t out, bool bias)
    : params_(params), in_(in), out_(out) {
  SF_CHECK(in > 0 && out > 0, "Linear ", prefix, ": sizes ", in, " -> ", out);
  const double bound = 1.0 / std::sqrt(double(in));  // PyTorch: kaiming_uniform(a=sqrt(5))
  weight_ = params.declare(prefix + ".weight", {out, in}, Init::Uniform(bound));
  if (bias) bias_ = params.declare(prefix + ".bias", {out}, Init::Uniform(bound));
}

Tensor Linear::forward(Backend& be, Tensor x) {
  SF_CHECK(x.shape().rank() == 2 && x.dim(1) == in_, "Linear expects (N, ", in_, "), got ",
           x.shape().str());
  const int64_t n = x.dim(0);
  x_ = x;
  Tensor y = y_.get(be, params_.dtype(), {n, out_});  // (N, out)
  const bool has_bias = bias_ != SIZE_MAX;
  GemmShape s{.trans_b = true, .m = n, .n = out_, .k = in_, .lda = in_, .ldb = in_, .ldc = out_};
  s.bias = has_bias;
  be.gemm(s, params_.dtype(), x.data(), params_.value(weight_).data(), y.data(),
          has_bias ? params_.value(bias_).data() : nullptr);
  return y;
}

Tensor Linear::backward(Backend& be, Tensor dy) {
  const int64_t n = x_.dim(0);
  SF_CHECK(dy.shape() == Shape({n, out_}), "Linear backward: dy ", dy.shape().str());
  // dW(out, in) += dy^T(out, N) x(N, in)
  GemmShape dw{.trans_a = true,
               .m = out_,
               .n = in_,
               .k = n,
               .lda = out_,
               .ldb = in_,
               .ldc = in_,
               .beta = 1.0f};
  be.gemm(dw, params_.dtype(), dy.data(), x_.data(), params_.grad(weight_).data());
  if (bias_ != SIZE_MAX) be.sum_rows_acc(params_.grad(bias_), dy);
  // dx(N, in) = dy(N, out) W(out, in)
  Tensor dx = dx_.get(be, params_.dtype(), {n, in_});
  GemmShape dxs{.m = n, .n = in_, .k = out_, .lda = out_, .ldb = in_, .ldc = in_};
  be.gemm(dxs, params_.dtype(), dy.data(), params_.value(weight_).data(), dx.data());
  return dx;
}

// ---- Embedding -------------------------------------------------------------------------------

Embedding::Embedding(Parameters& params, const std::string& prefix, int64_t vocab, int64_t dim)
    : params_(params), vocab_(vocab), dim_(dim) {
  SF_CHECK(vocab > 0 && dim > 0, "Embedding ", prefix, ": ", vocab, " x ", dim);
  table_ = params.declare(prefix + ".weight", {vocab, dim}, Init::Normal(0.0, 1.0));
}

Tensor Embedding::forward(Backend& be, Tensor ids) {
  ids_ = ids;
  Tensor y = y_.get(be, params_.dtype(), {ids.numel(), dim_});  // (N, dim)
  be.embedding_forward(y, params_.value(table_), ids);
  return y;
}

void Embedding::backward(Backend& be, Tensor dy) {
  SF_CHECK(dy.shape() == Shape({ids_.numel(), dim_}), "Embedding backward: dy ", dy.shape().str());
  be.embedding_backward(params_.grad(table_), dy, ids_);
}

// ---- Dropout ---------------------------------------------------------------------------------

Dropout::Dropout(double p) : p_(p) {
  if (!(p >= 0.0 && p < 1.0)) fail("dropout probability ", p, " outside [0, 1)");
}

Tensor Dropout::forward(Backend& be, Tensor x, bool training, Rng& rng) {
  active_ = training && p_ > 0.0;
  if (!active_) return x;
  Tensor mask = mask_.get(be, x.dtype(), x.shape());
  be.dropout_mask(mask, p_, rng.next());
  Tensor y = y_.get(be, x.dtype(), x.shape());
  be.mul(y, x, mask);
  return y;
}

Tensor Dropout::backward(Backend& be, Tensor dy) {
  if (!active_) return dy;
  Tensor dx = dx_.get(be, dy.dtype(), dy.shape());
  be.mul(dx, dy, mask_.tensor());
  return dx;
}

}  // namespace seqforge
