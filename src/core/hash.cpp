#include "seqforge/core/hash.hpp"

#include <bit>
#include <cstdio>
#include <cstring>

namespace seqforge {

namespace {
constexpr uint64_t kMul = 0x9e3779b97f4a7c15ull;
uint64_t finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t hash_bytes(const void* data, size_t size, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  // Four independent lanes keep the multiplier busy; each word is position-dependent through
  // the lane's running state.
  uint64_t lane[4] = {seed ^ kMul, seed + 1, std::rotl(seed, 17) ^ 0x5851f42d4c957f2dull, ~seed};
  size_t i = 0;
  for (; i + 32 <= size; i += 32)
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = std::rotl(lane[k] ^ (w * kMul), 29) * 0xbf58476d1ce4e5b9ull;
    }
  uint64_t h = finalize(lane[0]) ^ std::rotl(finalize(lane[1]), 16) ^
               std::rotl(finalize(lane[2]), 32) ^ std::rotl(finalize(lane[3]), 48);
  for (; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return finalize(h ^ size);
}

std::string hash_hex(uint64_t h) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

uint64_t mix_seed(uint64_t a, uint64_t b) { return finalize(finalize(a) + b * kMul); }

}  // namespace seqforge
