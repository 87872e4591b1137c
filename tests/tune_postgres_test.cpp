// The study storage on a real PostgreSQL server, started on loopback in a temporary directory
// for these tests and stopped afterwards: two workers share one study.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "seqforge/core/error.hpp"
#include "seqforge/tune/study.hpp"

namespace seqforge::tune::tune_postgres_test {
namespace {

namespace fs = std::filesystem;

int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

class TunePostgres : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string bin;
    if (fs::exists("/usr/lib/postgresql"))
      for (const auto& e : fs::directory_iterator("/usr/lib/postgresql"))
        if (fs::exists(e.path() / "bin" / "initdb")) bin = (e.path() / "bin").string();
    if (bin.empty()) {
      skip_ =
          "no PostgreSQL server binaries under /usr/lib/postgresql (Debian's postgresql "
          "package; scripts/install-deps.sh installs it)";
      return;
    }
    char tmpl[] = "/tmp/seqforge_pg_XXXXXX";
    if (!mkdtemp(tmpl)) {
      skip_ = "cannot make a temporary directory";
      return;
    }
    dir_ = tmpl;
    // PostgreSQL refuses to run as root: as root, run it as nobody.
    std::string as;
    if (geteuid() == 0) {
      const passwd* pw = getpwnam("nobody");
      if (!pw || chown(dir_.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
        skip_ = "running as root and cannot hand the server's directory to user nobody";
        return;
      }
      as = "runuser -u nobody -- ";
    }
    port_ = free_port();
    const std::string data = dir_ + "/data";
    const std::string init = as + bin + "/initdb -D " + data +
                             " -A trust -U seqforge --no-sync > " + dir_ + "/initdb.log 2>&1";
    if (std::system(init.c_str()) != 0) {
      skip_ = "initdb failed (see " + dir_ + "/initdb.log)";
      return;
    }
    stop_ = as + bin + "/pg_ctl -D " + data + " -m immediate -w stop > /dev/null 2>&1";
    const std::string start = as + bin + "/pg_ctl -D " + data + " -l " + dir_ +
                              "/server.log -w -t 60 -o \"-h 127.0.0.1 -p " + std::to_string(port_) +
                              " -k " + dir_ +
                              " -c fsync=off -c full_page_writes=off\" start > /dev/null 2>&1";
    if (std::system(start.c_str()) != 0) {
      skip_ = "the PostgreSQL server did not start (see " + dir_ + "/server.log)";
      return;
    }
    started_ = true;
    url_ = "postgresql://seqforge@127.0.0.1:" + std::to_string(port_) + "/postgres";
  }
  static void TearDownTestSuite() {
    if (started_) std::system(stop_.c_str());
    if (!dir_.empty() && skip_.empty()) fs::remove_all(dir_);
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << "PostgreSQL tests skipped: " << skip_;
  }
  static inline std::string dir_, url_, stop_, skip_;
  static inline int port_ = 0;
  static inline bool started_ = false;
};

TuneSettings settings(const std::string& name) {
  return parse_tune_settings(
      "tune:\n  sampler: {kind: tpe, seed: 2, n_startup_trials: 4}\n"
      "  pruner: {kind: successive_halving, min_resource: 1, reduction_factor: 2}\n"
      "  heartbeat_interval: 0.1\n  grace_period: 10\n"
      "  space:\n    optim.lr: {type: float, low: 0.001, high: 0.1, log: true}\n"
      "    optim.kind: {type: categorical, choices: [adamw, sgd]}\n",
      name + ".yaml", "val_loss");
}

int64_t fake_training(TrialContext& ctx) {
  const double lr = ctx.params().at("optim.lr");
  int64_t epochs = 0;
  for (int64_t step = 0; step < 6; ++step) {
    ++epochs;
    const double v =
        std::abs(std::log10(lr) + 2) + ctx.params().at("optim.kind") * 0.1 + 1.0 / double(step + 1);
    if (!ctx.report(step, v)) break;
  }
  return epochs;
}

TEST_F(TunePostgres, TwoWorkersShareOneStudy) {
  std::vector<std::thread> workers;
  std::vector<std::string> errors(2);
  for (int w = 0; w < 2; ++w)
    workers.emplace_back([&, w] {
      try {
        Study study(Storage::open(url_), settings("shared"), url_);
        std::ostringstream console;
        OptimizeOptions o;
        o.n_trials = 24;
        study.optimize(fake_training, o, console);
      } catch (const std::exception& e) {
        errors[size_t(w)] = e.what();
      }
    });
  for (auto& t : workers) t.join();
  for (const auto& e : errors) ASSERT_EQ(e, "");
  auto storage = Storage::open(url_, true);
  ASSERT_TRUE(storage->info("shared"));
  const auto trials = storage->trials();
  ASSERT_EQ(trials.size(), 24u);
  std::set<int64_t> numbers;
  int pruned = 0;
  for (const auto& t : trials) {
    numbers.insert(t.number);
    EXPECT_TRUE(t.state == TrialState::complete || t.state == TrialState::pruned) << t.message;
    EXPECT_EQ(int64_t(t.intermediate.size()), t.epochs);
    pruned += t.state == TrialState::pruned;
  }
  EXPECT_EQ(numbers.size(), 24u);
  EXPECT_GT(pruned, 0);
  // Several studies live in one database; a changed space under the same name is refused.
  { Study other(Storage::open(url_), settings("second"), url_); }
  TuneSettings changed = settings("shared");
  changed.space.pop_back();
  try {
    Study bad(Storage::open(url_), changed, url_);
    ADD_FAILURE() << "a changed search space was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another metric or search space"), std::string::npos);
  }
  std::ostringstream report;
  EXPECT_EQ(run_tune_report(url_, "shared", dir_ + "/report.html", report), 0);
  EXPECT_NE(report.str().find("24 trials"), std::string::npos) << report.str();
}

TEST_F(TunePostgres, UnreachableServerIsAClearError) {
  const std::string url =
      "postgresql://seqforge:secret@127.0.0.1:" + std::to_string(free_port()) + "/postgres";
  try {
    Storage::open(url);
    ADD_FAILURE() << "connected to nothing";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot connect to PostgreSQL"), std::string::npos) << m;
    EXPECT_EQ(m.find("secret"), std::string::npos) << m;  // no password in messages
  }
}

// A server that accepts the connection and never answers (a stuck proxy) is an error after the
// connection's timeout (10 s unless the URL sets one, as here), not a study that waits for ever.
TEST_F(TunePostgres, SilentServerTimesOut) {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(s, 4), 0);  // the kernel completes connections; nothing reads them
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string url = "postgresql://seqforge@127.0.0.1:" + std::to_string(ntohs(a.sin_port)) +
                          "/postgres?connect_timeout=2";
  const auto t0 = std::chrono::steady_clock::now();
  try {
    Storage::open(url);
    ADD_FAILURE() << "connected to a server that never answered";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot connect to PostgreSQL"), std::string::npos) << m;
    EXPECT_NE(m.find("timeout expired"), std::string::npos) << m;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 30.0);
  close(s);
}

}  // namespace
}  // namespace seqforge::tune::tune_postgres_test
