// Lab: oneDNN matmul GFLOP/s for f32 and bf16 (f32 output) on the LSTM workloads' GEMM shapes,
// 1 thread and all threads, plain row-major weights. Build:
//   g++ -O2 -std=c++20 -fopenmp bench/lab/gemm_dtypes.cpp -ldnnl -o /tmp/gemm_dtypes
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

using dt = dnnl::memory::data_type;

double run(int64_t m, int64_t n, int64_t k, dt type, bool trans_b, int reps) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  dnnl::memory::desc a({m, k}, type, {k, 1});
  dnnl::memory::desc b({k, n}, type, trans_b ? dnnl::memory::dims{1, k} : dnnl::memory::dims{n, 1});
  dnnl::memory::desc c({m, n}, dt::f32, {n, 1});
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), eng);
  dnnl::matmul mm(pd);
  dnnl::memory ma(a, eng), mb(b, eng), mc(c, eng);
  std::memset(ma.get_data_handle(), 0, a.get_size());
  std::memset(mb.get_data_handle(), 0, b.get_size());
  for (int i = 0; i < 2; ++i)
    mm.execute(s, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  s.wait();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i)
    mm.execute(s, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  s.wait();
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  return 2.0 * m * n * k / sec / 1e9;
}

int main() {
  struct S {
    int64_t m, n, k;
    bool tb;
    int reps;
    const char* what;
  };
  S shapes[] = {
      {256, 512, 128, true, 2000, "W1 recurrent"}, {38400, 512, 136, true, 10, "W1 input proj l1"},
      {512, 128, 38400, false, 10, "W1 dW_hh"},    {512, 512, 128, true, 1000, "W2 recurrent"},
      {64, 2048, 512, true, 1000, "W4 recurrent"}, {8192, 2048, 512, true, 5, "W4 input proj"},
      {64, 256, 24, true, 5000, "W3-ish"}};
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (const S& s : shapes)
      std::printf("%d thr %-18s %6ldx%5ldx%6ld  f32 %6.1f  bf16 %6.1f GFLOP/s\n", threads, s.what,
                  s.m, s.n, s.k, run(s.m, s.n, s.k, dt::f32, s.tb, s.reps),
                  run(s.m, s.n, s.k, dt::bf16, s.tb, s.reps));
  }
  // Two GEMMs side by side, one per core.
  omp_set_num_threads(2);
  for (auto type : {dt::f32, dt::bf16}) {
    double g[2];
#pragma omp parallel num_threads(2)
    g[omp_get_thread_num()] = run(256, 512, 128, type, true, 2000);
    std::printf("two side by side, 256x512x128 %s: %.1f aggregate GFLOP/s\n",
                type == dt::f32 ? "f32" : "bf16", g[0] + g[1]);
  }
}
