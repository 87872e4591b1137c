// The data pipeline: loader determinism across worker counts, augmentations, the augmentation
// cache (reuse, invalidation, corruption, unwritable and full directories), memory-mapped .npy
// sources and data files that change under a run.
#include "seqforge/data/loader.hpp"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "seqforge/backend/backend.hpp"
#include "seqforge/data/augment.hpp"
#include "seqforge/io/dates.hpp"
#include "seqforge/io/npy.hpp"
#include "seqforge/train/data_options.hpp"
#include "test_util.hpp"

namespace seqforge::loader_test {
namespace {

namespace fs = std::filesystem;

// A CSV of `rows` rows: a, b (features) and y (target), smooth and distinct.
std::string write_series(const fs::path& dir, int rows) {
  const std::string path = (dir / "series.csv").string();
  std::ofstream f(path);
  f << "a,b,y\n";
  for (int r = 0; r < rows; ++r)
    f << std::sin(0.1 * r) << "," << std::cos(0.07 * r) + 0.01 * r << "," << std::sin(0.1 * r + 1)
      << "\n";
  return path;
}

Config series_config(const std::string& path, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o = {"data.path=" + path, "data.features=[a, b]", "data.targets=[y]",
                                "data.lookback=12"};
  o.insert(o.end(), extra.begin(), extra.end());
  return Config::parse("data:\n  task: forecast\n", "test.yaml", o);
}

std::vector<float> floats(Tensor t) {
  const auto* p = static_cast<const float*>(t.data());
  return std::vector<float>(p, p + t.numel());
}

// Every batch of one pass, flattened: inputs, targets, masks.
std::vector<std::vector<float>> pass(Loader& loader, const std::vector<int64_t>& starts,
                                     int64_t batches, const BatchRecipe& recipe, uint64_t seed) {
  std::vector<std::vector<float>> out;
  loader.start(starts, batches, recipe, seed);
  for (int64_t i = 0; i < batches; ++i) {
    const Batch& b = loader.next();
    std::vector<float> all = floats(b.input);
    if (b.target.data()) {
      const auto t = floats(b.target);
      all.insert(all.end(), t.begin(), t.end());
    }
    if (b.mask.data()) {
      const auto m = floats(b.mask);
      all.insert(all.end(), m.begin(), m.end());
    }
    out.push_back(std::move(all));
  }
  return out;
}

}  // namespace

TEST(Loader, BatchesAreIdenticalForAnyNumberOfWorkers) {
  const fs::path dir = test::temp_dir("workers");
  const std::string csv = write_series(dir, 300);
  auto be = make_cpu_backend();
  for (const char* task : {"forecast", "mae"}) {
    const Config c = series_config(
        csv, {std::string("data.task=") + task, "augment.jitter.p=0.5", "augment.time_warp.p=0.5",
              "augment.window_slice.p=0.5", "augment.scaling.p=0.5"});
    const Dataset data = load_dataset(c);
    const AugmentOptions aug = augment_options(c);
    std::vector<int64_t> order = data.split().train;
    std::reverse(order.begin(), order.end());
    std::vector<std::vector<std::vector<float>>> runs;
    for (int workers : {0, 1, 3}) {
      Loader loader(*be, data, 16, LoaderOptions{workers, 2, ""});
      runs.push_back(pass(loader, order, 9, {&aug, nullptr}, 42));
      // A second pass with another seed differs; the same seed again repeats.
      EXPECT_NE(pass(loader, order, 9, {&aug, nullptr}, 43), runs.back()) << task;
      EXPECT_EQ(pass(loader, order, 9, {&aug, nullptr}, 42), runs.back()) << task;
    }
    EXPECT_EQ(runs[0], runs[1]) << task;
    EXPECT_EQ(runs[0], runs[2]) << task;
  }
}

// The masked autoencoder's masks are a function of the recipe's mask seed and the window: the same
// for batches of 16 and of 5 (validation in micro-batches scores the same masked steps) and
// whatever the pass's seed (a rank's), another mask seed another mask.
TEST(Loader, AWindowsMaskDoesNotDependOnItsBatch) {
  const fs::path dir = test::temp_dir("masks");
  const Dataset data = load_dataset(series_config(write_series(dir, 300), {"data.task=mae"}));
  auto be = make_cpu_backend();
  const std::vector<int64_t>& order = data.split().train;
  const int64_t n = 40, T = 12;
  auto masks = [&](int64_t batch, uint64_t mask_seed, uint64_t seed = 3) {
    Loader loader(*be, data, batch, LoaderOptions{1, 2, ""});
    loader.start({order.begin(), order.begin() + n}, INT64_MAX, {nullptr, nullptr, mask_seed},
                 seed);
    std::vector<float> all;
    for (int64_t done = 0; done < n;) {
      const Batch& b = loader.next();
      const auto m = floats(b.mask);
      all.insert(all.end(), m.begin(), m.end());
      done += b.size;
    }
    return all;
  };
  const std::vector<float> whole = masks(16, 7);
  ASSERT_EQ(whole.size(), size_t(n * T));
  EXPECT_EQ(masks(5, 7), whole);
  EXPECT_EQ(masks(16, 7, 4), whole);
  EXPECT_NE(masks(16, 8), whole);
  EXPECT_GT(std::count(whole.begin(), whole.end(), 1.0f), 0);
}

// The masked autoencoder with data.missing mask reconstructs only steps that hold every feature:
// a step with a missing cell is never masked (its target would be no value), whatever the draw
// and the ratio, and a window of such steps alone is left out. Elsewhere the draw is as before.
// Its targets are the file's features alone, not their missing indicators.
TEST(Loader, TheAutoencoderNeverReconstructsAMissingCell) {
  const fs::path dir = test::temp_dir("mae_missing");
  const std::string path = (dir / "gappy.csv").string();
  std::ofstream f(path);
  f << "a,b,y\n";
  for (int r = 0; r < 200; ++r) {
    const bool gap_a = r % 7 == 3 || (r >= 150 && r < 170), gap_b = r % 11 == 5;
    f << (gap_a ? "" : std::to_string(std::sin(0.1 * r))) << ","
      << (gap_b ? "NA" : std::to_string(std::cos(0.07 * r))) << "," << std::sin(0.1 * r + 1)
      << "\n";
  }
  f.close();
  auto be = make_cpu_backend();
  for (const char* ratio : {"0.3", "0.9"}) {
    const Dataset data = load_dataset(
        series_config(path, {"data.task=mae", "data.missing=mask", "data.split.train=1",
                             "data.split.val=0", std::string("data.mask_ratio=") + ratio}));
    const SeriesData& s = data.series;
    const auto& starts = data.split().train;
    // Windows inside rows 150..169 (a missing every step) are gone; the others stay.
    for (int64_t start : starts) EXPECT_FALSE(start >= 150 && start + 12 <= 170) << start;
    EXPECT_GT(starts.size(), 150u);
    ASSERT_EQ(s.num_features(), 4);  // a, b, a_missing, b_missing
    ASSERT_EQ(s.file_features, 2);
    Loader loader(*be, data, 16, LoaderOptions{0, 1, ""});
    loader.start(starts, INT64_MAX, {nullptr, nullptr, 11}, 0);
    int64_t masked = 0;
    std::vector<float> window(12 * 4);
    for (size_t done = 0; done < starts.size();) {
      const Batch& b = loader.next();
      const auto mask = floats(b.mask), target = floats(b.target);
      const int64_t O = b.target.dim(1);
      ASSERT_EQ(O, 2);
      for (int64_t i = 0; i < b.size; ++i) {
        int64_t in_window = 0;
        s.copy_window(starts[done + i], window.data());
        for (int64_t u = 0; u < 12; ++u) {
          if (mask[i * 12 + u] == 0.0f) continue;
          ++in_window, ++masked;
          EXPECT_TRUE(s.row_complete(starts[done + i] + u)) << starts[done + i] << " step " << u;
          for (int64_t j = 0; j < O; ++j) {
            EXPECT_TRUE(std::isfinite(target[(i * 12 + u) * O + j]));
            EXPECT_EQ(target[(i * 12 + u) * O + j], window[u * 4 + j]);
          }
        }
        EXPECT_GE(in_window, 1);
      }
      done += b.size;
    }
    EXPECT_GT(masked, int64_t(starts.size()));
  }
}

// The autoencoder's targets are the file's features of the masked steps, not the calendar's
// phases derived from the dates (every step's known, so no value to learn).
TEST(Loader, TheAutoencoderReconstructsTheFilesFeaturesAlone) {
  const fs::path dir = test::temp_dir("mae_calendar");
  const std::string path = (dir / "dated.csv").string();
  std::ofstream f(path);
  f << "date,a,b\n";
  for (int r = 0; r < 60; ++r)
    f << io::format_datetime(int64_t{1577836800} + r * int64_t{86400}) << "," << std::sin(0.1 * r)
      << "," << std::cos(0.3 * r) << "\n";
  f.close();
  auto be = make_cpu_backend();
  const Dataset data = load_dataset(Config::parse(
      "data: {task: mae, path: " + path +
          ", date_column: date, features: [a, b], calendar: [dayofweek, month], lookback: 6, "
          "mask_ratio: 0.5, split: {train: 1, val: 0}}\n",
      "mae.yaml"));
  const SeriesData& s = data.series;
  ASSERT_EQ(s.num_features(), 6);  // a, b, dayofweek_sin, dayofweek_cos, month_sin, month_cos
  ASSERT_EQ(s.file_features, 2);
  ASSERT_EQ(s.num_outputs(), 2);
  const auto& starts = data.split().train;
  Loader loader(*be, data, 8, LoaderOptions{0, 1, ""});
  loader.start(starts, INT64_MAX, {nullptr, nullptr, 5}, 0);
  std::vector<float> window(6 * 6);
  int64_t masked = 0;
  for (size_t done = 0; done < starts.size();) {
    const Batch& b = loader.next();
    const auto mask = floats(b.mask), target = floats(b.target), input = floats(b.input);
    ASSERT_EQ(b.target.dim(1), 2);
    for (int64_t i = 0; i < b.size; ++i) {
      s.copy_window(starts[done + i], window.data());
      for (int64_t u = 0; u < 6; ++u)
        for (int64_t j = 0; j < 6; ++j) {
          const bool hidden = mask[i * 6 + u] != 0.0f;
          masked += hidden && j == 0;
          EXPECT_EQ(input[(i * 6 + u) * 6 + j], hidden ? 0.0f : window[u * 6 + j]);
          if (j < 2) {
            EXPECT_EQ(target[(i * 6 + u) * 2 + j], window[u * 6 + j]);
          }
        }
    }
    done += b.size;
  }
  EXPECT_GT(masked, int64_t(starts.size()));
  // A file of dates alone has no feature to reconstruct: one line, not an empty head.
  std::ofstream(dir / "dates.csv") << "date\n2020-01-01\n2020-01-02\n2020-01-03\n";
  try {
    load_dataset(Config::parse("data: {task: mae, path: " + (dir / "dates.csv").string() +
                                   ", date_column: date, calendar: [dayofweek], lookback: 2}\n",
                               "dates.yaml"));
    ADD_FAILURE() << "a file without features loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.task mae reconstructs the file's features"),
              std::string::npos)
        << e.what();
  }
}

TEST(Loader, PassesCanEndEarlyAndRestart) {
  const fs::path dir = test::temp_dir("early");
  const std::string csv = write_series(dir, 400);
  auto be = make_cpu_backend();
  const Dataset data = load_dataset(series_config(csv));
  Loader loader(*be, data, 8, LoaderOptions{2, 4, ""});
  const auto& starts = data.split().train;
  for (int round = 0; round < 20; ++round) {
    loader.start(starts, 30, {}, round);
    for (int i = 0; i < round % 5; ++i) loader.next();  // abandoned with batches in flight
  }
  const auto full = pass(loader, starts, 5, {}, 7);
  Loader sync(*be, data, 8, LoaderOptions{0, 1, ""});
  EXPECT_EQ(pass(sync, starts, 5, {}, 7), full);
  // The last batch of a pass may be short; the pass never runs past the windows.
  loader.start(starts, INT64_MAX, {}, 0);
  int64_t seen = 0;
  for (size_t i = 0; i < (starts.size() + 7) / 8; ++i) seen += loader.next().size;
  EXPECT_EQ(seen, static_cast<int64_t>(starts.size()));
  EXPECT_NE(test::error_of([&] { loader.next(); }).find("past the end"), std::string::npos);
}

TEST(Loader, WindowsAreNormalisedSourceRows) {
  const fs::path dir = test::temp_dir("windows");
  const std::string csv = write_series(dir, 200);
  auto be = make_cpu_backend();
  const Dataset data = load_dataset(series_config(csv));
  const SeriesData& s = data.series;
  Loader loader(*be, data, 4, LoaderOptions{1, 2, ""});
  const std::vector<int64_t> starts = {0, 17, 33, 101};
  loader.start(starts, 1, {}, 0);
  const Batch& b = loader.next();
  const auto* x = static_cast<const float*>(b.input.data());
  const auto* y = static_cast<const float*>(b.target.data());
  for (int i = 0; i < 4; ++i) {
    for (int t = 0; t < 12; ++t) {
      const int r = static_cast<int>(starts[i]) + t;
      EXPECT_NEAR(x[(i * 12 + t) * 2 + 0],
                  (std::sin(0.1 * r) - s.feature_norm.shift[0]) / s.feature_norm.scale[0], 1e-5);
    }
    const int target = static_cast<int>(starts[i]) + 12;
    EXPECT_NEAR(
        y[i], (std::sin(0.1 * target + 1) - s.target_norm.shift[0]) / s.target_norm.scale[0], 1e-5);
  }
}

TEST(Loader, MemoryMappedNpyGivesTheSameWindowsAsCsv) {
  const fs::path dir = test::temp_dir("npy");
  const std::string csv = write_series(dir, 150);
  std::vector<float> values;
  for (int r = 0; r < 150; ++r)
    for (double v : {std::sin(0.1 * r), std::cos(0.07 * r) + 0.01 * r, std::sin(0.1 * r + 1)})
      values.push_back(static_cast<float>(v));
  const std::string npy = (dir / "series.npy").string();
  io::write_npy(npy, DType::f32, {150, 3}, values.data());
  auto be = make_cpu_backend();
  const Dataset from_csv = load_dataset(series_config(csv));
  const Dataset from_npy =
      load_dataset(series_config(npy, {"data.features=[0, 1]", "data.targets=[2]"}));
  EXPECT_EQ(from_npy.series.source.dtype, DType::f32);  // mapped, not converted
  Loader a(*be, from_csv, 32, LoaderOptions{1, 2, ""}),
      b(*be, from_npy, 32, LoaderOptions{1, 2, ""});
  const auto want = pass(a, from_csv.split().train, 3, {}, 0);
  const auto got = pass(b, from_npy.split().train, 3, {}, 0);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    std::vector<double> g(got[i].begin(), got[i].end()), w(want[i].begin(), want[i].end());
    EXPECT_LT(test::max_rel_error(g, w), 1e-4) << "batch " << i;  // the CSV has 6 digits
  }
}

TEST(Loader, AChangedOrMissingSourceStopsTheRun) {
  const fs::path dir = test::temp_dir("changed");
  const std::string csv = write_series(dir, 200);
  auto be = make_cpu_backend();
  const Dataset data = load_dataset(series_config(csv));
  Loader loader(*be, data, 8, LoaderOptions{1, 2, ""});
  EXPECT_NO_THROW(pass(loader, data.split().train, 2, {}, 0));
  { std::ofstream(csv, std::ios::app) << "1,2,3\n"; }
  loader.start(data.split().train, 2, {}, 0);
  std::string error = test::error_of([&] { loader.next(); });
  EXPECT_NE(error.find("series.csv: the data file changed during the run"), std::string::npos)
      << error;
  fs::remove(csv);
  EXPECT_NE(test::error_of([&] { data.check_source(); }).find("disappeared"), std::string::npos);
}

TEST(Augment, EachAugmentationChangesWindowsAsDescribed) {
  const int64_t T = 40, F = 3;
  std::vector<float> base(T * F);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t f = 0; f < F; ++f) base[t * F + f] = static_cast<float>(std::sin(0.2 * t + f));
  auto run = [&](const AugmentOptions& o, uint64_t seed) {
    std::vector<float> w = base;
    Rng rng(seed);
    augment_window(o, w.data(), T, F, std::vector<char>(F, 1), nullptr, rng);
    return w;
  };
  EXPECT_EQ(run(AugmentOptions{}, 1), base);  // nothing on: unchanged
  {                                           // jitter: noise of the given spread
    AugmentOptions o;
    o.jitter_p = 1;
    o.jitter_sigma = 0.5;
    double sq = 0;
    int n = 0;
    for (uint64_t seed = 0; seed < 50; ++seed) {
      const auto w = run(o, seed);
      for (size_t i = 0; i < w.size(); ++i, ++n) sq += (w[i] - base[i]) * (w[i] - base[i]);
    }
    EXPECT_NEAR(std::sqrt(sq / n), 0.5, 0.02);
  }
  {  // scaling: one factor per feature
    AugmentOptions o;
    o.scaling_p = 1;
    const auto w = run(o, 3);
    for (int64_t f = 0; f < F; ++f) {
      const double factor = w[5 * F + f] / base[5 * F + f];
      EXPECT_NE(factor, 1.0);
      for (int64_t t = 1; t < T; ++t)
        if (std::fabs(base[t * F + f]) > 1e-3) {
          EXPECT_NEAR(w[t * F + f] / base[t * F + f], factor, 1e-5);
        }
    }
  }
  {  // magnitude warp: a smooth factor around 1 that varies along time
    AugmentOptions o;
    o.magnitude_warp_p = 1;
    const auto w = run(o, 4);
    EXPECT_NE(w, base);
    for (int64_t t = 1; t < T; ++t) {
      const double r0 = w[(t - 1) * F] / base[(t - 1) * F], r1 = w[t * F] / base[t * F];
      if (std::fabs(base[t * F]) > 0.1 && std::fabs(base[(t - 1) * F]) > 0.1) {
        EXPECT_LT(std::fabs(r1 - r0), 0.2) << t;
      }
    }
  }
  // Time warp and window slicing resample along time: the end points stay (time warp), with
  // zero strength nothing moves, and every value stays within the window's range.
  for (int kind = 0; kind < 2; ++kind) {
    AugmentOptions o;
    (kind == 0 ? o.time_warp_p : o.window_slice_p) = 1;
    const auto w = run(o, 5);
    EXPECT_NE(w, base) << kind;
    for (int64_t f = 0; f < F; ++f) {
      float lo = 1e9, hi = -1e9;
      for (int64_t t = 0; t < T; ++t) {
        lo = std::min(lo, base[t * F + f]);
        hi = std::max(hi, base[t * F + f]);
      }
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_GE(w[t * F + f], lo - 1e-6f);
        EXPECT_LE(w[t * F + f], hi + 1e-6f);
      }
    }
    if (kind == 0) {
      EXPECT_FLOAT_EQ(w[0], base[0]);
      EXPECT_NEAR(w[(T - 1) * F], base[(T - 1) * F], 1e-5);
      o.time_warp_sigma = 0;
    } else {
      o.window_slice_ratio = 1;
    }
    const auto same = run(o, 5);
    for (size_t i = 0; i < same.size(); ++i) EXPECT_NEAR(same[i], base[i], 1e-5) << kind;
  }
}

// Only values change magnitude: dates' phases, one-hot categories and missing indicators are
// derived, and a missing cell stays 0 (the mean) under data.missing mask; moved along time, a
// derived feature or a cell beside a missing one takes the nearer step's, so no indicator becomes
// a fraction and no gap is filled. A forecast's slices end at its last step.
TEST(Augment, DerivedFeaturesAndMissingCellsKeepTheirMeaning) {
  const fs::path dir = test::temp_dir("aug_derived");
  const std::string csv = (dir / "gaps.csv").string();
  {
    std::ofstream f(csv);
    f << "date,a,b,y\n";
    for (int r = 0; r < 120; ++r) {
      char date[16];
      std::snprintf(date, sizeof date, "2024-%02d-%02d", 1 + r / 28, 1 + r % 28);
      f << date << "," << (r % 9 == 4 ? "" : std::to_string(std::sin(0.3 * r))) << ","
        << std::cos(0.2 * r) << "," << std::sin(0.1 * r) << "\n";
    }
  }
  const Config c =
      series_config(csv, {"data.date_column=date", "data.missing=mask", "data.calendar=[dayofyear]",
                          "data.known_future=[dayofyear, b]"});
  const Dataset data = load_dataset(c);
  const SeriesData& s = data.series;
  const int64_t T = s.lookback, F = s.num_features();
  // a, b, the day's sine and cosine, those of the day forecast, b there, a's and b's indicators
  ASSERT_EQ(F, 9);
  const std::vector<char> values = augmented_features(s);
  EXPECT_EQ(values, std::vector<char>({1, 1, 0, 0, 0, 0, 1, 0, 0}));
  const int64_t a_missing = 7;
  const int64_t start = data.split().train[1];  // row 4 + 9k is missing in a
  std::vector<float> plain(T * F);
  s.copy_window(start, plain.data());
  auto is_missing = [&](int64_t t) {
    return !std::isfinite(s.source.at(start + t, s.feature_cols[0]));
  };
  int gaps = 0;
  for (int64_t t = 0; t < T; ++t) gaps += is_missing(t);
  ASSERT_GT(gaps, 0);
  for (int kind = 0; kind < 5; ++kind) {
    AugmentOptions o;
    (kind == 0   ? o.jitter_p
     : kind == 1 ? o.scaling_p
     : kind == 2 ? o.magnitude_warp_p
     : kind == 3 ? o.time_warp_p
                 : o.window_slice_p) = 1;
    o.window_slice_ratio = 0.5;
    std::vector<float> w = plain;
    Rng rng(7);
    augment_window(o, s, values, start, w.data(), rng);
    EXPECT_NE(w, plain) << kind;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 2; f < F; ++f) {  // a derived feature: a value some step of it held
        if (values[size_t(f)]) continue;
        bool held = false;
        for (int64_t u = 0; u < T; ++u) held |= w[t * F + f] == plain[u * F + f];
        EXPECT_TRUE(held) << "kind " << kind << ", step " << t << ", feature " << f;
        if (kind < 3) {
          EXPECT_EQ(w[t * F + f], plain[t * F + f]) << kind;
        }
      }
    // a's indicator says where a is missing: there a is 0, as it was.
    float flag_on = 0;
    for (int64_t t = 0; t < T; ++t)
      if (is_missing(t)) flag_on = plain[t * F + a_missing];
    for (int64_t t = 0; t < T; ++t) {
      if (w[t * F + a_missing] == flag_on) {
        EXPECT_EQ(w[t * F + 0], 0.0f) << "kind " << kind << ", step " << t;
      }
    }
    if (kind < 3) {
      for (int64_t t = 0; t < T; ++t) {
        if (is_missing(t)) {
          EXPECT_EQ(w[t * F + 0], 0.0f) << kind;
        }
      }
    }
  }
  // A forecast's slice ends at the window's last step; a classifier's may end before it.
  AugmentOptions slice;
  slice.window_slice_p = 1;
  slice.window_slice_ratio = 0.5;
  const std::vector<char> all(F, 1);
  std::vector<float> base(T * F);
  for (int64_t i = 0; i < T * F; ++i) base[size_t(i)] = float(i);
  int ends_before = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    for (const bool keeps_end : {true, false}) {
      slice.slice_keeps_end = keeps_end;
      std::vector<float> w = base;
      Rng rng(seed);
      augment_window(slice, w.data(), T, F, all, nullptr, rng);
      if (keeps_end) {
        for (int64_t f = 0; f < F; ++f) EXPECT_EQ(w[(T - 1) * F + f], base[(T - 1) * F + f]);
      } else {
        ends_before += w[(T - 1) * F] != base[(T - 1) * F];
      }
    }
  }
  EXPECT_GT(ends_before, 0);
  // Every-step forecasts' targets would not follow steps moved along time.
  for (const char* key : {"augment.time_warp.p=0.5", "augment.window_slice.p=0.5"}) {
    const std::string error = test::error_of([&] {
      augment_options(series_config(csv, {"model.output=every_step", key}));
    });
    EXPECT_NE(error.find("model.output every_step"), std::string::npos) << error;
  }
}

TEST(Augment, BadOptionsNameTheKey) {
  const std::string path = "x.csv";
  auto error = [&](const std::string& kv) {
    return test::error_of([&] { augment_options(series_config(path, {kv})); });
  };
  EXPECT_NE(error("augment.jitter.p=1.5").find("augment.jitter.p must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(error("augment.scaling.sigma=-1").find("augment.scaling.sigma"), std::string::npos);
  EXPECT_NE(error("augment.window_slice.ratio=0").find("augment.window_slice.ratio"),
            std::string::npos);
  EXPECT_NE(error("augment.cache=true").find("no augmentation"), std::string::npos);
  EXPECT_NE(error("augment.time_warp.knots=0").find("augment.time_warp.knots"), std::string::npos);
  EXPECT_NE(test::error_of([&] {
              augment_options(
                  Config::parse("data:\n  task: charlm\n", "t.yaml", {"augment.jitter.p=0.5"}));
            }).find("not to data.task charlm"),
            std::string::npos);
}

TEST(AugmentCache, BuildsReusesInvalidatesAndRebuildsCorruptFiles) {
  const fs::path dir = test::temp_dir("cache");
  const std::string csv = write_series(dir, 200);
  const std::string cache_dir = (dir / "cache").string();
  const Config c =
      series_config(csv, {"augment.jitter.p=1", "augment.cache=true", "augment.cache_versions=3",
                          "augment.cache_dir=" + cache_dir});
  const Dataset data = load_dataset(c);
  const AugmentOptions aug = augment_options(c);
  std::ostringstream log;
  auto first = AugmentCache::open(data, aug, 1, 2, log);
  EXPECT_NE(log.str().find("built"), std::string::npos) << log.str();
  const std::string path = first->path();
  const int64_t start = data.split().train[5], n = 12 * 2;
  const std::vector<float> v0(first->window(start, 0), first->window(start, 0) + n);
  const std::vector<float> v1(first->window(start, 1), first->window(start, 1) + n);
  EXPECT_NE(v0, v1);  // versions differ
  std::vector<float> plain(n);
  data.series.copy_window(start, plain.data());
  EXPECT_NE(v0, plain);
  EXPECT_LT(test::max_rel_error(std::vector<double>(v0.begin(), v0.end()),
                                std::vector<double>(plain.begin(), plain.end()), 1.0),
            0.5);  // jittered by 0.03 in normalised units, not something else

  {  // the same again: reused, same values, built with another thread count
    std::ostringstream again;
    auto second = AugmentCache::open(data, aug, 1, 1, again);
    EXPECT_NE(again.str().find("reusing"), std::string::npos) << again.str();
    EXPECT_EQ(second->path(), path);
    EXPECT_EQ(std::vector<float>(second->window(start, 0), second->window(start, 0) + n), v0);
  }
  {  // another augmentation config, or another seed: another file
    AugmentOptions other = aug;
    other.jitter_sigma = 0.1;
    std::ostringstream l;
    EXPECT_NE(AugmentCache::open(data, other, 1, 1, l)->path(), path);
    EXPECT_NE(AugmentCache::open(data, aug, 2, 1, l)->path(), path);
  }
  first.reset();
  // A flipped byte in the data: detected by the checksum, rebuilt with the same values.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-7, std::ios::end);
    f.put('\x5a');
  }
  std::ostringstream corrupt;
  auto rebuilt = AugmentCache::open(data, aug, 1, 2, corrupt);
  EXPECT_NE(corrupt.str().find("checksum mismatch"), std::string::npos) << corrupt.str();
  EXPECT_NE(corrupt.str().find("built"), std::string::npos);
  EXPECT_EQ(std::vector<float>(rebuilt->window(start, 0), rebuilt->window(start, 0) + n), v0);
  rebuilt.reset();
  // Truncated: detected, rebuilt.
  fs::resize_file(path, fs::file_size(path) - 100);
  std::ostringstream truncated;
  AugmentCache::open(data, aug, 1, 2, truncated);
  EXPECT_NE(truncated.str().find("truncated data"), std::string::npos) << truncated.str();
  // Other values read from the same bytes (missing cells filled otherwise): a new fingerprint.
  {
    const std::string gaps = (dir / "gaps.csv").string();
    std::ofstream f(gaps);
    f << "a,b,y\n";
    for (int r = 0; r < 200; ++r)
      f << (r % 7 == 3 ? "" : std::to_string(r % 5)) << "," << r % 3 << "," << r % 4 << "\n";
    f.close();
    std::ostringstream quiet;
    const auto filled = [&](const char* how) {
      const Config m = series_config(
          gaps, {"augment.jitter.p=1", "augment.cache=true", "augment.cache_dir=" + cache_dir,
                 "data.normalize=none", std::string("data.missing=") + how});
      return AugmentCache::open(load_dataset(m), augment_options(m), 1, 1, quiet)->path();
    };
    EXPECT_NE(filled("ffill"), filled("interpolate"));
  }
  // A changed source: a new fingerprint.
  { std::ofstream(csv, std::ios::app) << "0.5,0.5,0.5\n"; }
  const Dataset changed = load_dataset(c);
  std::ostringstream l;
  EXPECT_NE(AugmentCache::open(changed, aug, 1, 1, l)->path(), path);
}

TEST(AugmentCache, UnwritableOrFullDirectoriesGiveClearErrors) {
  const fs::path dir = test::temp_dir("cache_bad");
  const std::string csv = write_series(dir, 200);
  { std::ofstream(dir / "a_file") << "x"; }
  auto open_in = [&](const std::string& cache_dir) {
    const Config c = series_config(
        csv, {"augment.jitter.p=1", "augment.cache=true", "augment.cache_dir=" + cache_dir});
    const Dataset data = load_dataset(c);
    std::ostringstream log;
    return test::error_of([&] { AugmentCache::open(data, augment_options(c), 1, 1, log); });
  };
  const std::string not_dir = open_in((dir / "a_file" / "cache").string());
  EXPECT_NE(not_dir.find("augment.cache_dir: cannot create"), std::string::npos) << not_dir;
  // A full disk: an 8 KiB tmpfs (needs root; skipped elsewhere).
  const fs::path full = dir / "full";
  fs::create_directories(full);
  if (::mount("tmpfs", full.c_str(), "tmpfs", 0, "size=8k") != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno)
                 << "): full-disk case not tested";
  const std::string no_space = open_in(full.string());
  ::umount(full.c_str());
  EXPECT_NE(no_space.find("augment.cache_dir: cannot write the augmentation cache"),
            std::string::npos)
      << no_space;
  EXPECT_NE(no_space.find("No space left on device"), std::string::npos) << no_space;
}

namespace {

// A text read with a stored model's vocabulary: its ids over that vocabulary; characters outside
// it are one error naming each with its count and first line.
TEST(Loader, TextOverAStoredVocabularyNamesEveryUnknownCharacter) {
  const fs::path dir = test::temp_dir("stored_vocabulary");
  DataOptions o;
  o.source = "c.yaml";
  o.task = TaskKind::charlm;
  o.path = (dir / "ok.txt").string();
  o.text.seq_len = 2;
  std::ofstream(o.path) << "cab\nba\n";
  const TextData ok = load_text(o, U"\nabc");
  EXPECT_EQ(ok.ids, (std::vector<int64_t>{3, 1, 2, 0, 2, 1, 0}));
  o.path = (dir / "new.txt").string();
  std::ofstream(o.path) << "ab\nxa\u00e9\nx\n";
  const std::string e = test::error_of([&] { load_text(o, U"\nabc"); });
  EXPECT_NE(e.find("new.txt: 2 characters are not in the vocabulary of the model (4 characters"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("'x' (2 times, first at line 2)"), std::string::npos) << e;
  EXPECT_NE(e.find("'\u00e9' U+00E9 (1 time, at line 2)"), std::string::npos) << e;
  // A byte-order mark is not a character of the text; a device is no text file.
  o.path = (dir / "bom.txt").string();
  std::ofstream(o.path) << "\xEF\xBB\xBF"
                        << "cab\nba\n";
  EXPECT_EQ(load_text(o, {}).vocab, U"\nabc");
  o.path = "/dev/zero";
  EXPECT_NE(test::error_of([&] {
              load_text(o, {});
            }).find("/dev/zero: not a regular file (a directory, device or pipe); give a file"),
            std::string::npos);
}

// text_classify's examples and batches: a pair cut longest-first to seq_len, the separator in
// segment 0, batches padded to their longest example with segments and lengths; errors name the
// file and line.
TEST(Loader, TextPairsArePaddedSegmentedAndCutLongestFirst) {
  const fs::path dir = test::temp_dir("text_pairs");
  const fs::path csv = dir / "pairs.csv";
  std::ofstream(csv) << "a,b,label\n"
                        "abcdefgh,xy,yes\n"     // 8 + 3 + 2 = 13 > 10: A cut to 5
                        "ab,\"x, y\",no\n"      // 2 + 3 + 4 = 9
                        "abcdef,uvwxyz,yes\n";  // 6 + 3 + 6 = 15: both cut, to 3 and 4
  DataOptions o;
  o.source = "c.yaml";
  o.task = TaskKind::text_classify;
  o.path = csv.string();
  o.text = {.seq_len = 10,
            .columns = {"a", "b"},
            .class_col = "label",
            .separator = " | ",
            .tokenizer = {}};
  o.split.train = 1.0;
  o.split.val = 0.0;
  const Dataset d = load_dataset(o);
  const TextData& t = d.text;
  ASSERT_EQ(t.examples(), 3);
  EXPECT_EQ(t.truncated, 2);
  EXPECT_EQ(t.class_names, (std::vector<std::string>{"no", "yes"}));
  EXPECT_EQ(t.classes, (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(t.lines, (std::vector<int64_t>{2, 3, 4}));
  {  // integer classes by value: class k is output k
    DataOptions n = o;
    n.path = (dir / "numbered.csv").string();
    std::ofstream(n.path) << "a,b,label\nab,c,10\nab,d,2\nab,e,0\nab,f,2\n";
    const TextData numbered = load_dataset(n).text;
    EXPECT_EQ(numbered.class_names, (std::vector<std::string>{"0", "2", "10"}));
    EXPECT_EQ(numbered.classes, (std::vector<int64_t>{2, 1, 0, 1}));
  }
  auto text_of = [&](int64_t e) {
    std::u32string s;
    for (int64_t i = t.offsets[e]; i < t.offsets[e + 1]; ++i) s += t.vocab[t.ids[i]];
    return encode_utf8(s);
  };
  EXPECT_EQ(text_of(0), "abcde | xy");
  EXPECT_EQ(text_of(1), "ab | x, y");
  EXPECT_EQ(text_of(2), "abc | uvwx");
  EXPECT_EQ(t.first_lengths, (std::vector<int64_t>{8, 5, 6}));
  EXPECT_EQ(t.segments, 2);
  auto be = make_reference_backend();
  Batch b;
  Rng rng(1);
  const std::vector<int64_t> starts = {1, 2};
  assemble_batch(*be, d, starts, 0, 2, {}, rng, &b);
  ASSERT_EQ(b.input.shape(), Shape({2, 10}));
  EXPECT_EQ(b.lengths_buf.host<int64_t>()[0], 9);
  EXPECT_EQ(b.lengths_buf.host<int64_t>()[1], 10);
  const int64_t* seg = b.segments_buf.host<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(seg, seg + 10),
            (std::vector<int64_t>{0, 0, 0, 0, 0, 1, 1, 1, 1, 0}));  // the padding: 0
  EXPECT_EQ(std::vector<int64_t>(seg + 10, seg + 20),
            (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(b.labels_buf.host<int64_t>()[0], 0);
  EXPECT_EQ(b.labels_buf.host<int64_t>()[1], 1);
  // Errors: an empty text or class (not a class named ""), a class unseen in training, a
  // character outside the vocabulary.
  std::ofstream(dir / "empty.csv") << "a,b,label\nab,c,yes\n,c,no\n";
  o.path = (dir / "empty.csv").string();
  EXPECT_NE(test::error_of([&] { load_dataset(o); }).find("empty.csv:3: column 'a' is empty"),
            std::string::npos);
  std::ofstream(dir / "no_class.csv") << "a,b,label\nab,c,yes\nb,c,no\nab,c,\n";
  o.path = (dir / "no_class.csv").string();
  EXPECT_NE(test::error_of([&] {
              load_dataset(o);
            }).find("no_class.csv:4: column 'label' is empty (every example needs a class)"),
            std::string::npos);
  // eval --data: a class the model was not trained on leaves its row out, with a note.
  std::ofstream(dir / "new.csv") << "a,b,label\nab,c,maybe\nb,c,no\n";
  o.path = (dir / "new.csv").string();
  const Dataset unseen = load_dataset(o, &d, WindowSet::with_targets);
  EXPECT_EQ(unseen.text.split.test, std::vector<int64_t>{1});
  ASSERT_EQ(unseen.notes().size(), 1u);
  EXPECT_NE(unseen.notes()[0].find("1 row has class 'maybe'"), std::string::npos);
  EXPECT_NE(test::error_of([&] {
              load_dataset(o, &d);
            }).find("new.csv:2: class 'maybe' was not seen in training"),
            std::string::npos);
  std::ofstream(dir / "case.csv") << "a,b,label\nab,c,Yes\nb,c,no\n";
  o.path = (dir / "case.csv").string();
  const Dataset other_case = load_dataset(o, &d, WindowSet::with_targets);
  ASSERT_EQ(other_case.notes().size(), 1u);
  EXPECT_NE(other_case.notes()[0].find("class 'Yes' in column 'label', which the model was not "
                                       "trained on (the model knows 'yes'): no actual class"),
            std::string::npos)
      << other_case.notes()[0];
  // Every character outside the vocabulary at once, each with its count and first line.
  std::ofstream(dir / "odd.csv") << "a,b,label\nab,q\u00e9,yes\nq,a,no\n";
  o.path = (dir / "odd.csv").string();
  const std::string odd = test::error_of([&] { load_dataset(o, &d, WindowSet::with_targets); });
  EXPECT_NE(odd.find("odd.csv: 2 characters are not in the vocabulary of the model"),
            std::string::npos)
      << odd;
  EXPECT_NE(odd.find("'q' (2 times, first at line 2)"), std::string::npos) << odd;
  EXPECT_NE(odd.find("'\u00e9' U+00E9 (1 time, at line 2)"), std::string::npos) << odd;
  // A separator's character the vocabulary lacks is the config's, not the file's.
  DataOptions tilde = o;
  tilde.text.separator = " ~ ";
  tilde.path = (dir / "new.csv").string();
  const std::string separator =
      test::error_of([&] { load_dataset(tilde, &d, WindowSet::with_targets); });
  EXPECT_NE(separator.find("data.separator: 1 character is not in the vocabulary of the model"),
            std::string::npos)
      << separator;
  EXPECT_NE(separator.find("'~' (1 time, at its character 2)"), std::string::npos) << separator;
}

// The class column read as text would hand the model each row's answer: refused.
TEST(Loader, TextColumnsNeverIncludeTheClassColumn) {
  const std::string error = test::error_of([] {
    data_options(Config::parse(
        "data: {path: x.csv, task: text_classify, text_columns: [text, label], class_column: "
        "label, separator: ' | ', seq_len: 16}\n",
        "c.yaml"));
  });
  EXPECT_EQ(error,
            "c.yaml:1: data.text_columns names 'label', the data.class_column: the model would "
            "read each row's class in its text");
}

}  // namespace
}  // namespace seqforge::loader_test
