// Multi-head attention, the scalar reference: for each (batch row, head) pair and query row, the
// scores over the row's allowed keys, softmax and the weighted sum of values, all in double.
// Backward runs per (batch row, key/value head), its group's query heads in turn, so that each
// key and value gradient is summed in one place.
// Backward recomputes the probabilities from qkv (it reads neither out nor lse) and applies the
// textbook gradient, per query row i over its allowed keys j, with c_ij = M_ij / (1 - p) the
// dropout factor (1 without dropout):
//   P_ij = softmax_j(cap(scale q_i . k_j))      dP_ij = c_ij dO_i . v_j
//   D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij
//   dS_ij = P_ij (dP_ij - D_i) cap'(scale q_i . k_j)
// where cap is the identity, or with soft-capping x -> softcap tanh(x / softcap).
//   dq_i = scale sum_j dS_ij k_j,   dk_j = scale sum_i dS_ij q_i,   dv_j = sum_i P_ij c_ij dO_i
//
// Gradient rule: activation gradients are assigned (dqkv =); a query with no key, and a key
// that no query sees, gets 0.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/attention/dropout_mask.hpp"

namespace seqforge::kernels {

namespace {

// Where pair p's q, k and v rows are (its key/value head's for k and v), and which keys each
// query row may see.
struct Pair {
  const AttentionShape& s;
  int64_t T, D, ld, b, h, g, keys;
  Pair(const AttentionShape& shape, const void* lengths, int64_t p)
      : s(shape),
        T(s.seq),
        D(s.head_dim),
        ld(s.qkv_width()),
        b(p / s.heads),
        h(p % s.heads),
        g(h / s.group()),
        keys(s.seq) {
    if (lengths) keys = std::clamp<int64_t>(static_cast<const int64_t*>(lengths)[b], 0, T);
  }
  // Offsets into (B, T, qkv_width()) of row t's q, k and v for this head.
  int64_t q(int64_t t) const { return (b * T + t) * ld + h * D; }
  int64_t k(int64_t t) const { return (b * T + t) * ld + (s.heads + g) * D; }
  int64_t v(int64_t t) const { return k(t) + s.kv() * D; }
  // Offset into (B, T, heads D) of row t's head slice, and into (B, heads, T) of row t's lse.
  int64_t o(int64_t t) const { return (b * T + t) * s.heads * D + h * D; }
  int64_t lse(int64_t t) const { return (b * s.heads + h) * T + t; }
  // Keys [first(i), last(i)) are query row i's.
  int64_t first(int64_t i) const { return std::min(s.first_key(i), last(i)); }
  int64_t last(int64_t i) const { return s.last_key(i, keys); }
};

// p [j0, n) = softmax of the scores x_ij = cap(scale q_i . k_j) over keys j0 <= j < n; returns
// log sum_j exp(x_ij). With `slope`, slope[j] = d x_ij / d (scale q_i . k_j) (1 without a cap).
template <typename T>
double softmax_row(const T* qkv, const Pair& pr, int64_t i, int64_t j0, int64_t n, double* p,
                   double* slope = nullptr) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = j0; j < n; ++j) {
    double s = 0;
    for (int64_t d = 0; d < pr.D; ++d) s += double(qkv[pr.q(i) + d]) * double(qkv[pr.k(j) + d]);
    p[j] = capped_score(pr.s.scale * s, pr.s.softcap);
    if (slope) slope[j] = capped_score_slope(pr.s.scale * s, pr.s.softcap);
    m = std::max(m, p[j]);
  }
  double sum = 0;
  for (int64_t j = j0; j < n; ++j) {
    p[j] = std::exp(p[j] - m);
    sum += p[j];
  }
  for (int64_t j = j0; j < n; ++j) p[j] /= sum;
  return m + std::log(sum);
}

// c (n) = M_ij / (1 - p) for query row i's keys j < n: 1 without dropout, else 0 or 1 / (1 - p).
void dropout_factors(const AttentionShape& s, const Pair& pr, int64_t i, int64_t n, double* c) {
  if (s.dropout == 0) {
    std::fill_n(c, n, 1.0);
    return;
  }
  const uint64_t threshold = attention_drop_threshold(s.dropout);
  const uint64_t row = attention_row_key(attention_pair_key(s.seed, pr.b, pr.h), i);
  for (int64_t j = 0; j < n; ++j)
    c[j] = attention_keep(row, j, threshold) ? 1.0 / (1.0 - s.dropout) : 0.0;
}

}  // namespace

template <typename T>
void attention_forward_reference(const AttentionForward& a, int64_t p0, int64_t p1) {
  const AttentionShape& s = a.shape;
  const T* qkv = static_cast<const T*>(a.qkv);        // (B, T, qkv_width())
  T* out = static_cast<T*>(a.out);                    // (B, T, heads D)
  T* lse = static_cast<T*>(a.lse);                    // (B, heads, T)
  std::vector<double> p(static_cast<size_t>(s.seq));  // (T) one row's probabilities
  std::vector<double> c(p.size());                    // (T) their dropout factors
  for (int64_t pair = p0; pair < p1; ++pair) {
    const Pair pr(s, a.lengths, pair);
    for (int64_t i = a.first_row; i < pr.T; ++i) {
      const int64_t j0 = pr.first(i), n = pr.last(i);
      if (n == j0) {
        std::fill_n(out + pr.o(i), pr.D, T(0));
        lse[pr.lse(i)] = -std::numeric_limits<T>::infinity();
        continue;
      }
      lse[pr.lse(i)] = static_cast<T>(softmax_row(qkv, pr, i, j0, n, p.data()));
      dropout_factors(s, pr, i, n, c.data());
      for (int64_t d = 0; d < pr.D; ++d) {
        double o = 0;
        for (int64_t j = j0; j < n; ++j) o += p[j] * c[j] * double(qkv[pr.v(j) + d]);
        out[pr.o(i) + d] = static_cast<T>(o);
      }
    }
  }
}

template <typename T>
void attention_backward_reference(const AttentionBackward& a, int64_t g0, int64_t g1) {
  const AttentionShape& s = a.shape;
  const T* qkv = static_cast<const T*>(a.qkv);    // (B, T, qkv_width())
  const T* dout = static_cast<const T*>(a.dout);  // (B, T, heads D)
  T* dqkv = static_cast<T*>(a.dqkv);              // (B, T, qkv_width())
  const size_t TD = static_cast<size_t>(s.seq * s.head_dim);
  std::vector<double> p(static_cast<size_t>(s.seq)), dp(p.size());  // (T) one query row's
  std::vector<double> slope(p.size());                      // (T) its scores' slopes under the cap
  std::vector<double> c(p.size());                          // (T) its dropout factors
  std::vector<double> dq(static_cast<size_t>(s.head_dim));  // (D)
  std::vector<double> dk(TD), dv(TD);  // (T, D) one key/value head's, over its group
  for (int64_t group = g0; group < g1; ++group) {
    const int64_t b = group / s.kv(), h0 = group % s.kv() * s.group();
    std::fill(dk.begin(), dk.end(), 0.0);
    std::fill(dv.begin(), dv.end(), 0.0);
    for (int64_t h = h0; h < h0 + s.group(); ++h) {
      const Pair pr(s, a.lengths, b * s.heads + h);
      const int64_t D = pr.D;
      for (int64_t i = 0; i < pr.T; ++i) {
        const int64_t j0 = pr.first(i), n = pr.last(i);
        std::fill(dq.begin(), dq.end(), 0.0);
        if (n > j0) softmax_row(qkv, pr, i, j0, n, p.data(), slope.data());
        dropout_factors(s, pr, i, n, c.data());
        double Di = 0;
        for (int64_t j = j0; j < n; ++j) {
          double g = 0;
          for (int64_t d = 0; d < D; ++d) g += double(dout[pr.o(i) + d]) * double(qkv[pr.v(j) + d]);
          dp[j] = g * c[j];
          Di += p[j] * dp[j];
        }
        for (int64_t j = j0; j < n; ++j) {
          const double ds = p[j] * (dp[j] - Di) * slope[j];
          for (int64_t d = 0; d < D; ++d) {
            dq[d] += s.scale * ds * double(qkv[pr.k(j) + d]);
            dk[j * D + d] += s.scale * ds * double(qkv[pr.q(i) + d]);
            dv[j * D + d] += p[j] * c[j] * double(dout[pr.o(i) + d]);
          }
        }
        for (int64_t d = 0; d < D; ++d) dqkv[pr.q(i) + d] = static_cast<T>(dq[d]);
      }
    }
    const Pair pr(s, a.lengths, b * s.heads + h0);
    for (int64_t j = 0; j < pr.T; ++j)
      for (int64_t d = 0; d < pr.D; ++d) {
        dqkv[pr.k(j) + d] = static_cast<T>(dk[j * pr.D + d]);
        dqkv[pr.v(j) + d] = static_cast<T>(dv[j * pr.D + d]);
      }
  }
}

template void attention_forward_reference<float>(const AttentionForward&, int64_t, int64_t);
template void attention_forward_reference<double>(const AttentionForward&, int64_t, int64_t);
template void attention_backward_reference<float>(const AttentionBackward&, int64_t, int64_t);
template void attention_backward_reference<double>(const AttentionBackward&, int64_t, int64_t);

}  // namespace seqforge::kernels
