#pragma once
// Where a study lives: a SQLite file (WAL, busy timeout) or a PostgreSQL database
// (postgresql://user@host:port/db), behind one interface. Every change is one transaction, so
// several workers (processes, machines) share a study without losing or duplicating trials.
//
// The tables are Optuna's own RDB schema (Optuna 3.x: version_info.schema_version 12, alembic
// revision v3.0.0.d), so optuna.load_study reads a seqforge study and seqforge continues a study
// Optuna created. seqforge's bookkeeping lives in Optuna's system attributes under `seqforge:`
// keys; files of seqforge's former schema (seqforge_meta, version 1) are converted on first open.
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "seqforge/core/error.hpp"
#include "seqforge/tune/space.hpp"
#include "seqforge/tune/trial.hpp"

namespace seqforge::tune {

class Grid;

inline constexpr int kSchemaVersion = 1;  // seqforge's former schema, converted when opened
inline constexpr int kOptunaSchemaVersion = 12;
inline constexpr const char* kOptunaAlembicRevision = "v3.0.0.d";
inline constexpr const char* kOptunaLibraryVersion = "3.1.0";

// A change to a trial that is no longer running (another worker failed it, e.g. while this one
// was paused past the grace period): rejected, as Optuna rejects updates to a finished trial.
class TrialFinishedError : public Error {
 public:
  TrialFinishedError(const std::string& what, std::string why)
      : Error(what), reason(std::move(why)) {}
  std::string reason;  // why the trial was finished ("no heartbeat from its worker ...")
};

struct StudyInfo {
  std::string name, direction, fingerprint;
  std::string space;  // the search space as JSON, for reports
  // What every trial's config holds besides the searched keys (JSON: key -> value as text);
  // empty: not checked.
  std::string trial_config;
};

struct Worker {
  std::string host;
  int64_t pid = 0;
};

// Marks each running trial whose worker was a process of this host that is no longer running
// (Trial::worker_gone): for reports, which otherwise show it running for ever.
void mark_gone_workers(std::vector<Trial>& trials);

class Storage {
 public:
  virtual ~Storage() = default;
  // A path or a postgresql:// URL. Read-only opens never create or change anything.
  static std::unique_ptr<Storage> open(const std::string& where, bool read_only = false);
  // Creates the study, or checks that the stored one is the same (name, direction, space).
  virtual void create_or_check(const StudyInfo& info) = 0;
  // The study's name and settings; nullopt if the database holds none (or not `name`).
  virtual std::optional<StudyInfo> info(const std::string& name = "") = 0;
  // In one transaction: fails running trials whose worker is gone (no heartbeat for
  // `grace_seconds`, or a dead process on this host) and queues a retry of each, then, while
  // fewer than `n_trials` trials are running, complete or pruned, claims the oldest waiting trial
  // or creates the next one. nullopt: the study has its trials.
  // With a `grid`, as Optuna's GridSampler: a new trial takes the first point (in grid->order())
  // that no running or finished trial of the same search space has taken, and none is created
  // once every point is taken; a waiting trial whose fixed parameters are an untaken point takes
  // it. The point is Trial::attrs["grid_id"], stored as Optuna's grid_id and search_space.
  virtual std::optional<Trial> claim(int64_t n_trials, const Worker& worker, double grace_seconds,
                                     const Grid* grid = nullptr) = 0;
  // A waiting trial's fixed parameters (Optuna's enqueue_trial, a retry) come back in
  // Trial::params; the others are sampled. The writes below throw TrialFinishedError when the
  // trial is no longer running.
  virtual void set_params(int64_t trial_id, const std::map<std::string, double>& params) = 0;
  virtual void report(int64_t trial_id, int64_t step, double value) = 0;
  virtual void set_attrs(int64_t trial_id, const std::map<std::string, double>& attrs) = 0;
  virtual void heartbeat(int64_t trial_id) = 0;  // a no-op once the trial is finished
  // With `retry`, a waiting trial of the same parameters is queued in the same transaction (a
  // trial a signal stopped: they run when the study goes on), unless they have failed 3 times.
  // Returns whether one was.
  virtual bool finish(int64_t trial_id, TrialState state, std::optional<double> value,
                      int64_t epochs, const std::string& message, bool retry = false) = 0;
  // Adds a waiting trial with these fixed parameters (config key -> value as text; a categorical
  // by its choice), as optuna's study.enqueue_trial does. Returns its number.
  virtual int64_t enqueue(const std::map<std::string, std::string>& fixed) = 0;
  virtual std::vector<Trial> trials() = 0;
  virtual const std::string& where() const = 0;
};

double now_seconds();
std::string host_name();
// A database URL without its password (postgresql://user:***@host/db), for messages and files.
std::string redacted_url(const std::string& url);

// A categorical choice (YAML text) as the JSON value Optuna holds: 16, 2.5, true, "lstm".
nlohmann::json choice_json(const std::string& text);

// Throws unless `fixed` (config key -> text, as --enqueue gives them) are parameters of `space`
// with values inside it; errors name `where` and `study`.
void check_fixed_params(const std::vector<Param>& space,
                        const std::map<std::string, std::string>& fixed, const std::string& where,
                        const std::string& study);

}  // namespace seqforge::tune
