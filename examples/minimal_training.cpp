// Minimal seqforge program: forecast next month's Mauna Loa CO2 from the previous 24 months with
// an LSTM, trained with AdamW on the library's engine. Prints the loss each epoch and exits with
// status 2 if training did not lower it.
//
//   seqforge_example [data/co2-concentration.csv] [epochs]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "seqforge/seqforge.hpp"

namespace sf = seqforge;

static std::vector<float> read_co2(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw sf::Error(path + ": cannot open");
  std::string line;
  std::getline(in, line);  // header: Date,CO2,adjusted CO2
  std::vector<float> values;
  for (int row = 2; std::getline(in, line); ++row) {
    std::stringstream fields(line);
    std::string date, co2;
    if (!std::getline(fields, date, ',') || !std::getline(fields, co2, ','))
      throw sf::Error(path + ":" + std::to_string(row) + ": expected Date,CO2,...");
    values.push_back(std::stof(co2));
  }
  return values;
}

int main(int argc, char** argv) try {
  const std::string path = argc > 1 ? argv[1] : "data/co2-concentration.csv";
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 30;
  const int64_t lookback = 24, batch = 32;

  std::vector<float> series = read_co2(path);
  const float mean = std::accumulate(series.begin(), series.end(), 0.0f) / series.size();
  float var = 0;
  for (float v : series) var += (v - mean) * (v - mean);
  const float stdev = std::sqrt(var / series.size());
  for (float& v : series) v = (v - mean) / stdev;
  const int64_t windows = static_cast<int64_t>(series.size()) - lookback;

  sf::ThreadConfig threads = sf::configure_threads();
  std::printf("seqforge %s: %lld monthly values, %lld windows, %d threads (%s)\n", sf::version(),
              static_cast<long long>(series.size()), static_cast<long long>(windows),
              threads.threads, threads.reason.c_str());

  auto backend = sf::make_cpu_backend();
  sf::ModelOptions options;
  options.rnn = {.input_size = 1, .hidden_size = 32, .num_layers = 1, .batch_first = true};
  options.output_size = 1;
  sf::SequenceModel model(options);
  model.initialize(*backend, 42);
  sf::Optimizer optimizer(*backend, model.parameters(), {.kind = "adamw", .lr = 1e-2});
  sf::Rng rng(7);

  std::vector<int64_t> order(windows);
  std::iota(order.begin(), order.end(), 0);
  std::vector<float> x(batch * lookback), y(batch), dpred(batch);
  double first_loss = 0, last_loss = 0;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    for (int64_t i = windows - 1; i > 0; --i) std::swap(order[i], order[rng.next() % (i + 1)]);
    double total = 0;
    int64_t seen = 0;
    for (int64_t start = 0; start + batch <= windows; start += batch) {
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t w = order[start + b];
        std::copy_n(series.begin() + w, lookback, x.begin() + b * lookback);
        y[b] = series[w + lookback];
      }
      sf::Tensor xt(x.data(), sf::DType::f32, {batch, lookback, 1});
      sf::Tensor yt(y.data(), sf::DType::f32, {batch, 1});
      sf::Tensor dt(dpred.data(), sf::DType::f32, {batch, 1});
      model.parameters().zero_grad(*backend);
      sf::Tensor pred = model.forward(*backend, xt, {}, {}, true, rng);
      const double loss = backend->mse_loss(pred, yt, {}, dt);
      model.backward(*backend, dt);
      sf::clip_grad_norm(*backend, model.parameters(), 1.0);
      optimizer.step();
      total += loss * batch;
      seen += batch;
    }
    std::printf("epoch %3d  train mse %.5f  (rmse %.3f ppm)\n", epoch, total / seen,
                std::sqrt(total / seen) * stdev);
    (epoch == 1 ? first_loss : last_loss) = total / seen;
  }
  if (epochs > 1 && !(last_loss < first_loss)) {
    std::fprintf(stderr, "error: the training loss did not fall\n");
    return 2;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
