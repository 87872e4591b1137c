#pragma once
// Multi-head attention kernels (ops.hpp: AttentionForward, AttentionBackward).
//
// Gradient rule: activation gradients are assigned (dqkv =).
//
// Dropout (AttentionShape::dropout > 0): both kernels draw M_ij from
// kernels/attention/dropout_mask.hpp, so they agree element for element.
#include <cmath>
#include <cstdint>

#include "seqforge/backend/ops.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::kernels {

// Every backend's check of a shape before its kernels run.
inline void check_attention_shape(const AttentionShape& s) {
  SF_CHECK(s.batch >= 0 && s.seq >= 0 && s.heads > 0 && s.head_dim > 0, "attention shape: batch ",
           s.batch, ", seq ", s.seq, ", heads ", s.heads, ", head_dim ", s.head_dim);
  SF_CHECK(s.kv_heads >= 0 && s.kv() <= s.heads && s.heads % s.kv() == 0, "attention: ", s.heads,
           " query heads are not groups of ", s.kv(), " key/value heads");
  SF_CHECK(s.window >= 0 && (s.window == 0 || s.causal), "attention: a sliding window of ",
           s.window, " needs a causal mask");
  SF_CHECK(s.softcap >= 0 && std::isfinite(s.softcap), "attention: soft-capping at ", s.softcap);
  SF_CHECK(!(s.bf16_products && s.fp16_products),
           "attention: products on bf16 and on fp16 operands at once");
}

// A score x = scale q.k, soft-capped: softcap tanh(x / softcap) (x itself without a cap), and the
// derivative of the capped score by x: 1 - tanh^2(x / softcap).
template <typename T>
SF_HOST_DEVICE inline T capped_score(T x, T softcap) {
  using std::tanh;
  return softcap > T(0) ? softcap * tanh(x / softcap) : x;
}
template <typename T>
SF_HOST_DEVICE inline T capped_score_slope(T x, T softcap) {
  using std::tanh;
  if (!(softcap > T(0))) return T(1);
  const T t = tanh(x / softcap);
  return T(1) - t * t;
}

// The scalar reference, the oracle: each query row's scores over all its keys, then softmax,
// in double. T = float or double. Forward takes pairs (batch row, head) [p0, p1) of
// B * heads; backward takes groups (batch row, key/value head) [g0, g1) of B * kv(), each with
// its query heads, as a key/value head's gradient sums over them.
template <typename T>
void attention_forward_reference(const AttentionForward& a, int64_t p0, int64_t p1);
template <typename T>
void attention_backward_reference(const AttentionBackward& a, int64_t g0, int64_t g1);

// Fused, f32: tiles of queries against tiles of keys with an online softmax, so the (T, T)
// score matrix is never stored; key tiles wholly above the causal diagonal are skipped.
// Backward recomputes the probabilities from lse. Pairs [p0, p1) and groups [g0, g1) as above.
void attention_forward_fused(const AttentionForward& a, int64_t p0, int64_t p1);
void attention_backward_fused(const AttentionBackward& a, int64_t g0, int64_t g1);
// The same with bf16 products (f32 sums) on AVX512-BF16; the caller checks the CPU has it.
void attention_forward_fused_bf16(const AttentionForward& a, int64_t p0, int64_t p1);
void attention_backward_fused_bf16(const AttentionBackward& a, int64_t g0, int64_t g1);

}  // namespace seqforge::kernels
