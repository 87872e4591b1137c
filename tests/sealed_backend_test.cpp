// Host code reaches backend memory only through upload/download: under the sealed backend (the
// reference kernels behind memory the host cannot touch outside backend calls) a direct read
// faults and an op given host memory fails, and whole runs give the reference backend's numbers
// exactly: training of every task and cell, stateful training, resume, init_from, eval, predict,
// generate and gradient all-reduce.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/dist/gradient_sync.hpp"
#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/train/trainer.hpp"
#include "test_util.hpp"

namespace seqforge::sealed_backend_test {
namespace {

namespace fs = std::filesystem;

TEST(SealedBackend, HostReadsOfItsMemoryFault) {
  auto be = make_sealed_backend();
  EXPECT_FALSE(be->host_addressable());
  Buffer buf;
  const Tensor t = buf.get(*be, DType::f32, {4});
  const std::vector<float> in = {1, 2, 3, 4};
  be->upload(t, in.data());
  std::vector<float> out(4);
  be->download(out.data(), t);
  EXPECT_EQ(out, in);
  EXPECT_DEATH({ std::printf("%g\n", static_cast<volatile float*>(t.data())[0]); }, "");
}

TEST(SealedBackend, OpsRejectHostMemory) {
  auto be = make_sealed_backend();
  Buffer buf;
  const Tensor t = buf.get(*be, DType::f32, {4});
  std::vector<float> host(4, 1.0f);
  const std::string e = test::error_of([&] { be->add(t, Tensor(host.data(), DType::f32, {4})); });
  EXPECT_NE(e.find("sealed backend: add was given memory that is not the backend's"),
            std::string::npos)
      << e;
}

// sealed_async: an op returns before it runs; its error comes out of the next wait (download or
// synchronize), once, and the ops after it still run, as on a GPU.
TEST(SealedBackend, AsyncOpsRunLaterAndTheirErrorsComeOutOfTheNextWait) {
  auto be = make_sealed_async_backend();
  EXPECT_EQ(be->name(), "sealed_async");
  Buffer table_buf, ids_buf, out_buf, sum_buf;
  const Tensor table = table_buf.get(*be, DType::f32, {3, 2});
  const Tensor ids = ids_buf.get(*be, DType::i64, {2});
  const Tensor out = out_buf.get(*be, DType::f32, {2, 2});
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  be->upload(table, values.data());
  const std::vector<int64_t> bad = {1, 7};
  be->upload(ids, bad.data());
  be->embedding_forward(out, table, ids);  // no error yet: it has not run
  be->fill(table, 0.5);
  EXPECT_EQ(test::error_of([&] { be->synchronize(); }), "token id 7 at position 1 outside [0, 3)");
  EXPECT_EQ(test::error_of([&] { be->synchronize(); }), "");
  std::vector<float> after(6);
  be->download(after.data(), table);
  EXPECT_EQ(after, std::vector<float>(6, 0.5f)) << "the op after the failed one ran";
  // A reduction into backend memory, read once it has run.
  be->sum_squares(table, sum_buf.get(*be, DType::f64, {1}));
  double sum = 0;
  be->download(&sum, sum_buf.tensor());
  EXPECT_EQ(sum, 1.5);
}

// Host views: in place on a host-addressable backend, through a copy on the sealed one.
TEST(SealedBackend, HostViewsAndStagedBuffersMoveValues) {
  for (const char* name : {"cpu", "sealed"}) {
    auto be = make_backend(name);
    StagedBuffer staged;
    const Tensor t = staged.get(*be, DType::f32, {3});
    for (int i = 0; i < 3; ++i) staged.host<float>()[i] = float(i + 1);
    staged.upload();
    HostView view(*be, t, HostView::Access::read_write);
    EXPECT_EQ(view.data<float>()[2], 3.0f) << name;
    view.data<float>()[0] = 7.0f;
    view.upload();
    EXPECT_EQ(download_vector<float>(*be, t), (std::vector<float>{7, 2, 3})) << name;
    EXPECT_EQ(view.data<float>() == t.data(), be->host_addressable()) << name;
  }
}

// Sums as if a second rank had the same gradients.
class DoublingCommunicator final : public dist::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int local_size() const override { return 1; }
  std::string name() const override { return "doubling"; }
  void set_timeout(double, std::string) override {}
  Request all_reduce_start(std::span<float> data, dist::ReduceOp) override {
    for (float& x : data) x *= 2;
    return 0;
  }
  bool test(Request) override { return true; }
  void wait(Request) override {}
  void all_reduce_sum(std::span<double>) override {}
  void broadcast(std::span<std::byte>) override {}
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message) override { fail(message); }
};

// Gradient buckets go through a host copy on the sealed backend and come back summed.
TEST(SealedBackend, GradientSyncStagesBuckets) {
  std::vector<double> grads[2];
  for (const char* name : {"reference", "sealed"}) {
    auto be = make_backend(name);
    ModelOptions o;
    o.output_size = 2;
    o.rnn.hidden_size = 8;
    o.rnn.input_size = 3;
    SequenceModel model(o);
    model.initialize(*be, 1);
    DoublingCommunicator comm;
    dist::GradientSync sync(comm, *be, model.parameters(), 256);
    model.set_grad_ready_hook([&](size_t first, size_t end) { sync.ready(first, end); });
    test::HostTensor x(*be, DType::f32, {2, 5, 3}, std::vector<double>(30, 0.5));
    Rng rng(1);
    Tensor y = model.forward(*be, x.t, {}, {}, true, rng);
    test::HostTensor dy(*be, DType::f32, y.shape(),
                        std::vector<double>(static_cast<size_t>(y.numel()), 0.1));
    sync.begin_step();
    model.backward(*be, dy.t);
    sync.finish();
    grads[std::string(name) == "sealed"] = test::to_doubles(*be, model.parameters().grads().flat());
  }
  EXPECT_EQ(grads[0], grads[1]);
  double norm = 0;
  for (double g : grads[1]) norm += g * g;
  EXPECT_GT(norm, 0);
}

std::string write_series(const fs::path& dir) {
  const fs::path path = dir / "series.csv";
  std::ofstream f(path);
  f << "when,signal,other,label\n";
  for (int i = 0; i < 300; ++i) {
    char date[32];
    std::snprintf(date, sizeof date, "2020-01-%02dT%02d:00:00", 1 + i / 24, i % 24);
    f << date << "," << std::sin(i * 0.3) << "," << std::cos(i * 0.05) << ","
      << (std::sin(i * 0.3) > 0 ? "up" : "down") << "\n";
  }
  return path.string();
}

// metrics.jsonl without its timings.
std::vector<nlohmann::json> metrics(const fs::path& run) {
  std::ifstream f(run / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(f, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    for (auto it = j.begin(); it != j.end();)  // timings and resources differ from run to run
      it = it.key().find("second") != std::string::npos || it.key().find("data_wait") == 0 ||
                   it.key().find("rss") != std::string::npos ||
                   it.key().find("cpu") != std::string::npos || it.key().find("gpu") == 0
               ? j.erase(it)
               : std::next(it);
    out.push_back(j);
  }
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Outcome {
  std::vector<nlohmann::json> metrics, resumed;
  std::map<std::string, double> eval;
  std::string predictions, text;
};

// One pass through a run's life on `backend`: train, resume for another epoch, eval, predict
// (or generate), and for mae a classifier fine-tuned from the run.
Outcome live(const std::string& backend, const std::string& yaml, const fs::path& dir,
             const std::string& data) {
  setenv("SEQFORGE_BACKEND", backend.c_str(), 1);
  Outcome o;
  const fs::path run = dir / backend;
  std::ostringstream log;
  train(Config::parse(yaml + "train: {epochs: 2, batch_size: 16, run_dir: " + run.string() +
                          ", stateful: " +
                          (yaml.find("stateful") != std::string::npos ? "true" : "false") + "}\n",
                      "c.yaml"),
        log);
  o.metrics = metrics(run);
  train(Config::load((run / "config.resolved.yaml").string(), {"train.epochs=3"}), log,
        run.string());
  o.resumed = metrics(run);
  const bool charlm = yaml.find("charlm") != std::string::npos;
  const bool mae = yaml.find("mae") != std::string::npos;
  o.eval = evaluate(run.string(), "val");
  if (charlm) {
    o.text = generate(run.string(), "ab", 20, 0.8, 0, 5);
  } else if (!mae) {
    predict(run.string(), {.input = data, .output = (run / "p.csv").string()}, log);
    o.predictions = slurp(run / "p.csv");
  } else {
    train(
        Config::parse("data: {path: " + data +
                          ", date_column: when, features: [signal, other], task: classify, "
                          "class_column: label, lookback: 8}\nmodel: {hidden: 6, bidirectional: "
                          "true, init_from: " +
                          run.string() + ", init_from_modules: [lstm]}\ntrain: {epochs: 1, " +
                          "batch_size: 16, run_dir: " + (dir / (backend + "_ft")).string() + "}\n",
                      "ft.yaml"),
        log);
    o.resumed.push_back(metrics(dir / (backend + "_ft")).front());
  }
  unsetenv("SEQFORGE_BACKEND");
  return o;
}

// The same run's life on the reference, the sealed backend and the sealed backend whose ops run
// later on a worker thread (a GPU stream's timing): bit for bit the same.
void expect_same_runs(const std::string& name, const std::string& yaml, const std::string& data) {
  const fs::path dir = test::temp_dir(name);
  const Outcome want = live("reference", yaml, dir, data);
  ASSERT_FALSE(want.metrics.empty());
  for (const char* backend : {"sealed", "sealed_async"}) {
    const Outcome got = live(backend, yaml, dir, data);
    EXPECT_EQ(got.metrics, want.metrics) << backend;
    EXPECT_EQ(got.resumed, want.resumed) << backend;
    EXPECT_EQ(got.eval, want.eval) << backend;
    EXPECT_EQ(got.predictions, want.predictions) << backend;
    EXPECT_EQ(got.text, want.text) << backend;
  }
}

TEST(SealedBackend, ForecastRunsMatchTheReference) {
  const fs::path dir = test::temp_dir("data_forecast");
  const std::string data = write_series(dir);
  expect_same_runs("forecast",
                   "data: {path: " + data +
                       ", date_column: when, features: [signal, other], targets: [signal], "
                       "lookback: 8}\nmodel: {hidden: 6, cell: gru, dropout: 0.2, layers: 2}\n",
                   data);
}

TEST(SealedBackend, StatefulRunsMatchTheReference) {
  const fs::path dir = test::temp_dir("data_stateful");
  const std::string data = write_series(dir);
  expect_same_runs("stateful",
                   "# stateful\ndata: {path: " + data +
                       ", date_column: when, features: [signal, other], targets: [signal], "
                       "lookback: 8}\nmodel: {hidden: 6, proj_size: 3}\n",
                   data);
}

TEST(SealedBackend, ClassifyAndMaeRunsMatchTheReference) {
  const fs::path dir = test::temp_dir("data_classify");
  const std::string data = write_series(dir);
  expect_same_runs("classify",
                   "data: {path: " + data +
                       ", date_column: when, features: [signal, other], task: classify, "
                       "class_column: label, lookback: 8}\nmodel: {hidden: 6, cell: lnlstm}\n",
                   data);
  expect_same_runs("mae",
                   "data: {path: " + data +
                       ", date_column: when, features: [signal, other], task: mae, lookback: 8}"
                       "\nmodel: {hidden: 6, bidirectional: true}\n",
                   data);
}

TEST(SealedBackend, CharlmRunsMatchTheReference) {
  const fs::path dir = test::temp_dir("data_charlm");
  const fs::path text = dir / "t.txt";
  std::ofstream(text) << "abcab cabba bcabc abacab cbacb aabbc cabab bcbca abcba caabb\n"
                         "bacab cabcb abbca bcaab cbabc aacbb abcab cbaca bbaca cabab\n";
  expect_same_runs("charlm",
                   "data: {path: " + text.string() +
                       ", task: charlm, seq_len: 8, split: {train: 0.8, val: 0.2}}\n"
                       "model: {hidden: 8, embedding: 4}\n",
                   text.string());
}

TEST(SealedBackend, TransformerRunsMatchTheReference) {
  const fs::path dir = test::temp_dir("data_gpt");
  const fs::path text = dir / "t.txt";
  std::ofstream(text) << "abcab cabba bcabc abacab cbacb aabbc cabab bcbca abcba caabb\n"
                         "bacab cabcb abbca bcaab cbabc aacbb abcab cbaca bbaca cabab\n";
  expect_same_runs("gpt",
                   "data: {path: " + text.string() +
                       ", task: charlm, seq_len: 8, split: {train: 0.8, val: 0.2}}\n"
                       "model: {family: transformer, embedding: 8, heads: 2, layers: 2, "
                       "dropout: 0.1}\n",
                   text.string());
  for (const char* adapter : {"{kind: lora, rank: 2, dropout: 0.1}", "{kind: dora, rank: 3}"})
    expect_same_runs(std::string("gpt_") + (adapter[7] == 'l' ? "lora" : "dora"),
                     "data: {path: " + text.string() +
                         ", task: charlm, seq_len: 8, split: {train: 0.8, val: 0.2}}\n"
                         "model: {family: transformer, embedding: 8, heads: 2, layers: 2}\n"
                         "adapter: " +
                         adapter + "\n",
                     text.string());
}

}  // namespace
}  // namespace seqforge::sealed_backend_test

namespace seqforge::sealed_backend_test {
namespace {

TEST(SealedBackend, TextClassifierAndRecurrentAdapterRunsMatchTheReference) {
  const fs::path dir = test::temp_dir("data_pairs");
  const fs::path pairs = dir / "pairs.csv";
  {
    std::ofstream f(pairs);
    f << "a,b,label\n";
    for (int i = 0; i < 60; ++i)
      f << "ab" << std::string(1 + i % 4, 'c') << ",\"b, " << std::string(i % 3, 'a') << "\","
        << (i % 3 == 0 ? "x" : "y") << "\n";
  }
  expect_same_runs("pairs",
                   "data: {path: " + pairs.string() +
                       ", task: text_classify, text_columns: [a, b], class_column: label, "
                       "seq_len: 10}\nmodel: {family: transformer, embedding: 8, heads: 2, "
                       "layers: 1, bidirectional: true, dropout: 0.1}\n",
                   pairs.string());
  const std::string data = write_series(test::temp_dir("data_lstm_dora"));
  expect_same_runs("lstm_dora",
                   "data: {path: " + data +
                       ", date_column: when, features: [signal, other], targets: [signal], "
                       "lookback: 8}\nmodel: {hidden: 6, layers: 2}\nadapter: {kind: dora, "
                       "rank: 2}\n",
                   data);
}

}  // namespace
}  // namespace seqforge::sealed_backend_test
