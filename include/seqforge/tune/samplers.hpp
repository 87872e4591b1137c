#pragma once
// Samplers: random, TPE (Optuna 3.1's univariate defaults) and grid. A trial's parameters depend
// only on the study's finished trials, the seed and the trial number, so workers need not talk.
#include <memory>
#include <vector>

#include "seqforge/tune/space.hpp"
#include "seqforge/tune/trial.hpp"

namespace seqforge::tune {

class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual std::map<std::string, double> sample(const std::vector<Trial>& trials,
                                               int64_t number) = 0;
  // Trials the sampler can produce at most (grid); 0: no limit.
  virtual int64_t limit() const { return 0; }
};

std::unique_ptr<Sampler> make_sampler(const TuneSettings& s);

}  // namespace seqforge::tune
