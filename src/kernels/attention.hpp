#pragma once
// Multi-head attention kernels (ops.hpp: AttentionForward, AttentionBackward).
//
// Gradient rule: activation gradients are assigned (dqkv =).
//
// Dropout (AttentionShape::dropout > 0): both kernels draw M_ij from
// kernels/attention/dropout_mask.hpp, so they agree element for element.
#include <cstdint>

#include "seqforge/backend/ops.hpp"

namespace seqforge::kernels {

// The scalar reference, the oracle: each query row's scores over all its keys, then softmax,
// in double. T = float or double; pairs (batch row, head) [p0, p1) of B * heads.
template <typename T>
void attention_forward_reference(const AttentionForward& a, int64_t p0, int64_t p1);
template <typename T>
void attention_backward_reference(const AttentionBackward& a, int64_t p0, int64_t p1);

// Fused, f32: tiles of queries against tiles of keys with an online softmax, so the (T, T)
// score matrix is never stored; key tiles wholly above the causal diagonal are skipped.
// Backward recomputes the probabilities from lse. Pairs [p0, p1) as above.
void attention_forward_fused(const AttentionForward& a, int64_t p0, int64_t p1);
void attention_backward_fused(const AttentionBackward& a, int64_t p0, int64_t p1);
// The same with bf16 products (f32 sums) on AVX512-BF16; the caller checks the CPU has it.
void attention_forward_fused_bf16(const AttentionForward& a, int64_t p0, int64_t p1);
void attention_backward_fused_bf16(const AttentionBackward& a, int64_t p0, int64_t p1);

}  // namespace seqforge::kernels
