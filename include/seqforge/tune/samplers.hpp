#pragma once
// Samplers: random, TPE (Optuna 3.1's univariate defaults) and grid. A trial's parameters depend
// only on the study's finished trials, the seed and the trial number, so workers need not talk;
// a grid trial's point is the one its claim took (Storage::claim), as Optuna's GridSampler does.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "seqforge/tune/space.hpp"
#include "seqforge/tune/trial.hpp"

namespace seqforge::tune {

// A grid study's points, numbered as Optuna's GridSampler numbers them (its grid_id): the product
// of each parameter's values, parameters in name order, the last one varying fastest.
class Grid {
 public:
  explicit Grid(const TuneSettings& s);
  int64_t size() const { return int64_t(order_.size()); }
  std::map<std::string, double> point(int64_t id) const;
  // The id of the point these parameters are (every parameter, each one of its values), if any.
  std::optional<int64_t> id_of(const std::map<std::string, double>& params) const;
  // Each parameter in name order with its values (a categorical's as choice indices).
  const std::vector<std::pair<Param, std::vector<double>>>& axes() const { return axes_; }
  // The ids in the order new trials take them: a shuffle seeded by tune.sampler.seed.
  const std::vector<int64_t>& order() const { return order_; }

 private:
  std::vector<std::pair<Param, std::vector<double>>> axes_;
  std::vector<int64_t> order_;
};

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The parameters of `trial` (claimed, its number and attributes set).
  virtual std::map<std::string, double> sample(const std::vector<Trial>& trials,
                                               const Trial& trial) = 0;
  // The grid sampler's points; nullptr for the others.
  virtual const Grid* grid() const { return nullptr; }
};

std::unique_ptr<Sampler> make_sampler(const TuneSettings& s);

}  // namespace seqforge::tune
