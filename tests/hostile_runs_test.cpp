// Hostile run directories: a run directory held by another process, damaged training states and
// checkpoints with non-finite values, each refused with one line naming the file and the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/file_util.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/train/trainer.hpp"
#include "test_util.hpp"

namespace seqforge::hostile_runs_test {
namespace {

namespace fs = std::filesystem;
using test::error_of;

std::string write_series(const fs::path& dir, int rows) {
  const fs::path path = dir / "series.csv";
  std::ofstream f(path);
  f << "when,signal,other\n";
  for (int i = 0; i < rows; ++i) {
    char date[32];
    std::snprintf(date, sizeof date, "2020-01-%02dT%02d:00:00", 1 + i / 24, i % 24);
    f << date << "," << std::sin(i * 0.3) << "," << std::cos(i * 0.05) << "\n";
  }
  return path.string();
}

Config forecast(const std::string& data, const fs::path& run,
                const std::vector<std::string>& overrides = {}) {
  return Config::parse("data:\n  path: " + data +
                           "\n  date_column: when\n  features: [signal, other]\n"
                           "  targets: [signal]\n  lookback: 8\nmodel: {hidden: 8}\n"
                           "train: {epochs: 2, batch_size: 16" +
                           (run.empty() ? "" : ", run_dir: " + run.string()) + "}\n",
                       "f.yaml", overrides);
}

// A safetensors file's tensors, owned, to edit and write back.
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }
};
using Edit = std::function<void(std::vector<OwnedTensor>&, std::map<std::string, std::string>&)>;

// Rewrites `path` with its tensors and metadata passed through `edit`.
void rewrite(const fs::path& path, const Edit& edit) {
  const io::SafetensorsFile file = io::SafetensorsFile::read(path.string());
  std::vector<OwnedTensor> tensors;
  for (const auto& e : file.entries()) {
    const auto b = file.bytes(e);
    tensors.push_back({e.name, e.dtype, e.shape, std::vector<std::byte>(b.begin(), b.end())});
  }
  std::map<std::string, std::string> meta = file.metadata();
  edit(tensors, meta);
  std::vector<io::SafetensorsTensor> out;
  for (const auto& t : tensors) out.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
  io::write_safetensors(path.string(), out, meta);
}

OwnedTensor& tensor(std::vector<OwnedTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// Sets a field of the training state's seqforge.loop metadata.
Edit loop_field(const std::string& key, const nlohmann::json& value) {
  return [=](std::vector<OwnedTensor>&, std::map<std::string, std::string>& meta) {
    auto j = nlohmann::json::parse(meta.at("seqforge.loop"));
    j[key] = value;
    meta["seqforge.loop"] = j.dump();
  };
}

Edit set_order(const std::function<void(std::vector<int64_t>&)>& change) {
  return [=](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
    OwnedTensor& o = tensor(ts, "order");
    std::vector<int64_t> order(o.as<int64_t>(), o.as<int64_t>() + o.shape[0]);
    change(order);
    o.shape = {static_cast<int64_t>(order.size())};
    o.bytes.resize(order.size() * sizeof(int64_t));
    std::memcpy(o.bytes.data(), order.data(), o.bytes.size());
  };
}

// The message of resuming `run` after `edit` damaged its training state (restored after).
std::string resume_error(const fs::path& run, const Edit& edit,
                         const std::vector<std::string>& overrides = {}) {
  const fs::path state = run / "training_state.safetensors";
  const fs::path saved = run.parent_path() / (run.filename().string() + ".state");
  fs::copy_file(state, saved, fs::copy_options::overwrite_existing);
  rewrite(state, edit);
  std::ostringstream log;
  const std::string e = error_of([&] {
    train(Config::load((run / "config.resolved.yaml").string(), overrides), log, run.string());
  });
  fs::copy_file(saved, state, fs::copy_options::overwrite_existing);
  return e;
}

// A small character model trained one epoch on `text` into `run` (its lines on `log`).
void train_charlm(const fs::path& text, const fs::path& run, std::ostream& log) {
  train(Config::parse("data: {path: " + text.string() +
                          ", task: charlm, seq_len: 16}\nmodel: {hidden: 8, embedding: 4}\n"
                          "train: {epochs: 1, batch_size: 8, run_dir: " +
                          run.string() + "}\n",
                      "lm.yaml"),
        log);
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(HostileRuns, ARunDirectoryHeldByAnotherProcessIsRefusedAndLeftAlone) {
  const fs::path dir = test::temp_dir("lock");
  const std::string data = write_series(dir, 200);
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(data, run, {"train.epochs=1"}), log);
  const std::string metrics = io::read_file((run / "metrics.jsonl").string());
  const auto model_time = fs::last_write_time(run / "model.safetensors");
  io::DirLock other;  // as another process's train would hold it
  long holder = 0;
  ASSERT_TRUE(other.try_lock(run.string(), &holder));
  io::DirLock second;
  EXPECT_FALSE(second.try_lock(run.string(), &holder));
  EXPECT_EQ(holder, static_cast<long>(getpid()));
  const std::string held = "pid " + std::to_string(getpid());
  for (int how = 0; how < 3; ++how) {  // plain, --overwrite, --resume
    const std::string e = error_of([&] {
      if (how == 2)
        train(Config::load((run / "config.resolved.yaml").string()), log, run.string());
      else
        train(forecast(data, run, {"train.epochs=1"}), log, "", {}, how == 1);
    });
    EXPECT_HAS(e, run.string() + ": in use");
    EXPECT_HAS(e, held);
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_EQ(io::read_file((run / "metrics.jsonl").string()), metrics);
    EXPECT_EQ(fs::last_write_time(run / "model.safetensors"), model_time);
  }
  // Reading a run needs no lock: eval runs beside a training.
  EXPECT_GT(evaluate(run.string(), "test").at("samples"), 0);
  other.release();
  train(forecast(data, run, {"train.epochs=1"}), log, "", {}, /*overwrite=*/true);
  // A default directory held by a run under way is passed over for the next one.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  ASSERT_TRUE(other.try_lock("runs/f", &holder));
  const TrainSummary s = train(forecast(data, "", {"train.epochs=1"}), log);
  fs::current_path(cwd);
  EXPECT_EQ(s.run_dir, "runs/f-2");
  other.release();
  // A directory the lock created for a run that failed before writing anything goes again.
  EXPECT_FALSE(fs::exists(dir / "runs" / "f"));
  const fs::path fresh = dir / "fresh";
  EXPECT_HAS(error_of([&] { train(forecast(data, fresh, {"optim.decay_params=none"}), log); }),
             "optim.decay_params");
  EXPECT_FALSE(fs::exists(fresh));
}

TEST(HostileRuns, ResumeRefusesADamagedTrainingState) {
  const fs::path dir = test::temp_dir("state");
  const std::string data = write_series(dir, 200);
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(data, run, {"train.save=last"}), log);
  const auto model_time = fs::last_write_time(run / "model.safetensors");
  const std::string file = (run / "training_state.safetensors").string();
  auto refused = [&](const Edit& edit, const std::string& what) {
    const std::string e = resume_error(run, edit, {"train.epochs=3"});
    EXPECT_HAS(e, file + ": ");
    EXPECT_HAS(e, what);
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  };
  refused(
      [](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
        ts.push_back({"foo.bar", DType::f32, {1}, std::vector<std::byte>(4)});
      },
      "tensor 'foo.bar' is none of this run's state");
  refused(set_order([](auto& o) { o[3] = 1000000000000; }),
          "tensor 'order': entry 3 is 1000000000000, not a window of the training split");
  refused(set_order([](auto& o) { o[0] = -1000; }),
          "tensor 'order': entry 0 is -1000, not a window");
  refused(set_order([](auto& o) { o[5] = o[4]; }), "tensor 'order': entry 5 repeats window");
  refused(set_order([](auto& o) { o.pop_back(); }), "tensor 'order' holds");
  refused(set_order([](auto& o) { o.push_back(o[0]); }), "tensor 'order' holds");
  refused(
      [](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
        OwnedTensor& m = tensor(ts, "optim.0.lstm.weight_hh_l0");
        m.shape = {m.shape[0] * m.shape[1]};
      },
      "tensor 'optim.0.lstm.weight_hh_l0' is F32 (256), this run has F32 (32, 8)");
  refused(
      [](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
        tensor(ts, "param.head.weight").as<float>()[2] = std::numeric_limits<float>::quiet_NaN();
      },
      "tensor 'param.head.weight' holds a non-finite value (nan at index 2)");
  refused(
      [](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
        tensor(ts, "optim.0.head.bias").as<float>()[0] = INFINITY;
      },
      "tensor 'optim.0.head.bias' holds a non-finite value (inf");
  refused(
      [](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
        tensor(ts, "optim.1.head.weight").as<float>()[0] = -1;
      },
      "tensor 'optim.1.head.weight' holds a negative value");
  refused(
      [](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
        OwnedTensor& r = tensor(ts, "rng");
        std::fill(r.bytes.begin(), r.bytes.end(), std::byte{0});
      },
      "tensor 'rng' is all zeros");
  refused([](std::vector<OwnedTensor>& ts,
             std::map<std::string, std::string>&) { tensor(ts, "rng").dtype = DType::f64; },
          "tensor 'rng' is F64");
  refused(loop_field("step", -5), "'step' is -5");
  refused(loop_field("epoch", -1), "'epoch' is -1");
  refused(loop_field("step", 1.5), "'step' is 1.5, not an integer");
  refused(loop_field("optimizer_steps", 1000000), "'optimizer_steps' is 1000000");
  refused(loop_field("param_steps", std::vector<int64_t>{1, 2}), "'param_steps' counts 2");
  refused(loop_field("since_best", 7), "'since_best' is 7");
  refused(loop_field("lr_factor", "nan"), "'lr_factor' is nan");
  refused(loop_field("lr_factor", "2x"), "'lr_factor' is '2x', not a number");
  refused(
      [](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>& meta) {
        loop_field("in_epoch", true)(ts, meta);
        loop_field("batch", 1000000)(ts, meta);
        loop_field("loss_sum", "1")(ts, meta);
        loop_field("seen", "16")(ts, meta);
      },
      "'batch' is 1000000; an epoch now has");
  refused(
      [](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>& meta) {
        loop_field("in_epoch", true)(ts, meta);
        loop_field("batch", 2)(ts, meta);
        loop_field("loss_sum", "1")(ts, meta);
        loop_field("seen", "16")(ts, meta);
        loop_field("skipped_steps", 3)(ts, meta);
      },
      "'skipped_steps' is 3; expected 0 to 'batch'");
  EXPECT_EQ(fs::last_write_time(run / "model.safetensors"), model_time);
  // A damaged line of metrics.jsonl is refused before the run's files are touched.
  const fs::path metrics = run / "metrics.jsonl";
  const std::string kept = io::read_file(metrics.string());
  std::ofstream(metrics, std::ios::app) << "{\"epoch\": \"3\"}\n";
  const std::string damaged = io::read_file(metrics.string());
  EXPECT_HAS(resume_error(run, [](auto&, auto&) {}, {"train.epochs=3"}),
             metrics.string() + ":" +
                 std::to_string(std::count(kept.begin(), kept.end(), '\n') + 1) +
                 ": \"epoch\" is \"3\"");
  EXPECT_EQ(io::read_file(metrics.string()), damaged);
  std::ofstream(metrics) << kept;
  // Stateful streams keep their order: a permutation of it is refused too.
  const fs::path stateful = dir / "stateful";
  train(forecast(data, stateful, {"train.stateful=true", "train.batch_size=4"}), log);
  const std::string e =
      resume_error(stateful, set_order([](auto& o) { std::swap(o[0], o[1]); }), {"train.epochs=3"});
  EXPECT_HAS(e, "training_state.safetensors: tensor 'order': entry 0 is ");
  EXPECT_HAS(e, ", the stateful streams' chunk there starts at ");
  // The untouched state resumes.
  const TrainSummary s = train(
      Config::load((run / "config.resolved.yaml").string(), {"train.epochs=3"}), log, run.string());
  EXPECT_EQ(s.epochs, 3);
}

// An order entry far outside the data crashed every task's loader; each is refused now.
TEST(HostileRuns, ResumeRefusesAnOrderOutsideTheDataInEveryTask) {
  const fs::path dir = test::temp_dir("order_tasks");
  const fs::path text = dir / "text.txt";
  {
    std::ofstream f(text);
    for (int i = 0; i < 200; ++i) f << "abcab cabd\n";
  }
  const fs::path pairs = dir / "pairs.csv";
  {
    std::ofstream f(pairs);
    f << "text,label\n";
    for (int i = 0; i < 120; ++i) f << (i % 2 ? "abab ab" : "cdcd cd") << "," << (i % 2) << "\n";
  }
  const std::string data = write_series(dir, 200);
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"charlm", "data: {path: " + text.string() +
                     ", task: charlm, seq_len: 16}\nmodel: {hidden: 8, embedding: 4}\n"},
      {"text_classify", "data: {path: " + pairs.string() +
                            ", task: text_classify, text_columns: [text], class_column: label, "
                            "seq_len: 8}\nmodel: {family: transformer, embedding: 8, layers: 1, "
                            "heads: 2}\n"},
      {"forecast", "data: {path: " + data +
                       ", date_column: when, features: [signal], targets: [signal], lookback: 8}\n"
                       "model: {hidden: 8}\n"},
  };
  for (const auto& [name, yaml] : runs) {
    const fs::path run = dir / name;
    std::ostringstream log;
    train(Config::parse(yaml + "train: {epochs: 1, batch_size: 8, run_dir: " + run.string() + "}\n",
                        name + ".yaml"),
          log);
    for (const int64_t bad : {int64_t{1000000000000}, int64_t{-1000}}) {
      const std::string e =
          resume_error(run, set_order([bad](auto& o) { o[0] = bad; }), {"train.epochs=2"});
      EXPECT_HAS(e, "training_state.safetensors: tensor 'order': entry 0 is " +
                        std::to_string(bad) + ", not a window of the training split");
    }
  }
}

TEST(HostileRuns, NonFiniteWeightsAreRefusedOnLoad) {
  const fs::path dir = test::temp_dir("nan_weights");
  const std::string data = write_series(dir, 200);
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(data, run, {"train.epochs=1"}), log);
  const fs::path model = run / "model.safetensors";
  const fs::path clean = dir / "clean.safetensors";
  fs::copy_file(model, clean);
  const std::string expected = model.string() + ": tensor 'lstm.weight_ih_l0' holds a non-finite";
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -INFINITY}) {
    fs::copy_file(clean, model, fs::copy_options::overwrite_existing);
    rewrite(model, [&](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
      tensor(ts, "lstm.weight_ih_l0").as<float>()[1] = bad;
    });
    EXPECT_HAS(error_of([&] { evaluate(run.string(), "test"); }), expected);
    EXPECT_HAS(error_of([&] {
                 std::ostringstream quiet;
                 predict(run.string(), {data, (dir / "p.csv").string()}, quiet);
               }),
               expected);
    // model.init_from: the same refusal before the new run touches anything.
    EXPECT_HAS(error_of([&] {
                 train(forecast(data, dir / "tuned", {"model.init_from=" + run.string()}), log);
               }),
               expected);
    EXPECT_FALSE(fs::exists(dir / "tuned"));
  }
  // A finite f64 beyond f32's range would load as infinity.
  fs::copy_file(clean, model, fs::copy_options::overwrite_existing);
  rewrite(model, [&](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
    OwnedTensor& w = tensor(ts, "head.bias");
    w.dtype = DType::f64;
    w.bytes.assign(sizeof(double), std::byte{0});
    *w.as<double>() = 1e300;
  });
  EXPECT_HAS(error_of([&] { evaluate(run.string(), "test"); }),
             "tensor 'head.bias' holds a non-finite value (inf at index 0)");

  // generate on a character model with a NaN embedding.
  const fs::path text = dir / "text.txt";
  std::ofstream(text) << std::string(600, 'a') + "abcabc\n";
  const fs::path lm = dir / "lm";
  train_charlm(text, lm, log);
  rewrite(lm / "model.safetensors",
          [&](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
            tensor(ts, "embedding.weight").as<float>()[0] = std::numeric_limits<float>::quiet_NaN();
          });
  EXPECT_HAS(error_of([&] { generate(lm.string(), "ab", 5, 1.0, 0, 0); }),
             "tensor 'embedding.weight' holds a non-finite value (nan at index 0)");
}

TEST(HostileRuns, MergeRefusesNonFiniteAdaptersAndZeroNormDoraRows) {
  const fs::path dir = test::temp_dir("merge");
  const std::string data = write_series(dir, 200);
  std::ostringstream log;
  train(forecast(data, dir / "base", {"train.epochs=1"}), log);
  for (const char* kind : {"lora", "dora"}) {
    const fs::path run = dir / kind;
    train(forecast(data, run,
                   {"adapter.kind=" + std::string(kind), "adapter.rank=2",
                    "model.init_from=" + (dir / "base").string(), "train.epochs=1"}),
          log);
    const fs::path model = run / "model.safetensors";
    const fs::path clean = dir / (std::string(kind) + ".safetensors");
    fs::copy_file(model, clean);
    const std::string b = "base_model.model.lstm.weight_hh_l0.lora_B.weight";
    rewrite(model, [&](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
      tensor(ts, b).as<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    });
    const fs::path out = dir / (std::string(kind) + "_merged.safetensors");
    EXPECT_HAS(error_of([&] { merge_adapters(run.string(), out.string()); }),
               "tensor '" + b + "' holds a non-finite value");
    EXPECT_FALSE(fs::exists(out));
    fs::copy_file(clean, model, fs::copy_options::overwrite_existing);
    if (std::string(kind) != "dora") continue;
    // Row 3 of W0 and of B zero: V = W0 + s B A has a zero row, and m V / ||V|| no value.
    rewrite(model, [&](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
      OwnedTensor& w0 = tensor(ts, "lstm.weight_hh_l0");
      OwnedTensor& lb = tensor(ts, b);
      std::fill_n(w0.as<float>() + 3 * w0.shape[1], w0.shape[1], 0.0f);
      std::fill_n(lb.as<float>() + 3 * lb.shape[1], lb.shape[1], 0.0f);
    });
    const std::string e = error_of([&] { merge_adapters(run.string(), out.string()); });
    EXPECT_HAS(e,
               "DoRA adapter base_model.model.lstm.weight_hh_l0: row 3 of W0 + (alpha/r) B A "
               "has norm 0");
    EXPECT_FALSE(fs::exists(out));
    fs::copy_file(clean, model, fs::copy_options::overwrite_existing);
    EXPECT_EQ(merge_adapters(run.string(), out.string()), 2);
  }
  // A base with a row of zeros (a pruned model's) is refused for DoRA at the start, naming the
  // row: its magnitude would be 0 and every loss NaN. LoRA trains on it.
  const fs::path pruned = dir / "pruned.safetensors";
  fs::copy_file(dir / "base" / "model.safetensors", pruned);
  rewrite(pruned, [&](std::vector<OwnedTensor>& ts, std::map<std::string, std::string>&) {
    OwnedTensor& w0 = tensor(ts, "lstm.weight_hh_l0");
    std::fill_n(w0.as<float>() + 3 * w0.shape[1], w0.shape[1], 0.0f);
  });
  const auto on_pruned = [&](const std::string& kind) {
    return forecast(data, dir / ("pruned_" + kind),
                    {"adapter.kind=" + kind, "adapter.rank=2", "model.init_from=" + pruned.string(),
                     "train.epochs=1"});
  };
  EXPECT_HAS(error_of([&] { train(on_pruned("dora"), log); }),
             "adapter.kind dora on lstm.weight_hh_l0: its row 3 is all zeros (norm 0)");
  EXPECT_TRUE(std::isfinite(train(on_pruned("lora"), log).best));
}

}  // namespace
}  // namespace seqforge::hostile_runs_test

namespace seqforge::hostile_runs_test {
namespace {

// A resume reads its run's config before it can lock the directory: a run that replaces the
// directory's run in that moment is found once the lock is held, and nothing is resumed.
TEST(HostileRuns, ResumeRefusesARunReplacedWhileItStarted) {
  const fs::path dir = test::temp_dir("resume_replaced");
  const std::string data = write_series(dir, 200);
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(data, run, {"optim.lr=0.003"}), log);
  const Config read = Config::load((run / "config.resolved.yaml").string(), {"train.epochs=3"});
  train(forecast(data, run, {"optim.lr=0.02"}), log, "", {}, /*overwrite=*/true);
  const std::string metrics = io::read_file((run / "metrics.jsonl").string());
  EXPECT_HAS(error_of([&] { train(read, log, run.string()); }),
             "run: another process wrote the run in it while this resume started (optim.lr was "
             "0.003, is now 0.02); nothing was resumed");
  EXPECT_EQ(io::read_file((run / "metrics.jsonl").string()), metrics);
  // Read again, the run it holds now resumes.
  train(Config::load((run / "config.resolved.yaml").string(), {"train.epochs=3"}), log,
        run.string());
}

// A resumed run continues the model it trained: an override that changes the model's function
// or its parameters' layout is refused, naming the key and both values; train.epochs may grow.
TEST(HostileRuns, ResumeRefusesSettingsThatChangeTheModel) {
  const fs::path dir = test::temp_dir("resume_keys");
  const std::string data = write_series(dir, 200);
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(data, run, {"train.save=last"}), log);
  const std::string resolved = (run / "config.resolved.yaml").string();
  for (const auto& [override_, words] : std::vector<std::pair<std::string, std::string>>{
           {"model.hidden=16",
            "model.hidden cannot change when a run resumes (it trained with 8, "
            "asked for 16)"},
           {"adapter.kind=lora", "adapter.kind cannot change when a run resumes"},
           {"data.lookback=7", "data.lookback cannot change when a run resumes"},
           // What the windows hold, how the state reads, what the best score measures.
           {"data.normalize=minmax", "data.normalize cannot change when a run resumes"},
           {"data.split.val=0.2", "data.split.val cannot change when a run resumes"},
           {"train.seed=5", "train.seed cannot change when a run resumes"},
           {"optim.kind=sgd", "optim.kind cannot change when a run resumes"},
           {"train.early_stopping.monitor=val_mae",
            "train.early_stopping.monitor cannot change when a run resumes (it trained with "
            "val_loss, asked for val_mae)"}}) {
    const std::string e =
        error_of([&] { train(Config::load(resolved, {override_}), log, run.string()); });
    EXPECT_HAS(e, "override '" + override_ + "': " + words);
  }
  // The same change made in config.resolved.yaml is refused too: the state keeps its config.
  const std::string kept = io::read_file(resolved);
  std::string edited = kept;
  const size_t loss = edited.find("loss: mse");
  ASSERT_NE(loss, std::string::npos) << edited;
  edited.replace(loss, 9, "loss: mae");
  std::ofstream(resolved) << edited;
  EXPECT_HAS(error_of([&] { train(Config::load(resolved), log, run.string()); }),
             "train.loss cannot change when a run resumes (it trained with mse, asked for mae)");
  std::ofstream(resolved) << kept;
  const TrainSummary more = train(Config::load(resolved, {"train.epochs=3"}), log, run.string());
  EXPECT_EQ(more.last.count("val_loss"), 1u);
  // A cosine schedule resumed for more epochs than it began with says it follows the new length.
  const fs::path cosine = dir / "cosine";
  train(forecast(data, cosine, {"train.schedule=cosine", "train.epochs=1"}), log);
  std::ostringstream longer;
  train(Config::load((cosine / "config.resolved.yaml").string(), {"train.epochs=2"}), longer,
        cosine.string());
  EXPECT_HAS(
      longer.str(),
      "note: train.schedule cosine now spans 2 epochs (the run began with 1 epoch): the rate "
      "from here follows the new length");
  // A base given anew is refused (its run records it as its base) unless the base it began from
  // has moved; a run without one is given none.
  EXPECT_HAS(error_of([&] {
               train(Config::load((cosine / "config.resolved.yaml").string(),
                                  {"model.init_from=" + run.string(), "train.epochs=3"}),
                     log, cosine.string());
             }),
             "model.init_from cannot change when a run resumes");
  const fs::path based = dir / "based";
  train(forecast(data, based, {"model.init_from=" + run.string(), "train.epochs=1"}), log);
  const std::string based_config = (based / "config.resolved.yaml").string();
  EXPECT_HAS(
      error_of([&] {
        train(Config::load(based_config, {"model.init_from=" + cosine.string(), "train.epochs=2"}),
              log, based.string());
      }),
      "model.init_from cannot change when a run resumes (it trained with " + run.string());
  train(Config::load(based_config, {"model.init_from=" + (run / ".").string(), "train.epochs=2"}),
        log, based.string());  // the same base, written otherwise
  fs::rename(run, dir / "moved");
  train(
      Config::load(based_config, {"model.init_from=" + (dir / "moved").string(), "train.epochs=3"}),
      log, based.string());
}

// A run that stopped early, or did its epochs, trains nothing more when resumed as it was, and
// says so; a larger patience or train.epochs trains on.
TEST(HostileRuns, AResumedRunThatHadStoppedTrainsNothingMore) {
  const fs::path dir = test::temp_dir("resume_stopped");
  const std::string data = write_series(dir, 200);
  const fs::path run = dir / "run";
  std::ostringstream log;
  // At rate 0 the validation loss never improves on epoch 1's: patience 1 stops after epoch 2.
  train(forecast(
            data, run,
            {"optim.lr=0", "train.epochs=6", "train.early_stopping.patience=1", "train.save=last"}),
        log);
  const std::string resolved = (run / "config.resolved.yaml").string();
  auto lines = [&] {
    std::ifstream f(run / "metrics.jsonl");
    std::string line;
    int n = 0;
    while (std::getline(f, line)) n += line.find("\"epoch\"") != std::string::npos;
    return n;
  };
  ASSERT_EQ(lines(), 2);
  // How the run ended, as its last epoch's line says: every resume keeps it true.
  auto last_stop = [&] {
    std::ifstream f(run / "metrics.jsonl");
    std::string line, last;
    while (std::getline(f, line))
      if (line.find("\"epoch\"") != std::string::npos) last = line;
    return nlohmann::json::parse(last).value("stop", "");
  };
  EXPECT_EQ(last_stop(), "early_stopping");
  const std::string model = io::read_file((run / "model.safetensors").string());
  std::ostringstream again;
  train(Config::load(resolved), again, run.string());
  EXPECT_HAS(again.str(),
             "nothing to train: the run stopped early after epoch 2 (val_loss did not improve for "
             "1 epochs; a larger train.early_stopping.patience trains on)");
  EXPECT_EQ(lines(), 2);
  EXPECT_EQ(last_stop(), "early_stopping");
  EXPECT_EQ(io::read_file((run / "model.safetensors").string()), model);
  std::ostringstream on;
  train(Config::load(resolved, {"train.early_stopping.patience=2"}), on, run.string());
  EXPECT_EQ(lines(), 3) << on.str();
  std::ostringstream done;
  train(Config::load(resolved, {"train.early_stopping.patience=0", "train.epochs=3"}), done,
        run.string());
  EXPECT_HAS(done.str(),
             "nothing to train: the run has done 3 epochs of 3 (a larger "
             "train.epochs trains on)");
  EXPECT_EQ(lines(), 3);
  EXPECT_EQ(last_stop(), "epochs");
  // A copy resumes, after a resume that trained nothing too (it writes the copy's directory
  // into config.resolved.yaml; the state still names the original).
  const fs::path copy = run.parent_path() / "copy";
  fs::copy(run, copy, fs::copy_options::recursive);
  fs::remove(copy / ".lock");
  const std::string copied = (copy / "config.resolved.yaml").string();
  std::ostringstream idle, more;
  train(Config::load(copied, {"train.early_stopping.patience=0"}), idle, copy.string());
  EXPECT_HAS(idle.str(), "nothing to train");
  train(Config::load(copied, {"train.early_stopping.patience=0", "train.epochs=4"}), more,
        copy.string());
  EXPECT_HAS(more.str(), "epoch 4/4");
}

// train.run_dir naming a directory of other files (/, a project's own, by mistake) is refused
// before anything is written there, the lock's file included; --overwrite writes beside them;
// the run's own data file there is allowed.
TEST(HostileRuns, ARunDirectoryOfOtherFilesIsRefused) {
  const fs::path dir = test::temp_dir("run_dir_of_others");
  const std::string data = write_series(dir, 200);
  std::ofstream(dir / "notes.txt") << "mine\n";
  std::ostringstream log;
  EXPECT_EQ(test::error_of([&] { train(forecast(data, dir, {"train.epochs=1"}), log); }),
            dir.string() +
                ": holds files of its own ('notes.txt'), not a run's: give train.run_dir a new or "
                "empty directory, or pass --overwrite to write the run's files beside them");
  EXPECT_FALSE(fs::exists(dir / ".lock"));
  EXPECT_FALSE(fs::exists(dir / "config.resolved.yaml"));
  train(forecast(data, dir, {"train.epochs=1"}), log, "", {}, /*overwrite=*/true);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  // The run's own data file in it is no stranger (the Python package keeps a frame's there).
  const fs::path own = test::temp_dir("run_dir_with_its_data");
  train(forecast(write_series(own, 200), own, {"train.epochs=1"}), log);
  EXPECT_TRUE(fs::exists(own / "model.safetensors"));
}

// An adapter scale so large that the gradient's squares overflow float32 stops the run at its
// first step, naming adapter.alpha: clipping had scaled the gradients to zero, and nothing trained.
TEST(HostileRuns, AGradientPastFloat32IsAnError) {
  const fs::path dir = test::temp_dir("huge_alpha");
  const std::string data = write_series(dir, 200);
  std::ostringstream log;
  train(forecast(data, dir / "base", {"train.epochs=1"}), log);
  const std::string e = test::error_of([&] {
    train(
        forecast(data, dir / "adapted",
                 {"train.epochs=1", "train.clip_grad_norm=1", "adapter.kind=lora", "adapter.rank=2",
                  "adapter.alpha=1e30", "model.init_from=" + (dir / "base").string()}),
        log);
  });
  EXPECT_HAS(e, "epoch 1, step 1 (batch 1 of ");
  EXPECT_HAS(e, ", past what float32 holds squared; lower adapter.alpha");
  EXPECT_FALSE(fs::exists(dir / "adapted" / "model.safetensors"));
}

// A resumed run whose metrics.jsonl was lost (or cut short) says so, and goes on.
TEST(HostileRuns, AResumeWithoutTheEpochsLinesSaysSo) {
  const fs::path dir = test::temp_dir("resume_lost_metrics");
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(write_series(dir, 200), run, {"train.epochs=2"}), log);
  fs::remove(run / "metrics.jsonl");
  std::ostringstream resumed;
  train(Config::load((run / "config.resolved.yaml").string(), {"train.epochs=3"}), resumed,
        run.string());
  EXPECT_HAS(resumed.str(), "note: " + (run / "metrics.jsonl").string() +
                                " holds lines for 0 of the 2 epochs done (the others were lost or "
                                "cut short): the report shows those it has");
  const std::string metrics = io::read_file((run / "metrics.jsonl").string());
  EXPECT_NE(metrics.find("\"epoch\":3"), std::string::npos) << metrics;
}

// A finished run's val_predictions.csv is of its saved model: the first checkpoint of a resumed
// run replaces that model, and the predictions go with it until the run finishes again.
TEST(HostileRuns, AResumedRunDropsThePredictionsOfTheModelItReplaces) {
  const fs::path dir = test::temp_dir("resume_predictions");
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(write_series(dir, 200), run, {"train.epochs=1", "train.save=every_n"}), log);
  ASSERT_TRUE(fs::exists(run / "val_predictions.csv"));
  std::vector<bool> there;  // at the first step of epochs 2 and 3
  TrainHooks hooks;
  hooks.on_step = [&](int64_t, int64_t done, int64_t) {
    if (done == 1) there.push_back(fs::exists(run / "val_predictions.csv"));
  };
  train(Config::load((run / "config.resolved.yaml").string(), {"train.epochs=3"}), log,
        run.string(), hooks);
  EXPECT_EQ(there, (std::vector<bool>{true, false}));
  EXPECT_TRUE(fs::exists(run / "val_predictions.csv"));  // the finished run's, again
  // Without its training state (a kill before the first was written), the way out is named.
  fs::remove(run / "training_state.safetensors");
  EXPECT_HAS(error_of([&] {
               train(Config::load((run / "config.resolved.yaml").string(), {"train.epochs=4"}), log,
                     run.string());
             }),
             "missing: this run has nothing to resume from (it stopped before its first training "
             "state was saved): train it anew with --overwrite");
}

// A new run's default directory (runs/<config name>) passes over a tune study's of that name.
TEST(HostileRuns, ANewRunLeavesAStudysDirectoryAlone) {
  const fs::path dir = test::temp_dir("study_named_alike");
  const std::string data = write_series(dir, 200);
  const fs::path before = fs::current_path();
  fs::current_path(dir);
  fs::create_directories("runs/job");
  { std::ofstream("runs/job/study.json") << "{}"; }
  const Config c = Config::parse("data: {path: " + data +
                                     ", date_column: when, features: [signal], targets: [signal], "
                                     "lookback: 8}\ntrain: {epochs: 1}\n",
                                 "job.yaml");
  std::ostringstream log;
  const TrainSummary s = train(c, log);
  fs::current_path(before);
  EXPECT_EQ(fs::path(s.run_dir).filename(), "job-2");
  EXPECT_FALSE(fs::exists(dir / "runs" / "job" / "metrics.jsonl"));
}

// train.precision auto is resolved once, at the run's start, and recorded: a resume (on another
// machine, whose bf16 GEMMs may or may not pay off) goes on in the precision the run began in.
TEST(HostileRuns, TheRunRecordsThePrecisionAutoChose) {
  const fs::path dir = test::temp_dir("precision_auto");
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(write_series(dir, 200), run, {"train.epochs=1"}), log);
  const Config saved = Config::load((run / "config.resolved.yaml").string());
  const std::string chosen = saved.str("train.precision");
  EXPECT_TRUE(chosen == "fp32" || chosen == "bf16") << chosen;
  EXPECT_HAS(log.str(), ", " + chosen + " GEMMs (");
  std::ostringstream resumed;
  train(Config::load((run / "config.resolved.yaml").string(), {"train.epochs=2"}), resumed,
        run.string());
  EXPECT_HAS(resumed.str(), ", " + chosen + " GEMMs (");
  EXPECT_EQ(Config::load((run / "config.resolved.yaml").string()).str("train.precision"), chosen);
}

// So is the precision a bf16 run falls back to where the CPU (or SEQFORGE_MAX_ISA) gives no bf16
// GEMMs: eval on a machine with them computes in fp32, as the logged losses were.
TEST(HostileRuns, TheRunRecordsThePrecisionItComputedIn) {
  const fs::path dir = test::temp_dir("precision_bf16");
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(write_series(dir, 200), run, {"train.epochs=1", "train.precision=bf16"}), log);
  const std::string used = test::cpu_runs_bf16() ? "bf16" : "fp32";
  EXPECT_HAS(log.str(), ", " + used + " GEMMs (");
  if (used == "fp32") {
    EXPECT_HAS(log.str(), "note: precision bf16: " + no_bf16_reason());
  }
  EXPECT_EQ(Config::load((run / "config.resolved.yaml").string()).str("train.precision"), used);
}

// A resumed run goes on with the data it began with: the same file rewritten with other values
// in as many rows (its windows, order and split unchanged) is refused, naming the file; the file
// as it was resumes.
TEST(HostileRuns, ResumeRefusesDataThatChanged) {
  const fs::path dir = test::temp_dir("resume_data");
  const std::string data = write_series(dir, 200);
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(data, run), log);
  const std::string resolved = (run / "config.resolved.yaml").string();
  const fs::path kept = dir / "kept.csv";
  fs::copy_file(data, kept);
  {
    std::ifstream in(kept);
    std::ofstream out(data);
    std::string line;
    for (int n = 0; std::getline(in, line); ++n)
      out << (n == 100 ? line.substr(0, line.rfind(',')) + ",0.5" : line) << "\n";
  }
  const std::string e =
      error_of([&] { train(Config::load(resolved, {"train.epochs=3"}), log, run.string()); });
  EXPECT_HAS(e, data + ": changed since the run saved its state");
  // Another file of other values is named as such.
  const fs::path changed = dir / "changed.csv";
  fs::copy_file(data, changed);
  const std::string other = error_of([&] {
    train(Config::load(resolved, {"train.epochs=3", "data.path=" + changed.string()}), log,
          run.string());
  });
  EXPECT_HAS(other, "data.path is " + changed.string() + ", the run began on " + data);
  fs::copy_file(kept, data, fs::copy_options::overwrite_existing);
  const TrainSummary more = train(Config::load(resolved, {"train.epochs=3"}), log, run.string());
  EXPECT_EQ(more.last.count("val_loss"), 1u);
}

}  // namespace
}  // namespace seqforge::hostile_runs_test

namespace seqforge::hostile_runs_test {
namespace {

namespace fs = std::filesystem;
using test::error_of;

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// The same rows with the columns in another order and one more column.
void write_reordered(const std::string& from, const fs::path& to) {
  std::ifstream in(from);
  std::ofstream out(to);
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream s(line);
    for (std::string cell; std::getline(s, cell, ',');) cells.push_back(cell);
    out << (header ? "unused" : "7") << "," << cells[2] << "," << cells[0] << "," << cells[1]
        << "\n";
    header = false;
  }
}

// generate, predict, eval --data and merge read the run directory alone: the training data may
// be gone. A file of the same columns in another order (features not listed in the config) feeds
// the model the columns it was trained on.
// merge builds the plain model's head as the run's: several steps ahead, quantiles, a masked
// autoencoder's reconstructions (merge sized it by the targets alone and refused those runs).
TEST(HostileRuns, MergeKeepsEveryOutputOfTheHead) {
  const fs::path dir = test::temp_dir("merge_heads");
  const std::string data = write_series(dir, 200);
  std::ostringstream log;
  const std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {"steps", {"data.horizon=3", "data.horizon_mode=direct"}},
      {"quantiles", {"train.loss=quantile", "train.quantiles=[0.1, 0.5, 0.9]"}},
      {"mae", {"data.task=mae"}}};
  for (const auto& [name, settings] : runs) {
    SCOPED_TRACE(name);
    std::vector<std::string> o = settings;
    o.insert(o.end(), {"adapter.kind=lora", "adapter.rank=2", "train.epochs=1"});
    const fs::path run = dir / name;
    train(forecast(data, run, o), log);
    const std::string merged = (dir / (name + ".safetensors")).string();
    EXPECT_EQ(merge_adapters(run.string(), merged), 2);
    const double adapted = evaluate(run.string(), "test").at("test_loss");
    EXPECT_NEAR(evaluate(merged, "test").at("test_loss"), adapted, 1e-5 * std::fabs(adapted));
  }
}

TEST(HostileRuns, ARunDirectoryServesWithoutItsTrainingData) {
  const fs::path dir = test::temp_dir("self_contained");
  const std::string data = write_series(dir, 200);
  std::ostringstream log;
  const fs::path run = dir / "lora";
  train(forecast(data, run,
                 {"data.features=[]", "adapter.kind=lora", "adapter.rank=2", "train.epochs=1"}),
        log);
  const fs::path copy = dir / "copy.csv", reordered = dir / "reordered.csv";
  fs::copy_file(data, copy);
  write_reordered(data, reordered);
  const auto on_copy = evaluate(run.string(), "", copy.string());
  fs::remove(data);
  EXPECT_EQ(merge_adapters(run.string(), (dir / "merged.safetensors").string()), 2);
  const auto on_reordered = evaluate(run.string(), "", reordered.string());
  ASSERT_TRUE(on_copy.count("data_mse"));
  EXPECT_EQ(on_copy.at("data_mse"), on_reordered.at("data_mse"));
  std::ostringstream quiet;
  EXPECT_GT(predict(run.string(), {reordered.string(), (dir / "p.csv").string()}, quiet), 0);
  EXPECT_HAS(error_of([&] { evaluate(run.string(), "test"); }), data + ": cannot open");

  // A transformer with block_size 0 (data.seq_len) and a text classifier with adapters.
  const fs::path text = dir / "text.txt";
  std::string body;
  for (int i = 0; i < 40; ++i) body += "to be or not to be\nthat is the question\n";
  std::ofstream(text) << body;
  const fs::path gpt = dir / "gpt";
  train(Config::parse("data: {path: " + text.string() +
                          ", task: charlm, seq_len: 16}\nmodel: {family: transformer, "
                          "embedding: 16, layers: 1, heads: 2}\ntrain: {epochs: 1, batch_size: "
                          "8, run_dir: " +
                          gpt.string() + "}\n",
                      "gpt.yaml"),
        log);
  const fs::path pairs = dir / "pairs.csv";
  {
    std::ofstream f(pairs);
    f << "a,b,label\n";
    const char* words[] = {"that", "is", "question"};
    for (int i = 0; i < 60; ++i)
      f << "to be,or not " << words[i % 3] << "," << (i % 2 ? "x" : "y") << "\n";
  }
  const fs::path tc = dir / "tc";
  train(Config::parse("data: {path: " + pairs.string() +
                          ", task: text_classify, text_columns: [a, b], class_column: label, "
                          "seq_len: 16}\nmodel: {family: transformer, embedding: 16, layers: 1, "
                          "heads: 2, init_from: " +
                          gpt.string() +
                          "}\nadapter: {kind: dora, rank: 2}\ntrain: {epochs: 1, batch_size: 8, "
                          "run_dir: " +
                          tc.string() + "}\n",
                      "tc.yaml"),
        log);
  fs::remove(text);
  fs::remove(pairs);
  EXPECT_EQ(generate(gpt.string(), "to", 10, 1.0, 0, 0).size(), 12u);
  EXPECT_EQ(merge_adapters(tc.string(), (dir / "tc_merged.safetensors").string()), 4);
}

// The normalizers, column names and label threshold read back from a checkpoint's metadata are
// checked: a damaged one is refused with one line naming the file and the key.
TEST(HostileRuns, DamagedNormalizersInACheckpointAreRefused) {
  const fs::path dir = test::temp_dir("normalizers");
  const std::string data = write_series(dir, 200);
  std::ostringstream log;
  const fs::path run = dir / "run";
  train(forecast(data, run, {"train.epochs=1"}), log);
  const fs::path model = run / "model.safetensors", clean = dir / "clean.safetensors";
  fs::copy_file(model, clean);
  auto error_with = [&](const std::string& key, const std::string& value) {
    fs::copy_file(clean, model, fs::copy_options::overwrite_existing);
    rewrite(model, [&](std::vector<OwnedTensor>&, std::map<std::string, std::string>& meta) {
      meta[key] = value;
    });
    return error_of([&] { evaluate(run.string(), "test"); });
  };
  const std::string where = model.string() + ": seqforge.feature_norm: ";
  EXPECT_HAS(error_with("seqforge.feature_norm", "[1, 2"), where + "not a normalizer");
  EXPECT_HAS(
      error_with("seqforge.feature_norm", R"({"kind":"zscore","shift":[0,0],"scale":[1,0]})"),
      where + "column 1: shift 0 and scale 0");
  EXPECT_HAS(error_with("seqforge.feature_norm", R"({"kind":"zscore","shift":[0],"scale":[1,2]})"),
             where + "1 shifts and 2 scales");
  EXPECT_HAS(error_with("seqforge.feature_norm", R"({"kind":"cube","shift":[],"scale":[]})"),
             where + "unknown kind 'cube'");
  // One normalised column where the model reads two.
  EXPECT_HAS(error_with("seqforge.feature_norm", R"({"kind":"zscore","shift":[0],"scale":[1]})"),
             "seqforge.features and seqforge.targets name 2 and 1 columns where the normalizers "
             "hold 1 and 1");
  EXPECT_HAS(error_with("seqforge.features", R"(["signal"])"),
             "seqforge.features and seqforge.targets name 1 and 1 columns");
  // Scalers for three steps ahead where the stored config forecasts one.
  EXPECT_HAS(error_with("seqforge.target_norm",
                        R"({"kind":"zscore","shift":[0,0,0],"scale":[1,1,1],"steps":3})"),
             model.string() +
                 ": seqforge.target_norm holds scalers for 3 steps ahead where its stored config "
                 "forecasts 1 (data.horizon, data.horizon_mode): the checkpoint is inconsistent");
  EXPECT_HAS(error_with("seqforge.label_threshold", "nan"),
             "seqforge.label_threshold is not a volatility");
  EXPECT_HAS(error_with("seqforge.step", "1 hour\x1b[2J"),
             model.string() + ": seqforge.step is not a step such as '1 hour': '1 hour\\x1b[2J'");
  EXPECT_HAS(error_with("seqforge.step", ""), "seqforge.step is not a step");
  for (const char* key : {"seqforge.static", "seqforge.categorical"}) {
    EXPECT_HAS(error_with(key, R"([["mode", ["run", "idle"]]])"),
               model.string() + ": " + key +
                   " metadata: the categories of 'mode' are not sorted and distinct");
    EXPECT_HAS(error_with(key, R"([["mode", ["idle", "idle"]]])"), "not sorted and distinct");
    EXPECT_HAS(error_with(key, R"([["mode"]])"), "metadata is not what seqforge wrote");
  }
  EXPECT_HAS(error_with("seqforge.static", R"([["mode", []]])"), "not sorted and distinct");
  fs::copy_file(clean, model, fs::copy_options::overwrite_existing);
  EXPECT_TRUE(evaluate(run.string(), "test").count("test_mse"));
}

}  // namespace
}  // namespace seqforge::hostile_runs_test

namespace seqforge::hostile_runs_test {
namespace {

namespace fs = std::filesystem;
using test::error_of;

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

Config text_classifier(const fs::path& data, const fs::path& run,
                       const std::vector<std::string>& overrides = {}) {
  return Config::parse("data: {path: " + data.string() +
                           ", task: text_classify, text_columns: [text], class_column: label, "
                           "seq_len: 16}\nmodel: {family: transformer, embedding: 16, layers: 1, "
                           "heads: 2}\ntrain: {epochs: 1, batch_size: 8, run_dir: " +
                           run.string() + "}\n",
                       "tc.yaml", overrides);
}

// Class names and column names go into a checkpoint's JSON metadata: invalid UTF-8 is refused
// before training, naming the file and line, and no run directory is left behind.
TEST(HostileRuns, ClassNamesThatAreNotUtf8AreRefusedBeforeTraining) {
  const fs::path dir = test::temp_dir("class_names");
  std::ostringstream log;
  const fs::path texts = dir / "texts.csv";
  {
    std::ofstream f(texts);
    f << "text,label\n";
    for (int i = 0; i < 40; ++i)
      f << "some text " << i % 5 << "," << (i == 30 ? "b\xff" : "a") << "\n";
  }
  const fs::path run = dir / "run";
  EXPECT_HAS(error_of([&] { train(text_classifier(texts, run), log); }),
             texts.string() + ":32: column 'label': byte 1: not UTF-8 text");
  EXPECT_FALSE(fs::exists(run));

  const fs::path series = dir / "series.csv";
  {
    std::ofstream f(series);
    f << "x,y\xe9,kind\n";
    for (int i = 0; i < 80; ++i)
      f << std::sin(i * 0.3) << "," << i % 7 << ","
        << (i == 50 ? "c\xc0"
            : i % 2 ? "p"
                    : "q")
        << "\n";
  }
  auto classify = [&](const std::string& features) {
    return Config::parse(
        "data: {path: " + series.string() +
            ", task: classify, class_column: kind, lookback: 4, features: " + features +
            "}\nmodel: {hidden: 8}\ntrain: {epochs: 1, run_dir: " + run.string() + "}\n",
        "c.yaml");
  };
  EXPECT_HAS(error_of([&] { train(classify("[x]"), log); }),
             series.string() + ":52: column 'kind': byte 1: a UTF-8 character cut short");
  EXPECT_HAS(error_of([&] { train(classify("[]"), log); }),
             series.string() + ": column name 'y\\xe9': byte 1: a UTF-8 character cut short");
  EXPECT_FALSE(fs::exists(run));
}

// generate without --prompt starts after a newline; on a text without one, from a character of
// the vocabulary drawn with the seed (the first of the length asked for), not an error about a
// prompt.
TEST(HostileRuns, GenerateWithoutAPromptOnATextWithoutNewlines) {
  const fs::path dir = test::temp_dir("no_newline");
  std::ostringstream log;
  const fs::path text = dir / "text.txt";
  std::string body;
  for (int i = 0; i < 200; ++i) body += "abc cab ";
  std::ofstream(text) << body;
  const fs::path lm = dir / "lm";
  train_charlm(text, lm, log);
  const std::string sample = generate(lm.string(), "", 12, 1.0, 0, 5);
  EXPECT_EQ(sample.size(), 12u);
  EXPECT_EQ(sample.find_first_not_of("abc "), std::string::npos) << sample;
  EXPECT_EQ(generate(lm.string(), "", 12, 1.0, 0, 5), sample);
}

// A text with a NUL byte trains (a control character is a character, said in a note), and its
// run loads again: evaluated, sampled from.
TEST(HostileRuns, ARunOnATextWithANulLoadsAgain) {
  const fs::path dir = test::temp_dir("nul_text");
  std::ostringstream log;
  const fs::path text = dir / "text.txt";
  std::string body;
  for (int i = 0; i < 200; ++i)
    body += i == 50 ? std::string("ab\0c\n", 5) : std::string("abc cab\n");
  std::ofstream(text, std::ios::binary) << body;
  const fs::path lm = dir / "lm";
  train_charlm(text, lm, log);
  EXPECT_NE(log.str().find("1 control characters (the first U+0000 at line 51)"), std::string::npos)
      << log.str();
  EXPECT_GT(evaluate(lm.string(), "test").at("samples"), 0);
  EXPECT_EQ(generate(lm.string(), "ab", 12, 1.0, 0, 5).size(), 14u);
}

// eval --data on a text classifier leaves out rows of an unseen or empty class with a note, as a
// recurrent classifier does.
TEST(HostileRuns, TextClassifierEvalLeavesOutUnseenAndEmptyClasses) {
  const fs::path dir = test::temp_dir("unseen_classes");
  std::ostringstream log;
  const fs::path texts = dir / "texts.csv", other = dir / "other.csv";
  std::ofstream f(texts), g(other);
  f << "text,label\n";
  g << "text,label\n";
  for (int i = 0; i < 40; ++i) {
    f << "some text " << i % 5 << "," << (i % 2 ? "a" : "b") << "\n";
    g << "some text " << i % 5 << "," << (i == 3 ? "new" : i == 4 ? "" : i % 2 ? "a" : "b") << "\n";
  }
  f.close();
  g.close();
  const fs::path run = dir / "run";
  train(text_classifier(texts, run), log);
  const auto m = evaluate(run.string(), "", other.string());
  EXPECT_EQ(m.at("samples"), 38);
  EXPECT_TRUE(m.count("data_accuracy"));
}

// A class that only the validation or test examples hold is named before training: no training
// example teaches it.
TEST(HostileRuns, TextClassifierNamesAClassWithoutATrainingExample) {
  const fs::path dir = test::temp_dir("late_text_class");
  const fs::path texts = dir / "texts.csv";
  std::ofstream f(texts);
  f << "text,label\n";
  for (int i = 0; i < 40; ++i)
    f << "some text " << i % 5 << "," << (i >= 36 ? "late" : "early") << "\n";
  f.close();
  std::ostringstream log;
  train(text_classifier(texts, dir / "run", {"data.split.mode=time"}), log);
  EXPECT_NE(log.str().find("note: every training example is of one class, 'early': the model "
                           "learns to answer it always, whatever its input; 1 of 2 classes "
                           "('late') in no training example, only in "
                           "validation or test: the model cannot learn them"),
            std::string::npos)
      << log.str();
}

// A run written before data.split.context (its stored configs lack the key) is evaluated and
// resumed with the strict windows it trained on, never silently on the history windows that are
// now the default; asking to change it on resume is refused.
TEST(HostileRuns, RunsOlderThanSplitContextKeepTheirWindows) {
  const fs::path dir = test::temp_dir("old_context");
  const std::string data = write_series(dir, 300);
  const fs::path run = dir / "run";
  std::ostringstream log;
  train(forecast(data, run, {"data.split.context=strict"}), log);
  const double strict_windows = evaluate(run.string(), "val").at("samples");
  auto drop_key = [](std::string yaml) {
    const size_t at = yaml.find("    context: strict\n");
    EXPECT_NE(at, std::string::npos) << yaml;
    return at == std::string::npos ? yaml : yaml.erase(at, std::strlen("    context: strict\n"));
  };
  rewrite(run / "model.safetensors", [&](std::vector<OwnedTensor>&, auto& meta) {
    meta["seqforge.config"] = drop_key(meta.at("seqforge.config"));
  });
  const fs::path resolved = run / "config.resolved.yaml";
  const std::string text = drop_key(io::read_file(resolved.string()));
  std::ofstream(resolved) << text;
  EXPECT_EQ(evaluate(run.string(), "val").at("samples"), strict_windows);
  std::ostringstream resumed;
  train(Config::load(resolved.string(), {"train.epochs=3"}), resumed, run.string());
  EXPECT_NE(resumed.str().find(" / " + std::to_string(int64_t(strict_windows)) + " validation "),
            std::string::npos)
      << resumed.str();
  EXPECT_NE(error_of([&] {
              train(
                  Config::load(resolved.string(), {"train.epochs=4", "data.split.context=history"}),
                  log, run.string());
            }).find("data.split.context cannot change when a run resumes"),
            std::string::npos);
  // A history run scores more validation windows on this data: the two differ.
  const fs::path fresh = dir / "fresh";
  train(forecast(data, fresh), log);
  EXPECT_GT(evaluate(fresh.string(), "val").at("samples"), strict_windows);
}

}  // namespace
}  // namespace seqforge::hostile_runs_test

namespace seqforge::hostile_runs_test {
namespace {

namespace fs = std::filesystem;
using test::error_of;

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// An input named as one of the files a run writes in its directory would be replaced by it: the
// run is refused and the file kept, with --overwrite too and on resume.
TEST(HostileRuns, AnInputNamedAsARunsOwnFileIsRefusedAndKept) {
  const fs::path dir = test::temp_dir("input_as_run_file");
  const fs::path data = dir / "val_predictions.csv";
  fs::rename(write_series(dir, 200), data);
  std::ostringstream log;
  for (const bool overwrite : {false, true}) {
    EXPECT_HAS(error_of([&] { train(forecast(data.string(), dir), log, "", {}, overwrite); }),
               "data.path '" + data.string() + "' is a file the run writes in its directory");
    EXPECT_TRUE(fs::exists(data));
    EXPECT_FALSE(fs::exists(dir / "config.resolved.yaml"));
  }
  // A run directory as model.init_from, training into itself.
  const fs::path run = dir / "run";
  train(forecast(write_series(dir, 200), run, {"train.epochs=1"}), log);
  EXPECT_HAS(error_of([&] {
               train(forecast(write_series(dir, 200), run, {"model.init_from=" + run.string()}),
                     log, "", {}, /*overwrite=*/true);
             }),
             "model.init_from '" + run.string() + "' is a file the run writes");
  EXPECT_TRUE(fs::exists(run / "model.safetensors"));
}

// A run whose directory was removed and made again (another run may hold the new one) stops
// before it writes there; a resumed run whose saved model is gone says so.
TEST(HostileRuns, ADirectoryReplacedUnderARunAndAMissingModelAreNamed) {
  const fs::path dir = test::temp_dir("replaced_run_dir");
  io::DirLock lock;
  long holder = 0;
  ASSERT_TRUE(lock.try_lock((dir / "run").string(), &holder));
  lock.check_still_held();
  fs::remove_all(dir / "run");
  io::DirLock other;
  ASSERT_TRUE(other.try_lock((dir / "run").string(), &holder));
  EXPECT_HAS(error_of([&] { lock.check_still_held(); }),
             "the run directory was removed or replaced while this run trained in it");
  other.check_still_held();
  // A directory it made, moved away and made again empty by someone else, is not removed when
  // the run lets go of its lock (it was not the run's).
  io::DirLock made;
  ASSERT_TRUE(made.try_lock((dir / "made").string(), &holder));
  fs::rename(dir / "made", dir / "moved");
  fs::create_directory(dir / "made");
  made.release();
  EXPECT_TRUE(fs::is_directory(dir / "made"));
  // A .lock that links elsewhere is not written through: refused, the file it names kept.
  fs::create_directories(dir / "linked");
  std::ofstream(dir / "victim.txt") << "kept";
  fs::create_symlink(dir / "victim.txt", dir / "linked" / ".lock");
  io::DirLock linked;
  EXPECT_HAS(error_of([&] { linked.try_lock((dir / "linked").string(), &holder); }),
             "linked/.lock: a symbolic link, not the run directory's lock file: remove it");
  EXPECT_EQ(io::read_file((dir / "victim.txt").string()), "kept");
  const std::string data = write_series(dir, 200);
  const fs::path run = dir / "kept";
  std::ostringstream log;
  train(forecast(data, run), log);
  // A damaged saved model is refused when the run resumes, before an epoch trains.
  const std::string model = (run / "model.safetensors").string();
  const std::string intact = io::read_file(model),
                    lines = io::read_file((run / "metrics.jsonl").string());
  std::string damaged = intact;
  damaged[damaged.size() - 2] ^= 0x10;
  std::ofstream(model, std::ios::binary | std::ios::trunc) << damaged;
  EXPECT_HAS(error_of([&] {
               train(Config::load((run / "config.resolved.yaml").string(), {"train.epochs=3"}), log,
                     run.string());
             }),
             model + ": its tensors' bytes differ from the hash written with them");
  EXPECT_EQ(io::read_file((run / "metrics.jsonl").string()), lines);
  fs::remove(run / "model.safetensors");
  const std::string e = error_of([&] {
    train(Config::load((run / "config.resolved.yaml").string(), {"train.epochs=3"}), log,
          run.string());
  });
  EXPECT_HAS(e, (run / "model.safetensors").string() + ": missing, though epoch ");
  EXPECT_HAS(e, " saved it (metrics.jsonl): the run's saved model is gone");
}

// A data file's fingerprint covers every byte: a value changed in place in a large file (same
// size) is a change. A checkpoint of an earlier version holds the sampled one, still accepted.
TEST(HostileRuns, AChangeAnywhereInALargeDataFileIsNoticed) {
  const fs::path dir = test::temp_dir("large_fingerprint");
  const std::string path = (dir / "large.csv").string();
  std::string text;
  for (int i = 0; text.size() < (size_t{9} << 20); ++i) text += std::to_string(i % 1000) + ",0.5\n";
  std::ofstream(path, std::ios::binary) << text;
  const std::string before = io::file_fingerprint(path),
                    sampled = io::sampled_file_fingerprint(path);
  EXPECT_TRUE(io::same_fingerprint(path, before, before));
  EXPECT_TRUE(io::same_fingerprint(path, sampled, before));
  // Far from every sampled block: they are 4 KB at steps of ~37 KB.
  const size_t at = text.find(",0.5\n", (size_t{5} << 20) + 20000) + 3;
  text[at] = '6';
  std::ofstream(path, std::ios::binary) << text;
  const std::string after = io::file_fingerprint(path);
  EXPECT_NE(after, before);
  EXPECT_FALSE(io::same_fingerprint(path, before, after));
  EXPECT_EQ(io::sampled_file_fingerprint(path), sampled);
}

// A metric the data gives no value is refused at start-up as the monitor, naming why, and is
// said to be left out otherwise; a training split whose windows all lack a target says so.
TEST(HostileRuns, AMonitorWithoutAValueAndWindowsWithoutTargetsAreNamed) {
  const fs::path dir = test::temp_dir("metric_without_value");
  const std::string data = write_series(dir, 200);
  std::ostringstream log;
  EXPECT_HAS(error_of([&] {
               train(forecast(data, dir / "mase",
                              {"data.season=1000", "train.early_stopping.monitor=val_mase"}),
                     log);
             }),
             "train.early_stopping.monitor is val_mase, which has no value on this data: MASE "
             "divides by the mean absolute 1000-step (data.season) change of target 'signal'");
  EXPECT_FALSE(fs::exists(dir / "mase" / "config.resolved.yaml"));
  train(forecast(data, dir / "noted", {"data.season=1000", "train.epochs=1"}), log);
  EXPECT_HAS(log.str(), "note: val_mase is left out: MASE divides");
  std::ifstream in(data);
  std::ofstream out(dir / "holes.csv");
  std::string line;
  for (int n = 0; std::getline(in, line); ++n)
    out << (n >= 1 && n <= 185
                ? line.substr(0, line.find(',')) + ",," + line.substr(line.rfind(',') + 1)
                : line)
        << "\n";
  out.close();
  const std::string e = error_of([&] {
    train(forecast((dir / "holes.csv").string(), dir / "holes", {"data.missing=mask"}), log);
  });
  EXPECT_HAS(e, (dir / "holes.csv").string() +
                    ": no training window is left: each of the training split's ");
  EXPECT_HAS(e,
             " windows lacks what it would be trained on (a target cell it forecasts is "
             "empty), and windows without it are left out");
}

}  // namespace
}  // namespace seqforge::hostile_runs_test
