// Lab: f32 GEMMs on a B packed once, the recurrent weights' GEMMs: seqforge's own panels
// (simd::gemm_panels, the panels split over the threads) against oneDNN's matmul on B reordered
// into the layout it prefers and OpenBLAS's sgemm on B as stored (Debian's OpenMP build), on the
// workloads' recurrent shapes; GFLOP/s, median of 15, and the own kernel's largest error against
// a double-precision sum. Threads from OMP_NUM_THREADS. Build against the library (after `ninja`
// in build/):
//   g++ -O2 -std=c++20 -fopenmp -Iinclude -Isrc bench/lab/gemm_packed.cpp build/libseqforge.a \
//       -lhwy -ldnnl -ldl -o /tmp/gemm_packed && OMP_NUM_THREADS=2 /tmp/gemm_packed
#include "kernels/cpu/gemm_packed.hpp"

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <vector>

namespace {

using seqforge::GemmShape;
using dt = dnnl::memory::data_type;

template <typename F>
double median_seconds(F&& f) {
  f();
  std::vector<double> s;
  for (int i = 0; i < 15; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(s.begin(), s.begin() + 7, s.end());
  return s[7];
}

using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                       float, float*, int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

struct Case {
  const char* what;
  int64_t m, n, k;
  bool trans_b;
};

}  // namespace

int main() {
  void* lib =
      dlopen("/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  const Sgemm openblas = lib ? reinterpret_cast<Sgemm>(dlsym(lib, "cblas_sgemm")) : nullptr;
  const Case cases[] = {{"W4 h W_hh^T", 64, 2048, 512, true},  {"W4 dR W_hh", 64, 512, 2048, false},
                        {"W1 h W_hh^T", 256, 512, 128, true},  {"W1 dR W_hh", 256, 128, 512, false},
                        {"W4g h W_hh^T", 64, 1536, 512, true}, {"W3 h W_hh^T", 64, 256, 64, true}};
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const int64_t width = seqforge::simd::gemm_panel_width();
  std::printf("panels %lld wide, %d threads, OpenBLAS %s\n", static_cast<long long>(width),
              omp_get_max_threads(), openblas ? "loaded" : "absent");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (const Case& x : cases) {
    const GemmShape s{.trans_b = x.trans_b,
                      .m = x.m,
                      .n = x.n,
                      .k = x.k,
                      .lda = x.k,
                      .ldb = x.trans_b ? x.k : x.n,
                      .ldc = x.n};
    std::vector<float> a(x.m * x.k), b(x.k * x.n), c(x.m * x.n), c2(x.m * x.n);
    for (float& v : a) v = uniform(rng);
    for (float& v : b) v = uniform(rng);
    const int64_t floats = seqforge::simd::gemm_panels_floats(s, width);
    float* panels = static_cast<float*>(std::aligned_alloc(64, (floats * 4 + 63) / 64 * 64));
    seqforge::simd::pack_gemm_panels(s, b.data(), width, panels);
    const int64_t n_panels = (x.n + width - 1) / width;
    const auto own = [&] {
#pragma omp parallel
      {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        seqforge::simd::gemm_panels(s, a.data(), panels, n_panels * t / nt, n_panels * (t + 1) / nt,
                                    c.data(), nullptr);
      }
    };
    own();
    double max_error = 0;
    for (int64_t i = 0; i < x.m; ++i)
      for (int64_t j = 0; j < x.n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < x.k; ++p)
          sum += double(a[i * x.k + p]) * (x.trans_b ? b[j * x.k + p] : b[p * x.n + j]);
        max_error = std::max(max_error, std::fabs(sum - c[i * x.n + j]));
      }
    const double own_s = median_seconds(own);
    const double openblas_s = !openblas ? 0 : median_seconds([&] {
      openblas(kRowMajor, kNoTrans, x.trans_b ? kTrans : kNoTrans, x.m, x.n, x.k, 1.0f, a.data(),
               x.k, b.data(), s.ldb, 0.0f, c2.data(), x.n);
    });
    using dims = dnnl::memory::dims;
    const dnnl::memory::desc a_md({x.m, x.k}, dt::f32, dims{x.k, 1});
    const dnnl::memory::desc b_any({x.k, x.n}, dt::f32, dnnl::memory::format_tag::any);
    const dnnl::memory::desc b_plain({x.k, x.n}, dt::f32, x.trans_b ? dims{1, x.k} : dims{x.n, 1});
    const dnnl::memory::desc c_md({x.m, x.n}, dt::f32, dims{x.n, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), engine);
    const dnnl::matmul mm(pd);
    dnnl::memory am(a_md, engine, a.data()), bm(pd.weights_desc(), engine),
        cm(c_md, engine, c2.data()), source(b_plain, engine, b.data());
    dnnl::reorder(source, bm).execute(stream, source, bm);
    stream.wait();
    const double onednn_s = median_seconds([&] {
      mm.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      stream.wait();
    });
    const double gflop = 2.0 * x.m * x.n * x.k / 1e9;
    std::printf(
        "%-13s %4lldx%5lldx%5lld  own %6.1f  oneDNN packed (%s) %6.1f  OpenBLAS %6.1f GFLOP/s  "
        "max error %.1e\n",
        x.what, static_cast<long long>(x.m), static_cast<long long>(x.n),
        static_cast<long long>(x.k), gflop / own_s, pd.impl_info_str(), gflop / onednn_s,
        openblas ? gflop / openblas_s : 0.0, max_error);
    std::free(panels);
  }
}
