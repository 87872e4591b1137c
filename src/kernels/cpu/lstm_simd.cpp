// The LSTM cell's f32 SIMD kernels (kernels/cells/lstm.hpp has the reference), dispatched at
// run time to the best instruction set available.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/lstm_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <vector>
// clang-format off
#include <hwy/highway.h>
// clang-format on

#include "kernels/cells.hpp"
#include "kernels/cells/lstm.hpp"
#include "kernels/cpu/cell_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void LstmForwardRows(const CellForward& p, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t H = p.hidden, N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t H_vec = H / N * N;
  thread_local std::vector<float> row;  // a row's pre-activations when gates is null
  if (!p.gates && row.size() < static_cast<size_t>(4 * H)) row.resize(4 * H);
  for (int64_t b = r0; b < r1; ++b) {
    float* gates = p.gates ? static_cast<float*>(p.gates) + b * 4 * H : row.data();  // (4H)
    bf16* low = p.gates_low ? static_cast<bf16*>(p.gates_low) + b * 4 * H : nullptr;
    const float* c_prev = static_cast<const float*>(p.c_prev) + b * H;
    float* c = static_cast<float*>(p.c) + b * H;
    float* tanh_c = static_cast<float*>(p.saved) + b * H;
    float* h = static_cast<float*>(p.h) + b * p.ldh;
    const float* rec = p.gates_rec ? static_cast<const float*>(p.gates_rec) + b * 4 * H : nullptr;
    const float* x = p.x ? static_cast<const float*>(p.x) + b * p.ldx : nullptr;
    const float* w_ih_t = static_cast<const float*>(p.w_ih_t);
    const float* bias = static_cast<const float*>(p.bias);
    // Pre-activation of gate k at column j: G, or bias + x W_ih^T when x is given, plus R (the
    // recurrent GEMM's output) when given.
    auto pre = [&](int64_t k, int64_t j) {
      auto g = hn::Zero(d);
      if (x) {
        g = hn::LoadU(d, bias + k * H + j);
        for (int64_t i = 0; i < p.input; ++i)
          g = hn::MulAdd(hn::Set(d, x[i]), hn::LoadU(d, w_ih_t + i * 4 * H + k * H + j), g);
      } else {
        g = hn::LoadU(d, gates + k * H + j);
      }
      return rec ? hn::Add(g, hn::LoadU(d, rec + k * H + j)) : g;
    };
    for (int64_t j = 0; j < H_vec; j += N) {
      const auto i = Sigmoid(d, pre(0, j));
      const auto f = Sigmoid(d, pre(1, j));
      const auto g = FastTanh(d, pre(2, j));
      const auto o = Sigmoid(d, pre(3, j));
      if (low) {
        StoreBf16(d, i, low + j);
        StoreBf16(d, f, low + H + j);
        StoreBf16(d, g, low + 2 * H + j);
        StoreBf16(d, o, low + 3 * H + j);
      } else {
        hn::StoreU(i, d, gates + j);
        hn::StoreU(f, d, gates + H + j);
        hn::StoreU(g, d, gates + 2 * H + j);
        hn::StoreU(o, d, gates + 3 * H + j);
      }
      const auto cv = hn::MulAdd(f, hn::LoadU(d, c_prev + j), hn::Mul(i, g));
      const auto tc = FastTanh(d, cv);
      hn::StoreU(cv, d, c + j);
      hn::StoreU(tc, d, tanh_c + j);
      hn::StoreU(hn::Mul(o, tc), d, h + j);
    }
    if (H_vec < H) {  // the tail, with the reference formulas
      if (x)
        for (int64_t k = 0; k < 4; ++k)
          for (int64_t j = H_vec; j < H; ++j) {
            float acc = bias[k * H + j];
            for (int64_t i = 0; i < p.input; ++i) acc += x[i] * w_ih_t[i * 4 * H + k * H + j];
            gates[k * H + j] = acc;
          }
      if (rec)
        for (int64_t k = 0; k < 4; ++k)
          for (int64_t j = H_vec; j < H; ++j) gates[k * H + j] += rec[k * H + j];
      for (int64_t j = H_vec; j < H; ++j) {
        const float i = ref::sigmoid(gates[j]), f = ref::sigmoid(gates[H + j]);
        const float g = std::tanh(gates[2 * H + j]), o = ref::sigmoid(gates[3 * H + j]);
        gates[j] = i;
        gates[H + j] = f;
        gates[2 * H + j] = g;
        gates[3 * H + j] = o;
        if (low)
          for (int64_t k = 0; k < 4; ++k) low[k * H + j] = to_bf16(gates[k * H + j]);
        c[j] = f * c_prev[j] + i * g;
        tanh_c[j] = std::tanh(c[j]);
        h[j] = o * tanh_c[j];
      }
    }
    if (p.h_low) ToBf16Row(h, static_cast<bf16*>(p.h_low) + b * p.ldh, H);
  }
}

void LstmBackwardRows(const CellBackward& p, int64_t r0, int64_t r1, float* dbias) {
  const hn::ScalableTag<float> d;
  const int64_t H = p.hidden, N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t H_vec = H / N * N;
  const auto one = hn::Set(d, 1.0f);
  thread_local std::vector<float> row;  // a row's dgates when only the bf16 copy is kept
  if (!p.dgates && row.size() < static_cast<size_t>(4 * H)) row.resize(4 * H);
  for (int64_t b = r0; b < r1; ++b) {
    const float* saved = p.gates ? static_cast<const float*>(p.gates) + b * 4 * H : nullptr;
    const bf16* saved_low =
        p.gates_low ? static_cast<const bf16*>(p.gates_low) + b * 4 * H : nullptr;
    auto gate = [&](int64_t j) {
      return saved_low ? LoadBf16(d, saved_low + j) : hn::LoadU(d, saved + j);
    };
    auto gate_scalar = [&](int64_t j) { return saved_low ? from_bf16(saved_low[j]) : saved[j]; };
    const float* c_prev = static_cast<const float*>(p.c_prev) + b * H;
    const float* tanh_c = static_cast<const float*>(p.saved) + b * H;
    const float* dh_out =
        p.dh_out ? static_cast<const float*>(p.dh_out) + b * p.ld_dh_out : nullptr;
    const float* dh_rec = p.dh_rec ? static_cast<const float*>(p.dh_rec) + b * H : nullptr;
    float* dc = static_cast<float*>(p.dc) + b * H;
    float* dgates = p.dgates ? static_cast<float*>(p.dgates) + b * 4 * H : row.data();
    for (int64_t j = 0; j < H_vec; j += N) {
      const auto i = gate(j), f = gate(H + j), g = gate(2 * H + j), o = gate(3 * H + j);
      auto dh = hn::Zero(d);
      if (dh_out) dh = hn::Add(dh, hn::LoadU(d, dh_out + j));
      if (dh_rec) dh = hn::Add(dh, hn::LoadU(d, dh_rec + j));
      const auto tc = hn::LoadU(d, tanh_c + j);
      // dc_t = dc + dh * o * (1 - tc^2)
      const auto dct = hn::MulAdd(hn::Mul(dh, o), hn::NegMulAdd(tc, tc, one), hn::LoadU(d, dc + j));
      hn::StoreU(hn::Mul(hn::Mul(dct, g), hn::Mul(i, hn::Sub(one, i))), d, dgates + j);
      hn::StoreU(hn::Mul(hn::Mul(dct, hn::LoadU(d, c_prev + j)), hn::Mul(f, hn::Sub(one, f))), d,
                 dgates + H + j);
      hn::StoreU(hn::Mul(hn::Mul(dct, i), hn::NegMulAdd(g, g, one)), d, dgates + 2 * H + j);
      hn::StoreU(hn::Mul(hn::Mul(dh, tc), hn::Mul(o, hn::Sub(one, o))), d, dgates + 3 * H + j);
      hn::StoreU(hn::Mul(dct, f), d, dc + j);
    }
    for (int64_t j = H_vec; j < H; ++j) {
      const float i = gate_scalar(j), f = gate_scalar(H + j);
      const float g = gate_scalar(2 * H + j), o = gate_scalar(3 * H + j);
      float dh = 0;
      if (dh_out) dh += dh_out[j];
      if (dh_rec) dh += dh_rec[j];
      const float tc = tanh_c[j];
      const float dct = dc[j] + dh * o * (1.0f - tc * tc);
      dgates[j] = dct * g * i * (1.0f - i);
      dgates[H + j] = dct * c_prev[j] * f * (1.0f - f);
      dgates[2 * H + j] = dct * i * (1.0f - g * g);
      dgates[3 * H + j] = dh * tc * o * (1.0f - o);
      dc[j] = dct * f;
    }
    if (p.dgates_low) ToBf16Row(dgates, static_cast<bf16*>(p.dgates_low) + b * 4 * H, 4 * H);
    if (dbias) AddRow(dbias, dgates, 4 * H);
  }
}

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqforge::simd {

HWY_EXPORT(LstmForwardRows);
HWY_EXPORT(LstmBackwardRows);

void lstm_cell_forward(const CellForward& p, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(LstmForwardRows)(p, r0, r1);
}
void lstm_cell_backward(const CellBackward& p, int64_t r0, int64_t r1, float* dbias) {
  HWY_DYNAMIC_DISPATCH(LstmBackwardRows)(p, r0, r1, dbias);
}

}  // namespace seqforge::simd
#endif
