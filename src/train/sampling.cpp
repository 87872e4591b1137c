#include "sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "seqforge/core/error.hpp"

namespace seqforge {

int64_t sample_next(const std::vector<float>& row, double temperature, int64_t top_k, Rng& rng,
                    double top_p) {
  const int64_t V = static_cast<int64_t>(row.size());
  for (int64_t i = 0; i < V; ++i)  // a NaN would leave the order, and the draw, undefined
    if (!std::isfinite(row[i]))
      fail("generate: the model's logit for token ", i, " is ", row[i],
           ": its weights or its input hold values that are not finite");
  std::vector<int64_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  int64_t k = top_k > 0 ? std::min(top_k, V) : V;
  const auto likelier = [&](int64_t a, int64_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), likelier);
  if (temperature == 0) return idx[0];
  const float kth = row[idx[k - 1]];
  const auto tied =
      std::partition(idx.begin() + k, idx.end(), [&](int64_t i) { return row[i] == kth; });
  std::sort(idx.begin() + k, tied, likelier);
  k = tied - idx.begin();
  std::vector<double> p(k);
  double total = 0;
  for (int64_t i = 0; i < k; ++i)
    total += p[i] = std::exp((row[idx[i]] - row[idx[0]]) / temperature);
  int64_t kept = k;
  if (top_p < 1) {
    double before = 0;
    for (kept = 0; kept < k && before < top_p * total; ++kept) before += p[kept];
    total = before;
  }
  double u = rng.uniform() * total;
  for (int64_t i = 0; i < kept; ++i)
    if ((u -= p[i]) <= 0) return idx[i];
  return idx[kept - 1];
}

}  // namespace seqforge
