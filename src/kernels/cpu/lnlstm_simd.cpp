// The layer-normalised LSTM cell's f32 SIMD kernels (kernels/cells/lnlstm.hpp has the reference
// and the formulas), dispatched at run time to the best instruction set available.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/lnlstm_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <vector>
// clang-format off
#include <hwy/highway.h>
// clang-format on

#include "kernels/cells.hpp"
#include "kernels/cells/lnlstm.hpp"
#include "kernels/cpu/cell_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out = LN(x) over n values; returns 1 / sqrt(var + eps).
HWY_INLINE float LayerNormRow(const float* x, float* out, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), n_vec = n / N * N;
  auto acc = hn::Zero(d);
  for (int64_t j = 0; j < n_vec; j += N) acc = hn::Add(acc, hn::LoadU(d, x + j));
  float sum = hn::GetLane(hn::SumOfLanes(d, acc));
  for (int64_t j = n_vec; j < n; ++j) sum += x[j];
  const float mean = sum / static_cast<float>(n);
  const auto m = hn::Set(d, mean);
  acc = hn::Zero(d);
  for (int64_t j = 0; j < n_vec; j += N) {
    const auto v = hn::Sub(hn::LoadU(d, x + j), m);
    acc = hn::MulAdd(v, v, acc);
  }
  float var = hn::GetLane(hn::SumOfLanes(d, acc));
  for (int64_t j = n_vec; j < n; ++j) var += (x[j] - mean) * (x[j] - mean);
  const float rstd =
      1.0f / std::sqrt(var / static_cast<float>(n) + static_cast<float>(ref::kLayerNormEps));
  const auto r = hn::Set(d, rstd);
  for (int64_t j = 0; j < n_vec; j += N)
    hn::StoreU(hn::Mul(hn::Sub(hn::LoadU(d, x + j), m), r), d, out + j);
  for (int64_t j = n_vec; j < n; ++j) out[j] = (x[j] - mean) * rstd;
  return rstd;
}

// dx = rstd (dy - mean(dy) - y mean(dy y)).
HWY_INLINE void LayerNormBackwardRow(const float* dy, const float* y, float rstd, float* dx,
                                     int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), n_vec = n / N * N;
  auto a1 = hn::Zero(d), a2 = hn::Zero(d);
  for (int64_t j = 0; j < n_vec; j += N) {
    const auto g = hn::LoadU(d, dy + j);
    a1 = hn::Add(a1, g);
    a2 = hn::MulAdd(g, hn::LoadU(d, y + j), a2);
  }
  float m1 = hn::GetLane(hn::SumOfLanes(d, a1)), m2 = hn::GetLane(hn::SumOfLanes(d, a2));
  for (int64_t j = n_vec; j < n; ++j) {
    m1 += dy[j];
    m2 += dy[j] * y[j];
  }
  m1 /= static_cast<float>(n);
  m2 /= static_cast<float>(n);
  const auto v1 = hn::Set(d, m1), v2 = hn::Set(d, m2), r = hn::Set(d, rstd);
  for (int64_t j = 0; j < n_vec; j += N) {
    const auto t = hn::NegMulAdd(hn::LoadU(d, y + j), v2, hn::Sub(hn::LoadU(d, dy + j), v1));
    hn::StoreU(hn::Mul(r, t), d, dx + j);
  }
  for (int64_t j = n_vec; j < n; ++j) dx[j] = rstd * (dy[j] - m1 - y[j] * m2);
}

void LnLstmForwardRows(const CellForward& p, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t H = p.hidden, NG = 4 * H, W = 10 * H + 3, N = static_cast<int64_t>(hn::Lanes(d));
  const float* g_ih = static_cast<const float*>(p.params);
  const float *g_hh = g_ih + NG, *g_c = g_hh + NG, *b_c = g_c + H;
  const float* bias = static_cast<const float*>(p.bias);
  thread_local std::vector<float> act;
  if (act.size() < static_cast<size_t>(NG)) act.resize(NG);
  for (int64_t b = r0; b < r1; ++b) {
    float* gates = static_cast<float*>(p.gates) + b * NG;
    const float* rec = static_cast<const float*>(p.gates_rec) + b * NG;
    float* saved = static_cast<float*>(p.saved) + b * W;
    float *g_hat = saved, *r_hat = saved + NG, *c_hat = saved + 2 * NG, *tc = c_hat + H;
    float* rstd = tc + H;
    rstd[0] = LayerNormRow(gates, g_hat, NG);
    rstd[1] = LayerNormRow(rec, r_hat, NG);
    // The pre-activations and activations of gate k (tanh for g, k = 2), columns [0, H).
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t o = k * H, H_vec = H / N * N;
      for (int64_t j = 0; j < H_vec; j += N) {
        const auto pre =
            hn::MulAdd(hn::LoadU(d, g_ih + o + j), hn::LoadU(d, g_hat + o + j),
                       hn::MulAdd(hn::LoadU(d, g_hh + o + j), hn::LoadU(d, r_hat + o + j),
                                  hn::LoadU(d, bias + o + j)));
        hn::StoreU(k == 2 ? FastTanh(d, pre) : Sigmoid(d, pre), d, act.data() + o + j);
      }
      for (int64_t j = H_vec; j < H; ++j) {
        const float pre = g_ih[o + j] * g_hat[o + j] + g_hh[o + j] * r_hat[o + j] + bias[o + j];
        act[o + j] = k == 2 ? std::tanh(pre) : ref::sigmoid(pre);
      }
    }
    const float* c_prev = static_cast<const float*>(p.c_prev) + b * H;
    float* c = static_cast<float*>(p.c) + b * H;
    const float* a = act.data();
    const int64_t H_vec = H / N * N;
    for (int64_t j = 0; j < H_vec; j += N)
      hn::StoreU(hn::MulAdd(hn::LoadU(d, a + H + j), hn::LoadU(d, c_prev + j),
                            hn::Mul(hn::LoadU(d, a + j), hn::LoadU(d, a + 2 * H + j))),
                 d, c + j);
    for (int64_t j = H_vec; j < H; ++j) c[j] = a[H + j] * c_prev[j] + a[j] * a[2 * H + j];
    rstd[2] = LayerNormRow(c, c_hat, H);
    float* h = static_cast<float*>(p.h) + b * p.ldh;
    for (int64_t j = 0; j < H_vec; j += N) {
      const auto t = FastTanh(
          d, hn::MulAdd(hn::LoadU(d, g_c + j), hn::LoadU(d, c_hat + j), hn::LoadU(d, b_c + j)));
      hn::StoreU(t, d, tc + j);
      hn::StoreU(hn::Mul(hn::LoadU(d, a + 3 * H + j), t), d, h + j);
    }
    for (int64_t j = H_vec; j < H; ++j) {
      tc[j] = std::tanh(g_c[j] * c_hat[j] + b_c[j]);
      h[j] = a[3 * H + j] * tc[j];
    }
    if (p.gates_low)
      ToBf16Row(a, static_cast<bf16*>(p.gates_low) + b * NG, NG);
    else
      std::copy(a, a + NG, gates);
    if (p.h_low) ToBf16Row(h, static_cast<bf16*>(p.h_low) + b * p.ldh, H);
  }
}

void LnLstmBackwardRows(const CellBackward& p, int64_t r0, int64_t r1, float* dbias) {
  const hn::ScalableTag<float> d;
  const int64_t H = p.hidden, NG = 4 * H, W = 10 * H + 3, N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t H_vec = H / N * N, NG_vec = NG / N * N;
  const auto one = hn::Set(d, 1.0f);
  const float* g_ih = static_cast<const float*>(p.params);
  const float *g_hh = g_ih + NG, *g_c = g_hh + NG;
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(5 * NG + 3 * H)) scratch.resize(5 * NG + 3 * H);
  float *act = scratch.data(), *dpre = act + NG, *d_hat = dpre + NG, *dg = d_hat + NG;
  float *dr = dg + NG, *dt = dr + NG, *dc_hat = dt + H, *dc_norm = dc_hat + H;
  for (int64_t b = r0; b < r1; ++b) {
    if (p.gates_low) {
      const bf16* low = static_cast<const bf16*>(p.gates_low) + b * NG;
      for (int64_t j = 0; j < NG_vec; j += N) hn::StoreU(LoadBf16(d, low + j), d, act + j);
      for (int64_t j = NG_vec; j < NG; ++j) act[j] = from_bf16(low[j]);
    } else {
      const float* saved_act = static_cast<const float*>(p.gates) + b * NG;
      std::copy(saved_act, saved_act + NG, act);
    }
    const float* saved = static_cast<const float*>(p.saved) + b * W;
    const float *g_hat = saved, *r_hat = saved + NG, *c_hat = saved + 2 * NG, *tc = c_hat + H;
    const float* rstd = tc + H;
    const float* c_prev = static_cast<const float*>(p.c_prev) + b * H;
    const float* dh_out =
        p.dh_out ? static_cast<const float*>(p.dh_out) + b * p.ld_dh_out : nullptr;
    const float* dh_rec = p.dh_rec ? static_cast<const float*>(p.dh_rec) + b * H : nullptr;
    float* dc = static_cast<float*>(p.dc) + b * H;
    for (int64_t j = 0; j < H_vec; j += N) {
      auto dh = hn::Zero(d);
      if (dh_out) dh = hn::Add(dh, hn::LoadU(d, dh_out + j));
      if (dh_rec) dh = hn::Add(dh, hn::LoadU(d, dh_rec + j));
      const auto o = hn::LoadU(d, act + 3 * H + j), t = hn::LoadU(d, tc + j);
      const auto dtv = hn::Mul(hn::Mul(dh, o), hn::NegMulAdd(t, t, one));
      hn::StoreU(dtv, d, dt + j);
      hn::StoreU(hn::Mul(dtv, hn::LoadU(d, g_c + j)), d, dc_hat + j);
      hn::StoreU(hn::Mul(hn::Mul(dh, t), hn::Mul(o, hn::Sub(one, o))), d, dpre + 3 * H + j);
    }
    for (int64_t j = H_vec; j < H; ++j) {
      float dh = 0;
      if (dh_out) dh += dh_out[j];
      if (dh_rec) dh += dh_rec[j];
      const float o = act[3 * H + j];
      dt[j] = dh * o * (1.0f - tc[j] * tc[j]);
      dc_hat[j] = dt[j] * g_c[j];
      dpre[3 * H + j] = dh * tc[j] * o * (1.0f - o);
    }
    LayerNormBackwardRow(dc_hat, c_hat, rstd[2], dc_norm, H);
    for (int64_t j = 0; j < H_vec; j += N) {
      const auto i = hn::LoadU(d, act + j), f = hn::LoadU(d, act + H + j);
      const auto g = hn::LoadU(d, act + 2 * H + j);
      const auto dct = hn::Add(hn::LoadU(d, dc + j), hn::LoadU(d, dc_norm + j));
      hn::StoreU(hn::Mul(hn::Mul(dct, g), hn::Mul(i, hn::Sub(one, i))), d, dpre + j);
      hn::StoreU(hn::Mul(hn::Mul(dct, hn::LoadU(d, c_prev + j)), hn::Mul(f, hn::Sub(one, f))), d,
                 dpre + H + j);
      hn::StoreU(hn::Mul(hn::Mul(dct, i), hn::NegMulAdd(g, g, one)), d, dpre + 2 * H + j);
      hn::StoreU(hn::Mul(dct, f), d, dc + j);
    }
    for (int64_t j = H_vec; j < H; ++j) {
      const float i = act[j], f = act[H + j], g = act[2 * H + j];
      const float dct = dc[j] + dc_norm[j];
      dpre[j] = dct * g * i * (1.0f - i);
      dpre[H + j] = dct * c_prev[j] * f * (1.0f - f);
      dpre[2 * H + j] = dct * i * (1.0f - g * g);
      dc[j] = dct * f;
    }
    for (int64_t j = 0; j < NG_vec; j += N)
      hn::StoreU(hn::Mul(hn::LoadU(d, dpre + j), hn::LoadU(d, g_ih + j)), d, d_hat + j);
    for (int64_t j = NG_vec; j < NG; ++j) d_hat[j] = dpre[j] * g_ih[j];
    LayerNormBackwardRow(d_hat, g_hat, rstd[0], dg, NG);
    for (int64_t j = 0; j < NG_vec; j += N)
      hn::StoreU(hn::Mul(hn::LoadU(d, dpre + j), hn::LoadU(d, g_hh + j)), d, d_hat + j);
    for (int64_t j = NG_vec; j < NG; ++j) d_hat[j] = dpre[j] * g_hh[j];
    LayerNormBackwardRow(d_hat, r_hat, rstd[1], dr, NG);
    if (p.dgates) std::copy(dg, dg + NG, static_cast<float*>(p.dgates) + b * NG);
    if (p.dgates_low) ToBf16Row(dg, static_cast<bf16*>(p.dgates_low) + b * NG, NG);
    if (p.dgates_rec) std::copy(dr, dr + NG, static_cast<float*>(p.dgates_rec) + b * NG);
    if (p.dgates_rec_low) ToBf16Row(dr, static_cast<bf16*>(p.dgates_rec_low) + b * NG, NG);
    if (dbias) {  // d b_ih, d b_hh, d g_ih, d g_hh, d g_c, d b_c
      AddRow(dbias, dpre, NG);
      AddRow(dbias + NG, dpre, NG);
      for (int64_t j = 0; j < NG_vec; j += N) {
        const auto dp = hn::LoadU(d, dpre + j);
        float* a = dbias + 2 * NG + j;
        hn::StoreU(hn::MulAdd(dp, hn::LoadU(d, g_hat + j), hn::LoadU(d, a)), d, a);
        float* r = dbias + 3 * NG + j;
        hn::StoreU(hn::MulAdd(dp, hn::LoadU(d, r_hat + j), hn::LoadU(d, r)), d, r);
      }
      for (int64_t j = NG_vec; j < NG; ++j) {
        dbias[2 * NG + j] += dpre[j] * g_hat[j];
        dbias[3 * NG + j] += dpre[j] * r_hat[j];
      }
      for (int64_t j = 0; j < H; ++j) {
        dbias[4 * NG + j] += dt[j] * c_hat[j];
        dbias[4 * NG + H + j] += dt[j];
      }
    }
  }
}

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqforge::simd {

HWY_EXPORT(LnLstmForwardRows);
HWY_EXPORT(LnLstmBackwardRows);

void lnlstm_cell_forward(const CellForward& p, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(LnLstmForwardRows)(p, r0, r1);
}
void lnlstm_cell_backward(const CellBackward& p, int64_t r0, int64_t r1, float* dbias) {
  HWY_DYNAMIC_DISPATCH(LnLstmBackwardRows)(p, r0, r1, dbias);
}

}  // namespace seqforge::simd
#endif
