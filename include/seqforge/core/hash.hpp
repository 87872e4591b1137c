#pragma once
// A fast 64-bit hash of bytes, for fingerprints and checksums of data files (not cryptographic:
// it notices corruption and changes, it does not resist tampering).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace seqforge {

uint64_t hash_bytes(const void* data, size_t size, uint64_t seed = 0);
inline uint64_t hash_text(std::string_view s, uint64_t seed = 0) {
  return hash_bytes(s.data(), s.size(), seed);
}
// A hash as 16 hex digits, as files and metadata record it.
std::string hash_hex(uint64_t h);
// Two values mixed into one (for seeds derived from a seed and an index).
uint64_t mix_seed(uint64_t a, uint64_t b);

}  // namespace seqforge
