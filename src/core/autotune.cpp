#include "seqforge/core/autotune.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "seqforge/core/cpu.hpp"
#include "seqforge/core/threads.hpp"
#include "seqforge/source_id.hpp"

namespace seqforge::autotune {

namespace {

std::mutex mutex;
std::map<std::string, std::string>* table = nullptr;  // loaded on first use
std::set<std::string>* chosen = nullptr;              // keys this process has stored
std::map<std::string, std::string>* held = nullptr;   // choices timed on shared CPUs: this run's
std::string unwritable;  // why the cache file could not be written, once it could not

// The cache file as this process last read or wrote it, so that a store re-reads the file only
// when another process has written it since (a parse per store would cost more than the races).
struct FileStamp {
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  timespec modified{};
  bool operator==(const FileStamp& o) const {
    return device == o.device && inode == o.inode && size == o.size &&
           modified.tv_sec == o.modified.tv_sec && modified.tv_nsec == o.modified.tv_nsec;
  }
};
std::optional<FileStamp> known_file;

std::optional<FileStamp> stamp_of(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileStamp{st.st_dev, st.st_ino, st.st_size, st.st_mtim};
}

// The cache keeps the choices of this many source trees (builds of different code), the most
// recently stored first, so that a cache shared by a few builds is not timed again each time one
// of them runs, and one that sees many builds does not grow without end.
constexpr size_t kKeptSources = 4;
constexpr const char* kSourcesEntry = "#sources";  // their digests, most recent first

// The entries of the cache file (none if it is missing or unreadable).
std::map<std::string, std::string> read_file() {
  std::map<std::string, std::string> entries;
  known_file = stamp_of(cache_path());  // before the read: a later write is then seen as new
  std::ifstream in(cache_path());
  if (!in) return entries;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& [key, value] : j.items())
      if (value.is_string()) entries[key] = value.get<std::string>();
  } catch (const std::exception& e) {
    if (verbose())
      std::fprintf(stderr, "seqforge: autotune cache %s unreadable (%s); starting afresh\n",
                   cache_path().c_str(), e.what());
  }
  return entries;
}

void load_locked() {
  if (table) return;
  table = new std::map<std::string, std::string>(read_file());
  chosen = new std::set<std::string>();
  held = new std::map<std::string, std::string>();
}

// One look at the runnable tasks of other processes (other_work_now): /proc/stat's procs_running
// less this process's threads in state R (counted before and after, the larger, as its spinning
// threads may go to sleep in between), where with this process's compute threads they outnumber
// the CPUs (else 0).
int other_work_at_a_glance() {
  const auto own_running = [] {
    int n = 0;
    std::error_code ec;
    for (std::filesystem::directory_iterator task("/proc/self/task", ec), end; !ec && task != end;
         task.increment(ec)) {
      // A thread that ends after the listing fails the read (ESRCH): with stdio that is a short
      // read, where a stream's buffer iterator threw it out of the run.
      std::string stat;
      if (FILE* f = std::fopen((task->path() / "stat").c_str(), "r")) {
        char buf[1024];
        stat.assign(buf, std::fread(buf, 1, sizeof buf, f));
        std::fclose(f);
      }
      const size_t name_end = stat.rfind(')');  // the thread's name may hold anything
      if (name_end != std::string::npos && name_end + 2 < stat.size() && stat[name_end + 2] == 'R')
        ++n;
    }
    return n;
  };
  const int before = own_running();
  int running = -1;
  {
    std::ifstream in("/proc/stat");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("procs_running ", 0) == 0) running = std::atoi(line.c_str() + 14);
  }
  const int others = running - std::max(before, own_running());
  return others > 0 && others + compute_threads() > online_cpus() ? others : 0;
}

// Runnable tasks of other processes now: the fewest of three looks 1 ms apart, so that a process
// woken for a moment (the reader of a line just written, a kernel worker) is not taken for a load.
int other_work_now() {
  int fewest = std::numeric_limits<int>::max();
  for (int look = 0; look < 3 && fewest > 0; ++look) {
    if (look > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    fewest = std::min(fewest, other_work_at_a_glance());
  }
  return fewest;
}

// SEQFORGE_AUTOTUNE=always_cache: choices timed on shared CPUs are kept on disk too.
bool always_cache() {
  const char* v = std::getenv("SEQFORGE_AUTOTUNE");
  return v && std::string(v) == "always_cache";
}

// The source digest a key was made under, "" for keys without one (caches of earlier versions).
std::string source_of(const std::string& key) {
  const std::string marker = " sources ";
  const size_t version = key.find("|seqforge ");
  const size_t at = version == std::string::npos ? version : key.find(marker, version);
  if (at == std::string::npos) return "";
  const size_t begin = at + marker.size();
  return key.substr(begin, key.find('|', begin) - begin);
}

// `entries` without the choices of source trees beyond the kKeptSources most recent (this one
// first), and the list of those kept.
void keep_recent_sources(std::map<std::string, std::string>& entries) {
  std::vector<std::string> kept = {SEQFORGE_SOURCE_ID};
  std::istringstream listed(entries[kSourcesEntry]);
  for (std::string id; listed >> id && kept.size() < kKeptSources;)
    if (std::find(kept.begin(), kept.end(), id) == kept.end()) kept.push_back(id);
  std::string list;
  for (const auto& id : kept) list += (list.empty() ? "" : " ") + id;
  std::erase_if(entries, [&](const auto& entry) {
    return entry.first != kSourcesEntry &&
           std::find(kept.begin(), kept.end(), source_of(entry.first)) == kept.end();
  });
  entries[kSourcesEntry] = list;
}

}  // namespace

bool verbose() {
  const char* v = std::getenv("SEQFORGE_VERBOSE");
  return v && *v && std::string(v) != "0";
}

bool enabled() {
  const char* v = std::getenv("SEQFORGE_AUTOTUNE");
  return !(v && std::string(v) == "0");
}

std::string cache_path() {
  namespace fs = std::filesystem;
  fs::path dir;
  if (const char* d = std::getenv("SEQFORGE_CACHE_DIR"); d && *d) {
    dir = d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    dir = fs::path(x) / "seqforge";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    dir = fs::path(h) / ".cache" / "seqforge";
  } else {
    dir = fs::temp_directory_path() / "seqforge";
  }
  return (dir / "autotune.json").string();
}

std::string machine_prefix(int threads) {
  // The tier dispatch reaches: schedules timed under SEQFORGE_MAX_ISA=avx2 are not the machine's.
  static const std::string model = cpu_model() + " up to " + isa_tier_name(isa_tier());
  return model + "|" + std::to_string(threads) +
         " threads|seqforge " SEQFORGE_VERSION " sources " SEQFORGE_SOURCE_ID "|";
}

std::optional<std::string> lookup(const std::string& key) {
  std::lock_guard lock(mutex);
  load_locked();
  if (auto it = table->find(key); it != table->end()) return it->second;
  if (auto it = held->find(key); it != held->end()) return it->second;
  return std::nullopt;
}

Timing::Timing() : start_(other_work_now()) {}

int Timing::other_work() const { return start_ > 0 ? std::min(start_, other_work_now()) : 0; }

std::string where_kept(const std::string& key) {
  std::lock_guard lock(mutex);
  load_locked();
  if (held->count(key) && !table->count(key)) return "this run only: timed on shared CPUs";
  if (!unwritable.empty()) return "this run only: " + unwritable;
  return "cached in " + cache_path();
}

void announce_first_use(const std::string& what) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr,
                 "seqforge: autotune: timing %s on first use (once per shape on this machine; "
                 "choices are cached in %s)\n",
                 what.c_str(), cache_path().c_str());
  });
}

void store(const std::string& key, const std::string& choice, const Timing& timing) {
  namespace fs = std::filesystem;
  if (const int others = timing.other_work(); others > 0 && !always_cache()) {
    std::lock_guard lock(mutex);
    load_locked();
    (*held)[key] = choice;
    static bool said = false;
    if (!said && !verbose())
      std::fprintf(stderr,
                   "seqforge: autotune: other processes were running on these CPUs while choices "
                   "were timed (%d runnable): they serve this run only, and the next run times "
                   "them again\n",
                   others);
    said = true;
    return;
  }
  std::lock_guard lock(mutex);
  load_locked();
  (*table)[key] = choice;
  chosen->insert(key);
  const fs::path path = cache_path();
  // What other processes have stored since this one last read or wrote the file stays, under
  // this process's own choices.
  const std::optional<FileStamp> now = stamp_of(path);
  if (now && !(known_file && *now == *known_file)) {
    std::map<std::string, std::string> merged = read_file();
    for (const auto& k : *chosen) merged[k] = (*table)[k];
    *table = std::move(merged);
  }
  keep_recent_sources(*table);
  const fs::path tmp = path.string() + ".tmp." + std::to_string(getpid());
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (!ec) {
    errno = 0;
    std::ofstream out(tmp);
    out << nlohmann::json(*table).dump(1) << "\n";
    if (!out) ec = std::error_code(errno ? errno : EIO, std::generic_category());
  }
  if (!ec) fs::rename(tmp, path, ec);
  if (!ec) {
    known_file = stamp_of(path);
    unwritable.clear();
  }
  if (ec) {
    const bool first = unwritable.empty();
    unwritable = "cannot write " + path.string() + " (" + ec.message() + ")";
    fs::remove(tmp, ec);
    if (first)  // else every run times its choices again, unsaid
      std::fprintf(stderr,
                   "seqforge: autotune: %s: the choices serve this run only, and the next run "
                   "times them again (SEQFORGE_CACHE_DIR names a writable directory)\n",
                   unwritable.c_str());
  }
}

}  // namespace seqforge::autotune
