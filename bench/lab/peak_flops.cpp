// Lab: one core's arithmetic peak, GFLOP/s, of the two instructions the GEMMs and the attention
// kernels are built on: vfmadd (f32, 32 FLOP per zmm) and vdpbf16ps (bf16 pairs into f32, 64
// FLOP per zmm), each on 12 independent accumulators so that latency does not bound them. Build:
//   g++ -O2 -march=native bench/lab/peak_flops.cpp -o /tmp/peak_flops && /tmp/peak_flops
// The machine's peak is this times its cores (run one copy per core to see them together).
#include <immintrin.h>

#include <chrono>
#include <cstdio>

namespace {

constexpr int kAccumulators = 12;
constexpr long kRounds = 20'000'000;

template <typename Step>
double gflops(int flop_per_instruction, Step step) {
  __m512 acc[kAccumulators];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kRounds; ++i) {
#pragma GCC unroll 12
    for (__m512& a : acc) a = step(a);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float sink = 0;
  for (const __m512& a : acc) sink += _mm512_reduce_add_ps(a);
  __asm__ volatile("" : : "x"(sink));
  return double(kRounds) * kAccumulators * flop_per_instruction / s / 1e9;
}

}  // namespace

int main() {
  const __m512 x = _mm512_set1_ps(1e-3f);
  const __m512bh pairs = (__m512bh)_mm512_set1_epi32(0x3a833a83);  // two bf16 1e-3
  for (int repeat = 0; repeat < 2; ++repeat) {
    const double fma = gflops(32, [&](__m512 a) { return _mm512_fmadd_ps(a, x, x); });
    const double dp = gflops(64, [&](__m512 a) { return _mm512_dpbf16_ps(a, pairs, pairs); });
    std::printf("one core: f32 FMA %.1f GFLOP/s, bf16 vdpbf16ps %.1f GFLOP/s (%.2fx)\n", fma, dp,
                dp / fma);
  }
}
