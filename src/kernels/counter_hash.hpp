#pragma once
// The counter-based hash behind every random mask (dropout, attention dropout), shared by the host
// kernels and the CUDA kernels so that a GPU run draws the CPU run's masks bit for bit.
#include <cstdint>

#include "seqforge/core/host_device.hpp"

namespace seqforge::ref {

// A 64-bit hash of (seed, index), splitmix64's finalizer: counter-based, so any thread or device
// draws the same value for the same element.
SF_HOST_DEVICE inline uint64_t counter_hash(uint64_t seed, uint64_t index) {
  uint64_t z = seed ^ (index * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A mask's seed mixed with the u64 at `base` where there is one (Backend::set_seed_base).
SF_HOST_DEVICE inline uint64_t seed_with_base(const uint64_t* base, uint64_t seed) {
  return base ? counter_hash(*base, seed) : seed;
}

}  // namespace seqforge::ref
