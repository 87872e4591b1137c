// Random, TPE and grid samplers. TPE follows Optuna 3.1's univariate TPESampler defaults: 10
// random start-up trials, 24 candidates drawn from l(x) and ranked by l(x)/g(x), gamma(n) =
// min(ceil(0.1 n), 25), older observations down-weighted past 25, a prior component, "magic
// clip" on the bandwidths, pruned trials ranked below complete ones by how far they got.
#include "seqforge/tune/samplers.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>

#include "seqforge/core/error.hpp"
#include "seqforge/core/rng.hpp"

namespace seqforge::tune {

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One stream per (seed, trial number, parameter): a trial's draw depends on nothing else.
Rng stream(uint64_t seed, int64_t number, const std::string& param) {
  return Rng(mix(mix(seed) ^ mix(uint64_t(number) + 0x51ed27) ^ std::hash<std::string>{}(param)));
}

double sample_uniform(const Param& p, Rng& rng) {
  if (p.kind == Param::Kind::categorical)
    return std::min(double(p.choices.size()) - 1, std::floor(rng.uniform() * p.choices.size()));
  if (p.log) {
    const double lo = p.kind == Param::Kind::integer ? p.low - 0.5 : p.low;
    const double hi = p.kind == Param::Kind::integer ? p.high + 0.5 : p.high;
    return p.snap(std::exp(rng.uniform(std::log(lo), std::log(hi))));
  }
  if (p.step > 0) {
    const double k = std::round((p.high - p.low) / p.step);
    return p.snap(p.low + p.step * std::min(k, std::floor(rng.uniform() * (k + 1))));
  }
  return p.snap(rng.uniform(p.low, p.high));
}

class RandomSampler final : public Sampler {
 public:
  explicit RandomSampler(const TuneSettings& s) : s_(s) {}
  std::map<std::string, double> sample(const std::vector<Trial>&, const Trial& trial) override {
    const int64_t number = trial.number;
    std::map<std::string, double> out;
    for (const auto& p : s_.space) {
      Rng rng = stream(s_.sampler.seed, number, p.name);
      out[p.name] = sample_uniform(p, rng);
    }
    return out;
  }

 private:
  TuneSettings s_;
};

double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

std::vector<double> default_weights(size_t n) {
  std::vector<double> w(n, 1.0);
  if (n >= 25) {  // a ramp from 1/n to 1 over the oldest n - 25, then 25 ones
    const size_t ramp = n - 25;
    for (size_t i = 0; i < ramp; ++i)
      w[i] = ramp == 1 ? 1.0 / double(n)
                       : 1.0 / double(n) + (1.0 - 1.0 / double(n)) * double(i) / double(ramp - 1);
  }
  return w;
}

// A mixture of truncated normals on [lo, hi] (one per observation and the prior).
struct Parzen {
  std::vector<double> weights, mus, sigmas;
  double lo = 0, hi = 0;

  Parzen(const std::vector<double>& obs, double lo_, double hi_) : lo(lo_), hi(hi_) {
    const size_t n = obs.size();
    weights = default_weights(n);
    weights.push_back(1.0);  // the prior
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    for (double& w : weights) w /= total;
    mus = obs;
    mus.push_back(0.5 * (lo + hi));
    // Bandwidth: the larger gap to a neighbour among the sorted means, with lo and hi as
    // outer neighbours except for the outermost means (consider_endpoints = false).
    std::vector<size_t> order(mus.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return mus[a] < mus[b]; });
    std::vector<double> ends{lo};
    for (size_t i : order) ends.push_back(mus[i]);
    ends.push_back(hi);
    std::vector<double> sorted_sigma(mus.size());
    for (size_t i = 0; i < mus.size(); ++i)
      sorted_sigma[i] = std::max(ends[i + 1] - ends[i], ends[i + 2] - ends[i + 1]);
    if (ends.size() >= 4) {
      sorted_sigma.front() = ends[2] - ends[1];
      sorted_sigma.back() = ends[ends.size() - 2] - ends[ends.size() - 3];
    }
    sigmas.assign(mus.size(), 0);
    for (size_t i = 0; i < order.size(); ++i) sigmas[order[i]] = sorted_sigma[i];
    const double maxs = hi - lo, mins = (hi - lo) / std::min(100.0, 1.0 + double(mus.size()));
    for (double& s : sigmas) s = std::clamp(s, mins, maxs);
    sigmas.back() = hi - lo;  // the prior's
  }

  double draw(Rng& rng) const {
    double u = rng.uniform(), acc = 0;
    size_t k = 0;
    for (; k + 1 < weights.size(); ++k) {
      acc += weights[k];
      if (u < acc) break;
    }
    for (int tries = 0; tries < 1000; ++tries) {
      const double x = mus[k] + sigmas[k] * rng.normal();
      if (x >= lo && x <= hi) return x;
    }
    return std::clamp(mus[k], lo, hi);
  }

  // log density at x, or log mass of [x - half, x + half] when half > 0 (discrete values).
  double log_density(double x, double half_lo, double half_hi) const {
    double total = 0;
    for (size_t k = 0; k < mus.size(); ++k) {
      const double z =
          normal_cdf((hi - mus[k]) / sigmas[k]) - normal_cdf((lo - mus[k]) / sigmas[k]);
      if (z <= 0) continue;
      double p;
      if (half_lo > 0 || half_hi > 0) {
        p = normal_cdf((std::min(hi, x + half_hi) - mus[k]) / sigmas[k]) -
            normal_cdf((std::max(lo, x - half_lo) - mus[k]) / sigmas[k]);
      } else {
        const double d = (x - mus[k]) / sigmas[k];
        p = std::exp(-0.5 * d * d) / (sigmas[k] * std::sqrt(2 * M_PI));
      }
      total += weights[k] * p / z;
    }
    return std::log(std::max(total, 1e-300));
  }
};

class TpeSampler final : public Sampler {
 public:
  explicit TpeSampler(const TuneSettings& s) : s_(s) {}

  std::map<std::string, double> sample(const std::vector<Trial>& trials,
                                       const Trial& trial) override {
    const int64_t number = trial.number;
    // Observations: complete trials first by value, then pruned ones by how far they got.
    struct Obs {
      double step_key, score;
      const Trial* t;
    };
    std::vector<Obs> obs;
    const double sign = s_.direction == Direction::minimize ? 1 : -1;
    for (const auto& t : trials) {
      if (t.state == TrialState::complete && t.value) {
        obs.push_back({-std::numeric_limits<double>::infinity(), sign * *t.value, &t});
      } else if (t.state == TrialState::pruned) {
        if (t.intermediate.empty()) {
          obs.push_back({1, 0, &t});
        } else {
          const auto& [step, v] = *t.intermediate.rbegin();
          obs.push_back({-double(step),
                         std::isnan(v) ? std::numeric_limits<double>::infinity() : sign * v, &t});
        }
      }
    }
    std::map<std::string, double> out;
    for (const auto& p : s_.space) {
      Rng rng = stream(s_.sampler.seed, number, p.name);
      std::vector<const Obs*> have;
      for (const auto& o : obs)
        if (o.t->params.count(p.name) && p.contains(o.t->params.at(p.name))) have.push_back(&o);
      if (int64_t(have.size()) < s_.sampler.n_startup_trials || have.empty()) {
        out[p.name] = sample_uniform(p, rng);
        continue;
      }
      const size_t n_below = std::min<size_t>(size_t(std::ceil(0.1 * double(have.size()))), 25);
      std::vector<size_t> rank(have.size());
      std::iota(rank.begin(), rank.end(), 0);
      std::stable_sort(rank.begin(), rank.end(), [&](size_t a, size_t b) {
        if (have[a]->step_key != have[b]->step_key) return have[a]->step_key < have[b]->step_key;
        return have[a]->score < have[b]->score;
      });
      std::vector<bool> is_below(have.size(), false);
      for (size_t i = 0; i < n_below; ++i) is_below[rank[i]] = true;
      std::vector<double> below, above;  // in trial order
      for (size_t i = 0; i < have.size(); ++i)
        (is_below[i] ? below : above).push_back(have[i]->t->params.at(p.name));
      out[p.name] = p.kind == Param::Kind::categorical ? categorical(p, below, above, rng)
                                                       : numerical(p, below, above, rng);
    }
    return out;
  }

 private:
  double numerical(const Param& p, std::vector<double> below, std::vector<double> above,
                   Rng& rng) const {
    const bool is_int = p.kind == Param::Kind::integer;
    double lo = p.low, hi = p.high;
    if (p.log) {
      lo = std::log(is_int ? p.low - 0.5 : p.low);
      hi = std::log(is_int ? p.high + 0.5 : p.high);
    } else if (p.step > 0) {
      lo = p.low - 0.5 * p.step;
      hi = p.high + 0.5 * p.step;
    }
    auto to_internal = [&](double x) { return p.log ? std::log(x) : x; };
    for (double& x : below) x = to_internal(x);
    for (double& x : above) x = to_internal(x);
    const Parzen l(below, lo, hi), g(above, lo, hi);
    double best_x = 0, best_score = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < s_.sampler.n_ei_candidates; ++c) {
      const double x = l.draw(rng);
      double value = p.log ? std::exp(x) : x;
      value = p.snap(value);
      double half_lo = 0, half_hi = 0, at = x;
      if (is_int || p.step > 0) {  // discrete values: the mass of their bin
        const double half = is_int && p.log ? 0.5 : 0.5 * p.step;
        if (p.log) {
          at = std::log(value);
          half_lo = at - std::log(value - half);
          half_hi = std::log(value + half) - at;
        } else {
          at = value;
          half_lo = half_hi = half;
        }
      }
      const double score =
          l.log_density(at, half_lo, half_hi) - g.log_density(at, half_lo, half_hi);
      if (score > best_score) {
        best_score = score;
        best_x = value;
      }
    }
    return p.snap(best_x);
  }

  double categorical(const Param& p, const std::vector<double>& below,
                     const std::vector<double>& above, Rng& rng) const {
    const size_t k = p.choices.size();
    auto probabilities = [&](const std::vector<double>& obs) {
      std::vector<double> w = default_weights(obs.size());
      w.push_back(1.0);
      const double total = std::accumulate(w.begin(), w.end(), 0.0);
      std::vector<double> prob(k, 0);
      // Each observation is a component with its own choice weighted up; the prior is uniform.
      const double prior = 1.0 / double(obs.size() + 1);
      for (size_t i = 0; i <= obs.size(); ++i) {
        std::vector<double> comp(k, prior);
        if (i < obs.size()) comp[size_t(obs[i])] += 1;
        const double s = std::accumulate(comp.begin(), comp.end(), 0.0);
        for (size_t c = 0; c < k; ++c) prob[c] += w[i] / total * comp[c] / s;
      }
      return prob;
    };
    const std::vector<double> l = probabilities(below), g = probabilities(above);
    double best = 0, best_score = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < s_.sampler.n_ei_candidates; ++c) {
      double u = rng.uniform(), acc = 0;
      size_t choice = 0;
      for (; choice + 1 < k; ++choice) {
        acc += l[choice];
        if (u < acc) break;
      }
      const double score = std::log(l[choice]) - std::log(g[choice]);
      if (score > best_score) {
        best_score = score;
        best = double(choice);
      }
    }
    return best;
  }

  TuneSettings s_;
};

class GridSampler final : public Sampler {
 public:
  explicit GridSampler(const TuneSettings& s) : grid_(s) {}
  std::map<std::string, double> sample(const std::vector<Trial>&, const Trial& trial) override {
    const auto id = trial.attrs.find("grid_id");
    if (id == trial.attrs.end())
      fail("trial ", trial.number,
           ": a grid study's enqueued trial gives every parameter of the grid (as Optuna's "
           "GridSampler asks)");
    if (!(id->second >= 0 && id->second < double(grid_.size())))
      fail("trial ", trial.number, ": grid_id ", id->second, " is not one of the grid's ",
           grid_.size(), " points");
    return grid_.point(int64_t(id->second));
  }
  const Grid* grid() const override { return &grid_; }

 private:
  Grid grid_;
};

}  // namespace

Grid::Grid(const TuneSettings& s) {
  std::vector<const Param*> params;
  for (const auto& p : s.space) params.push_back(&p);
  std::sort(params.begin(), params.end(),
            [](const Param* a, const Param* b) { return a->name < b->name; });
  int64_t total = 1;
  for (const Param* p : params) {
    const std::string& where = p->where.empty() ? s.source : p->where;
    std::vector<double> values;
    if (p->kind == Param::Kind::categorical) {
      for (size_t i = 0; i < p->choices.size(); ++i) values.push_back(double(i));
    } else if (!p->grid.empty()) {
      values = p->grid;
    } else {  // low, low + step, ... (an int's step defaults to 1), each snapped as sampled
      const double step = p->step > 0 ? p->step : 1;
      const double steps = std::floor((p->high - p->low) / step + 1e-9);
      if (steps >= 100000)
        fail(where, ": tune.space.", p->name, ": ",
             steps < 1e15 ? std::to_string(int64_t(steps) + 1) : std::string("over 10^15"),
             " grid values from low to high by step; at most 100000: give a larger step or the "
             "values in grid");
      for (double k = 0; k <= steps; ++k) values.push_back(p->snap(p->low + k * step));
    }
    total *= int64_t(values.size());
    if (total > 1000000)
      fail(where, ": tune.space: with tune.space.", p->name,
           " the grid has over a million points (", total,
           " so far): search fewer values or use the tpe or random sampler");
    axes_.emplace_back(*p, std::move(values));
  }
  order_.resize(size_t(total));
  std::iota(order_.begin(), order_.end(), 0);
  Rng rng(mix(s.sampler.seed));
  for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.next() % i]);
}

std::map<std::string, double> Grid::point(int64_t id) const {
  std::map<std::string, double> out;
  for (size_t a = axes_.size(); a-- > 0;) {
    const auto& [param, values] = axes_[a];
    out[param.name] = values[size_t(id) % values.size()];
    id /= int64_t(values.size());
  }
  return out;
}

std::optional<int64_t> Grid::id_of(const std::map<std::string, double>& params) const {
  if (params.size() != axes_.size()) return std::nullopt;
  int64_t id = 0;
  for (const auto& [param, values] : axes_) {
    const auto v = params.find(param.name);
    if (v == params.end()) return std::nullopt;
    const auto at = std::find(values.begin(), values.end(), v->second);
    if (at == values.end()) return std::nullopt;
    id = id * int64_t(values.size()) + (at - values.begin());
  }
  return id;
}

std::unique_ptr<Sampler> make_sampler(const TuneSettings& s) {
  if (s.sampler.kind == "random") return std::make_unique<RandomSampler>(s);
  if (s.sampler.kind == "tpe") return std::make_unique<TpeSampler>(s);
  if (s.sampler.kind == "grid") return std::make_unique<GridSampler>(s);
  fail(s.source, ": tune.sampler.kind: unknown sampler '", s.sampler.kind, "'");
}

}  // namespace seqforge::tune
