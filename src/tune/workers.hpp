#pragma once
// Several trials of one study on one device (tune.trials_per_device): more `seqforge tune`
// processes on the same study database, each an ordinary worker that claims trials until none is
// left, its console in the study directory's worker-K.log.
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace seqforge::tune {

class HelperWorkers {
 public:
  HelperWorkers() = default;
  HelperWorkers(const HelperWorkers&) = delete;
  HelperWorkers& operator=(const HelperWorkers&) = delete;
  // Interrupts (SIGINT: each records its trial under way as failed) and waits for the workers
  // still running: this process is ending without having waited for them.
  ~HelperWorkers();

  // Starts `count` more workers: `executable` with `args`, numbered after those already started.
  // Each ends with this process (PR_SET_PDEATHSIG).
  void start(int count, const std::string& executable, const std::vector<std::string>& args,
             const std::filesystem::path& dir);
  // Waits for every worker to end; one line for each that ended otherwise than with exit code 0.
  std::vector<std::string> wait();
  int count() const { return static_cast<int>(workers_.size()); }

 private:
  struct Worker {
    pid_t pid;
    std::string log;
  };
  std::vector<Worker> workers_;
};

// How many trials an `auto` setting runs on one GPU: the trials that fit in 80% of the memory
// left free after one trial, each needing what that trial took (`trial_bytes`) and a process's
// CUDA context; 1 to 8.
int trials_that_fit(double free_bytes, double trial_bytes);

}  // namespace seqforge::tune
