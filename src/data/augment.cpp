#include "seqforge/data/augment.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/hash.hpp"
#include "seqforge/io/npy.hpp"

namespace fs = std::filesystem;

namespace seqforge {

bool AugmentOptions::any() const {
  return jitter_p > 0 || scaling_p > 0 || magnitude_warp_p > 0 || time_warp_p > 0 ||
         window_slice_p > 0;
}

std::string AugmentOptions::describe() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "jitter %.17g %.17g; scaling %.17g %.17g; magnitude_warp %.17g %.17g %lld; "
                "time_warp %.17g %.17g %lld; window_slice %.17g %.17g%s",
                jitter_p, jitter_sigma, scaling_p, scaling_sigma, magnitude_warp_p,
                magnitude_warp_sigma, (long long)magnitude_warp_knots, time_warp_p, time_warp_sigma,
                (long long)time_warp_knots, window_slice_p, window_slice_ratio,
                slice_keeps_end ? " at the end" : "");
  return buf;
}

namespace {

// A smooth curve through knots 1 + sigma * N(0, 1), evenly spaced over T steps (Catmull-Rom).
void smooth_curve(int64_t T, int64_t knots, double sigma, Rng& rng, std::vector<double>* out) {
  std::vector<double> v(knots + 2);
  for (double& x : v) x = 1.0 + sigma * rng.normal();
  const int64_t last = static_cast<int64_t>(v.size()) - 1;
  out->resize(T);
  for (int64_t t = 0; t < T; ++t) {
    const double x = T > 1 ? double(t) * last / double(T - 1) : 0.0;
    const int64_t k = std::min<int64_t>(static_cast<int64_t>(x), last - 1);
    const double u = x - k;
    const double p0 = v[std::max<int64_t>(k - 1, 0)], p1 = v[k], p2 = v[k + 1],
                 p3 = v[std::min(k + 2, last)];
    (*out)[t] = 0.5 * (2 * p1 + (p2 - p0) * u + (2 * p0 - 5 * p1 + 4 * p2 - p3) * u * u +
                       (3 * p1 - p0 - 3 * p2 + p3) * u * u * u);
  }
}

// window(t) = old(at[t]) along time: a value by linear interpolation between the steps either
// side, a derived feature (and a value beside a missing cell) from the nearer step, so that
// dates' phases, categories and missing indicators stay what some step held and a missing cell
// stays missing. `missing` (T, F), if any, moves with the cells.
void resample(float* window, int64_t T, int64_t F, const std::vector<char>& values, char* missing,
              const std::vector<double>& at) {
  thread_local std::vector<float> old;
  thread_local std::vector<char> old_missing;
  old.assign(window, window + T * F);
  if (missing) old_missing.assign(missing, missing + T * F);
  for (int64_t t = 0; t < T; ++t) {
    const double x = std::clamp(at[t], 0.0, double(T - 1));
    const int64_t i = std::min<int64_t>(static_cast<int64_t>(x), T - 2);
    const double u = x - i;
    const int64_t nearer = u <= 0.5 ? i : i + 1;
    for (int64_t f = 0; f < F; ++f) {
      const bool gap = missing && (old_missing[i * F + f] || old_missing[(i + 1) * F + f]);
      if (values[size_t(f)] && !gap)
        window[t * F + f] = static_cast<float>((1 - u) * old[i * F + f] + u * old[(i + 1) * F + f]);
      else
        window[t * F + f] = old[nearer * F + f];
      if (missing) missing[t * F + f] = old_missing[nearer * F + f];
    }
  }
}

}  // namespace

void augment_window(const AugmentOptions& o, float* w, int64_t T, int64_t F,
                    const std::vector<char>& values, char* missing, Rng& rng) {
  thread_local std::vector<double> curve, at;
  // Whether an augmentation changes cell (t, f)'s magnitude: a value, not missing.
  auto changes = [&](int64_t t, int64_t f) {
    return values[size_t(f)] && !(missing && missing[t * F + f]);
  };
  if (T >= 2 && o.window_slice_p > 0 && rng.uniform() < o.window_slice_p) {
    const int64_t L = std::clamp<int64_t>(std::llround(o.window_slice_ratio * T), 2, T);
    const uint64_t draw = rng.next();
    const int64_t first = o.slice_keeps_end ? T - L : static_cast<int64_t>(draw % (T - L + 1));
    at.resize(T);
    for (int64_t t = 0; t < T; ++t) at[t] = first + double(t) * (L - 1) / double(T - 1);
    resample(w, T, F, values, missing, at);
  }
  if (T >= 2 && o.time_warp_p > 0 && rng.uniform() < o.time_warp_p) {
    smooth_curve(T, o.time_warp_knots, o.time_warp_sigma, rng, &curve);  // local speed
    at.resize(T);
    double sum = 0;
    for (int64_t t = 0; t < T; ++t) {
      at[t] = sum;
      sum += std::max(curve[t], 0.05);
    }
    const double end = at[T - 1];
    for (int64_t t = 0; t < T; ++t) at[t] *= double(T - 1) / end;
    resample(w, T, F, values, missing, at);
  }
  if (o.magnitude_warp_p > 0 && rng.uniform() < o.magnitude_warp_p)
    for (int64_t f = 0; f < F; ++f) {
      if (!values[size_t(f)]) continue;
      smooth_curve(T, o.magnitude_warp_knots, o.magnitude_warp_sigma, rng, &curve);
      for (int64_t t = 0; t < T; ++t)
        if (changes(t, f)) w[t * F + f] = static_cast<float>(w[t * F + f] * curve[t]);
    }
  if (o.scaling_p > 0 && rng.uniform() < o.scaling_p)
    for (int64_t f = 0; f < F; ++f) {
      if (!values[size_t(f)]) continue;
      const double s = 1.0 + o.scaling_sigma * rng.normal();
      for (int64_t t = 0; t < T; ++t)
        if (changes(t, f)) w[t * F + f] = static_cast<float>(w[t * F + f] * s);
    }
  if (o.jitter_p > 0 && rng.uniform() < o.jitter_p)
    for (int64_t i = 0; i < T * F; ++i)
      if (changes(i / F, i % F)) w[i] = static_cast<float>(w[i] + o.jitter_sigma * rng.normal());
}

std::vector<char> augmented_features(const SeriesData& s) {
  SF_CHECK(int64_t(s.value_features.size()) == s.num_features(),
           "augment: ", s.value_features.size(), " features described of ", s.num_features());
  return s.value_features;
}

void augment_window(const AugmentOptions& o, const SeriesData& s, const std::vector<char>& values,
                    int64_t start, float* w, Rng& rng) {
  const int64_t T = s.lookback, F = s.num_features();
  thread_local std::vector<char> missing;
  if (s.masks_missing) {
    missing.resize(size_t(T * F));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 0; f < F; ++f)
        missing[size_t(t * F + f)] =
            !std::isfinite(s.source.at(start + t, s.feature_cols[size_t(f)]));
  }
  augment_window(o, w, T, F, values, s.masks_missing ? missing.data() : nullptr, rng);
}

namespace {

// The fingerprint: everything the cached windows depend on.
uint64_t fingerprint(const Dataset& data, const AugmentOptions& o, uint64_t seed) {
  const SeriesData& s = data.series;
  uint64_t h = 0;
  {  // the source file's bytes, mapped: it may be larger than memory
    const io::MappedFile file = io::map_file(data.path);
    h = hash_bytes(file.data, file.size);
  }
  // The values the windows are cut from, as missing cells were filled (data.missing) and the
  // columns transformed.
  h = hash_bytes(s.source.data,
                 static_cast<size_t>(s.source.rows * s.source.cols) * dtype_size(s.source.dtype),
                 h);
  nlohmann::json j = {{"format", 3},
                      {"task", task_name(s.task)},
                      {"layout", s.layout},
                      {"masks_missing", s.masks_missing},
                      {"file_features", s.file_features},
                      {"known", {s.known_begin, s.known_end}},
                      {"lookback", s.lookback},
                      {"features", s.feature_names},
                      {"feature_cols", s.feature_cols},
                      {"norm", s.feature_norm.to_json()},
                      {"augment", o.describe()},
                      {"versions", o.cache_versions},
                      {"seed", seed}};
  h = hash_text(j.dump(), h);
  return hash_bytes(s.split.train.data(), s.split.train.size() * sizeof(int64_t), h);
}

}  // namespace

std::unique_ptr<AugmentCache> AugmentCache::open(const Dataset& data, const AugmentOptions& o,
                                                 uint64_t seed, int threads, std::ostream& log) {
  const SeriesData& s = data.series;
  const int64_t K = o.cache_versions, N = static_cast<int64_t>(s.split.train.size());
  const int64_t T = s.lookback, F = s.num_features();
  const std::vector<int64_t> shape = {K, N, T, F};
  std::error_code ec;
  fs::create_directories(o.cache_dir, ec);
  if (ec || !fs::is_directory(o.cache_dir))
    fail("augment.cache_dir: cannot create ", o.cache_dir, ": ",
         ec ? ec.message() : "not a directory");
  const std::string name = "augment-" + hash_hex(fingerprint(data, o, seed));
  const std::string npy_path = (fs::path(o.cache_dir) / (name + ".npy")).string();
  const std::string sum_path = (fs::path(o.cache_dir) / (name + ".json")).string();

  auto cache = std::make_unique<AugmentCache>();
  cache->path_ = npy_path;
  cache->versions_ = K;
  cache->window_size_ = T * F;
  cache->starts_ = s.split.train;
  const size_t bytes = static_cast<size_t>(K * N * T * F) * sizeof(float);

  // Reuse: the checksum file must name this shape and the data's hash.
  if (fs::exists(npy_path) || fs::exists(sum_path)) {
    std::string problem;
    try {
      const auto j = nlohmann::json::parse(io::read_file(sum_path));
      io::MappedNpy m = io::map_npy(npy_path);
      if (m.dtype != DType::f32 || m.shape != shape) {
        problem = "shape or type differs";
      } else if (j.at("checksum").get<std::string>() != hash_hex(hash_bytes(m.data, bytes))) {
        problem = "checksum mismatch";
      } else {
        cache->mapping_ = m.mapping;
        cache->data_ = reinterpret_cast<const float*>(m.data);
        log << "augmentation cache: reusing " << npy_path << "\n";
        return cache;
      }
    } catch (const std::exception& e) {
      problem = e.what();
    }
    log << "augmentation cache: " << npy_path << " is not usable (" << problem
        << "); rebuilding it\n";
  }

  // Build: item k * N + i is version k of window i, drawn from its own seed, so the result does
  // not depend on the threads.
  std::vector<float> values(static_cast<size_t>(K * N * T * F));
  const std::vector<char> augmented = augmented_features(s);
  auto build = [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t i = item % N;
      float* w = values.data() + item * T * F;
      s.copy_window(s.split.train[i], w);
      Rng rng(mix_seed(seed, static_cast<uint64_t>(item)));
      augment_window(o, s, augmented, s.split.train[i], w, rng);
    }
  };
  const int64_t items = K * N, n_threads = std::clamp<int64_t>(threads, 1, items);
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < n_threads; ++t)
    pool.emplace_back(build, items * t / n_threads, items * (t + 1) / n_threads);
  for (auto& th : pool) th.join();
  const uint64_t checksum = hash_bytes(values.data(), bytes);
  try {
    io::write_npy(npy_path, DType::f32, shape, values.data());
    const std::string sum =
        nlohmann::json{{"checksum", hash_hex(checksum)}, {"shape", shape}}.dump();
    io::write_file_atomically(sum_path, {{sum.data(), sum.size()}});
  } catch (const Error& e) {
    fail("augment.cache_dir: cannot write the augmentation cache: ", e.what());
  }
  io::MappedNpy m = io::map_npy(npy_path);
  cache->mapping_ = m.mapping;
  cache->data_ = reinterpret_cast<const float*>(m.data);
  log << "augmentation cache: built " << npy_path << " (" << K << " versions of " << N
      << " windows, " << bytes / 1000000 << " MB)\n";
  return cache;
}

const float* AugmentCache::window(int64_t start, int64_t version) const {
  const auto it = std::lower_bound(starts_.begin(), starts_.end(), start);
  if (it == starts_.end() || *it != start)
    fail(path_, ": window at row ", start, " is not a training window of this cache");
  const int64_t i = it - starts_.begin(), n = static_cast<int64_t>(starts_.size());
  return data_ + (version * n + i) * window_size_;
}

}  // namespace seqforge
