// SIMD pointwise kernels (f32) with runtime dispatch through Highway: the best of AVX-512, AVX2,
// SSE4 and scalar that this CPU supports is chosen on first use. Same formulas as the reference
// kernels in kernels/reference.hpp up to a rational tanh (FastTanh); sigmoid(x) = 0.5 + 0.5
// tanh(x / 2) keeps it to one approximation that is well-behaved for every input.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/pointwise_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <cstring>
#include <vector>
// clang-format off
#include <hwy/highway.h>
// clang-format on

#include "kernels/cpu/bf16_simd-inl.h"
#include "kernels/cpu/pointwise_simd.hpp"
#include "kernels/reference.hpp"

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

HWY_INLINE void to_bf16_row(const float* src, bf16* dst, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), n_vec = n / N * N;
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t j = 0; j < n_vec; j += N) StoreBf16(d, hn::LoadU(d, src + j), dst + j);
  for (int64_t j = n_vec; j < n; ++j) {
    uint32_t u;
    std::memcpy(&u, src + j, 4);
    out[j] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

// tanh through Lambert's continued fraction tanh(h) = h / (1 + h^2 / (3 + h^2 / (5 + ...)))
// truncated after 13, i.e. h N(u) / D(u) with u = h^2, taken at h = x / 2 and doubled with
// tanh(x) = 2t / (1 + t^2): one division, within 3e-7 of tanh in f32 (relative, for every x;
// beyond |x| = 9 tanh rounds to +-1). Several times faster than an exp-based tanh, and most of an
// LSTM step's pointwise work is tanh. The clamp keeps a NaN a NaN.
template <class D, class V>
HWY_INLINE V FastTanh(D d, V x) {
  const V limit = hn::Set(d, 9.0f);
  const V y = hn::Min(limit, hn::Max(hn::Neg(limit), x));
  const V h = hn::Mul(hn::Set(d, 0.5f), y), u = hn::Mul(h, h);
  V n = hn::MulAdd(u, hn::Set(d, 1.0f), hn::Set(d, 378.0f));
  n = hn::MulAdd(u, n, hn::Set(d, 17325.0f));
  n = hn::MulAdd(u, n, hn::Set(d, 135135.0f));
  V q = hn::MulAdd(u, hn::Set(d, 28.0f), hn::Set(d, 3150.0f));
  q = hn::MulAdd(u, q, hn::Set(d, 62370.0f));
  q = hn::MulAdd(u, q, hn::Set(d, 135135.0f));
  const V num = hn::Mul(y, hn::Mul(n, q));
  const V den = hn::MulAdd(hn::Mul(u, n), n, hn::Mul(q, q));
  return hn::Div(num, den);
}

template <class D, class V>
HWY_INLINE V Sigmoid(D d, V x) {
  const V half = hn::Set(d, 0.5f);
  return hn::MulAdd(half, FastTanh(d, hn::Mul(half, x)), half);
}

// db(N) += column sums of dy(rows, N) over rows [r0, r1), into `acc` (N) first.
void SumRows(const float* dy, int64_t n, int64_t r0, int64_t r1, float* acc) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), n_vec = n / N * N;
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = dy + r * n;
    for (int64_t j = 0; j < n_vec; j += N)
      hn::StoreU(hn::Add(hn::LoadU(d, acc + j), hn::LoadU(d, row + j)), d, acc + j);
    for (int64_t j = n_vec; j < n; ++j) acc[j] += row[j];
  }
}

void LstmCellForwardRows(const LstmCellForward& p, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t H = p.hidden, N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t H_vec = H / N * N;
  thread_local std::vector<float> row;  // a row's pre-activations when gates is null
  if (!p.gates && row.size() < static_cast<size_t>(4 * H)) row.resize(4 * H);
  for (int64_t b = r0; b < r1; ++b) {
    float* gates = p.gates ? static_cast<float*>(p.gates) + b * 4 * H : row.data();  // (4H)
    bf16* low = p.gates_bf16 ? static_cast<bf16*>(p.gates_bf16) + b * 4 * H : nullptr;
    const float* c_prev = static_cast<const float*>(p.c_prev) + b * H;
    float* c = static_cast<float*>(p.c) + b * H;
    float* tanh_c = static_cast<float*>(p.tanh_c) + b * H;
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
    if (p.h_bf16) to_bf16_row(h, static_cast<bf16*>(p.h_bf16) + b * p.ldh, H);
  }
}

void LstmCellBackwardRows(const LstmCellBackward& p, int64_t r0, int64_t r1, float* dbias) {
  const hn::ScalableTag<float> d;
  const int64_t H = p.hidden, N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t H_vec = H / N * N;
  const auto one = hn::Set(d, 1.0f);
  thread_local std::vector<float> row;  // a row's dgates when only the bf16 copy is kept
  if (!p.dgates && row.size() < static_cast<size_t>(4 * H)) row.resize(4 * H);
  for (int64_t b = r0; b < r1; ++b) {
    const float* saved = p.gates ? static_cast<const float*>(p.gates) + b * 4 * H : nullptr;
    const bf16* saved_low =
        p.gates_bf16 ? static_cast<const bf16*>(p.gates_bf16) + b * 4 * H : nullptr;
    auto gate = [&](int64_t j) {
      return saved_low ? LoadBf16(d, saved_low + j) : hn::LoadU(d, saved + j);
    };
    auto gate_scalar = [&](int64_t j) { return saved_low ? from_bf16(saved_low[j]) : saved[j]; };
    const float* c_prev = static_cast<const float*>(p.c_prev) + b * H;
    const float* tanh_c = static_cast<const float*>(p.tanh_c) + b * H;
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
    if (p.dgates_bf16) to_bf16_row(dgates, static_cast<bf16*>(p.dgates_bf16) + b * 4 * H, 4 * H);
    if (dbias) SumRows(dgates, 4 * H, 0, 1, dbias);
  }
}

// dst(cols, rows) = src(rows, cols)^T for 2- and 4-byte elements, in 8 x 8 blocks (2 bytes:
// 128-bit vectors, three rounds of interleaves; 4 bytes: 256-bit vectors where there are any,
// else 4 x 4 blocks); the edges, and targets without 128-bit vectors, element by element. A strip
// of one cache line of source columns at a time, so that the destination rows fill front to back
// rather than all of them a piece at a time.
template <typename T>
HWY_INLINE void TransposeEdges(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows,
                               int64_t cols, int64_t rows_done, int64_t cols_done) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = r < rows_done ? cols_done : 0; c < cols; ++c)
      dst[c * ld_dst + r] = src[r * ld_src + c];
}

void Transpose16(uint16_t* dst, int64_t ld_dst, const uint16_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols) {
#if HWY_TARGET == HWY_SCALAR
  TransposeEdges(dst, ld_dst, src, ld_src, rows, cols, 0, 0);
#else
  const hn::Full128<uint16_t> d16;
  const hn::Full128<uint32_t> d32;
  const hn::Full128<uint64_t> d64;
  const int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (int64_t c0 = 0; c0 < cols8; c0 += 32)  // 32 destination rows, filled front to back
    for (int64_t r = 0; r < rows8; r += 8)
      for (int64_t c = c0; c < std::min(c0 + 32, cols8); c += 8) {
        const uint16_t* s = src + r * ld_src + c;
        hn::Vec<decltype(d32)> t[8];
        for (int k = 0; k < 4; ++k) {  // pairs of rows, interleaved element by element
          const auto a = hn::LoadU(d16, s + 2 * k * ld_src),
                     b = hn::LoadU(d16, s + (2 * k + 1) * ld_src);
          t[2 * k] = hn::BitCast(d32, hn::InterleaveLower(d16, a, b));
          t[2 * k + 1] = hn::BitCast(d32, hn::InterleaveUpper(d16, a, b));
        }
        hn::Vec<decltype(d64)> u[8];
        for (int k = 0; k < 2; ++k)  // then pairs of those, two elements at a time
          for (int h = 0; h < 2; ++h) {
            const auto a = t[4 * k + h], b = t[4 * k + 2 + h];
            u[4 * k + 2 * h] = hn::BitCast(d64, hn::InterleaveLower(d32, a, b));
            u[4 * k + 2 * h + 1] = hn::BitCast(d64, hn::InterleaveUpper(d32, a, b));
          }
        uint16_t* o = dst + c * ld_dst + r;
        for (int k = 0; k < 4; ++k) {  // and the two halves of the block, four at a time
          hn::StoreU(hn::BitCast(d16, hn::InterleaveLower(d64, u[k], u[k + 4])), d16,
                     o + 2 * k * ld_dst);
          hn::StoreU(hn::BitCast(d16, hn::InterleaveUpper(d64, u[k], u[k + 4])), d16,
                     o + (2 * k + 1) * ld_dst);
        }
      }
  TransposeEdges(dst, ld_dst, src, ld_src, rows, cols, rows8, cols8);
#endif
}

#if HWY_TARGET <= HWY_AVX2
// An 8 x 8 block in 256-bit vectors: interleaves within 128-bit halves, then the halves swapped.
HWY_INLINE void Transpose32Block8(uint32_t* o, int64_t ld_dst, const uint32_t* s, int64_t ld_src) {
  const hn::Full256<uint32_t> d32;
  const hn::Full256<uint64_t> d64;
  hn::Vec<decltype(d32)> t[8];
  for (int k = 0; k < 4; ++k) {
    const auto a = hn::LoadU(d32, s + 2 * k * ld_src), b = hn::LoadU(d32, s + (2 * k + 1) * ld_src);
    t[2 * k] = hn::InterleaveLower(d32, a, b);
    t[2 * k + 1] = hn::InterleaveUpper(d32, a, b);
  }
  hn::Vec<decltype(d32)> u[8];  // u[k]: columns k and k + 4 of rows 0-3; u[k + 4]: of rows 4-7
  for (int k = 0; k < 2; ++k)
    for (int h = 0; h < 2; ++h) {
      const auto a = hn::BitCast(d64, t[4 * k + h]), b = hn::BitCast(d64, t[4 * k + 2 + h]);
      u[4 * k + 2 * h] = hn::BitCast(d32, hn::InterleaveLower(d64, a, b));
      u[4 * k + 2 * h + 1] = hn::BitCast(d32, hn::InterleaveUpper(d64, a, b));
    }
  for (int k = 0; k < 4; ++k) {
    hn::StoreU(hn::ConcatLowerLower(d32, u[k + 4], u[k]), d32, o + k * ld_dst);
    hn::StoreU(hn::ConcatUpperUpper(d32, u[k + 4], u[k]), d32, o + (k + 4) * ld_dst);
  }
}
constexpr int64_t kBlock32 = 8;
#elif HWY_TARGET != HWY_SCALAR
// A 4 x 4 block of 4-byte elements at s (rows ld_src apart) to o (rows ld_dst apart).
HWY_INLINE void Transpose32Block4(uint32_t* o, int64_t ld_dst, const uint32_t* s, int64_t ld_src) {
  const hn::Full128<uint32_t> d32;
  const hn::Full128<uint64_t> d64;
  const auto r0 = hn::LoadU(d32, s), r1 = hn::LoadU(d32, s + ld_src);
  const auto r2 = hn::LoadU(d32, s + 2 * ld_src), r3 = hn::LoadU(d32, s + 3 * ld_src);
  const auto a = hn::BitCast(d64, hn::InterleaveLower(d32, r0, r1));
  const auto b = hn::BitCast(d64, hn::InterleaveUpper(d32, r0, r1));
  const auto e = hn::BitCast(d64, hn::InterleaveLower(d32, r2, r3));
  const auto f = hn::BitCast(d64, hn::InterleaveUpper(d32, r2, r3));
  hn::StoreU(hn::BitCast(d32, hn::InterleaveLower(d64, a, e)), d32, o);
  hn::StoreU(hn::BitCast(d32, hn::InterleaveUpper(d64, a, e)), d32, o + ld_dst);
  hn::StoreU(hn::BitCast(d32, hn::InterleaveLower(d64, b, f)), d32, o + 2 * ld_dst);
  hn::StoreU(hn::BitCast(d32, hn::InterleaveUpper(d64, b, f)), d32, o + 3 * ld_dst);
}
constexpr int64_t kBlock32 = 4;
#endif

void Transpose32(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols) {
#if HWY_TARGET == HWY_SCALAR
  TransposeEdges(dst, ld_dst, src, ld_src, rows, cols, 0, 0);
#else
  constexpr int64_t n = kBlock32;
  const int64_t rows_n = rows / n * n, cols_n = cols / n * n;
  for (int64_t c0 = 0; c0 < cols_n; c0 += 16)  // 16 destination rows, filled front to back
    for (int64_t r = 0; r < rows_n; r += n)
      for (int64_t c = c0; c < std::min(c0 + 16, cols_n); c += n) {
#if HWY_TARGET <= HWY_AVX2
        Transpose32Block8(dst + c * ld_dst + r, ld_dst, src + r * ld_src + c, ld_src);
#else
        Transpose32Block4(dst + c * ld_dst + r, ld_dst, src + r * ld_src + c, ld_src);
#endif
      }
  TransposeEdges(dst, ld_dst, src, ld_src, rows, cols, rows_n, cols_n);
#endif
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqforge::simd {

HWY_EXPORT(LstmCellForwardRows);
HWY_EXPORT(LstmCellBackwardRows);
HWY_EXPORT(SumRows);
HWY_EXPORT(Transpose16);
HWY_EXPORT(Transpose32);
HWY_EXPORT(TargetName);

void lstm_cell_forward(const LstmCellForward& p, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(LstmCellForwardRows)(p, r0, r1);
}
void lstm_cell_backward(const LstmCellBackward& p, int64_t r0, int64_t r1, float* dbias) {
  HWY_DYNAMIC_DISPATCH(LstmCellBackwardRows)(p, r0, r1, dbias);
}
void sum_rows(const float* dy, int64_t n, int64_t r0, int64_t r1, float* acc) {
  HWY_DYNAMIC_DISPATCH(SumRows)(dy, n, r0, r1, acc);
}
void transpose16(uint16_t* dst, int64_t ld_dst, const uint16_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols) {
  HWY_DYNAMIC_DISPATCH(Transpose16)(dst, ld_dst, src, ld_src, rows, cols);
}
void transpose32(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols) {
  HWY_DYNAMIC_DISPATCH(Transpose32)(dst, ld_dst, src, ld_src, rows, cols);
}
const char* target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace seqforge::simd
#endif
