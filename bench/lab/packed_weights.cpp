// Lab: oneDNN matmul on the LSTM recurrent shapes with the weights as given (row-major, possibly
// transposed) against weights reordered once into the layout the primitive prefers ("any"),
// 1 thread, the two timed alternately in rounds (medians), f32 and bf16. Build:
//   g++ -O2 -std=c++20 -fopenmp bench/lab/packed_weights.cpp -ldnnl -o /tmp/packed_weights
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

struct Case {
  dnnl::matmul mm;
  dnnl::memory a, b, c;
};

Case make(dnnl::engine& eng, int64_t m, int64_t n, int64_t k, dt type, bool trans_b, bool packed) {
  dnnl::memory::desc a({m, k}, type, {k, 1});
  dnnl::memory::desc b_plain({k, n}, type,
                             trans_b ? dnnl::memory::dims{1, k} : dnnl::memory::dims{n, 1});
  dnnl::memory::desc b_any({k, n}, type, tag::any);
  dnnl::memory::desc c({m, n}, dt::f32, {n, 1});
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, packed ? b_any : b_plain, c), eng);
  Case x{dnnl::matmul(pd), dnnl::memory(a, eng), dnnl::memory(pd.weights_desc(), eng),
         dnnl::memory(c, eng)};
  std::memset(x.a.get_data_handle(), 0, a.get_size());
  std::memset(x.b.get_data_handle(), 0, pd.weights_desc().get_size());
  return x;
}

double time_ms(dnnl::stream& s, Case& x, int reps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i)
    x.mm.execute(s, {{DNNL_ARG_SRC, x.a}, {DNNL_ARG_WEIGHTS, x.b}, {DNNL_ARG_DST, x.c}});
  s.wait();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         reps;
}

int main() {
  omp_set_num_threads(1);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  struct S {
    int64_t m, n, k;
    bool tb;
    const char* what;
  } shapes[] = {{256, 512, 128, true, "W1 fwd h*Whh^T"}, {256, 128, 512, false, "W1 bwd dG*Whh"},
                {512, 512, 128, true, "W2 fwd"},         {64, 2048, 512, true, "W4 fwd"},
                {64, 512, 2048, false, "W4 bwd"},        {64, 256, 64, true, "W3 fwd"}};
  for (const S& sh : shapes)
    for (dt type : {dt::f32, dt::bf16}) {
      Case plain = make(eng, sh.m, sh.n, sh.k, type, sh.tb, false);
      Case packed = make(eng, sh.m, sh.n, sh.k, type, sh.tb, true);
      const int reps = std::max<int64_t>(20, 2000000000 / (2 * sh.m * sh.n * sh.k) / 20);
      time_ms(s, plain, reps);
      time_ms(s, packed, reps);
      std::vector<double> p, q;
      for (int r = 0; r < 9; ++r) {
        p.push_back(time_ms(s, plain, reps));
        q.push_back(time_ms(s, packed, reps));
      }
      std::nth_element(p.begin(), p.begin() + 4, p.end());
      std::nth_element(q.begin(), q.begin() + 4, q.end());
      const double flop = 2.0 * sh.m * sh.n * sh.k;
      std::printf("%-16s %-4s plain %7.4f ms (%5.1f GFLOP/s)  packed %7.4f ms (%5.1f)  x%.2f\n",
                  sh.what, type == dt::f32 ? "f32" : "bf16", p[4], flop / p[4] / 1e6, q[4],
                  flop / q[4] / 1e6, p[4] / q[4]);
    }
}
