// The study storage and driver on SQLite: concurrent workers, dead workers found by heartbeat or
// by pid, crashing trials, resume, timeouts, and the errors for files that are not this study's.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "seqforge/core/error.hpp"
#include "seqforge/train/trainer.hpp"
#include "seqforge/tune/study.hpp"
#include "test_util.hpp"

namespace seqforge::tune::tune_storage_test {
namespace {

namespace fs = std::filesystem;

TuneSettings settings(const std::string& name = "s", double grace = 5) {
  TuneSettings s = parse_tune_settings(
      "tune:\n  sampler: {kind: random, seed: 1}\n  pruner: {kind: median, n_startup_trials: 2}\n"
      "  heartbeat_interval: 0.05\n  grace_period: " +
          std::to_string(grace) +
          "\n  space:\n    optim.lr: {type: float, low: 0.001, high: 0.1, log: true}\n"
          "    model.hidden: {type: int, low: 4, high: 64}\n",
      name + ".yaml", "val_loss");
  return s;
}

// A learning rate and a categorical choice, sampled at random.
TuneSettings settings_with_a_choice() {
  return parse_tune_settings(
      "tune:\n  sampler: {kind: random, seed: 1}\n  space:\n"
      "    optim.lr: {type: float, low: 0.001, high: 0.1, log: true}\n"
      "    optim.kind: {type: categorical, choices: [adamw, sgd]}\n",
      "s.yaml", "val_loss");
}

// A fake training run: five epochs whose metric depends on the learning rate.
int64_t fake_training(TrialContext& ctx, int sleep_ms = 1) {
  const double lr = ctx.params().at("optim.lr");
  int64_t epochs = 0;
  for (int64_t step = 0; step < 5; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    ++epochs;
    const double v = std::abs(std::log10(lr) + 2) + 1.0 / double(step + 1);
    if (!ctx.report(step, v)) break;
  }
  return epochs;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void sql(const fs::path& db, const std::string& statement) {
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(h, statement.c_str(), nullptr, nullptr, &err), SQLITE_OK)
      << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(h);
}

TEST(TuneStorage, ConcurrentWorkersRunEveryTrialOnce) {
  const fs::path dir = test::temp_dir("concurrent");
  const std::string db = (dir / "study.db").string();
  std::atomic<int> errors{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&] {
      try {
        Study study(Storage::open(db), settings(), db);
        std::ostringstream console;
        OptimizeOptions o;
        o.n_trials = 40;
        study.optimize([](TrialContext& c) { return fake_training(c); }, o, console);
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++errors;
      }
    });
  for (auto& t : workers) t.join();
  ASSERT_EQ(errors, 0);
  auto storage = Storage::open(db, true);
  ASSERT_TRUE(storage->info("s"));
  const auto trials = storage->trials();
  ASSERT_EQ(trials.size(), 40u);
  std::set<int64_t> numbers;
  int pruned = 0;
  for (const auto& t : trials) {
    numbers.insert(t.number);
    EXPECT_TRUE(t.state == TrialState::complete || t.state == TrialState::pruned)
        << t.number << " " << state_name(t.state) << " " << t.message;
    EXPECT_EQ(t.params.size(), 2u);
    EXPECT_EQ(int64_t(t.intermediate.size()), t.epochs);
    ASSERT_TRUE(t.value);
    pruned += t.state == TrialState::pruned;
  }
  EXPECT_EQ(numbers.size(), 40u);
  EXPECT_EQ(*numbers.rbegin(), 39);
  EXPECT_GT(pruned, 0);
}

TEST(TuneStorage, OtherStudiesSchemasAndFilesAreRejected) {
  const fs::path dir = test::temp_dir("reject");
  const std::string db = (dir / "study.db").string();
  { Study a(Storage::open(db), settings("a"), db); }
  EXPECT_NE(error_of([&] {
              Study b(Storage::open(db), settings("b"), db);
            }).find("holds study 'a', not 'b'"),
            std::string::npos);
  TuneSettings other = settings("a");
  other.space.pop_back();
  EXPECT_NE(error_of([&] {
              Study b(Storage::open(db), other, db);
            }).find("another metric or search space"),
            std::string::npos);
  other = settings("a");
  other.direction = Direction::maximize;
  EXPECT_NE(error_of([&] { Study b(Storage::open(db), other, db); }).find("created to minimize"),
            std::string::npos);
  sql(db, "UPDATE version_info SET schema_version = 99");
  EXPECT_NE(
      error_of([&] { Storage::open(db); }).find("Optuna schema version 99 (alembic v3.0.0.d)"),
      std::string::npos);
  const std::string old = (dir / "old.db").string();
  sql(old,
      "CREATE TABLE seqforge_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
      "INSERT INTO seqforge_meta VALUES ('schema_version', '99')");
  EXPECT_NE(error_of([&] { Storage::open(old); }).find("schema version 99; this seqforge reads"),
            std::string::npos);
  const std::string foreign = (dir / "foreign.db").string();
  sql(foreign, "CREATE TABLE people (name TEXT)");
  EXPECT_NE(error_of([&] {
              Storage::open(foreign);
            }).find("not a seqforge study database (it holds tables people)"),
            std::string::npos);
  const std::string text = (dir / "notes.db").string();
  std::ofstream(text) << "these are not the droids you are looking for, not a database at all\n";
  const std::string e = error_of([&] { Storage::open(text); });
  EXPECT_EQ(e.rfind(text + ": not a seqforge study database", 0), 0u) << e;
  EXPECT_NE(error_of([&] {
              Storage::open((dir / "missing.db").string(), true);
            }).find("no such study file"),
            std::string::npos);
}

TEST(TuneStorage, LockedAndReadOnlyDatabasesGiveClearErrors) {
  const fs::path dir = test::temp_dir("locked");
  const std::string db = (dir / "study.db").string();
  { Study a(Storage::open(db), settings(), db); }
  setenv("SEQFORGE_TUNE_BUSY_TIMEOUT_MS", "200", 1);
  auto storage = Storage::open(db);
  unsetenv("SEQFORGE_TUNE_BUSY_TIMEOUT_MS");
  storage->create_or_check({"s", "minimize", settings().fingerprint(), "[]", ""});
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  const std::string e = error_of([&] { storage->claim(5, {"h", 1}, 60); });
  EXPECT_NE(e.find("stayed locked by another process for 0.2 s"), std::string::npos) << e;
  sqlite3_exec(h, "COMMIT", nullptr, nullptr, nullptr);
  sqlite3_close(h);
  EXPECT_TRUE(storage->claim(5, {"h", 1}, 60));  // the lock is gone: the study goes on
  // Read-only: what --report opens; nothing can be changed through it.
  auto ro = Storage::open(db, true);
  ASSERT_TRUE(ro->info());
  EXPECT_EQ(ro->trials().size(), 1u);
  EXPECT_NE(error_of([&] {
              ro->claim(5, {"h", 1}, 60);
            }).find("opened read-only"),
            std::string::npos);
  if (geteuid() != 0) {
    fs::permissions(db, fs::perms::owner_read | fs::perms::group_read);
    EXPECT_NE(error_of([&] { Storage::open(db); }).find("read-only"), std::string::npos);
    fs::permissions(db, fs::perms::owner_all);
  } else {
    std::printf("note: running as root, file permissions cannot make the study read-only\n");
  }
}

TEST(TuneStudy, CrashingTrialFailsAndTheStudyGoesOn) {
  const fs::path dir = test::temp_dir("crash");
  const std::string db = (dir / "study.db").string();
  Study study(Storage::open(db), settings(), db);
  std::ostringstream console;
  OptimizeOptions o;
  o.n_trials = 5;
  const auto stats = study.optimize(
      [](TrialContext& c) -> int64_t {
        if (c.number() == 2) {
          c.report(0, 1.0);
          throw Error("data.csv:7: boom");
        }
        return fake_training(c);
      },
      o, console);
  EXPECT_EQ(stats.failed, 1);
  const auto trials = study.trials();
  ASSERT_EQ(trials.size(), 6u);  // the failed one does not count towards n_trials
  EXPECT_EQ(trials[2].state, TrialState::failed);
  EXPECT_EQ(trials[2].message, "data.csv:7: boom");
  EXPECT_NE(console.str().find("failed: data.csv:7: boom"), std::string::npos) << console.str();
  for (size_t i = 0; i < trials.size(); ++i)
    if (i != 2) {
      EXPECT_NE(trials[i].state, TrialState::failed);
    }
}

// A trial whose training diverges after a good epoch keeps that epoch under tune.value: best
// (its checkpoint was saved then); under tune.value: last, or with no epoch before, it fails.
TEST(TuneStudy, ATrialThatDivergesKeepsItsBestEpoch) {
  for (const std::string value : {"best", "last"}) {
    const fs::path dir = test::temp_dir("diverged");
    const std::string db = (dir / "study.db").string();
    TuneSettings s = settings();
    s.value = value;
    Study study(Storage::open(db), s, db);
    std::ostringstream console;
    OptimizeOptions o;
    o.n_trials = 3;
    study.optimize(
        [](TrialContext& c) -> int64_t {
          if (c.number() == 1) {
            c.report(0, 2.0);
            c.report(1, 1.5);
            c.report(2, 1.75);
            throw Diverged("epoch 4, step 40 (batch 2 of 12): the training loss is nan");
          }
          if (c.number() == 2)
            throw Diverged("epoch 1, step 3 (batch 3 of 12): the training loss is inf");
          return fake_training(c);
        },
        o, console);
    const auto trials = study.trials();
    ASSERT_GE(trials.size(), 3u) << value;
    if (value == "best") {
      EXPECT_EQ(trials[1].state, TrialState::complete);
      ASSERT_TRUE(trials[1].value);
      EXPECT_EQ(*trials[1].value, 1.5);
      EXPECT_EQ(trials[1].epochs, 3);
      EXPECT_EQ(trials[1].message,
                "diverged after its best epoch: epoch 4, step 40 (batch 2 of 12): the training "
                "loss is nan");
      EXPECT_NE(console.str().find("\n  diverged after its best epoch: epoch 4"), std::string::npos)
          << console.str();
    } else {
      EXPECT_EQ(trials[1].state, TrialState::failed);
      EXPECT_FALSE(trials[1].value);
      EXPECT_EQ(trials[1].message, "epoch 4, step 40 (batch 2 of 12): the training loss is nan");
    }
    EXPECT_EQ(trials[2].state, TrialState::failed) << value;
    EXPECT_EQ(trials[2].message, "epoch 1, step 3 (batch 3 of 12): the training loss is inf");
  }
}

TEST(TuneStudy, DeadWorkersTrialsAreFailedAndRetried) {
  const fs::path dir = test::temp_dir("dead");
  const std::string db = (dir / "study.db").string();
  {  // a worker elsewhere that stops sending heartbeats
    Study setup(Storage::open(db), settings("s", 0.3), db);
  }
  auto other = Storage::open(db);
  other->info("s");
  const auto t0 = other->claim(10, {"elsewhere", 4242}, 0.3);
  ASSERT_TRUE(t0);
  other->set_params(t0->id, {{"optim.lr", 0.01}, {"model.hidden", 8}});
  other->report(t0->id, 0, 0.5);
  // a worker on this host whose process is gone: a zombie, not reaped yet by its parent (a
  // tune.trials_per_device worker killed while the first one trains)
  const pid_t child = fork();
  if (child == 0) _exit(0);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, id_t(child), &info, WEXITED | WNOWAIT), 0);
  const auto t1 = other->claim(10, {host_name(), int64_t(child)}, 1000);
  ASSERT_TRUE(t1);
  other->set_params(t1->id, {{"optim.lr", 0.02}, {"model.hidden", 9}});
  std::this_thread::sleep_for(std::chrono::milliseconds(400));

  Study study(Storage::open(db), settings("s", 0.3), db);
  std::ostringstream console;
  OptimizeOptions o;
  o.n_trials = 3;
  study.optimize([](TrialContext& c) { return fake_training(c); }, o, console);
  waitpid(child, nullptr, 0);
  const auto trials = study.trials();
  ASSERT_EQ(trials.size(), 5u) << trials_table(trials, nullptr);
  EXPECT_EQ(trials[0].state, TrialState::failed);
  EXPECT_NE(trials[0].message.find("no heartbeat"), std::string::npos) << trials[0].message;
  EXPECT_EQ(trials[1].state, TrialState::failed);
  EXPECT_NE(trials[1].message.find("died"), std::string::npos) << trials[1].message;
  // Their parameters run again as new trials.
  int retried = 0;
  for (size_t i = 2; i < trials.size(); ++i) {
    EXPECT_NE(trials[i].state, TrialState::failed);
    if (trials[i].attrs.count("retry_of")) {
      const auto& orig = trials[size_t(trials[i].attrs.at("retry_of"))];
      EXPECT_EQ(trials[i].params, orig.params);
      ++retried;
    }
  }
  EXPECT_EQ(retried, 2);
}

// A killed trial's parameters run again, at most three times in all (as Optuna's
// RetryFailedTrialCallback with max_retry 2): the third failure says they do not run again.
TEST(TuneStudy, ParametersRunAtMostThreeTimesAndTheLastFailureSaysSo) {
  const fs::path dir = test::temp_dir("retries");
  const std::string db = (dir / "study.db").string();
  { Study setup(Storage::open(db), settings("s", 0.3), db); }
  auto worker = Storage::open(db);
  worker->info("s");
  const std::map<std::string, double> params = {{"optim.lr", 0.01}, {"model.hidden", 8}};
  for (int run = 0; run < 3; ++run) {
    const auto t = worker->claim(10, {"elsewhere", 7}, 0.05);
    ASSERT_TRUE(t);
    if (run > 0) {
      EXPECT_EQ(t->params, params) << "run " << run;
    }
    worker->set_params(t->id, params);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // its heartbeat stops
  }
  ASSERT_TRUE(worker->claim(10, {"elsewhere", 7}, 0.05));  // fails the third; a new trial
  const auto trials = worker->trials();
  ASSERT_EQ(trials.size(), 4u) << trials_table(trials, nullptr);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(trials[k].state, TrialState::failed);
    EXPECT_EQ(trials[k].params, params);
  }
  EXPECT_EQ(trials[1].message.find("do not run again"), std::string::npos) << trials[1].message;
  EXPECT_NE(trials[2].message.find("its parameters have now failed 3 times (this trial and 2 "
                                   "retries): they do not run again"),
            std::string::npos)
      << trials[2].message;
  EXPECT_TRUE(trials[3].params.empty());  // sampled anew, not a fourth run of them
}

// A trial a signal stopped queues its parameters' retry as it finishes, and says whether it did:
// twice, not the third time.
TEST(TuneStudy, AStoppedTrialSaysWhetherItsParametersRunAgain) {
  const fs::path dir = test::temp_dir("stopped_retries");
  const std::string db = (dir / "study.db").string();
  { Study setup(Storage::open(db), settings("s", 0.3), db); }
  auto worker = Storage::open(db);
  worker->info("s");
  const std::map<std::string, double> params = {{"optim.lr", 0.01}, {"model.hidden", 8}};
  for (const bool runs_again : {true, true, false}) {
    const auto t = worker->claim(10, {"here", 7}, 60);
    ASSERT_TRUE(t);
    worker->set_params(t->id, params);
    EXPECT_EQ(worker->finish(t->id, TrialState::failed, std::nullopt, 0, "interrupted", true),
              runs_again)
        << "trial " << t->number;
  }
  const auto next = worker->claim(10, {"here", 7}, 60);
  ASSERT_TRUE(next);
  EXPECT_TRUE(next->params.empty());  // sampled anew
}

TEST(TuneStudy, HeartbeatKeepsLongTrialsAlive) {
  const fs::path dir = test::temp_dir("heartbeat");
  const std::string db = (dir / "study.db").string();
  std::thread slow([&] {
    Study study(Storage::open(db), settings("s", 0.5), db);
    std::ostringstream console;
    OptimizeOptions o;
    o.n_trials = 1;
    study.optimize([](TrialContext& c) { return fake_training(c, 300); }, o, console);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Study other(Storage::open(db), settings("s", 0.5), db);
  std::ostringstream console;
  OptimizeOptions o;
  o.n_trials = 4;
  other.optimize([](TrialContext& c) { return fake_training(c, 200); }, o, console);
  slow.join();
  for (const auto& t : other.trials())
    EXPECT_NE(t.state, TrialState::failed) << t.number << ": " << t.message;
}

TEST(TuneStudy, LateWritesToATrialFailedByAnotherWorkerAreRejected) {
  const fs::path dir = test::temp_dir("late");
  const std::string db = (dir / "study.db").string();
  { Study setup(Storage::open(db), settings(), db); }
  auto a = Storage::open(db), b = Storage::open(db);
  a->info("s");
  b->info("s");
  const auto t = a->claim(2, {"elsewhere", 1}, 0.01);
  a->set_params(t->id, {{"optim.lr", 0.01}, {"model.hidden", 8}});
  a->report(t->id, 0, 0.5);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const auto retry = b->claim(2, {"here", 2}, 0.01);  // takes t for dead, queues a retry
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->attrs.at("retry_of"), 0);
  EXPECT_EQ(retry->params,
            (std::map<std::string, double>{{"optim.lr", 0.01}, {"model.hidden", 8}}));
  // the paused worker comes back: every write into its trial is rejected, as Optuna does
  auto rejected = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const TrialFinishedError& e) {
      EXPECT_NE(e.reason.find("no heartbeat"), std::string::npos) << e.reason;
      EXPECT_NE(std::string(e.what()).find("trial 0 is already FAIL"), std::string::npos)
          << e.what();
      return true;
    }
    return false;
  };
  EXPECT_TRUE(rejected([&] { a->report(t->id, 1, 0.25); }));
  EXPECT_TRUE(rejected([&] { a->set_attrs(t->id, {{"seconds", 1}}); }));
  EXPECT_TRUE(rejected([&] { a->set_params(t->id, {{"optim.lr", 0.02}}); }));
  EXPECT_TRUE(rejected([&] { a->finish(t->id, TrialState::complete, 0.25, 5, ""); }));
  a->heartbeat(t->id);  // a no-op
  const auto trials = a->trials();
  ASSERT_EQ(trials.size(), 2u);
  EXPECT_EQ(trials[0].state, TrialState::failed);
  EXPECT_FALSE(trials[0].value);
  EXPECT_EQ(trials[0].intermediate.size(), 1u);
  EXPECT_EQ(trials[1].state, TrialState::running);
  EXPECT_EQ(trials[1].params, trials[0].params);
}

// A worker whose trial another worker failed prints one line and goes on with the next trial.
TEST(TuneStudy, AWorkerWhoseTrialWasFailedDiscardsItAndGoesOn) {
  const fs::path dir = test::temp_dir("discard");
  const std::string db = (dir / "study.db").string();
  Study study(Storage::open(db), settings("s", 0.3), db);
  auto other = Storage::open(db);
  other->info("s");
  std::ostringstream console;
  OptimizeOptions o;
  o.n_trials = 3;
  bool first = true;
  study.optimize(
      [&](TrialContext& c) -> int64_t {
        if (first) {  // as if paused: another worker fails the trial meanwhile
          first = false;
          c.report(0, 1.0);
          const auto t = other->trials().at(0);
          other->finish(t.id, TrialState::failed, std::nullopt, 0, "taken for dead in a test");
        }
        return fake_training(c);
      },
      o, console);
  EXPECT_NE(console.str().find("trial 0: failed by another worker while this worker was paused "
                               "(taken for dead in a test); its result is discarded"),
            std::string::npos)
      << console.str();
  const auto trials = study.trials();
  ASSERT_EQ(trials.size(), 4u);
  EXPECT_EQ(trials[0].state, TrialState::failed);
  EXPECT_EQ(trials[0].intermediate.size(), 1u);
  for (size_t i = 1; i < trials.size(); ++i) EXPECT_NE(trials[i].state, TrialState::failed);
}

// Enqueued trials (Optuna's enqueue_trial) run first, with their fixed parameters.
TEST(TuneStudy, EnqueuedTrialsRunFirstWithTheirParameters) {
  const fs::path dir = test::temp_dir("enqueue");
  const std::string db = (dir / "study.db").string();
  const TuneSettings s = settings_with_a_choice();
  Study study(Storage::open(db), s, db);
  auto st = Storage::open(db);
  st->info("s");
  EXPECT_EQ(st->enqueue({{"optim.lr", "0.05"}, {"optim.kind", "sgd"}}), 0);
  EXPECT_EQ(st->enqueue({{"optim.kind", "adamw"}}), 1);
  EXPECT_NE(error_of([&] {
              st->enqueue({{"optim.lr", "0.5"}});
            }).find("is outside the space"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              st->enqueue({{"optim.kind", "adam"}});
            }).find("not one of the choices"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              st->enqueue({{"optim.wd", "1"}});
            }).find("not a parameter"),
            std::string::npos);
  std::ostringstream console;
  OptimizeOptions o;
  o.n_trials = 3;
  study.optimize([](TrialContext& c) { return fake_training(c); }, o, console);
  const auto trials = study.trials();
  ASSERT_EQ(trials.size(), 3u);
  EXPECT_EQ(trials[0].params.at("optim.lr"), 0.05);
  EXPECT_EQ(trials[0].params.at("optim.kind"), 1);
  EXPECT_EQ(trials[1].params.at("optim.kind"), 0);
  EXPECT_TRUE(trials[1].params.count("optim.lr"));
  for (const auto& t : trials) EXPECT_EQ(t.state, TrialState::complete) << t.message;
  // The total bounds waiting trials too (Optuna's optimize(n_trials) runs that many): of three
  // more enqueued, a total of 4 runs one; the others wait for a larger total.
  for (const char* lr : {"0.01", "0.02", "0.03"}) st->enqueue({{"optim.lr", lr}});
  o.n_trials = 4;
  study.optimize([](TrialContext& c) { return fake_training(c); }, o, console);
  std::map<TrialState, int> states;
  for (const auto& t : study.trials()) ++states[t.state];
  EXPECT_EQ(states[TrialState::complete] + states[TrialState::pruned], 4);
  EXPECT_EQ(states[TrialState::waiting], 2);
  o.n_trials = 6;
  study.optimize([](TrialContext& c) { return fake_training(c); }, o, console);
  const auto all = study.trials();
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[5].params.at("optim.lr"), 0.03);
  for (const auto& t : all)
    EXPECT_TRUE(t.state == TrialState::complete || t.state == TrialState::pruned) << t.message;
}

// A damaged study file (a value or parameter that is not a number, a choice outside the space, a
// log-scale parameter that is not positive, a direction missing or unknown) is one error naming
// the trial or study, never a 0 or a default read in its place.
TEST(TuneStorage, DamagedValuesAndParametersAreErrorsNamingTheTrial) {
  const fs::path dir = test::temp_dir("damaged");
  const auto run_study = [](const std::string& path, const TuneSettings& s, int64_t trials) {
    Study study(Storage::open(path), s, path);
    std::ostringstream console;
    OptimizeOptions o;
    o.n_trials = trials;
    study.optimize([](TrialContext& c) { return fake_training(c); }, o, console);
  };
  const std::string db = (dir / "study.db").string();
  run_study(db, settings_with_a_choice(), 2);
  const fs::path copy = dir / "damaged.db";
  // The error reading a copy of `from` after `statement` ran on it.
  const auto error_after = [&](const std::string& statement, const std::string& from = "") {
    fs::copy_file(from.empty() ? db : from, copy, fs::copy_options::overwrite_existing);
    sql(copy, statement);
    return error_of([&] {
      auto st = Storage::open(copy.string());
      st->info("s");
      st->trials();
    });
  };
  const std::string first = "(SELECT trial_id FROM trials WHERE number = 0)";
  std::string e = error_after("UPDATE trial_values SET value = 'abc' WHERE trial_id = " + first);
  EXPECT_NE(e.find("trial 0: its value 'abc' is not a number"), std::string::npos) << e;
  e = error_after("UPDATE trial_values SET value = NULL WHERE trial_id = " + first);
  EXPECT_NE(e.find("trial 0: its value NULL is not a number"), std::string::npos) << e;
  e = error_after("UPDATE trial_intermediate_values SET intermediate_value = 'x' WHERE step = 1");
  EXPECT_NE(e.find("its value at step 1 'x' is not a number"), std::string::npos) << e;
  e = error_after("UPDATE trial_intermediate_values SET step = 'one' WHERE step = 1");
  EXPECT_NE(e.find("a step value's step 'one' is not a whole number"), std::string::npos) << e;
  e = error_after("UPDATE trial_params SET param_value = 'nan' WHERE param_name = 'optim.lr'");
  EXPECT_NE(e.find("parameter 'optim.lr' holds 'nan', not a number"), std::string::npos) << e;
  e = error_after("UPDATE trial_params SET param_value = 7 WHERE param_name = 'optim.kind'");
  EXPECT_NE(e.find("parameter 'optim.kind' holds choice 7 of the 2 its distribution_json lists"),
            std::string::npos)
      << e;
  // A choice the record lists that the study's search space does not have.
  e = error_after(
      "UPDATE trial_params SET param_value = 0, distribution_json = "
      "'{\"name\": \"CategoricalDistribution\", \"attributes\": {\"choices\": [\"lion\"]}}' "
      "WHERE param_name = 'optim.kind'");
  EXPECT_NE(e.find("parameter 'optim.kind' holds '\"lion\"', which is not one of the search "
                   "space's 2 choices"),
            std::string::npos)
      << e;
  e = error_after("UPDATE trial_params SET param_value = -5 WHERE param_name = 'optim.lr'");
  EXPECT_NE(e.find("parameter 'optim.lr' holds -5, which its log-scale search space cannot hold"),
            std::string::npos)
      << e;
  e = error_after("DELETE FROM study_directions");
  EXPECT_NE(e.find("study 1 has no direction in the study database"), std::string::npos) << e;
  e = error_after("UPDATE study_directions SET direction = 'SIDEWAYS'");
  EXPECT_NE(e.find("study 1's direction is 'SIDEWAYS' in the study database, not MINIMIZE or "
                   "MAXIMIZE"),
            std::string::npos)
      << e;
  const std::string int_db = (dir / "int.db").string();  // model.hidden an integer
  run_study(int_db, settings(), 1);
  e = error_after("UPDATE trial_params SET param_value = 3.5 WHERE param_name = 'model.hidden'",
                  int_db);
  EXPECT_NE(e.find("parameter 'model.hidden' holds 3.5, not a whole number"), std::string::npos)
      << e;
  // The undamaged file reads as it was written.
  auto st = Storage::open(db);
  st->info("s");
  EXPECT_EQ(st->trials().size(), 2u);
}

// The tables of seqforge's former study schema (version 1).
constexpr const char* kFormerSchema =
    "CREATE TABLE seqforge_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE seqforge_studies (name TEXT PRIMARY KEY, direction TEXT NOT NULL, "
    "fingerprint TEXT NOT NULL, space TEXT, created TEXT);"
    "CREATE TABLE seqforge_trials (id INTEGER PRIMARY KEY AUTOINCREMENT, study TEXT NOT NULL, "
    "number INTEGER NOT NULL, state TEXT NOT NULL, value TEXT, params TEXT, attrs TEXT, started "
    "TEXT, finished TEXT, heartbeat TEXT, epochs INTEGER, host TEXT, pid INTEGER, message TEXT, "
    "UNIQUE (study, number));"
    "CREATE TABLE seqforge_intermediate (trial_id INTEGER NOT NULL, step INTEGER NOT NULL, "
    "value TEXT, PRIMARY KEY (trial_id, step));"
    "INSERT INTO seqforge_meta VALUES ('schema_version', '1');";

// A former study without its search space cannot be given Optuna's distributions: refused,
// the file left as it was.
TEST(TuneStorage, FormerSchemaWithoutASpaceIsRefused) {
  const fs::path dir = test::temp_dir("migrate_no_space");
  const std::string db = (dir / "study.db").string();
  sql(db, std::string(kFormerSchema) +
              "INSERT INTO seqforge_studies VALUES ('s', 'minimize', 'f', NULL, '1700000000');");
  const std::string e = error_of([&] { Storage::open(db)->trials(); });
  EXPECT_NE(e.find("has no readable search space"), std::string::npos) << e;
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(h, "SELECT count(*) FROM seqforge_studies", -1, &st, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), 1);
  sqlite3_finalize(st);
  sqlite3_close(h);
}

// A file of seqforge's former schema is converted to Optuna's on first open.
TEST(TuneStorage, FormerSchemaIsConvertedOnFirstOpen) {
  const fs::path dir = test::temp_dir("migrate");
  const std::string db = (dir / "study.db").string();
  const TuneSettings s = settings();
  const std::string fp = s.fingerprint(), space = space_json(s.space);
  sql(db,
      std::string(kFormerSchema) + "INSERT INTO seqforge_studies VALUES ('s', 'minimize', '" + fp +
          "', '" + space +
          "', '1700000000');"
          "INSERT INTO seqforge_trials (study, number, state, value, params, attrs, started, "
          "finished, heartbeat, epochs, host, pid, message) VALUES "
          "('s', 0, 'complete', '0.33333333333333331', '{\"optim.lr\":0.033333333333333333,"
          "\"model.hidden\":7}', '{\"seconds\":1.5}', '1700000000.25', '1700000010.5', "
          "'1700000010', 3, 'h', 12, ''),"
          "('s', 1, 'pruned', 'nan', '{\"optim.lr\":0.01,\"model.hidden\":8}', '{}', "
          "'1700000011', '1700000012', '1700000012', 1, 'h', 12, ''),"
          "('s', 2, 'failed', NULL, '{\"optim.lr\":0.02,\"model.hidden\":9}', '{}', "
          "'1700000013', '1700000014', '1700000014', 0, 'h', 12, 'boom'),"
          "('s', 3, 'waiting', NULL, '{\"optim.lr\":0.02,\"model.hidden\":9}', "
          "'{\"retries\":1,\"retry_of\":2}', NULL, NULL, NULL, NULL, NULL, NULL, NULL);"
          "INSERT INTO seqforge_intermediate VALUES (1, 0, '0.5'), (1, 1, '0.33333333333333331'),"
          "(2, 0, 'nan');");
  {
    auto st = Storage::open(db);
    const auto info = st->info("s");
    ASSERT_TRUE(info);
    EXPECT_EQ(info->fingerprint, fp);
    EXPECT_EQ(info->direction, "minimize");
    const auto trials = st->trials();
    ASSERT_EQ(trials.size(), 4u);
    EXPECT_EQ(trials[0].state, TrialState::complete);
    EXPECT_EQ(*trials[0].value, 1.0 / 3.0);
    EXPECT_EQ(trials[0].params.at("optim.lr"), 0.1 / 3);
    EXPECT_EQ(trials[0].params.at("model.hidden"), 7);
    EXPECT_EQ(trials[0].intermediate.at(1), 1.0 / 3.0);
    EXPECT_EQ(trials[0].attrs.at("seconds"), 1.5);
    EXPECT_EQ(trials[0].epochs, 3);
    EXPECT_EQ(trials[0].host, "h");
    EXPECT_NEAR(trials[0].started, 1700000000.25, 1e-6);
    EXPECT_EQ(trials[1].state, TrialState::pruned);
    EXPECT_FALSE(trials[1].value);  // NaN: Optuna stores no value
    EXPECT_TRUE(std::isnan(trials[1].intermediate.at(0)));
    EXPECT_EQ(trials[2].state, TrialState::failed);
    EXPECT_EQ(trials[2].message, "boom");
    EXPECT_EQ(trials[3].state, TrialState::waiting);
    EXPECT_EQ(trials[3].params, trials[2].params);  // as Optuna's fixed_params
    EXPECT_EQ(trials[3].attrs.at("retry_of"), 2);
  }
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(h, "SELECT count(*) FROM sqlite_master WHERE name LIKE 'seqforge%'",
                               -1, &st, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), 0);
  sqlite3_finalize(st);
  sqlite3_close(h);
  // and the study goes on: the retry runs first
  Study study(Storage::open(db), settings(), db);
  std::ostringstream console;
  OptimizeOptions o;
  o.n_trials = 3;
  study.optimize([](TrialContext& c) { return fake_training(c); }, o, console);
  const auto trials = study.trials();
  EXPECT_EQ(trials[3].state, TrialState::complete);
  EXPECT_EQ(trials[3].params, trials[2].params);
}

TEST(TuneStudy, ResumesWhereItStoppedAndHonoursTheTimeout) {
  const fs::path dir = test::temp_dir("resume");
  const std::string db = (dir / "study.db").string();
  std::ostringstream console;
  OptimizeOptions o;
  o.n_trials = 3;
  {
    Study study(Storage::open(db), settings(), db);
    study.optimize([](TrialContext& c) { return fake_training(c); }, o, console);
  }
  o.n_trials = 6;
  Study again(Storage::open(db), settings(), db);
  const auto stats = again.optimize([](TrialContext& c) { return fake_training(c); }, o, console);
  EXPECT_EQ(stats.trials, 3);
  const auto trials = again.trials();
  ASSERT_EQ(trials.size(), 6u);
  for (size_t i = 0; i < trials.size(); ++i) EXPECT_EQ(trials[i].number, int64_t(i));
  o.n_trials = 100;
  o.timeout = 0.05;
  const auto timed =
      again.optimize([](TrialContext& c) { return fake_training(c, 60); }, o, console);
  EXPECT_EQ(timed.trials, 1);
  EXPECT_NE(console.str().find("timeout"), std::string::npos);
}

TEST(TuneStorage, ValuesRoundTripExactlyWithNaN) {
  const fs::path dir = test::temp_dir("values");
  const std::string db = (dir / "study.db").string();
  Study setup(Storage::open(db), settings(), db);
  auto s = Storage::open(db);
  s->info("s");
  const auto t = s->claim(1, {"h", 1}, 60);
  const double third = 1.0 / 3.0;
  s->report(t->id, 0, third);
  s->report(t->id, 2, std::nan(""));
  s->report(t->id, 2, 5.0);  // a step's first report wins
  s->report(t->id, 3, INFINITY);
  s->report(t->id, 4, -INFINITY);
  s->set_params(t->id, {{"optim.lr", 0.1 / 3}, {"model.hidden", 7}});
  s->finish(t->id, TrialState::complete, third, 3, "");
  const Trial back = s->trials().at(0);
  EXPECT_EQ(back.intermediate.at(0), third);
  EXPECT_TRUE(std::isnan(back.intermediate.at(2)));
  EXPECT_EQ(back.intermediate.at(3), INFINITY);
  EXPECT_EQ(back.intermediate.at(4), -INFINITY);
  {  // as Optuna stores them: NULL with the value's type
    sqlite3* h = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(h,
                                 "SELECT step, intermediate_value IS NULL, intermediate_value_type "
                                 "FROM trial_intermediate_values ORDER BY step",
                                 -1, &st, nullptr),
              SQLITE_OK);
    std::string rows;
    while (sqlite3_step(st) == SQLITE_ROW)
      rows += std::to_string(sqlite3_column_int(st, 0)) + ":" +
              std::to_string(sqlite3_column_int(st, 1)) + ":" +
              reinterpret_cast<const char*>(sqlite3_column_text(st, 2)) + " ";
    sqlite3_finalize(st);
    sqlite3_close(h);
    EXPECT_EQ(rows, "0:0:FINITE 2:1:NAN 3:1:INF_POS 4:1:INF_NEG ");
  }
  EXPECT_EQ(back.params.at("optim.lr"), 0.1 / 3);
  EXPECT_EQ(*back.value, third);
  const std::string table = trials_table(s->trials(), &setup.settings());
  EXPECT_NE(table.find("complete"), std::string::npos);
  const std::string html =
      html_report("s", "val_loss", s->trials(), Direction::minimize, setup.settings().space);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("Optimisation history"), std::string::npos);
}

// A grid of 6 points, each run to the end once: through trials whose workers died (failed, their
// parameters retried, also one that died before it wrote them), an enqueued trial that is a grid
// point (it takes that point) and one that is not (it runs besides the grid), and a second worker
// that finds every point taken.
TEST(TuneStudy, EveryGridPointRunsOnceThroughDeadWorkersAndEnqueuedTrials) {
  const fs::path dir = test::temp_dir("grid");
  const std::string db = (dir / "study.db").string();
  const TuneSettings s = parse_tune_settings(
      "tune:\n  sampler: {kind: grid, seed: 3}\n  pruner: {kind: none}\n"
      "  heartbeat_interval: 0.05\n  grace_period: 0.2\n  space:\n"
      "    optim.lr: {type: float, low: 0.001, high: 0.1, grid: [0.001, 0.01, 0.1]}\n"
      "    model.hidden: {type: int, low: 4, high: 8, step: 4}\n",
      "g.yaml", "val_loss");
  { Study setup(Storage::open(db), s, db); }
  const auto sampler = make_sampler(s);
  const Grid& grid = *sampler->grid();
  auto storage = Storage::open(db);
  storage->info("g");
  const auto dead = storage->claim(100, {"elsewhere", 1}, 0.01, &grid);
  ASSERT_TRUE(dead);
  const std::map<std::string, double> dead_point = grid.point(int64_t(dead->attrs.at("grid_id")));
  storage->set_params(dead->id, dead_point);
  ASSERT_TRUE(storage->claim(100, {"elsewhere", 2}, 0.01, &grid));         // dies before its params
  const std::map<std::string, double> next = grid.point(grid.order()[2]);  // a grid point
  ASSERT_NE(next, dead_point);
  storage->enqueue({{"optim.lr", s.param("optim.lr").text(next.at("optim.lr"))},
                    {"model.hidden", s.param("model.hidden").text(next.at("model.hidden"))}});
  storage->enqueue({{"optim.lr", "0.05"}, {"model.hidden", "4"}});  // not one
  std::this_thread::sleep_for(std::chrono::milliseconds(300));      // the first worker is gone
  std::ostringstream console;
  OptimizeOptions o;
  o.n_trials = 100;
  Study(Storage::open(db), s, db)
      .optimize([](TrialContext& c) { return fake_training(c); }, o, console);
  Study(Storage::open(db), s, db)
      .optimize([](TrialContext& c) { return fake_training(c); }, o,
                console);  // nothing is left
  std::map<std::map<std::string, double>, int> complete;
  int failed = 0;
  for (const Trial& t : storage->trials()) {
    if (t.state == TrialState::complete) ++complete[t.params];
    failed += t.state == TrialState::failed;
  }
  EXPECT_EQ(failed, 2);
  EXPECT_EQ(complete.size(), 7u) << console.str();
  EXPECT_EQ(storage->trials().size(), 9u);  // the failed two, their retries, 4 points, 0.05
  for (int64_t id = 0; id < grid.size(); ++id)
    EXPECT_EQ(complete[grid.point(id)], 1) << "point " << id;
  EXPECT_EQ((complete[{{"optim.lr", 0.05}, {"model.hidden", 4}}]), 1);
}

}  // namespace
}  // namespace seqforge::tune::tune_storage_test
