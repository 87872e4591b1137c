#include "tune/workers.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "seqforge/core/error.hpp"

namespace seqforge::tune {

namespace fs = std::filesystem;

HelperWorkers::~HelperWorkers() {
  for (const Worker& w : workers_) kill(w.pid, SIGINT);
  for (const Worker& w : workers_) {
    int status = 0;
    while (waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

void HelperWorkers::start(int count, const std::string& executable,
                          const std::vector<std::string>& args, const fs::path& dir) {
  std::vector<std::string> argv_text = {executable};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  for (int i = 0; i < count; ++i) {
    const std::string log =
        (dir / ("worker-" + std::to_string(workers_.size() + 1) + ".log")).string();
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail(log, ": cannot write the worker's log: ", std::strerror(errno));
    const pid_t pid = fork();
    if (pid < 0) {
      close(fd);
      fail("tune.trials_per_device: cannot start a worker: ", std::strerror(errno));
    }
    if (pid == 0) {  // the child: only async-signal-safe calls until exec
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(1);  // the parent ended before the line above
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fd);
    workers_.push_back({pid, log});
  }
}

std::vector<std::string> HelperWorkers::wait() {
  std::vector<std::string> problems;
  for (const Worker& w : workers_) {
    int status = 0;
    while (waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    problems.push_back("a worker on this device ended with " +
                       (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                          : "signal " + std::to_string(WTERMSIG(status))) +
                       " (see " + w.log + ")");
  }
  workers_.clear();
  return problems;
}

int trials_that_fit(double free_bytes, double trial_bytes) {
  constexpr double kContextBytes = 512.0 * (1 << 20);  // a CUDA context, cuBLASLt's workspace
  const double each = std::max(trial_bytes, 64.0 * (1 << 20)) + kContextBytes;
  return static_cast<int>(std::clamp(1 + std::floor(0.8 * free_bytes / each), 1.0, 8.0));
}

}  // namespace seqforge::tune
