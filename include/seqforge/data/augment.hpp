#pragma once
// Time-series augmentations for training windows, each applied with its own probability:
// window slicing, time warp, magnitude warp, scaling and jitter (in that order). The
// pre-augmentation cache keeps K augmented versions of every training window on disk, so later
// runs assemble augmented batches as fast as plain ones.
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "seqforge/core/rng.hpp"
#include "seqforge/data/datasets.hpp"

namespace seqforge {

struct AugmentOptions {
  double jitter_p = 0, jitter_sigma = 0.03;   // x += N(0, sigma)
  double scaling_p = 0, scaling_sigma = 0.1;  // x *= N(1, sigma), one factor per feature
  double magnitude_warp_p = 0, magnitude_warp_sigma = 0.2;  // x *= a smooth curve around 1
  int64_t magnitude_warp_knots = 4;
  double time_warp_p = 0, time_warp_sigma = 0.2;  // time axis sped up and slowed down smoothly
  int64_t time_warp_knots = 4;
  double window_slice_p = 0, window_slice_ratio = 0.9;  // a sub-window stretched to full length
  bool slice_keeps_end = false;  // the slice ends at the last step (a forecast's origin)
  bool cache = false;
  int64_t cache_versions = 4;
  std::string cache_dir;  // resolved: augment.cache_dir, or <cache>/augment

  bool any() const;
  // Every field but the cache's, as text: part of the cache's fingerprint.
  std::string describe() const;
};

// Augments one normalised window (T, F) in place. `values` (F): which features are values (the
// file's, data.known_future's ahead), whose magnitudes the augmentations change; the others
// (dates' phases, categories' one-hot columns, missing indicators) only move along time with
// their step. `missing` (T, F) or null: cells missing under data.missing mask, which stay 0
// (the mean) and move with their step as well.
void augment_window(const AugmentOptions& options, float* window, int64_t T, int64_t F,
                    const std::vector<char>& values, char* missing, Rng& rng);
// A series' values among its features, as above (SeriesData::value_features).
std::vector<char> augmented_features(const SeriesData& series);
// Augments `series`' window at row `start`, copied into `window`, its missing cells read from
// the series.
void augment_window(const AugmentOptions& options, const SeriesData& series,
                    const std::vector<char>& values, int64_t start, float* window, Rng& rng);

// K augmented versions of each training window of a series, in one .npy file (K, N, T, F) named
// by a fingerprint of the source file's bytes, the values read from it, the windowing, the
// normalisation, the training split and the augmentation options, with a checksum beside it
// (<name>.json).
class AugmentCache {
 public:
  // Reuses a valid cache file or builds one (in parallel on `threads` threads). A truncated or
  // corrupt file is reported on `log` and rebuilt, never used. Errors name augment.cache_dir.
  static std::unique_ptr<AugmentCache> open(const Dataset& data, const AugmentOptions& options,
                                            uint64_t seed, int threads, std::ostream& log);
  int64_t versions() const { return versions_; }
  const std::string& path() const { return path_; }
  // Training window `start` as augmented version `version`: (T, F) floats.
  const float* window(int64_t start, int64_t version) const;

 private:
  std::string path_;
  int64_t versions_ = 0, window_size_ = 0;
  std::vector<int64_t> starts_;  // the training windows, ascending
  std::shared_ptr<const void> mapping_;
  const float* data_ = nullptr;
};

}  // namespace seqforge
