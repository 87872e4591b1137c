#pragma once
// Deterministic random numbers (xoshiro256**, seeded through splitmix64). The state is four
// words, saved in checkpoints so that resumed runs draw the same numbers.
#include <array>
#include <cstdint>

namespace seqforge {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed);
  uint64_t next();
  double uniform();                      // [0, 1) with 53 random bits
  double uniform(double lo, double hi);  // [lo, hi)
  double normal();                       // standard normal (Box-Muller)
  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_{};
};

}  // namespace seqforge
