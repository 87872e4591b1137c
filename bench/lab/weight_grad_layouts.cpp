// Lab: the layouts of an LSTM weight gradient as one oneDNN matmul over all T*B rows, on W2's
// shapes (K = 105 * 512): dW = dG^T X with dG transposed (tA), against dW^T = X^T dG from a
// transposed copy of X (both operands plain), and both stacked for two inputs. Build:
//   g++ -O2 -std=c++20 -fopenmp bench/lab/weight_grad_layouts.cpp -ldnnl -o /tmp/wgrad
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
using dt = dnnl::memory::data_type;
// C(m,n) += op(A)(m,k) B(k,n); ta: A stored (k, m) row-major.
double run(int64_t m, int64_t n, int64_t k, dt type, bool ta, bool tb, int reps,
           int64_t chunks = 1) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  int64_t kc = k / chunks;
  dnnl::memory::desc a({m, kc}, type, ta ? dnnl::memory::dims{1, m} : dnnl::memory::dims{kc, 1});
  dnnl::memory::desc b({kc, n}, type, tb ? dnnl::memory::dims{1, kc} : dnnl::memory::dims{n, 1});
  dnnl::memory::desc c({m, n}, dt::f32, {n, 1});
  dnnl::primitive_attr attr;
  dnnl::post_ops po;
  po.append_sum(1.0f);
  attr.set_post_ops(po);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, eng);
  dnnl::matmul mm(pd);
  dnnl::memory::desc afull({m, k}, type, ta ? dnnl::memory::dims{1, m} : dnnl::memory::dims{k, 1});
  dnnl::memory::desc bfull({k, n}, type, tb ? dnnl::memory::dims{1, k} : dnnl::memory::dims{n, 1});
  dnnl::memory ma(afull, eng), mb(bfull, eng), mc(c, eng);
  std::memset(ma.get_data_handle(), 0, afull.get_size());
  std::memset(mb.get_data_handle(), 0, bfull.get_size());
  size_t es = type == dt::f32 ? 4 : 2;
  auto once = [&] {
    for (int64_t i = 0; i < chunks; ++i) {
      dnnl::memory sa(a, eng, (char*)ma.get_data_handle() + i * kc * m * es);
      dnnl::memory sb(b, eng, (char*)mb.get_data_handle() + i * kc * n * es);
      mm.execute(s, {{DNNL_ARG_SRC, sa}, {DNNL_ARG_WEIGHTS, sb}, {DNNL_ARG_DST, mc}});
    }
  };
  once();
  once();
  s.wait();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) once();
  s.wait();
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  return sec * 1e3;
}
int main() {
  int64_t K = 53760;
  for (dt type : {dt::bf16, dt::f32}) {
    const char* tn = type == dt::f32 ? "f32 " : "bf16";
    double a1 = run(512, 128, K, type, true, false, 5), a2 = run(512, 256, K, type, true, false, 5);
    std::printf("%s (a) tA: dW_hh %.2f + dW_ih %.2f = %.2f ms\n", tn, a1, a2, a1 + a2);
    double b1 = run(128, 512, K, type, false, false, 5),
           b2 = run(256, 512, K, type, false, false, 5);
    std::printf("%s (b) hT: dW_hh^T %.2f + dW_ih^T %.2f = %.2f ms\n", tn, b1, b2, b1 + b2);
    double c = run(384, 512, K, type, false, false, 5);
    std::printf("%s (c) stacked XT 384x512: %.2f ms\n", tn, c);
    double d = run(512, 384, K, type, true, false, 5);
    std::printf("%s (d) tA stacked 512x384: %.2f ms\n", tn, d);
    double e1 = run(128, 512, K, type, false, false, 5),
           e0 = run(512, 128, K, type, true, false, 5);
    std::printf("%s L0: hT %.2f vs tA %.2f\n", tn, e1, e0);
  }
}
