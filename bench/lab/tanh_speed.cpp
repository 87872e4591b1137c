// Lab: Highway's Tanh against a rational (13/6-degree odd/even) approximation with one division,
// on AVX-512: max absolute error over [-12, 12] and time per element, alternately timed. Build:
//   g++ -O2 -std=c++20 -march=skylake-avx512 bench/lab/tanh_speed.cpp -o /tmp/tanh_speed
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

namespace hn = hwy::HWY_NAMESPACE;

template <class D, class V>
HWY_INLINE V RationalTanh(D d, V x) {
  // tanh(x) ~ x P(x^2) / Q(x^2) on [-9, 9], clamped outside (|tanh| rounds to 1 in f32 there).
  const V c = hn::Set(d, 9.0f);
  x = hn::Min(hn::Max(x, hn::Neg(c)), c);
  const V x2 = hn::Mul(x, x);
  V p = hn::Set(d, -2.76076847742355e-16f);
  p = hn::MulAdd(x2, p, hn::Set(d, 2.00018790482477e-13f));
  p = hn::MulAdd(x2, p, hn::Set(d, -8.60467152213735e-11f));
  p = hn::MulAdd(x2, p, hn::Set(d, 5.12229709037114e-08f));
  p = hn::MulAdd(x2, p, hn::Set(d, 1.48572235717979e-05f));
  p = hn::MulAdd(x2, p, hn::Set(d, 6.37261928875436e-04f));
  p = hn::MulAdd(x2, p, hn::Set(d, 4.89352455891786e-03f));
  p = hn::Mul(x, p);
  V q = hn::Set(d, 1.19825839466702e-06f);
  q = hn::MulAdd(x2, q, hn::Set(d, 1.18534705686654e-04f));
  q = hn::MulAdd(x2, q, hn::Set(d, 2.26843463243900e-03f));
  q = hn::MulAdd(x2, q, hn::Set(d, 4.89352518554385e-03f));
  return hn::Div(p, q);
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
