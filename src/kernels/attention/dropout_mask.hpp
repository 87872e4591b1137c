#pragma once
// The keep-mask of dropout on attention probabilities (ops.hpp: AttentionShape::dropout), shared
// by the reference, the fused kernel and the CUDA kernels: M_ij is a counter-based hash of (seed,
// b, h, i, j), so forward and backward, and every tiling and thread split, draw the same mask
// without storing it.
#include <cmath>
#include <cstdint>

#include "kernels/counter_hash.hpp"  // SF_HOST_DEVICE
#include "seqforge/core/error.hpp"

namespace seqforge::kernels {

// splitmix64's finalizer: every input bit reaches every output bit.
SF_HOST_DEVICE inline uint64_t attention_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline constexpr uint64_t kAttentionGolden = 0x9e3779b97f4a7c15ull;  // 2^64 / golden ratio

// The hash of (seed, b, h), then of query row i: one per row, so that each key costs one mix.
SF_HOST_DEVICE inline uint64_t attention_pair_key(uint64_t seed, int64_t b, int64_t h) {
  const uint64_t z = attention_mix(seed + kAttentionGolden);
  return attention_mix(attention_mix(z + uint64_t(b) * kAttentionGolden) +
                       uint64_t(h) * kAttentionGolden);
}
SF_HOST_DEVICE inline uint64_t attention_row_key(uint64_t pair_key, int64_t i) {
  return attention_mix(pair_key + uint64_t(i) * kAttentionGolden);
}

// Hashes below p * 2^64 are dropped: the threshold, once per call site. p must be in [0, 1).
inline uint64_t attention_drop_threshold(double p) {
  SF_CHECK(p >= 0 && p < 1, "attention dropout ", p, " is not in [0, 1)");
  return static_cast<uint64_t>(std::ldexp(p, 64));  // below 2^64 for any double p < 1
}

// M_ij for key j of the query row whose attention_row_key is row_key.
SF_HOST_DEVICE inline bool attention_keep(uint64_t row_key, int64_t j, uint64_t threshold) {
  return attention_mix(row_key + uint64_t(j) * kAttentionGolden) >= threshold;
}

}  // namespace seqforge::kernels
