#include "seqforge/nn/layers.hpp"

#include <algorithm>
#include <cmath>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/profiler.hpp"

namespace seqforge {

// ---- Linear ----------------------------------------------------------------------------------

Linear::Linear(Parameters& params, const std::string& prefix, int64_t in, int64_t out, bool bias)
    : Linear(params, prefix, in, out, bias,
             Init::Uniform(1.0 / std::sqrt(double(std::max<int64_t>(in, 1)))),
             Init::Uniform(1.0 / std::sqrt(double(std::max<int64_t>(in, 1))))) {
}  // kaiming_uniform(a=sqrt(5))

Linear::Linear(Parameters& params, const std::string& prefix, int64_t in, int64_t out, bool bias,
               Init weight_init, Init bias_init)
    : params_(params), in_(in), out_(out) {
  SF_CHECK(in > 0 && out > 0, "Linear ", prefix, ": sizes ", in, " -> ", out);
  weight_ = params.declare(prefix + ".weight", {out, in}, weight_init);
  if (bias) bias_ = params.declare(prefix + ".bias", {out}, bias_init);
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
  const void* bias = has_bias ? params_.value(bias_).data() : nullptr;
  if (!low_) {
    be.gemm(s, params_.dtype(), x.data(), params_.value(weight_).data(), y.data(), bias);
    return y;
  }
  Tensor x_low = x_low_.get(be, DType::bf16, x.shape());
  Tensor w_low = w_low_.get(be, DType::bf16, {out_, in_});
  be.convert(x_low, x);
  be.convert(w_low, params_.value(weight_));  // the weights change at every step
  be.gemm(s, DType::bf16, x_low.data(), w_low.data(), y.data(), bias);
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
  GemmShape dxs{.m = n, .n = in_, .k = out_, .lda = out_, .ldb = in_, .ldc = in_};
  Tensor dx = dx_.get(be, params_.dtype(), {n, in_});
  if (bias_ != SIZE_MAX) be.sum_rows_acc(params_.grad(bias_), dy);
  if (!low_) {
    be.gemm(dw, params_.dtype(), dy.data(), x_.data(), params_.grad(weight_).data());
    // dx(N, in) = dy(N, out) W(out, in)
    be.gemm(dxs, params_.dtype(), dy.data(), params_.value(weight_).data(), dx.data());
    return dx;
  }
  Tensor dy_low = dy_low_.get(be, DType::bf16, dy.shape());
  be.convert(dy_low, dy);
  be.gemm(dw, DType::bf16, dy_low.data(), x_low_.tensor().data(), params_.grad(weight_).data());
  be.gemm(dxs, DType::bf16, dy_low.data(), w_low_.tensor().data(), dx.data());
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

// ---- LayerNorm -------------------------------------------------------------------------------

LayerNorm::LayerNorm(Parameters& params, const std::string& prefix, int64_t dim, double eps)
    : params_(params), dim_(dim), eps_(eps) {
  weight_ = params.declare(prefix + ".weight", {dim}, Init::Constant(1.0));
  bias_ = params.declare(prefix + ".bias", {dim}, Init::Constant(0.0));
}

Tensor LayerNorm::forward(Backend& be, Tensor x) {
  SF_CHECK(x.shape().rank() == 2 && x.dim(1) == dim_, "LayerNorm expects (N, ", dim_, "), got ",
           x.shape().str());
  x_ = x;
  Tensor y = y_.get(be, params_.dtype(), x.shape());
  Tensor saved = saved_.get(be, params_.dtype(), {x.dim(0), 2});
  SF_PROFILE_SCOPE("layer norm");
  be.layer_norm_forward(y, saved, x, params_.value(weight_), params_.value(bias_), eps_);
  return y;
}

Tensor LayerNorm::backward(Backend& be, Tensor dy) {
  SF_CHECK(dy.shape() == x_.shape(), "LayerNorm backward: dy ", dy.shape().str());
  SF_PROFILE_SCOPE("layer norm");
  Tensor dx = dx_.get(be, params_.dtype(), dy.shape());
  be.layer_norm_backward(dx, params_.grad(weight_), params_.grad(bias_), dy, x_,
                         params_.value(weight_), saved_.tensor());
  return dx;
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
