// Lab: f32 GEMM rates of oneDNN's matmul and OpenBLAS's sgemm (Debian's OpenMP build, the same
// runtime) on the training workloads' shapes, 2 threads, GFLOP/s (median of 9). Cap either with
// ONEDNN_MAX_CPU_ISA=AVX2 and OPENBLAS_CORETYPE=Haswell to see an AVX2-only machine. Build:
//   g++ -O2 -fopenmp bench/lab/gemm_providers.cpp -I/usr/include/x86_64-linux-gnu/openblas-openmp \
//     -L/usr/lib/x86_64-linux-gnu/openblas-openmp
//     -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp \ -lopenblas -ldnnl -o
//     /tmp/gemm_providers && /tmp/gemm_providers
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

namespace {

struct Shape {
  const char* what;
  int64_t m, n, k;
  bool trans_a, trans_b;
};

template <typename F>
double median_seconds(F&& f) {
  f();
  std::vector<double> s;
  for (int i = 0; i < 9; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(s.begin(), s.begin() + 4, s.end());
  return s[4];
}

}  // namespace

int main() {
  const Shape shapes[] = {
      {"W1 recurrent h W_hh^T", 256, 512, 128, false, true},
      {"W1 input projection", 256 * 150, 512, 128, false, true},
      {"W1 dW_hh = dG^T H", 512, 128, 256 * 150, true, false},
      {"W4 recurrent", 64, 2048, 512, false, true},
      {"W4 projection", 64 * 128, 2048, 512, false, true},
      {"W4 dW = dG^T X", 2048, 512, 64 * 128, true, false},
      {"W4 dX = dG W", 64 * 128, 512, 2048, false, false},
      {"W5 qkv", 4096, 1152, 384, false, true},
      {"W5 mlp fc", 4096, 1536, 384, false, true},
      {"W5 dW mlp", 1536, 384, 4096, true, false},
      {"square 2048", 2048, 2048, 2048, false, false},
  };
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::printf("oneDNN %s (isa %d), OpenBLAS %s, %d threads\n",
              std::to_string(dnnl::version()->major).c_str(), int(dnnl::get_effective_cpu_isa()),
              openblas_get_corename(), omp_get_max_threads());
  for (const Shape& s : shapes) {
    std::vector<float> a(s.m * s.k, 0.5f), b(s.k * s.n, 0.25f), c(s.m * s.n);
    using dims = dnnl::memory::dims;
    const dnnl::memory::desc a_md({s.m, s.k}, dnnl::memory::data_type::f32,
                                  s.trans_a ? dims{1, s.m} : dims{s.k, 1});
    const dnnl::memory::desc b_md({s.k, s.n}, dnnl::memory::data_type::f32,
                                  s.trans_b ? dims{1, s.k} : dims{s.n, 1});
    const dnnl::memory::desc c_md({s.m, s.n}, dnnl::memory::data_type::f32, dims{s.n, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine);
    const dnnl::matmul mm(pd);
    dnnl::memory am(a_md, engine, a.data()), bm(b_md, engine, b.data()), cm(c_md, engine, c.data());
    const double flop = 2.0 * s.m * s.n * s.k;
    const double onednn = median_seconds([&] {
      mm.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      stream.wait();
    });
    const double openblas = median_seconds([&] {
      cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans,
                  s.trans_b ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data(),
                  s.trans_a ? s.m : s.k, b.data(), s.trans_b ? s.k : s.n, 0.0f, c.data(), s.n);
    });
    std::printf("%-24s %6ldx%5ldx%6ld  oneDNN %-16s %6.1f  OpenBLAS %6.1f GFLOP/s\n", s.what,
                long(s.m), long(s.n), long(s.k), pd.impl_info_str(), flop / onednn / 1e9,
                flop / openblas / 1e9);
  }
}
