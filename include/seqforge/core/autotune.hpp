#pragma once
// The autotuning cache: choices measured once per problem on this machine, kept on disk
// (SEQFORGE_CACHE_DIR, else $XDG_CACHE_HOME/seqforge, else ~/.cache/seqforge; autotune.json),
// the way cudnn.benchmark keeps its choice per shape. Keys include the CPU model, the thread count,
// the seqforge version and a digest of its sources, so a cache copied to another machine, or
// written by other code (an upgrade, a rebuild with changed kernels), is simply not hit; the file
// keeps the choices of the four source trees that stored last. A store merges with what other
// processes have stored in the meantime.
#include <optional>
#include <string>

namespace seqforge::autotune {

// The cached choice for `key`, if any.
std::optional<std::string> lookup(const std::string& key);

// Whether other processes' work shared the CPUs while a choice was being timed: tasks of other
// processes runnable, as many as this process's compute threads leave no CPU for, when the timing
// began and when it ended. A choice timed on shared CPUs reflects the load as much as the
// candidates (two threads' schedule loses to one thread's while another process holds a core), so
// it is not kept for later runs.
class Timing {
 public:
  Timing();
  // Other processes' runnable tasks at the start and now, where they and this process's compute
  // threads outnumbered the CPUs both times (the fewer of the two counts), else 0.
  int other_work() const;

 private:
  int start_;
};

// Records a choice timed under `timing`: in memory and, atomically, on disk (a cache that cannot
// be written is reported once under SEQFORGE_VERBOSE and otherwise ignored). A choice timed on
// shared CPUs serves this process only, and the next run times it again (said once on standard
// error); SEQFORGE_AUTOTUNE=always_cache keeps those on disk too, for test suites that run in
// parallel and need their processes to agree.
void store(const std::string& key, const std::string& choice, const Timing& timing);
// Where the choice for `key` is kept, for SEQFORGE_VERBOSE's lines: "cached in <path>", or "this
// run only: timed on shared CPUs".
std::string where_kept(const std::string& key);
// Prefix for keys: "<cpu model> up to <tier>|<threads> threads|seqforge <version> sources
// <digest>|".
std::string machine_prefix(int threads);
// Says once per process, on standard error, that `what` is being timed on its first use and
// that the choice will be cached (first runs are slower by that much).
void announce_first_use(const std::string& what);
// SEQFORGE_VERBOSE is set (to anything but 0).
bool verbose();
// Whether tuning is on (SEQFORGE_AUTOTUNE=0 turns it off: the default choices are used).
bool enabled();
// The cache file's path.
std::string cache_path();

}  // namespace seqforge::autotune
