#pragma once
// Pruners with Optuna 3.1's semantics (MedianPruner, PercentilePruner, SuccessiveHalvingPruner,
// NopPruner): after every report, decide from the study's trials whether a trial stops.
#include <memory>
#include <vector>

#include "seqforge/tune/space.hpp"
#include "seqforge/tune/trial.hpp"

namespace seqforge::tune {

class Pruner {
 public:
  virtual ~Pruner() = default;
  // `trial` is the running trial with its reports so far; `trials` every trial of the study
  // (it may include `trial` as stored). Attributes to store on the trial go to `set_attrs`.
  virtual bool prune(const std::vector<Trial>& trials, const Trial& trial, Direction direction,
                     std::map<std::string, double>* set_attrs) = 0;
};

std::unique_ptr<Pruner> make_pruner(const PrunerSettings& s);

// numpy.nanpercentile(values, q) with the default linear method, bit for bit; NaN when no value
// is a number.
double nan_percentile(std::vector<double> values, double q);

}  // namespace seqforge::tune
