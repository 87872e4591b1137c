#pragma once
// The data layer's options bound from the config (data.*, augment.*, train.seed), each key
// checked with an error naming it, and the data loaded with them.
#include <cstdint>
#include <vector>

#include "seqforge/data/augment.hpp"
#include "seqforge/data/datasets.hpp"
#include "seqforge/data/loader.hpp"
#include "seqforge/train/config.hpp"

namespace seqforge {

DataOptions data_options(const Config& config);
// train.quantiles, checked (in (0, 1), ascending, at most kMaxQuantiles), with train.loss
// quantile; else none.
std::vector<double> loss_quantiles(const Config& config);
AugmentOptions augment_options(const Config& config);
// data.num_workers ("auto" or a count) and data.prefetch_factor.
LoaderOptions loader_options(const Config& config, int64_t batch_bytes);

SeriesData load_series(const Config& config, const SeriesData* stored = nullptr,
                       WindowSet windows = WindowSet::splits);
Dataset load_dataset(const Config& config, const Dataset* from = nullptr,
                     WindowSet windows = WindowSet::splits);

}  // namespace seqforge
