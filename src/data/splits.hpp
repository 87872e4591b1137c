#pragma once
// How a sequence of n items (rows, characters, windows) is split: shared by the series and the
// text loaders.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "seqforge/data/datasets.hpp"

namespace seqforge {

// Split boundaries [0, a), [a, b), [b, n) from the train and val shares.
std::pair<int64_t, int64_t> boundaries(const SplitOptions& o, int64_t n);
// Whole windows (or chunks) dealt at random, with the split's seed, by its shares.
void random_split(const SplitOptions& o, std::vector<int64_t> all, Split* out);
// A note naming the classes (of `names`) that no training item holds, or saying that the training
// items hold one class only, given the class of each training item (-1: none), `item` "window"
// or "example"; "" when every class has one. `labelled`: the share of the training items whose
// class is kept (data.label_fraction), which the note names as the cause when below 1.
std::string untrained_classes_note(const std::vector<std::string>& names,
                                   const std::vector<int64_t>& train_classes, const char* item,
                                   double labelled = 1.0);

}  // namespace seqforge
