// Lab: one core's arithmetic peak, GFLOP/s, of the instructions the GEMMs and the attention
// kernels are built on: 256-bit vfmadd (f32, 16 FLOP per ymm; AVX2 machines), 512-bit vfmadd
// (32 FLOP per zmm) and vdpbf16ps (bf16 pairs into f32, 64 FLOP per zmm), each on 12 independent
// accumulators so that latency does not bound them. Each runs where the CPU has it. Build:
//   g++ -O2 bench/lab/peak_flops.cpp -o /tmp/peak_flops && /tmp/peak_flops
// The machine's peak is this times its cores (run one copy per core to see them together).
#include <immintrin.h>

#include <chrono>
#include <cstdio>

namespace {

constexpr int kAccumulators = 12;
constexpr long kRounds = 20'000'000;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

__attribute__((target("avx2,fma"))) double fma256_gflops() {
  const __m256 x = _mm256_set1_ps(1e-3f);
  __m256 acc[kAccumulators];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kRounds; ++i) {
#pragma GCC unroll 12
    for (__m256& a : acc) a = _mm256_fmadd_ps(a, x, x);
  }
  const double s = seconds_since(t0);
  __m256 sum = _mm256_setzero_ps();
  for (const __m256& a : acc) sum = _mm256_add_ps(sum, a);
  __asm__ volatile("" : : "x"(sum));
  return double(kRounds) * kAccumulators * 16 / s / 1e9;
}

__attribute__((target("avx512f"))) double fma512_gflops() {
  const __m512 x = _mm512_set1_ps(1e-3f);
  __m512 acc[kAccumulators];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kRounds; ++i) {
#pragma GCC unroll 12
    for (__m512& a : acc) a = _mm512_fmadd_ps(a, x, x);
  }
  const double s = seconds_since(t0);
  __m512 sum = _mm512_setzero_ps();
  for (const __m512& a : acc) sum = _mm512_add_ps(sum, a);
  __asm__ volatile("" : : "x"(sum));
  return double(kRounds) * kAccumulators * 32 / s / 1e9;
}

__attribute__((target("avx512f,avx512bf16"))) double dpbf16_gflops() {
  const __m512bh pairs = (__m512bh)_mm512_set1_epi32(0x3a833a83);  // two bf16 1e-3
  __m512 acc[kAccumulators];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kRounds; ++i) {
#pragma GCC unroll 12
    for (__m512& a : acc) a = _mm512_dpbf16_ps(a, pairs, pairs);
  }
  const double s = seconds_since(t0);
  __m512 sum = _mm512_setzero_ps();
  for (const __m512& a : acc) sum = _mm512_add_ps(sum, a);
  __asm__ volatile("" : : "x"(sum));
  return double(kRounds) * kAccumulators * 64 / s / 1e9;
}

}  // namespace

int main() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  for (int repeat = 0; repeat < 2; ++repeat) {
    std::printf("one core:");
    if (avx2) std::printf(" f32 FMA ymm %.1f GFLOP/s", fma256_gflops());
    if (avx512) std::printf(", f32 FMA zmm %.1f GFLOP/s", fma512_gflops());
    if (bf16) std::printf(", bf16 vdpbf16ps %.1f GFLOP/s", dpbf16_gflops());
    if (!avx2) std::printf(" no AVX2 with FMA");
    std::printf("\n");
  }
}
