#include "run_dir.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "run.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

namespace fs = std::filesystem;

// A run with something to lose: a finished epoch's metrics, a model or a training state (a run
// stopped before its first epoch ended left nothing of value).
bool holds_a_run(const fs::path& dir) {
  std::error_code ec;
  const auto metrics = fs::file_size(dir / "metrics.jsonl", ec);
  return (!ec && metrics > 0) || fs::exists(dir / "model.safetensors") ||
         fs::exists(dir / "training_state.safetensors");
}

namespace {

// Whether `name` is a data file the Python package writes into a run directory for an array, a
// frame or texts ("data-" and 16 hex digits of its content's hash), or its temporary: one of an
// earlier call whose training failed is no stranger's file.
bool package_data_file(const std::string& name) {
  if (!name.starts_with("data-") || name.size() < 5 + 16 + 4) return false;
  if (!std::all_of(name.begin() + 5, name.begin() + 21, [](char ch) {
        return std::isdigit(static_cast<unsigned char>(ch)) || (ch >= 'a' && ch <= 'f');
      }))
    return false;
  const std::string rest = name.substr(21);
  for (const char* suffix : {".npy", ".csv", ".txt"})
    if (rest == suffix || rest.starts_with(std::string(suffix) + ".tmp.")) return true;
  return false;
}

// The name of an entry of `dir` that is neither a run's file, its lock, a temporary of one, nor
// the run's data file `data` or another the Python package wrote: a directory such as / or a
// project's own, given as train.run_dir by mistake; "" if none.
std::string other_entry(const fs::path& dir, const fs::path& data) {
  std::error_code ec;
  const fs::path data_file = fs::weakly_canonical(fs::absolute(data), ec);
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == ".lock" || name == "train.log" || package_data_file(name) ||
                      fs::weakly_canonical(fs::absolute(entry.path()), ec) == data_file ||
                      std::any_of(kRunFiles.begin(), kRunFiles.end(), [&](const std::string& f) {
                        return name == f || name.starts_with(f + ".tmp.");
                      });
    if (!ours) return name;
  }
  return "";
}

// An input file the run would delete or replace: one named as a run's file in its directory
// (data.path as val_predictions.csv there, model.init_from as the run itself).
void check_inputs_outside_run_files(const Config& c, const fs::path& dir) {
  std::error_code ec;
  const fs::path run_dir = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec) return;
  for (const ConfigKey& k : config_keys()) {
    if (k.type != ConfigKey::Type::path || k.path == "train.run_dir" ||
        k.path == "augment.cache_dir")
      continue;
    const std::string value = c.str(k.path);
    if (value.empty()) continue;
    fs::path file = fs::weakly_canonical(fs::absolute(value), ec);
    if (ec) continue;
    if (k.path == "model.init_from" && fs::is_directory(file, ec)) file /= "model.safetensors";
    const std::string name = file.filename().string();
    const bool run_file =
        name == ".lock" || name == "train.log" ||
        std::any_of(kRunFiles.begin(), kRunFiles.end(), [&](const std::string& f) {
          return name == f || name.starts_with(f + ".tmp.");
        });
    if (run_file && file.parent_path() == run_dir)
      fail(c.origin(k.path), ": ", k.path, " '", value, "' is a file the run writes in its ",
           "directory ", dir.string(), ", and would be replaced: move it out of ", dir.string(),
           " or give train.run_dir another directory");
  }
}

// Takes `dir`'s lock for this process, or refuses: another process is training in it.
void lock_run_dir(const std::string& dir, io::DirLock* lock) {
  long holder = 0;
  if (!lock->try_lock(dir, &holder)) {
    if (holder == static_cast<long>(::getpid()))
      fail(dir, ": in use: another training of this process (pid ", holder,
           ", another of its threads) is training in it; wait for it to end, or give this one "
           "another directory. Nothing in the directory was changed");
    fail(dir, ": in use: another seqforge process is training in it (",
         holder > 0 ? "pid " + std::to_string(holder) : std::string("its pid not yet written"),
         " holds ", (fs::path(dir) / ".lock").string(),
         "); wait for it to end or stop it. Nothing in the directory was changed");
  }
  io::remove_stale_temporaries(dir, kRunFiles);
}

}  // namespace

std::string new_run_dir(const Config& c, bool overwrite, io::DirLock* lock) {
  std::string dir = c.str("train.run_dir");
  if (!dir.empty()) {
    check_inputs_outside_run_files(c, dir);
    // Checked before the lock, whose file would be left behind.
    if (const std::string other = other_entry(dir, c.str("data.path"));
        !overwrite && !other.empty())
      fail(dir, ": holds files of its own ('", other, "'), not a run's: give train.run_dir a new ",
           "or empty directory, or pass --overwrite to write the run's files beside them");
    lock_run_dir(dir, lock);
    if (!overwrite && holds_a_run(dir))
      fail(dir, ": holds another run's files; pass --overwrite to replace them, or --resume ", dir,
           " to continue that run");
    return dir;
  }
  const fs::path base = fs::path("runs") / fs::path(c.source()).stem();
  if (overwrite) {
    check_inputs_outside_run_files(c, base);
    lock_run_dir(base.string(), lock);
    return base.string();
  }
  for (int version = 1;; ++version) {
    const fs::path p =
        version == 1 ? base : fs::path(base.string() + "-" + std::to_string(version));
    if (holds_a_run(p) || fs::exists(p / "study.json") || fs::exists(p / "study.db"))
      continue;  // a run's, or a tune study's of the same name
    check_inputs_outside_run_files(c, p);
    long holder = 0;
    if (!lock->try_lock(p.string(), &holder)) continue;  // a run under way
    if (!holds_a_run(p)) return p.string();
    lock->release();
  }
}

void lock_resumed_run_dir(const Config& c, const std::string& dir, io::DirLock* lock) {
  check_inputs_outside_run_files(c, dir);
  lock_run_dir(dir, lock);
}

}  // namespace seqforge
