// Multi-head attention in f32, fused in the manner of FlashAttention-2: one (batch row, head) pair
// at a time on the calling thread, and the (T, T) scores never exist beyond one tile. A second
// form of both passes (at the end) takes its products' operands in bf16 on AVX512-BF16.
//
// Grouped-query attention reads each query head's key/value head where it is; backward runs per
// key/value head, its query heads in turn, adding into the same dK and dV. A sliding window
// starts a query tile's keys at its first row's window, and backward's key tile stops at the
// rows whose window it leaves.
//
// Forward: per tile of kBr query rows, the key tiles (kBcF keys) in order; per block of kRows rows
// and key tile, S = q k^T, then an online softmax per row (running max m and sum l; the row's
// accumulator is scaled by exp(m_old - m_new) as P V is added). At the end out = acc / l and
// lse = m + log l. Under the causal mask a row block computes only the keys up to its last row,
// so tiles above the diagonal, and most of the diagonal tiles' upper halves, are skipped.
//
// Backward: per row D_i = dO_i . O_i; key tiles outer, so that one tile's dK and dV accumulate
// while the query tiles that see it pass by, and are done with. Per (query tile, key tile):
//   P = exp(scale q k^T - lse), dP = dO v^T, dS = scale P (dP - D),
//   dV += P^T dO, dK += dS^T q, dQ += dS k   (dQ (T, D) accumulates for the whole pair).
// Each gradient row is assigned by the first tile that reaches it rather than zero-filled first.
//
// Dropout (AttentionShape::dropout p > 0) multiplies each probability by M_ij / (1 - p), the mask
// hashed from (seed, b, h, i, j) per element: forward after the online softmax has summed the
// undropped row into l (lse stays undropped), backward into P before dV and into dP = dO v^T before
// dS. D_i = dO_i . O_i needs nothing more, as O is already dropped. Without dropout none of it
// runs.
//
// Each pair's k (and v for backward) is packed into thread-local scratch first, transposed into
// panels of kKeyBlock keys (D, kKeyBlock), zero-padded, for the dot products. The axpys' right-hand
// sides (v; q, dO and k for backward) are packed in column chunks as wide as the micro-kernel
// (kChunk), each chunk's rows contiguous, so that an axpy streams them in order; the gradients
// accumulate where they are when D is a multiple of the vector, else in copies padded to Dp
// columns. Both micro-kernels hold a block of kRows rows by a few vectors in registers. Before its
// first pair, a batch row's blocks are read once in order (WarmBlocks), as the heads' strided
// pieces of them come several times slower from memory.
//
// Gradient rule: activation gradients are assigned (dqkv =).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention_fused.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>
// clang-format off
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>
// clang-format on

#include "kernels/attention.hpp"
#include "kernels/attention/dropout_mask.hpp"
#include "kernels/cpu/pointwise_simd.hpp"
// clang-format off
#include "kernels/cpu/bf16_simd-inl.h"
#include "kernels/cpu/exp_simd-inl.h"
#include "kernels/cpu/partial_simd-inl.h"
#include "kernels/cpu/hash_simd-inl.h"
// clang-format on
#include "seqforge/core/error.hpp"

HWY_BEFORE_NAMESPACE();
namespace seqforge::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int64_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);
constexpr int kRows = 6;  // rows of a micro-kernel block, by kVecs vectors of accumulators
#if HWY_TARGET <= HWY_AVX3
constexpr int kVecs = 4;  // 32 vector registers: 24 accumulators in the axpy
#else
constexpr int kVecs = 2;  // 16 registers: 12 accumulators, more than two FMA pipes' latency needs
#endif
constexpr int64_t kKeyBlock = 2 * kMaxLanes;               // keys per panel: two vectors
constexpr int64_t kBc = std::max<int64_t>(64, kKeyBlock);  // keys per tile (backward)
constexpr int64_t kBcF = 256;                              // keys per tile (forward)
constexpr int64_t kBr = 16 * kRows;                        // query rows per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Per-thread scratch, grown to the largest problem seen and kept, 64-byte aligned.
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  float* get(size_t floats) {
    if (floats > cap_) {
      std::free(data_);
      data_ = static_cast<float*>(std::aligned_alloc(64, RoundUp(int64_t(floats) * 4, 64)));
      SF_CHECK(data_ != nullptr, "attention scratch of ", floats, " floats");
      cap_ = floats;
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  size_t cap_ = 0;
};

// Carves consecutive 64-byte aligned buffers out of one scratch block (without a block, only
// counts the floats they need).
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(int64_t floats) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += RoundUp(floats, 16);
    return p;
  }
  int64_t used() const { return used_; }

 private:
  float* base_;
  int64_t used_ = 0;
};

using simd::HWY_NAMESPACE::WithCount;

// c (R, panels * kKeyBlock) = a (R, D) bt: a rows lda apart; bt the panels, each (D, kKeyBlock)
// contiguous; c rows ldc apart.
template <int R>
HWY_INLINE void DotBlock(const float* HWY_RESTRICT a, int64_t lda, const float* HWY_RESTRICT bt,
                         int64_t D, int64_t panels, float* HWY_RESTRICT c, int64_t ldc) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t pb = 0; pb < panels; ++pb)
    for (int64_t j = 0; j < kKeyBlock; j += 2 * N) {
      VF acc0[R], acc1[R];
      for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = hn::Zero(d);
      const float* b = bt + pb * D * kKeyBlock + j;
      for (int64_t k = 0; k < D; ++k, b += kKeyBlock) {
        const VF b0 = hn::Load(d, b), b1 = hn::Load(d, b + N);
        for (int r = 0; r < R; ++r) {
          const VF ar = hn::Set(d, a[r * lda + k]);
          acc0[r] = hn::MulAdd(ar, b0, acc0[r]);
          acc1[r] = hn::MulAdd(ar, b1, acc1[r]);
        }
      }
      float* cj = c + pb * kKeyBlock + j;
      for (int r = 0; r < R; ++r) {
        hn::StoreU(acc0[r], d, cj + r * ldc);
        hn::StoreU(acc1[r], d, cj + r * ldc + N);
      }
    }
}

HWY_INLINE void Dot(int nr, const float* a, int64_t lda, const float* bt, int64_t D, int64_t panels,
                    float* c, int64_t ldc) {
  WithCount<kRows>(nr, [&](auto rows) HWY_ATTR {
    DotBlock<decltype(rows)::value>(a, lda, bt, D, panels, c, ldc);
  });
}

// c (R, NV vectors), first scaled by alpha_r if alpha is given (or, with assign, taken as 0),
// += sum over t in [t0, t1) of p[r * rs + t * ts] * (row t of b, NV vectors): b rows ldb apart,
// c rows ldc apart.
template <int R, int NV>
HWY_INLINE void AxpyBlock(const float* HWY_RESTRICT p, int64_t rs, int64_t ts, int64_t t0,
                          int64_t t1, const float* HWY_RESTRICT b, int64_t ldb,
                          float* HWY_RESTRICT c, int64_t ldc, const float* alpha, bool assign) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = assign ? hn::Zero(d) : hn::LoadU(d, c + r * ldc + v * N);
  if (alpha && !assign)
    for (int r = 0; r < R; ++r) {
      const VF s = hn::Set(d, alpha[r]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::Mul(acc[r][v], s);
    }
  for (int64_t t = t0; t < t1; ++t) {
    const float* bt = b + t * ldb;
    VF bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = hn::LoadU(d, bt + v * N);
    const float* pt = p + t * ts;
    for (int r = 0; r < R; ++r) {
      const VF pr = hn::Set(d, pt[r * rs]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(pr, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[r][v], d, c + r * ldc + v * N);
}

// The right-hand side of an axpy: rows of Dp columns in chunks of kChunk columns, column col of
// row t at p[(col / kChunk) * chunk + t * ld + col % kChunk]. Rows where they are have
// chunk = kChunk; rows packed by PackChunks have ld = kChunk and each chunk's column of rows
// contiguous, which the axpy reads as one sequential stream rather than a line per row.
struct AxpyRows {
  const float* p;
  int64_t ld, chunk;
  AxpyRows at(int64_t t) const { return {p + t * ld, ld, chunk}; }
};
constexpr int64_t kChunk = kVecs * kMaxLanes;

// The same over all Dp columns (a multiple of kMaxLanes), kVecs vectors at a time, for nr rows.
HWY_INLINE void Axpy(int nr, const float* p, int64_t rs, int64_t ts, int64_t t0, int64_t t1,
                     AxpyRows b, float* c, int64_t ldc, const float* alpha, int64_t Dp,
                     bool assign = false) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  WithCount<kRows>(nr, [&](auto rows) HWY_ATTR {
    constexpr int R = decltype(rows)::value;
    int64_t col = 0;
    const float* bc = b.p;
    for (; col + kChunk <= Dp; col += kChunk, bc += b.chunk)
      AxpyBlock<R, kVecs>(p, rs, ts, t0, t1, bc, b.ld, c + col, ldc, alpha, assign);
    if (col < Dp)
      WithCount<kVecs>(static_cast<int>((Dp - col) / N), [&](auto vecs) HWY_ATTR {
        AxpyBlock<R, decltype(vecs)::value>(p, rs, ts, t0, t1, bc, b.ld, c + col, ldc, alpha,
                                            assign);
      });
  });
}

// Rows [0, n) (ld apart, D floats) into chunks of kChunk columns (AxpyRows with ld = kChunk and
// chunk = rows * kChunk), zero-padded to whole chunks.
void PackChunks(float* dst, int64_t rows, const float* src, int64_t ld, int64_t n, int64_t D) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t c0 = 0; c0 < D; c0 += kChunk) {
    float* chunk = dst + c0 / kChunk * rows * kChunk;
    const int64_t cols = std::min(kChunk, D - c0);
    if (cols == kChunk) {
      for (int64_t t = 0; t < n; ++t)
        for (int64_t k = 0; k < kChunk; k += N)
          hn::Store(hn::LoadU(d, src + t * ld + c0 + k), d, chunk + t * kChunk + k);
      continue;
    }
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(chunk + t * kChunk, src + t * ld + c0, cols * sizeof(float));
      std::fill(chunk + t * kChunk + cols, chunk + (t + 1) * kChunk, 0.0f);
    }
  }
}
// Floats PackChunks writes for `rows` rows of D columns.
int64_t ChunkFloats(int64_t rows, int64_t D) { return RoundUp(D, kChunk) * rows; }

// The lanes of the vector at t that lie in [n0, n).
HWY_INLINE hn::Mask<DF> LanesWithin(int64_t t, int64_t n0, int64_t n) {
  const DF d;
  const auto below_n = hn::FirstN(d, static_cast<size_t>(std::max<int64_t>(n - t, 0)));
  return hn::AndNot(hn::FirstN(d, static_cast<size_t>(std::max<int64_t>(n0 - t, 0))), below_n);
}

// Soft-capping (AttentionShape::softcap): the raw q.k dots s [n0, n) of one row become
// cap tanh(scale s / cap) / scale, so that the softmax's scale s is the capped score; with
// `slope` (the row's wv entries), slope = 1 - tanh^2 there and 1 elsewhere.
HWY_INLINE void CapRow(float* s, float* slope, int64_t n0, int64_t n, int64_t wv, float scale,
                       float cap) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vin = hn::Set(d, scale / cap), vout = hn::Set(d, cap / scale), one = hn::Set(d, 1.0f);
  for (int64_t t = 0; t < wv; t += N) {
    if (t >= n || t + N <= n0) {
      if (slope) hn::StoreU(one, d, slope + t);
      continue;
    }
    const auto keep = LanesWithin(t, n0, n);
    const VF th = hn::Tanh(d, hn::Mul(hn::LoadU(d, s + t), vin));
    hn::StoreU(hn::IfThenElse(keep, hn::Mul(th, vout), hn::LoadU(d, s + t)), d, s + t);
    if (slope) hn::StoreU(hn::IfThenElse(keep, hn::NegMulAdd(th, th, one), one), d, slope + t);
  }
}

// One row s (wv, a multiple of the vector) of raw q.k dots whose entries [n0, n) are the row's
// keys: updates the running max m and sum l, leaves p = exp(scale s - m) in s (0 outside
// [n0, n)) and returns the factor exp(m_old - m_new) for the row's accumulator.
HWY_INLINE float OnlineSoftmaxRow(float* s, int64_t n0, int64_t n, int64_t wv, float scale,
                                  float& m, float& l) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  if (n <= n0) {
    for (int64_t t = 0; t < wv; t += N) hn::StoreU(hn::Zero(d), d, s + t);
    return 1.0f;
  }
  const VF vscale = hn::Set(d, scale), ninf = hn::Set(d, kNegInf);
  VF vmax = ninf;
  for (int64_t t = n0 / N * N; t < n; t += N) {
    VF x = hn::Mul(hn::LoadU(d, s + t), vscale);
    if (n - t < N || t < n0) x = hn::IfThenElse(LanesWithin(t, n0, n), x, ninf);
    vmax = hn::Max(vmax, x);
  }
  const float m_new = std::max(m, hn::GetLane(hn::MaxOfLanes(d, vmax)));
  const float alpha = std::exp(m - m_new);  // 0 on the row's first tile, where m = -inf
  const VF vm = hn::Set(d, m_new);
  VF sum = hn::Zero(d);
  for (int64_t t = 0; t < wv; t += N) {
    VF p = hn::Zero(d);
    if (t < n && t + N > n0) {
      p = simd::HWY_NAMESPACE::ExpAtMost88OrNaN(d, hn::MulSub(hn::LoadU(d, s + t), vscale, vm));
      if (n - t < N || t < n0) p = hn::IfThenElseZero(LanesWithin(t, n0, n), p);
    }
    hn::StoreU(p, d, s + t);
    sum = hn::Add(sum, p);
  }
  l = l * alpha + hn::GetLane(hn::SumOfLanes(d, sum));
  m = m_new;
  return alpha;
}

// One row of raw q.k dots (p) and dO.v dots (g), entries [n0, n) of wv the row's keys, into
// p = exp(scale s - lse) and g = scale p (g - Di); both 0 outside [n0, n). With kDrop, c (wv)
// holds the dropout factors M_ij / (1 - p): p = c exp(scale s - lse) and
// g = scale exp(..) (c g - Di).
template <bool kDrop>
HWY_INLINE void GradRow(float* p, float* g, int64_t n0, int64_t n, int64_t wv, float scale,
                        float lse, float Di, const float* c) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vscale = hn::Set(d, scale), vlse = hn::Set(d, lse), vD = hn::Set(d, Di);
  for (int64_t t = 0; t < wv; t += N) {
    VF pv = hn::Zero(d), gv = hn::Zero(d);
    if (t < n && t + N > n0) {
      pv = simd::HWY_NAMESPACE::ExpAtMost88OrNaN(d, hn::MulSub(hn::LoadU(d, p + t), vscale, vlse));
      if constexpr (kDrop) {
        const VF cv = hn::LoadU(d, c + t);
        gv = hn::Mul(hn::Mul(pv, vscale), hn::MulSub(hn::LoadU(d, g + t), cv, vD));
        pv = hn::Mul(pv, cv);
      } else {
        gv = hn::Mul(hn::Mul(pv, vscale), hn::Sub(hn::LoadU(d, g + t), vD));
      }
      if (n - t < N || t < n0) {
        const auto keep = LanesWithin(t, n0, n);
        pv = hn::IfThenElseZero(keep, pv);
        gv = hn::IfThenElseZero(keep, gv);
      }
    }
    hn::StoreU(pv, d, p + t);
    hn::StoreU(gv, d, g + t);
  }
}

// g (wv) *= slope (wv).
HWY_INLINE void MulRow(float* g, const float* slope, int64_t wv) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t t = 0; t < wv; t += N)
    hn::StoreU(hn::Mul(hn::LoadU(d, g + t), hn::LoadU(d, slope + t)), d, g + t);
}

// The dropout factors M_ij / (1 - p) of one pair's query rows.
struct RowDropout {
  uint64_t pair_key, threshold;
  float keep_scale;  // 1 / (1 - p)
  // c (wv) = query row i's factors for t < n, 0 beyond.
  void factors(float* c, int64_t i, int64_t j0, int64_t n, int64_t wv) const {
    const uint64_t row = attention_row_key(pair_key, i);
    int64_t t = 0;
#if HWY_TARGET <= HWY_AVX3
    const hn::ScalableTag<uint64_t> du;
    const hn::Rebind<uint32_t, decltype(du)> du32;
    const int64_t N = static_cast<int64_t>(hn::Lanes(du));
    const auto golden = hn::Set(du, kAttentionGolden), vrow = hn::Set(du, row);
    const auto vthreshold = hn::Set(du, threshold);
    uint32_t keep_u32;
    std::memcpy(&keep_u32, &keep_scale, 4);
    const auto keep_bits = hn::Set(du, uint64_t{keep_u32});
    for (auto j = hn::Iota(du, uint64_t(j0)); t + N <= n; t += N) {
      const auto z = simd::HWY_NAMESPACE::SplitMix64(du, hn::Add(vrow, hn::Mul(j, golden)));
      const auto bits = hn::IfThenZeroElse(hn::Gt(vthreshold, z), keep_bits);
      hn::StoreU(hn::TruncateTo(du32, bits), du32, reinterpret_cast<uint32_t*>(c + t));
      j = hn::Add(j, hn::Set(du, uint64_t(N)));
    }
#endif
    for (; t < n; ++t) c[t] = attention_keep(row, j0 + t, threshold) ? keep_scale : 0.0f;
    for (; t < wv; ++t) c[t] = 0.0f;
  }
};

// Keys [0, n) of rows ld apart (n, D) into panels (D, kKeyBlock) each, zero-padded to whole panels.
void PackPanels(float* dst, const float* src, int64_t ld, int64_t n, int64_t D) {
  for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
    float* panel = dst + j0 * D;
    const int64_t cols = std::min(kKeyBlock, n - j0);
    simd::transpose32(reinterpret_cast<uint32_t*>(panel), kKeyBlock,
                      reinterpret_cast<const uint32_t*>(src + j0 * ld), ld, cols, D);
    if (cols < kKeyBlock)
      for (int64_t k = 0; k < D; ++k)
        std::fill(panel + k * kKeyBlock + cols, panel + (k + 1) * kKeyBlock, 0.0f);
  }
}

// Rows of a matrix, ld apart.
template <typename T>
struct Rows {
  T* p;
  int64_t ld;
  T* operator[](int64_t i) const { return p + i * ld; }
};

// A pair reads and writes one head's D columns of every row of its batch row's blocks: pieces of
// D floats strided 3C or C apart, which memory serves several times slower than a sequential
// read. So the pairs of a batch row are preceded by one sequential read of its blocks, which
// leaves them in the last-level cache for the heads to take their pieces from; blocks of more
// than kWarmBytes together (which that cache would not hold) are left alone.
constexpr int64_t kWarmBytes = int64_t{8} << 20;

void WarmBlocks(std::initializer_list<std::pair<const float*, int64_t>> blocks) {
  int64_t floats = 0;
  for (const auto& [p, n] : blocks) floats += n;
  if (floats * int64_t{sizeof(float)} > kWarmBytes) return;
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), kLine = 64 / sizeof(float);
  VF acc = hn::Zero(d);
  for (const auto& [p, n] : blocks)
    for (int64_t i = 0; i + N <= n; i += kLine) acc = hn::Add(acc, hn::LoadU(d, p + i));
  volatile float sink = hn::GetLane(acc);  // keeps the loads
  (void)sink;
}

int64_t KeysOf(const void* lengths, int64_t b, int64_t T) {
  return lengths ? std::clamp<int64_t>(static_cast<const int64_t*>(lengths)[b], 0, T) : T;
}

// The forward pass over pairs [p0, p1), its products taken by `Products` (F32Products here, or
// Bf16Products with AVX512-BF16): pack_keys(k, v, nk) packs a key/value head's operands (rows ld
// apart), pack_queries(q, first) a query head's from row `first`; dot(nr, rb, j0, panels, sc) puts
// a row block's raw scores q.k into sc (rows kBc apart); row(r, p, w) sees row r's final
// probabilities; axpy(nr, j0, w, sc, acc, alpha) adds the block's P V into acc (rows
// Products::width apart), scaling acc by alpha first.
template <class Products>
HWY_INLINE void ForwardPass(const AttentionForward& a, int64_t p0, int64_t p1, Products& prod) {
  const AttentionShape& s = a.shape;
  const int64_t T = s.seq, H = s.heads, D = s.head_dim, C = H * D, W = prod.width;
  const int64_t ld = s.qkv_width(), KV = s.kv();
  const int64_t first = a.first_row;  // the first query row computed
  const float scale = static_cast<float>(s.scale), cap = static_cast<float>(s.softcap);
  const float* qkv = static_cast<const float*>(a.qkv);  // (B, T, ld)
  float* out = static_cast<float*>(a.out);              // (B, T, C)
  float* lse = static_cast<float*>(a.lse);              // (B, heads, T)

  thread_local Scratch scratch;
  Carver sizes(nullptr);
  for (int64_t n : {kRows * kBcF, kBr * W, kBr, kBr, int64_t{kRows}, kBcF}) sizes.take(n);
  Carver carve(scratch.get(sizes.used()));
  float* sc = carve.take(kRows * kBcF);  // (kRows, kBcF) one row block's scores, then P
  float* acc = carve.take(kBr * W);      // (kBr, W) one query tile's unnormalised out
  float* m = carve.take(kBr);            // (kBr) running max of scale q.k
  float* l = carve.take(kBr);            // (kBr) running sum of exp(scale q.k - m)
  float* alpha = carve.take(kRows);      // (kRows) accumulator scale factors
  float* c = carve.take(kBcF);           // (kBcF) one row's dropout factors
  const bool drop = s.dropout != 0;
  RowDropout dropout{0, drop ? attention_drop_threshold(s.dropout) : 0,
                     static_cast<float>(1.0 / (1.0 - s.dropout))};

  const float* packed = nullptr;  // the key rows whose copy the products hold
  for (int64_t pair = p0; pair < p1; ++pair) {
    const int64_t b = pair / H, h = pair % H, nk = KeysOf(a.lengths, b, T);
    float* o = out + b * T * C + h * D;  // rows C apart
    float* lrow = lse + pair * T;        // (T)
    if (drop) dropout.pair_key = attention_pair_key(s.seed, b, h);
    if (nk == 0) {
      for (int64_t i = first; i < T; ++i) std::fill_n(o + i * C, D, 0.0f);
      std::fill_n(lrow + first, T - first, kNegInf);
      continue;
    }
    if (h == 0 || pair == p0) WarmBlocks({{qkv + b * T * ld, T * ld}, {out + b * T * C, T * C}});
    // A group's query heads share their key/value head's packed copy.
    const float* k = qkv + b * T * ld + (H + h / s.group()) * D;
    if (k != packed) prod.pack_keys(k, k + KV * D, nk);
    packed = k;
    prod.pack_queries(qkv + b * T * ld + h * D, first);
    for (int64_t i0 = first; i0 < T; i0 += kBr) {
      const int64_t i1 = std::min(T, i0 + kBr), kend = s.causal ? std::min(nk, i1) : nk;
      // The tile's keys start at its first row's window, at a panel's start.
      const int64_t kbegin = s.first_key(i0) / kKeyBlock * kKeyBlock;
      std::fill_n(m, i1 - i0, kNegInf);
      std::fill_n(l, i1 - i0, 0.0f);
      std::fill_n(acc, (i1 - i0) * W, 0.0f);
      for (int64_t j0 = kbegin; j0 < kend; j0 += kBcF) {
        const int64_t j1 = std::min(kend, j0 + kBcF);
        for (int64_t rb = i0; rb < i1; rb += kRows) {
          const int nr = static_cast<int>(std::min<int64_t>(kRows, i1 - rb));
          const int64_t last = s.causal ? std::min(j1, rb + nr) : j1;  // keys the block needs
          if (last <= j0 || j1 <= s.first_key(rb)) continue;
          const int64_t w = last - j0, wp = RoundUp(w, kKeyBlock);
          prod.dot(nr, rb, j0, wp / kKeyBlock, sc);
          for (int r = 0; r < nr; ++r) {
            const int64_t i = rb + r, n = (s.causal ? std::min(j1, i + 1) : j1) - j0;
            const int64_t n0 = std::max<int64_t>(0, s.first_key(i) - j0);
            float* pr = sc + r * kBcF;
            if (cap > 0) CapRow(pr, nullptr, n0, n, wp, scale, cap);
            alpha[r] = OnlineSoftmaxRow(pr, n0, n, wp, scale, m[i - i0], l[i - i0]);
            if (drop) {  // after l has the undropped row
              dropout.factors(c, i, j0, n, n);
              for (int64_t t = 0; t < n; ++t) pr[t] *= c[t];
            }
            prod.row(r, pr, w);
          }
          prod.axpy(nr, j0, w, sc, acc + (rb - i0) * W, alpha);
        }
      }
      for (int64_t i = i0; i < i1; ++i) {
        float* orow = o + i * C;
        if (l[i - i0] == 0) {  // a row whose window has passed the batch row's keys
          std::fill_n(orow, D, 0.0f);
          lrow[i] = kNegInf;
          continue;
        }
        const float inv = 1.0f / l[i - i0];
        const float* ar = acc + (i - i0) * W;
        for (int64_t d = 0; d < D; ++d) orow[d] = ar[d] * inv;
        lrow[i] = m[i - i0] + std::log(l[i - i0]);
      }
    }
  }
}

// f32 products: q where it is, k^T in panels of kKeyBlock keys, v in chunks.
struct F32Products {
  explicit F32Products(const AttentionShape& s)
      : D(s.head_dim), ld(s.qkv_width()), width(RoundUp(D, kMaxLanes)) {
    const int64_t T = s.seq, Tk = RoundUp(T, kKeyBlock);
    thread_local Scratch scratch;
    Carver sizes(nullptr);
    for (int64_t n : {D * Tk, ChunkFloats(T, D)}) sizes.take(n);
    Carver carve(scratch.get(sizes.used()));
    kt = carve.take(D * Tk);            // (Tk / kKeyBlock panels of (D, kKeyBlock)) k^T
    v = carve.take(ChunkFloats(T, D));  // v in chunks
    V = {v, kChunk, T * kChunk};
  }
  void pack_queries(const float* qrows, int64_t) { q = qrows; }
  void pack_keys(const float* krows, const float* vrows, int64_t nk) {
    PackPanels(kt, krows, ld, nk, D);
    PackChunks(v, V.chunk / kChunk, vrows, ld, nk, D);
  }
  void dot(int nr, int64_t rb, int64_t j0, int64_t panels, float* sc) const {
    Dot(nr, q + rb * ld, ld, kt + j0 * D, D, panels, sc, kBcF);
  }
  void row(int, const float*, int64_t) const {}
  void axpy(int nr, int64_t j0, int64_t w, const float* sc, float* acc, const float* alpha) const {
    Axpy(nr, sc, kBcF, 1, 0, w, V.at(j0), acc, width, alpha, width);
  }

  const int64_t D, ld, width;  // width: Dp
  float *kt, *v;
  const float* q = nullptr;
  AxpyRows V{nullptr, 0, 0};  // v in chunks
};

void ForwardPairs(const AttentionForward& a, int64_t p0, int64_t p1) {
  F32Products products(a.shape);
  ForwardPass(a, p0, p1, products);
}

// Dv (T) = per row i, sum over k < D of dO_ik O_ik (dO rounded to bf16 with kRound); o and g
// rows ld apart.
template <bool kRound>
HWY_INLINE void RowDots(float* Dv, const float* o, const float* g, int64_t ld, int64_t T,
                        int64_t D) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; i < T; ++i) {
    const float *oi = o + i * ld, *gi = g + i * ld;
    VF sum = hn::Zero(d);
    for (int64_t k = 0; k < D; k += N) {
      const size_t n = static_cast<size_t>(std::min(N, D - k));  // rows unaligned: no masked loads
      VF gv = simd::HWY_NAMESPACE::LoadN(d, gi + k, n);
      if constexpr (kRound) gv = simd::HWY_NAMESPACE::RoundToBf16(d, gv);
      sum = hn::MulAdd(gv, simd::HWY_NAMESPACE::LoadN(d, oi + k, n), sum);
    }
    Dv[i] = hn::GetLane(hn::SumOfLanes(d, sum));
  }
}

// The backward pass over groups [g0, g1) (batch row, key/value head), the group's query heads in
// turn, its products taken by `Grads` (F32Grads here, or Bf16Grads with AVX512-BF16). Per query
// head, begin(q, k, v, dO, dq, dk, dv, nk, accumulate) packs the operands (rows ld apart; dO rows
// C apart) and readies the gradients (rows ld apart; dk and dv add to what they hold with
// accumulate, the group's later heads); kRoundDout says whether the products see dO rounded to
// bf16. Per key tile, begin_keys(j0, nkt) and end_keys(j0, j1); per query tile,
// dots(nr, rb, j0, panels, P, dP) puts a row block's raw q.k and dO.v into P and dP (rows kBc
// apart), ds_row(r, dS, nkt) sees a row's final dS, tile(rows, nkt) the whole tile's P and dS,
// then dv_dk(nr, kb, t0, i0, rows, .., assign) adds keys kb..'s P^T dO and dS^T q over the tile's
// queries [t0, rows), dq(nr, rb, i0, j0, last, .., assign) the row block's dS k; with assign the
// gradient rows start from 0 rather than adding to what they hold, so no gradient is zero-filled
// first (assigns_keys(first_head): whether a key tile's first query tile assigns). Under a
// sliding window the rows' first key tiles differ, so clear_dq() zeroes dQ first instead.
// end() finishes the head.
template <class Grads>
HWY_INLINE void BackwardPass(const AttentionBackward& a, int64_t g0, int64_t g1, Grads& g) {
  const AttentionShape& s = a.shape;
  const int64_t T = s.seq, H = s.heads, D = s.head_dim, C = H * D, ld = s.qkv_width();
  const int64_t KV = s.kv(), G = s.group();
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  const float scale = static_cast<float>(s.scale), cap = static_cast<float>(s.softcap);
  const float* qkv = static_cast<const float*>(a.qkv);    // (B, T, ld)
  const float* out = static_cast<const float*>(a.out);    // (B, T, C)
  const float* lse = static_cast<const float*>(a.lse);    // (B, heads, T)
  const float* dout = static_cast<const float*>(a.dout);  // (B, T, C)
  float* dqkv = static_cast<float*>(a.dqkv);              // (B, T, ld)

  thread_local Scratch scratch;
  Carver sizes(nullptr);
  for (int64_t n : {T, kBr * kBc, kBr * kBc, kBc, kBc}) sizes.take(n);
  Carver carve(scratch.get(sizes.used()));
  float* Dv = carve.take(T);          // (T) rowsum(dO * O), dO as the products see it
  float* P = carve.take(kBr * kBc);   // (kBr, kBc) one tile's probabilities
  float* dS = carve.take(kBr * kBc);  // (kBr, kBc) one tile's dP, then scale * dS
  float* c = carve.take(kBc);         // (kBc) one row's dropout factors
  float* slope = carve.take(kBc);     // (kBc) one row's slopes of the capped scores
  const bool drop = s.dropout != 0;
  RowDropout dropout{0, drop ? attention_drop_threshold(s.dropout) : 0,
                     static_cast<float>(1.0 / (1.0 - s.dropout))};

  for (int64_t group = g0; group < g1; ++group) {
    const int64_t b = group / KV, kvh = group % KV, nk = KeysOf(a.lengths, b, T);
    const float* k = qkv + b * T * ld + (H + kvh) * D;  // rows ld apart; v at + KV D
    float* dk = dqkv + b * T * ld + (H + kvh) * D;      // rows ld apart; dv at + KV D
    for (int64_t j = nk; j < T; ++j) {                  // keys no query sees
      std::fill_n(dk + j * ld, D, 0.0f);
      std::fill_n(dk + j * ld + KV * D, D, 0.0f);
    }
    for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
      const int64_t pair = b * H + h;
      const bool first_head = h == kvh * G;
      const float* q = qkv + b * T * ld + h * D;  // rows ld apart
      const float* o = out + b * T * C + h * D;   // rows C apart
      const float* dO = dout + b * T * C + h * D;
      const float* lrow = lse + pair * T;      // (T)
      float* dqr = dqkv + b * T * ld + h * D;  // rows ld apart
      if (nk == 0) {
        for (int64_t i = 0; i < T; ++i) std::fill_n(dqr + i * ld, D, 0.0f);
        continue;
      }
      if (drop) dropout.pair_key = attention_pair_key(s.seed, b, h);
      if (h == 0 || group == g0)
        WarmBlocks({{qkv + b * T * ld, T * ld},
                    {out + b * T * C, T * C},
                    {dout + b * T * C, T * C},
                    {dqkv + b * T * ld, T * ld}});
      g.begin(q, k, k + KV * D, dO, dqr, dk, dk + KV * D, nk, !first_head);
      if (s.window > 0) g.clear_dq();
      RowDots<Grads::kRoundDout>(Dv, o, dO, C, T, D);

      for (int64_t j0 = 0; j0 < nk; j0 += kBc) {
        const int64_t j1 = std::min(nk, j0 + kBc), nkt = j1 - j0, wt = RoundUp(nkt, N);
        // The rows that see the tile: from j0 when causal, up to its last key's window.
        const int64_t iend = s.window > 0 ? std::min(T, j1 - 1 + s.window) : T;
        bool seen[kBc / kRows + 1] = {};  // key blocks that have had a query tile
        g.begin_keys(j0, nkt);
        for (int64_t i0 = s.causal ? j0 : 0; i0 < iend; i0 += kBr) {
          const int64_t i1 = std::min(iend, i0 + kBr), rows = i1 - i0;
          for (int64_t rb = i0; rb < i1; rb += kRows) {
            const int nr = static_cast<int>(std::min<int64_t>(kRows, i1 - rb));
            const int64_t last = s.causal ? std::min(j1, rb + nr) : j1;
            float *pr = P + (rb - i0) * kBc, *gr = dS + (rb - i0) * kBc;
            g.dots(nr, rb, j0, RoundUp(last - j0, kKeyBlock) / kKeyBlock, pr, gr);
            for (int r = 0; r < nr; ++r) {
              const int64_t i = rb + r, n = (s.causal ? std::min(j1, i + 1) : j1) - j0;
              const int64_t n0 = std::max<int64_t>(0, s.first_key(i) - j0);
              if (cap > 0) CapRow(pr + r * kBc, slope, n0, n, wt, scale, cap);
              if (drop) {
                dropout.factors(c, i, j0, n, wt);
                GradRow<true>(pr + r * kBc, gr + r * kBc, n0, n, wt, scale, lrow[i], Dv[i], c);
              } else {
                GradRow<false>(pr + r * kBc, gr + r * kBc, n0, n, wt, scale, lrow[i], Dv[i],
                               nullptr);
              }
              if (cap > 0) MulRow(gr + r * kBc, slope, wt);
              g.ds_row(rb - i0 + r, gr + r * kBc, nkt);
            }
          }
          g.tile(P, dS, rows, nkt);
          for (int64_t kb = 0; kb < nkt; kb += kRows) {  // dV += P^T dO, dK += dS^T q
            const int nr = static_cast<int>(std::min<int64_t>(kRows, nkt - kb));
            const int64_t t0 = s.causal ? std::max<int64_t>(0, j0 + kb - i0) : 0;
            if (t0 >= rows) continue;
            g.dv_dk(nr, kb, t0, i0, rows, P, dS, !seen[kb / kRows] && g.assigns_keys(first_head));
            seen[kb / kRows] = true;
          }
          for (int64_t rb = i0; rb < i1; rb += kRows) {  // dQ += dS k, assigned on the first tile
            const int nr = static_cast<int>(std::min<int64_t>(kRows, i1 - rb));
            g.dq(nr, rb, i0, j0, s.causal ? std::min(j1, rb + nr) : j1, dS,
                 j0 == 0 && s.window == 0);
          }
        }
        // Keys no query tile reached, 0: none under these tilings (every key has a query at or
        // after it), but no gradient row is left unwritten should one arise.
        for (int64_t kb = 0; kb < nkt; kb += kRows)
          if (!seen[kb / kRows])
            g.dv_dk(static_cast<int>(std::min<int64_t>(kRows, nkt - kb)), kb, 0, 0, 0, P, dS,
                    g.assigns_keys(first_head));
        g.end_keys(j0, j1);
      }
      g.end();
    }
  }
}

// dst (n, D) rows ld apart += src (n, D) rows lds apart, or = with assign.
void StoreRows(float* dst, int64_t ld, const float* src, int64_t lds, int64_t n, int64_t D,
               bool assign) {
  for (int64_t j = 0; j < n; ++j) {
    float* d = dst + j * ld;
    const float* x = src + j * lds;
    if (assign)
      std::memcpy(d, x, D * sizeof(float));
    else
      for (int64_t k = 0; k < D; ++k) d[k] += x[k];
  }
}

// f32 products: q and dO where they are for the dots, k^T and v^T in panels; q, dO and k in
// chunks for the axpys; the gradients where they are when D is whole vectors (they then
// accumulate in place), else padded copies.
struct F32Grads {
  explicit F32Grads(const AttentionShape& s)
      : T(s.seq),
        D(s.head_dim),
        C(s.heads * s.head_dim),
        ld(s.qkv_width()),
        Dp(RoundUp(D, kMaxLanes)),
        direct(D == Dp) {
    const int64_t Tk = RoundUp(T, kKeyBlock);
    thread_local Scratch scratch;
    Carver sizes(nullptr);
    const int64_t chunks = ChunkFloats(T, D);
    for (int64_t n : {D * Tk, D * Tk, chunks, chunks, chunks, T * Dp, kBc * Dp, kBc * Dp})
      sizes.take(n);
    Carver carve(scratch.get(sizes.used()));
    kt = carve.take(D * Tk);  // (Tk / kKeyBlock panels of (D, kKeyBlock)) k^T
    vt = carve.take(D * Tk);  // same for v^T
    qc = carve.take(chunks);  // q, dO and k in chunks, the axpys' right-hand sides
    gc = carve.take(chunks);
    kc = carve.take(chunks);
    dqp = carve.take(T * Dp);    // (T, Dp) dQ, when D is not whole vectors
    dkp = carve.take(kBc * Dp);  // (kBc, Dp) one key tile's dK, same
    dvp = carve.take(kBc * Dp);  // (kBc, Dp) one key tile's dV, same
  }
  void begin(const float* q, const float* k, const float* v, const float* dO, float* dq, float* dk,
             float* dv, int64_t nk, bool accumulate_) {
    dqr = dq, dkr = dk, dvr = dv, accumulate = accumulate_;
    Q = {q, ld};
    G = {dO, C};
    dQ = {dqr, ld};
    if (!direct) dQ = {dqp, Dp};
    if (k != packed_k) {  // a group's later query heads reuse their key/value head's copies
      PackPanels(kt, k, ld, nk, D);
      PackPanels(vt, v, ld, nk, D);
      PackChunks(kc, T, k, ld, nk, D);
      packed_k = k;
    }
    PackChunks(qc, T, q, ld, T, D);
    PackChunks(gc, T, dO, C, T, D);
  }
  AxpyRows Chunks(const float* p) const { return {p, kChunk, T * kChunk}; }
  void clear_dq() const {
    for (int64_t i = 0; i < T; ++i) std::fill_n(dQ[i], direct ? D : Dp, 0.0f);
  }
  // In place, the group's later heads add to what the first assigned; a padded copy is per head.
  bool assigns_keys(bool first_head) const { return first_head || !direct; }
  static constexpr bool kRoundDout = false;
  void begin_keys(int64_t j0, int64_t) {
    dK = {dkr + j0 * ld, ld};
    dV = {dvr + j0 * ld, ld};
    if (!direct) {
      dK = {dkp, Dp};
      dV = {dvp, Dp};
    }
  }
  void dots(int nr, int64_t rb, int64_t j0, int64_t panels, float* p, float* dp) const {
    Dot(nr, Q[rb], Q.ld, kt + j0 * D, D, panels, p, kBc);
    Dot(nr, G[rb], G.ld, vt + j0 * D, D, panels, dp, kBc);
  }
  void ds_row(int64_t, const float*, int64_t) const {}
  void tile(const float*, const float*, int64_t, int64_t) const {}
  void dv_dk(int nr, int64_t kb, int64_t t0, int64_t i0, int64_t rows, const float* P,
             const float* dS, bool assign) const {
    Axpy(nr, P + kb, 1, kBc, t0, rows, Chunks(gc).at(i0), dV[kb], dV.ld, nullptr, Dp, assign);
    Axpy(nr, dS + kb, 1, kBc, t0, rows, Chunks(qc).at(i0), dK[kb], dK.ld, nullptr, Dp, assign);
  }
  void dq(int nr, int64_t rb, int64_t i0, int64_t j0, int64_t last, const float* dS,
          bool assign) const {
    Axpy(nr, dS + (rb - i0) * kBc, kBc, 1, 0, last - j0, Chunks(kc).at(j0), dQ[rb], dQ.ld, nullptr,
         Dp, assign);
  }
  void end_keys(int64_t j0, int64_t j1) const {
    if (direct) return;
    StoreRows(dkr + j0 * ld, ld, dkp, Dp, j1 - j0, D, !accumulate);
    StoreRows(dvr + j0 * ld, ld, dvp, Dp, j1 - j0, D, !accumulate);
  }
  void end() const {
    if (direct) return;
    StoreRows(dqr, ld, dqp, Dp, T, D, true);
  }

  const int64_t T, D, C, ld, Dp;
  const bool direct;  // D whole vectors: rows are used where they are
  float *kt, *vt, *qc, *gc, *kc, *dqp, *dkp, *dvp;
  float *dqr = nullptr, *dkr = nullptr, *dvr = nullptr;  // the head's gradients, rows ld apart
  bool accumulate = false;                               // dk and dv add to what they hold
  const float* packed_k = nullptr;                       // the key rows kt, vt and kc hold
  Rows<const float> Q{nullptr, 0}, G{nullptr, 0};
  Rows<float> dQ{nullptr, 0}, dK{nullptr, 0}, dV{nullptr, 0};
};

void BackwardGroups(const AttentionBackward& a, int64_t g0, int64_t g1) {
  F32Grads grads(a.shape);
  BackwardPass(a, g0, g1, grads);
}

// bf16 products (AttentionShape::bf16_products, AVX512-BF16): the same tiles and online softmax
// in f32, with every product's operands (q, k, v, dO, P, dS) rounded to bf16 and summed in f32
// pairs at a time (vdpbf16ps). The operands are packed per pair into 32-bit words, each holding
// the two bf16 values one instruction multiplies together with the other operand's word:
//   rows:    (n, Dw) pairs along a row (q, dO, dS and P rows), Dw = ceil(D / 2)
//   panels:  (Dw, kKeyBlock) the rows' words transposed in panels of keys (k and v for the dots)
//   stacked: (ceil(n / 2), Dv) rows 2t and 2t + 1 interleaved, Dv = D rounded up to 16 (k, v,
//            q and dO as the right-hand side of the axpys; P^T and dS^T likewise over queries)
// Everything beyond the data is zero, so padded pairs add nothing.
#if HWY_TARGET <= HWY_AVX3
#define SF_BF16_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

constexpr int64_t kWordLanes = 16;  // 32-bit words per 512-bit vector

SF_BF16_ATTR inline __mmask16 FirstLanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// dst (words) = pairs (src[2w], src[2w + 1]) of src's first n floats as bf16, zero beyond.
SF_BF16_ATTR void RowWords(uint32_t* dst, const float* src, int64_t n, int64_t words) {
  for (int64_t w = 0; w < words; w += kWordLanes) {
    const int64_t f = 2 * w;  // first float of these 16 words
    const __m512 lo = _mm512_maskz_loadu_ps(FirstLanes(n - f), src + f);
    const __m512 hi = _mm512_maskz_loadu_ps(FirstLanes(n - f - 16), src + f + 16);
    const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    _mm512_mask_storeu_epi32(dst + w, FirstLanes(words - w), v);
  }
}

// dst (words, a multiple of 16) = (a[d], b[d]) as bf16 pairs for d < n, zero beyond; b may be
// null (zeros).
SF_BF16_ATTR void StackedWords(uint32_t* dst, const float* a, const float* b, int64_t n,
                               int64_t words) {
  alignas(64) static const uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                       21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                       11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (int64_t d = 0; d < words; d += kWordLanes) {
    const __mmask16 m = FirstLanes(n - d);
    const __m512 va = _mm512_maskz_loadu_ps(m, a + d);
    const __m512 vb = b ? _mm512_maskz_loadu_ps(m, b + d) : _mm512_setzero_ps();
    const __m512i v = _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(vb, va));
    _mm512_storeu_si512(dst + d, v);
  }
}

// Rows [0, n) (ld apart, D floats) into stacked pairs: ceil(n / 2) rows of Dv words, and zero
// rows up to `pairs`.
SF_BF16_ATTR void PackStacked(uint32_t* dst, int64_t Dv, const float* src, int64_t ld, int64_t n,
                              int64_t D, int64_t pairs) {
  for (int64_t t = 0; t < pairs; ++t) {
    const int64_t r = 2 * t;
    const float* a = r < n ? src + r * ld : nullptr;
    const float* b = r + 1 < n ? src + (r + 1) * ld : nullptr;
    if (!a)
      std::fill_n(dst + t * Dv, Dv, 0u);
    else
      StackedWords(dst + t * Dv, a, b, D, Dv);
  }
}

// Rows [0, n) (ld apart, D floats) as row words (n, Dw).
SF_BF16_ATTR void PackRowWords(uint32_t* dst, int64_t Dw, const float* src, int64_t ld, int64_t n,
                               int64_t D) {
  for (int64_t r = 0; r < n; ++r) RowWords(dst + r * Dw, src + r * ld, D, Dw);
}

// Keys [0, n) (ld apart, D floats) into panels (Dw, kKeyBlock) of words, zero-padded; `rows`
// (n, Dw) is scratch.
SF_BF16_ATTR void PackWordPanels(uint32_t* dst, uint32_t* rows, int64_t Dw, const float* src,
                                 int64_t ld, int64_t n, int64_t D) {
  PackRowWords(rows, Dw, src, ld, n, D);
  for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
    uint32_t* panel = dst + j0 * Dw;
    const int64_t cols = std::min(kKeyBlock, n - j0);
    simd::transpose32(panel, kKeyBlock, rows + j0 * Dw, Dw, cols, Dw);
    if (cols < kKeyBlock)
      for (int64_t k = 0; k < Dw; ++k)
        std::fill(panel + k * kKeyBlock + cols, panel + (k + 1) * kKeyBlock, 0u);
  }
}

// c (R, panels * kKeyBlock) = a (R rows of Dw words, lda apart) . panels (Dw, kKeyBlock) each.
template <int R>
SF_BF16_ATTR void DotWordsBlock(const uint32_t* a, int64_t lda, const uint32_t* bt, int64_t Dw,
                                int64_t panels, float* c, int64_t ldc) {
  for (int64_t pb = 0; pb < panels; ++pb) {
    __m512 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
    const uint32_t* b = bt + pb * Dw * kKeyBlock;
    for (int64_t k = 0; k < Dw; ++k, b += kKeyBlock) {
      const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
      const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + kWordLanes);
      for (int r = 0; r < R; ++r) {
        const __m512bh ar = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * lda + k]));
        acc0[r] = _mm512_dpbf16_ps(acc0[r], ar, b0);
        acc1[r] = _mm512_dpbf16_ps(acc1[r], ar, b1);
      }
    }
    float* cj = c + pb * kKeyBlock;
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_ps(cj + r * ldc, acc0[r]);
      _mm512_storeu_ps(cj + r * ldc + kWordLanes, acc1[r]);
    }
  }
}

SF_BF16_ATTR void DotWords(int nr, const uint32_t* a, int64_t lda, const uint32_t* bt, int64_t Dw,
                           int64_t panels, float* c, int64_t ldc) {
  WithCount<kRows>(nr, [&](auto rows) SF_BF16_ATTR {
    DotWordsBlock<decltype(rows)::value>(a, lda, bt, Dw, panels, c, ldc);
  });
}

// c (R, NV * 16), first scaled by alpha_r if alpha is given (or, with assign, taken as 0), +=
// sum over pairs t in [t0, t1) of the word p[r * rs + t * ts] . stacked row t of b (NV * 16
// words): b rows ldb apart, c rows ldc.
template <int R, int NV>
SF_BF16_ATTR void AxpyWordsBlock(const uint32_t* p, int64_t rs, int64_t ts, int64_t t0, int64_t t1,
                                 const uint32_t* b, int64_t ldb, float* c, int64_t ldc,
                                 const float* alpha, bool assign) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = assign ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + v * kWordLanes);
  if (alpha && !assign)
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_set1_ps(alpha[r]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_mul_ps(acc[r][v], s);
    }
  for (int64_t t = t0; t < t1; ++t) {
    const uint32_t* bt = b + t * ldb;
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(bt + v * kWordLanes);
    const uint32_t* pt = p + t * ts;
    for (int r = 0; r < R; ++r) {
      const __m512bh pr = (__m512bh)_mm512_set1_epi32(static_cast<int>(pt[r * rs]));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], pr, bv[v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + v * kWordLanes, acc[r][v]);
}

// The same over all Dv columns (a multiple of 16), kVecs vectors at a time, for nr rows.
SF_BF16_ATTR void AxpyWords(int nr, const uint32_t* p, int64_t rs, int64_t ts, int64_t t0,
                            int64_t t1, const uint32_t* b, int64_t ldb, float* c, int64_t ldc,
                            const float* alpha, int64_t Dv, bool assign = false) {
  WithCount<kRows>(nr, [&](auto rows) SF_BF16_ATTR {
    constexpr int R = decltype(rows)::value;
    int64_t col = 0;
    for (; col + kVecs * kWordLanes <= Dv; col += kVecs * kWordLanes)
      AxpyWordsBlock<R, kVecs>(p, rs, ts, t0, t1, b + col, ldb, c + col, ldc, alpha, assign);
    if (col < Dv)
      WithCount<kVecs>(static_cast<int>((Dv - col) / kWordLanes), [&](auto vecs) SF_BF16_ATTR {
        AxpyWordsBlock<R, decltype(vecs)::value>(p, rs, ts, t0, t1, b + col, ldb, c + col, ldc,
                                                 alpha, assign);
      });
  });
}

// bf16 products: q as row words, k in word panels, v stacked over keys; each row's
// probabilities turned into words as they become final.
struct Bf16Products {
  static constexpr int64_t kBcw = kBcF / 2;  // words of a row of kBcF probabilities

  SF_BF16_ATTR explicit Bf16Products(const AttentionShape& s)
      : T(s.seq), D(s.head_dim), ld(s.qkv_width()), Dw((D + 1) / 2), width(RoundUp(D, kWordLanes)) {
    const int64_t Tk = RoundUp(T, kKeyBlock), Tp = (T + 1) / 2;
    thread_local Scratch scratch;
    Carver sizes(nullptr);
    for (int64_t n : {T * Dw, T * Dw, Dw * Tk, Tp * width, kRows * kBcw}) sizes.take(n);
    Carver carve(scratch.get(sizes.used()));
    auto words = [&](int64_t n) { return reinterpret_cast<uint32_t*>(carve.take(n)); };
    qw = words(T * Dw);        // (T, Dw) q rows
    rows = words(T * Dw);      // (T, Dw) k rows, before their panels
    kt = words(Dw * Tk);       // (Tk / kKeyBlock panels of (Dw, kKeyBlock)) k
    vs = words(Tp * width);    // (ceil(T / 2), Dv) v stacked over keys
    pw = words(kRows * kBcw);  // (kRows, kBcw) P rows as words
  }
  SF_BF16_ATTR void pack_queries(const float* q, int64_t first) {
    PackRowWords(qw + first * Dw, Dw, q + first * ld, ld, T - first, D);
  }
  SF_BF16_ATTR void pack_keys(const float* k, const float* v, int64_t nk) {
    PackWordPanels(kt, rows, Dw, k, ld, nk, D);
    PackStacked(vs, width, v, ld, nk, D, (nk + 1) / 2);
  }
  SF_BF16_ATTR void dot(int nr, int64_t rb, int64_t j0, int64_t panels, float* sc) const {
    DotWords(nr, qw + rb * Dw, Dw, kt + j0 * Dw, Dw, panels, sc, kBcF);
  }
  SF_BF16_ATTR void row(int r, const float* p, int64_t w) const {
    RowWords(pw + r * kBcw, p, w, (w + 1) / 2);
  }
  SF_BF16_ATTR void axpy(int nr, int64_t j0, int64_t w, const float*, float* acc,
                         const float* alpha) const {
    AxpyWords(nr, pw, kBcw, 1, 0, (w + 1) / 2, vs + (j0 / 2) * width, width, acc, width, alpha,
              width);
  }

  const int64_t T, D, ld, Dw, width;  // width: Dv
  uint32_t *qw, *rows, *kt, *vs, *pw;
};

SF_BF16_ATTR void ForwardPairsBf16(const AttentionForward& a, int64_t p0, int64_t p1) {
  Bf16Products products(a.shape);
  ForwardPass(a, p0, p1, products);
}

// bf16 products: q and dO as row words, k and v in word panels for the dots; k stacked over keys,
// q and dO over queries for the axpys; per tile, dS rows as words and P^T, dS^T stacked over the
// tile's queries. The gradients accumulate in f32 buffers of Dv columns.
struct Bf16Grads {
  static constexpr int64_t kBcw = kBc / 2;  // words of a row of kBc values

  SF_BF16_ATTR explicit Bf16Grads(const AttentionShape& s)
      : T(s.seq),
        D(s.head_dim),
        C(s.heads * s.head_dim),
        ld(s.qkv_width()),
        Dw((D + 1) / 2),
        Dv(RoundUp(D, kWordLanes)),
        Tp((T + 1) / 2) {
    const int64_t Tk = RoundUp(T, kKeyBlock);
    thread_local Scratch scratch;
    Carver sizes(nullptr);
    for (int64_t n : {T * Dw, T * Dw, T * Dw, Dw * Tk, Dw * Tk, Tp * Dv, Tp * Dv, Tp * Dv, T * Dv,
                      kBc * Dv, kBc * Dv, (kBr / 2) * kBc, (kBr / 2) * kBc, kBr * kBcw})
      sizes.take(n);
    Carver carve(scratch.get(sizes.used()));
    auto words = [&](int64_t n) { return reinterpret_cast<uint32_t*>(carve.take(n)); };
    qw = words(T * Dw);            // (T, Dw) q rows
    gw = words(T * Dw);            // (T, Dw) dO rows
    rows = words(T * Dw);          // (T, Dw) k or v rows, before their panels
    kt = words(Dw * Tk);           // (Tk / kKeyBlock panels of (Dw, kKeyBlock)) k
    vt = words(Dw * Tk);           // same for v
    ks = words(Tp * Dv);           // (ceil(T / 2), Dv) k stacked over keys
    qs = words(Tp * Dv);           // (ceil(T / 2), Dv) q stacked over queries
    gs = words(Tp * Dv);           // (ceil(T / 2), Dv) dO stacked over queries
    dqb = carve.take(T * Dv);      // (T, Dv) dQ
    dkb = carve.take(kBc * Dv);    // (kBc, Dv) one key tile's dK
    dvb = carve.take(kBc * Dv);    // (kBc, Dv) one key tile's dV
    pt = words((kBr / 2) * kBc);   // (kBr / 2, kBc) P^T stacked over queries
    dst = words((kBr / 2) * kBc);  // (kBr / 2, kBc) dS^T the same
    dsw = words(kBr * kBcw);       // (kBr, kBcw) dS rows as words
  }
  SF_BF16_ATTR void begin(const float* q, const float* k, const float* v, const float* dO,
                          float* dq, float* dk, float* dv, int64_t nk, bool accumulate_) {
    dqr = dq, dkr = dk, dvr = dv, accumulate = accumulate_;
    PackRowWords(qw, Dw, q, ld, T, D);
    PackRowWords(gw, Dw, dO, C, T, D);
    if (k != packed_k) {  // a group's later query heads reuse their key/value head's copies
      PackWordPanels(kt, rows, Dw, k, ld, nk, D);
      PackWordPanels(vt, rows, Dw, v, ld, nk, D);
      PackStacked(ks, Dv, k, ld, nk, D, (nk + 1) / 2);
      packed_k = k;
    }
    PackStacked(qs, Dv, q, ld, T, D, Tp);
    PackStacked(gs, Dv, dO, C, T, D, Tp);
  }
  void clear_dq() const { std::fill_n(dqb, T * Dv, 0.0f); }
  bool assigns_keys(bool) const { return true; }  // the key tile's buffers are the head's
  // dO rounded as dP = dO v^T has it, so that dP - D cancels where it should (one key: dS = 0).
  static constexpr bool kRoundDout = true;
  void begin_keys(int64_t, int64_t) const {}
  SF_BF16_ATTR void dots(int nr, int64_t rb, int64_t j0, int64_t panels, float* p,
                         float* dp) const {
    DotWords(nr, qw + rb * Dw, Dw, kt + j0 * Dw, Dw, panels, p, kBc);
    DotWords(nr, gw + rb * Dw, Dw, vt + j0 * Dw, Dw, panels, dp, kBc);
  }
  SF_BF16_ATTR void ds_row(int64_t r, const float* ds, int64_t nkt) const {
    RowWords(dsw + r * kBcw, ds, nkt, (nkt + 1) / 2);
  }
  SF_BF16_ATTR void tile(const float* P, const float* dS, int64_t rows_in, int64_t nkt) const {
    for (int64_t t = 0; t < (rows_in + 1) / 2; ++t) {  // stacked over the tile's queries
      const int64_t r = 2 * t;
      const bool second = r + 1 < rows_in;
      StackedWords(pt + t * kBc, P + r * kBc, second ? P + (r + 1) * kBc : nullptr, nkt, kBc);
      StackedWords(dst + t * kBc, dS + r * kBc, second ? dS + (r + 1) * kBc : nullptr, nkt, kBc);
    }
  }
  SF_BF16_ATTR void dv_dk(int nr, int64_t kb, int64_t t0, int64_t i0, int64_t rows_in, const float*,
                          const float*, bool assign) const {
    const int64_t pairs = (rows_in + 1) / 2;
    AxpyWords(nr, pt + kb, 1, kBc, t0 / 2, pairs, gs + (i0 / 2) * Dv, Dv, dvb + kb * Dv, Dv,
              nullptr, Dv, assign);
    AxpyWords(nr, dst + kb, 1, kBc, t0 / 2, pairs, qs + (i0 / 2) * Dv, Dv, dkb + kb * Dv, Dv,
              nullptr, Dv, assign);
  }
  SF_BF16_ATTR void dq(int nr, int64_t rb, int64_t i0, int64_t j0, int64_t last, const float*,
                       bool assign) const {
    AxpyWords(nr, dsw + (rb - i0) * kBcw, kBcw, 1, 0, (last - j0 + 1) / 2, ks + (j0 / 2) * Dv, Dv,
              dqb + rb * Dv, Dv, nullptr, Dv, assign);
  }
  SF_BF16_ATTR void end_keys(int64_t j0, int64_t j1) const {
    StoreRows(dkr + j0 * ld, ld, dkb, Dv, j1 - j0, D, !accumulate);
    StoreRows(dvr + j0 * ld, ld, dvb, Dv, j1 - j0, D, !accumulate);
  }
  SF_BF16_ATTR void end() const { StoreRows(dqr, ld, dqb, Dv, T, D, true); }

  const int64_t T, D, C, ld, Dw, Dv, Tp;
  uint32_t *qw, *gw, *rows, *kt, *vt, *ks, *qs, *gs, *pt, *dst, *dsw;
  float *dqb, *dkb, *dvb;
  float *dqr = nullptr, *dkr = nullptr, *dvr = nullptr;  // the head's gradients, rows ld apart
  bool accumulate = false;                               // dk and dv add to what they hold
  const float* packed_k = nullptr;                       // the key rows kt, vt and ks hold
};

SF_BF16_ATTR void BackwardGroupsBf16(const AttentionBackward& a, int64_t g0, int64_t g1) {
  Bf16Grads grads(a.shape);
  BackwardPass(a, g0, g1, grads);
}
#undef SF_BF16_ATTR
#else
void ForwardPairsBf16(const AttentionForward& a, int64_t p0, int64_t p1) {
  ForwardPairs(a, p0, p1);
}
void BackwardGroupsBf16(const AttentionBackward& a, int64_t g0, int64_t g1) {
  BackwardGroups(a, g0, g1);
}
#endif

}  // namespace seqforge::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqforge::kernels {

HWY_EXPORT(ForwardPairs);
HWY_EXPORT(BackwardGroups);
HWY_EXPORT(ForwardPairsBf16);
HWY_EXPORT(BackwardGroupsBf16);

void attention_forward_fused(const AttentionForward& a, int64_t p0, int64_t p1) {
  HWY_DYNAMIC_DISPATCH(ForwardPairs)(a, p0, p1);
}
void attention_backward_fused(const AttentionBackward& a, int64_t g0, int64_t g1) {
  HWY_DYNAMIC_DISPATCH(BackwardGroups)(a, g0, g1);
}
void attention_forward_fused_bf16(const AttentionForward& a, int64_t p0, int64_t p1) {
  HWY_DYNAMIC_DISPATCH(ForwardPairsBf16)(a, p0, p1);
}
void attention_backward_fused_bf16(const AttentionBackward& a, int64_t g0, int64_t g1) {
  HWY_DYNAMIC_DISPATCH(BackwardGroupsBf16)(a, g0, g1);
}

}  // namespace seqforge::kernels
#endif
