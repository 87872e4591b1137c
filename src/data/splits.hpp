#pragma once
// How a config splits a sequence of n items (rows, characters, windows): shared by the series
// and the text loaders.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "seqforge/data/datasets.hpp"
#include "seqforge/train/config.hpp"

namespace seqforge {

// Split boundaries [0, a), [a, b), [b, n) from data.split.train and data.split.val.
std::pair<int64_t, int64_t> boundaries(const Config& c, int64_t n);
// Whole windows (or chunks) dealt at random, with train.seed, by the split shares.
void random_split(const Config& c, std::vector<int64_t> all, Split* out);
// The integer config key, which must be positive.
int64_t positive(const Config& c, const std::string& key);

}  // namespace seqforge
