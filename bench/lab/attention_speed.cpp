// Lab: the fused attention kernels on one core, GFLOP/s of their products (the causal triangle's
// multiply-adds only), forward and backward, f32 and bf16 products; W5's shape by default.
// Build against the library (after `ninja` in build/):
//   g++ -O2 -std=c++20 -fopenmp -Iinclude -Isrc bench/lab/attention_speed.cpp build/libseqforge.a \
//       -lhwy -ldnnl -lfmt -lyaml-cpp -lsqlite3 -lpq -o /tmp/attention_speed
//   /tmp/attention_speed [T D heads batch]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/attention.hpp"

using namespace seqforge;

template <class F>
double median_ms(F&& f, int reps) {
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 256, D = argc > 2 ? std::atoll(argv[2]) : 64;
  const int64_t H = argc > 3 ? std::atoll(argv[3]) : 6, B = argc > 4 ? std::atoll(argv[4]) : 16;
  const int64_t C = H * D;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(B * T * 3 * C), out(B * T * C), lse(B * H * T), dout(B * T * C),
      dqkv(B * T * 3 * C);
  for (float& v : qkv) v = normal(gen);
  for (float& v : dout) v = normal(gen);
  // Multiply-adds of one pair's product over the causal triangle: sum over rows of (i + 1) keys.
  const double macs = double(T) * double(T + 1) / 2 * double(D);
  for (bool bf16 : {false, true}) {
    AttentionShape s;
    s.batch = B, s.seq = T, s.heads = H, s.head_dim = D, s.causal = true;
    s.scale = 1.0 / std::sqrt(double(D));
    s.bf16_products = bf16;
    AttentionForward f{s, qkv.data(), nullptr, out.data(), lse.data()};
    AttentionBackward b{s, qkv.data(), nullptr, out.data(), lse.data(), dout.data(), dqkv.data()};
    auto fwd = bf16 ? kernels::attention_forward_fused_bf16 : kernels::attention_forward_fused;
    auto bwd = bf16 ? kernels::attention_backward_fused_bf16 : kernels::attention_backward_fused;
    const int64_t pairs = B * H;
    const double f_ms = median_ms([&] { fwd(f, 0, pairs); }, 7);
    const double b_ms = median_ms([&] { bwd(b, 0, pairs); }, 7);
    const double f_gflops = 2 * 2 * macs * pairs / (f_ms * 1e6);  // S = q k^T, P v
    const double b_gflops = 2 * 5 * macs * pairs / (b_ms * 1e6);  // S, dP, dV, dK, dQ
    std::printf(
        "%s T %lld D %lld pairs %lld: forward %.2f ms (%.0f GFLOP/s), backward %.2f ms "
        "(%.0f GFLOP/s)\n",
        bf16 ? "bf16" : "f32 ", (long long)T, (long long)D, (long long)pairs, f_ms, f_gflops, b_ms,
        b_gflops);
  }
}
