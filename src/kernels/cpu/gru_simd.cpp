// The GRU cell's f32 SIMD kernels (kernels/cells/gru.hpp has the reference and the formulas),
// dispatched at run time to the best instruction set available.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/gru_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <vector>
// clang-format off
#include <hwy/highway.h>
// clang-format on

#include "kernels/cells.hpp"
#include "kernels/cells/gru.hpp"
#include "kernels/cpu/cell_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void GruForwardRows(const CellForward& p, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t H = p.hidden, N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t H_vec = H / N * N;
  thread_local std::vector<float> row;  // a row's input projection when gates is null
  if (!p.gates && row.size() < static_cast<size_t>(3 * H)) row.resize(3 * H);
  const float* b_hn = static_cast<const float*>(p.bias_rec);
  const float* w_ih_t = static_cast<const float*>(p.w_ih_t);
  const float* bias = static_cast<const float*>(p.bias);
  for (int64_t b = r0; b < r1; ++b) {
    float* gates = p.gates ? static_cast<float*>(p.gates) + b * 3 * H : row.data();  // (3H)
    bf16* low = p.gates_low ? static_cast<bf16*>(p.gates_low) + b * 3 * H : nullptr;
    const float* rec = static_cast<const float*>(p.gates_rec) + b * 3 * H;
    const float* h_prev = static_cast<const float*>(p.h_prev) + b * p.ld_h_prev;
    float* hn_out = static_cast<float*>(p.saved) + b * H;
    float* h = static_cast<float*>(p.h) + b * p.ldh;
    const float* x = p.x ? static_cast<const float*>(p.x) + b * p.ldx : nullptr;
    // The input projection of gate k at column j: G, or bias + x W_ih^T when x is given.
    auto input = [&](int64_t k, int64_t j) {
      if (!x) return hn::LoadU(d, gates + k * H + j);
      auto g = hn::LoadU(d, bias + k * H + j);
      for (int64_t i = 0; i < p.input; ++i)
        g = hn::MulAdd(hn::Set(d, x[i]), hn::LoadU(d, w_ih_t + i * 3 * H + k * H + j), g);
      return g;
    };
    for (int64_t j = 0; j < H_vec; j += N) {
      const auto r = Sigmoid(d, hn::Add(input(0, j), hn::LoadU(d, rec + j)));
      const auto z = Sigmoid(d, hn::Add(input(1, j), hn::LoadU(d, rec + H + j)));
      const auto hn_v = hn::Add(hn::LoadU(d, rec + 2 * H + j), hn::LoadU(d, b_hn + j));
      const auto n = FastTanh(d, hn::MulAdd(r, hn_v, input(2, j)));
      if (low) {
        StoreBf16(d, r, low + j);
        StoreBf16(d, z, low + H + j);
        StoreBf16(d, n, low + 2 * H + j);
      } else {
        hn::StoreU(r, d, gates + j);
        hn::StoreU(z, d, gates + H + j);
        hn::StoreU(n, d, gates + 2 * H + j);
      }
      hn::StoreU(hn_v, d, hn_out + j);
      hn::StoreU(hn::MulAdd(z, hn::Sub(hn::LoadU(d, h_prev + j), n), n), d, h + j);
    }
    for (int64_t j = H_vec; j < H; ++j) {  // the tail, with the reference formulas
      float g[3];
      for (int64_t k = 0; k < 3; ++k) {
        g[k] = x ? bias[k * H + j] : gates[k * H + j];
        if (x)
          for (int64_t i = 0; i < p.input; ++i) g[k] += x[i] * w_ih_t[i * 3 * H + k * H + j];
      }
      const float r = ref::sigmoid(g[0] + rec[j]), z = ref::sigmoid(g[1] + rec[H + j]);
      hn_out[j] = rec[2 * H + j] + b_hn[j];
      const float n = std::tanh(g[2] + r * hn_out[j]);
      gates[j] = r;
      gates[H + j] = z;
      gates[2 * H + j] = n;
      if (low)
        for (int64_t k = 0; k < 3; ++k) low[k * H + j] = to_bf16(gates[k * H + j]);
      h[j] = n + z * (h_prev[j] - n);
    }
    if (p.h_low) ToBf16Row(h, static_cast<bf16*>(p.h_low) + b * p.ldh, H);
  }
}

void GruBackwardRows(const CellBackward& p, int64_t r0, int64_t r1, float* dbias) {
  const hn::ScalableTag<float> d;
  const int64_t H = p.hidden, N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t H_vec = H / N * N;
  const auto one = hn::Set(d, 1.0f);
  thread_local std::vector<float> row, row_rec;  // a row's gradients when only bf16 is kept
  if (!p.dgates && row.size() < static_cast<size_t>(3 * H)) row.resize(3 * H);
  if (!p.dgates_rec && row_rec.size() < static_cast<size_t>(3 * H)) row_rec.resize(3 * H);
  for (int64_t b = r0; b < r1; ++b) {
    const float* saved = p.gates ? static_cast<const float*>(p.gates) + b * 3 * H : nullptr;
    const bf16* saved_low =
        p.gates_low ? static_cast<const bf16*>(p.gates_low) + b * 3 * H : nullptr;
    auto gate = [&](int64_t j) {
      return saved_low ? LoadBf16(d, saved_low + j) : hn::LoadU(d, saved + j);
    };
    auto gate_scalar = [&](int64_t j) { return saved_low ? from_bf16(saved_low[j]) : saved[j]; };
    const float* hn_in = static_cast<const float*>(p.saved) + b * H;
    const float* h_prev = static_cast<const float*>(p.h_prev) + b * p.ld_h_prev;
    const float* dh_out =
        p.dh_out ? static_cast<const float*>(p.dh_out) + b * p.ld_dh_out : nullptr;
    const float* dh_rec = p.dh_rec ? static_cast<const float*>(p.dh_rec) + b * H : nullptr;
    float* dgates = p.dgates ? static_cast<float*>(p.dgates) + b * 3 * H : row.data();
    float* drec = p.dgates_rec ? static_cast<float*>(p.dgates_rec) + b * 3 * H : row_rec.data();
    float* dh_direct = static_cast<float*>(p.dh_direct) + b * H;
    for (int64_t j = 0; j < H_vec; j += N) {
      const auto r = gate(j), z = gate(H + j), n = gate(2 * H + j);
      auto dh = hn::Zero(d);
      if (dh_out) dh = hn::Add(dh, hn::LoadU(d, dh_out + j));
      if (dh_rec) dh = hn::Add(dh, hn::LoadU(d, dh_rec + j));
      const auto da_n = hn::Mul(hn::Mul(dh, hn::Sub(one, z)), hn::NegMulAdd(n, n, one));
      const auto da_r =
          hn::Mul(hn::Mul(da_n, hn::LoadU(d, hn_in + j)), hn::Mul(r, hn::Sub(one, r)));
      const auto da_z =
          hn::Mul(hn::Mul(dh, hn::Sub(hn::LoadU(d, h_prev + j), n)), hn::Mul(z, hn::Sub(one, z)));
      hn::StoreU(da_r, d, dgates + j);
      hn::StoreU(da_z, d, dgates + H + j);
      hn::StoreU(da_n, d, dgates + 2 * H + j);
      hn::StoreU(da_r, d, drec + j);
      hn::StoreU(da_z, d, drec + H + j);
      hn::StoreU(hn::Mul(da_n, r), d, drec + 2 * H + j);
      hn::StoreU(hn::Mul(dh, z), d, dh_direct + j);
    }
    for (int64_t j = H_vec; j < H; ++j) {
      const float r = gate_scalar(j), z = gate_scalar(H + j), n = gate_scalar(2 * H + j);
      float dh = 0;
      if (dh_out) dh += dh_out[j];
      if (dh_rec) dh += dh_rec[j];
      const float da_n = dh * (1.0f - z) * (1.0f - n * n);
      const float da_r = da_n * hn_in[j] * r * (1.0f - r);
      const float da_z = dh * (h_prev[j] - n) * z * (1.0f - z);
      dgates[j] = drec[j] = da_r;
      dgates[H + j] = drec[H + j] = da_z;
      dgates[2 * H + j] = da_n;
      drec[2 * H + j] = da_n * r;
      dh_direct[j] = dh * z;
    }
    if (p.dgates_low) ToBf16Row(dgates, static_cast<bf16*>(p.dgates_low) + b * 3 * H, 3 * H);
    if (p.dgates_rec_low) ToBf16Row(drec, static_cast<bf16*>(p.dgates_rec_low) + b * 3 * H, 3 * H);
    if (dbias) {
      AddRow(dbias, dgates, 3 * H);
      AddRow(dbias + 3 * H, drec, 3 * H);
    }
  }
}

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqforge::simd {

HWY_EXPORT(GruForwardRows);
HWY_EXPORT(GruBackwardRows);

void gru_cell_forward(const CellForward& p, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(GruForwardRows)(p, r0, r1);
}
void gru_cell_backward(const CellBackward& p, int64_t r0, int64_t r1, float* dbias) {
  HWY_DYNAMIC_DISPATCH(GruBackwardRows)(p, r0, r1, dbias);
}

}  // namespace seqforge::simd
#endif
