#pragma once
// A trial of a study as stored: its parameters, the metric it reported per step (epoch - 1), its
// state and outcome. Shared by the samplers, pruners and storages.
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace seqforge::tune {

enum class Direction { minimize, maximize };
enum class TrialState { waiting, running, complete, pruned, failed };

const char* state_name(TrialState s);
// Optuna's name of a state, as its study tables hold it (WAITING, RUNNING, COMPLETE, PRUNED, FAIL).
const char* optuna_state_name(TrialState s);
TrialState state_of(const std::string& name);  // throws on an unknown name
const char* direction_name(Direction d);

struct Trial {
  int64_t id = 0;      // storage row
  int64_t number = 0;  // 0, 1, 2, ... in order of creation within the study
  TrialState state = TrialState::running;
  std::optional<double> value;             // complete: its value; pruned: the last reported
  std::map<std::string, double> params;    // config key -> value (categorical: choice index)
  std::map<int64_t, double> intermediate;  // step -> reported value (NaN allowed)
  std::map<std::string, double> attrs;     // pruner and driver bookkeeping
  double started = 0, finished = 0, heartbeat = 0;  // seconds since the Unix epoch
  int64_t epochs = 0;
  std::string host, message;
  int64_t pid = 0;
  bool worker_gone = false;  // running, but its worker was a process of this host that is gone

  std::optional<int64_t> last_step() const {
    if (intermediate.empty()) return std::nullopt;
    return intermediate.rbegin()->first;
  }
};

}  // namespace seqforge::tune
