// Lab: f32 GEMM rates of oneDNN's matmul and of OpenBLAS's and BLIS's sgemm (Debian's OpenMP
// builds, the same runtime, loaded as the engine loads them) on the training workloads' shapes,
// 2 threads, GFLOP/s (median of 9). Cap oneDNN and OpenBLAS with ONEDNN_MAX_CPU_ISA=AVX2 and
// OPENBLAS_CORETYPE=Haswell to see an AVX2-only machine (BLIS has no such switch). Build:
//   g++ -O2 -fopenmp bench/lab/gemm_providers.cpp -ldnnl -ldl -o /tmp/gemm_providers &&
//     /tmp/gemm_providers
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

namespace {

struct Shape {
  const char* what;
  int64_t m, n, k;
  bool trans_a, trans_b;
};

// cblas_sgemm of a library loaded on its own (both export the same names), or nullptr.
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                       float, float*, int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
Sgemm load_sgemm(const char* path, std::string* name) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) return nullptr;
  using Text = const char* (*)();
  if (auto core = reinterpret_cast<Text>(dlsym(lib, "openblas_get_corename"))) *name = core();
  using Id = int (*)();
  using Arch = const char* (*)(int);
  const auto arch = reinterpret_cast<Arch>(dlsym(lib, "bli_arch_string"));
  const auto id = reinterpret_cast<Id>(dlsym(lib, "bli_arch_query_id"));
  if (arch && id) *name = arch(id());
  using Threads = void (*)(long);
  if (auto threads = reinterpret_cast<Threads>(dlsym(lib, "bli_thread_set_num_threads")))
    threads(omp_get_max_threads());  // BLIS reads no OpenMP setting of its own
  return reinterpret_cast<Sgemm>(dlsym(lib, "cblas_sgemm"));
}

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
      {"W5 attention proj", 4096, 384, 384, false, true},
      {"W5 mlp fc", 4096, 1536, 384, false, true},
      {"W5 mlp proj", 4096, 384, 1536, false, true},
      {"W5 dX mlp fc", 4096, 384, 1536, false, false},
      {"W5 dW mlp fc", 1536, 384, 4096, true, false},
      {"W5 dW mlp proj", 384, 1536, 4096, true, false},
      {"W5 lm head", 4096, 65, 384, false, true},
      {"square 2048", 2048, 2048, 2048, false, false},
  };
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::string openblas_core = "?", blis_config = "?";
  const Sgemm openblas =
      load_sgemm("/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0", &openblas_core);
  const Sgemm blis = load_sgemm("/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", &blis_config);
  std::printf("oneDNN %s (isa %d), OpenBLAS %s, BLIS %s, %d threads\n",
              std::to_string(dnnl::version()->major).c_str(), int(dnnl::get_effective_cpu_isa()),
              openblas ? openblas_core.c_str() : "absent", blis ? blis_config.c_str() : "absent",
              omp_get_max_threads());
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
    const auto rate = [&](Sgemm sgemm) {
      if (!sgemm) return 0.0;
      return flop / 1e9 / median_seconds([&] {
               sgemm(kRowMajor, s.trans_a ? kTrans : kNoTrans, s.trans_b ? kTrans : kNoTrans, s.m,
                     s.n, s.k, 1.0f, a.data(), s.trans_a ? s.m : s.k, b.data(),
                     s.trans_b ? s.k : s.n, 0.0f, c.data(), s.n);
             });
    };
    std::printf("%-24s %6ldx%5ldx%6ld  oneDNN %-16s %6.1f  OpenBLAS %6.1f  BLIS %6.1f GFLOP/s\n",
                s.what, long(s.m), long(s.n), long(s.k), pd.impl_info_str(), flop / onednn / 1e9,
                rate(openblas), rate(blis));
  }
}
