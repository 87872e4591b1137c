// Lab: Highway's Tanh against the continued-fraction tanh of the LSTM cell (one division),
// on AVX-512: max absolute error over [-12, 12] and time per element, alternately timed. Build:
//   g++ -O2 -std=c++20 -march=skylake-avx512 bench/lab/tanh_speed.cpp -o /tmp/tanh_speed
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

namespace hn = hwy::HWY_NAMESPACE;

template <class D, class V>
HWY_INLINE V RationalTanh(D d, V x) {  // as FastTanh in src/kernels/cpu/pointwise_simd.cpp
  const V limit = hn::Set(d, 9.0f);
  const V y = hn::Min(limit, hn::Max(hn::Neg(limit), x));
  const V h = hn::Mul(hn::Set(d, 0.5f), y), u = hn::Mul(h, h);
  V n = hn::MulAdd(u, hn::Set(d, 1.0f), hn::Set(d, 378.0f));
  n = hn::MulAdd(u, n, hn::Set(d, 17325.0f));
  n = hn::MulAdd(u, n, hn::Set(d, 135135.0f));
  V q = hn::MulAdd(u, hn::Set(d, 28.0f), hn::Set(d, 3150.0f));
  q = hn::MulAdd(u, q, hn::Set(d, 62370.0f));
  q = hn::MulAdd(u, q, hn::Set(d, 135135.0f));
  return hn::Div(hn::Mul(y, hn::Mul(n, q)), hn::MulAdd(hn::Mul(u, n), n, hn::Mul(q, q)));
}

int main() {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d), n = 32768 * 5;
  std::vector<float> x(n), y(n);
  for (size_t i = 0; i < n; ++i) x[i] = -12.0f + 24.0f * float(i) / float(n);
  double err_hwy = 0, err_rat = 0;
  for (size_t i = 0; i < n; i += N) {
    const auto v = hn::LoadU(d, x.data() + i);
    float a[64], b[64];
    hn::StoreU(hn::Tanh(d, v), d, a);
    hn::StoreU(RationalTanh(d, v), d, b);
    for (size_t k = 0; k < N; ++k) {
      const double t = std::tanh(double(x[i + k]));
      err_hwy = std::max(err_hwy, std::fabs(a[k] - t));
      err_rat = std::max(err_rat, std::fabs(b[k] - t));
    }
  }
  auto time = [&](bool rational) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 50; ++rep)
      for (size_t i = 0; i < n; i += N) {
        const auto v = hn::LoadU(d, x.data() + i);
        hn::StoreU(rational ? RationalTanh(d, v) : hn::Tanh(d, v), d, y.data() + i);
      }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
           (50.0 * n);
  };
  std::vector<double> h, r;
  for (int round = 0; round < 15; ++round) {
    h.push_back(time(false));
    r.push_back(time(true));
  }
  std::sort(h.begin(), h.end());
  std::sort(r.begin(), r.end());
  std::printf("max abs error: highway %.2e, rational %.2e\n", err_hwy, err_rat);
  std::printf("ns per element (median): highway %.3f, rational %.3f, ratio %.2f\n", h[7], r[7],
              h[7] / r[7]);
}
