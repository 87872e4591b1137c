#include "seqforge/core/autotune.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "seqforge/core/cpu.hpp"
#include "seqforge/source_id.hpp"

namespace seqforge::autotune {

namespace {

std::mutex mutex;
std::map<std::string, std::string>* table = nullptr;  // loaded on first use
std::set<std::string>* chosen = nullptr;              // keys this process has stored

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
  auto it = table->find(key);
  if (it == table->end()) return std::nullopt;
  return it->second;
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

void store(const std::string& key, const std::string& choice) {
  namespace fs = std::filesystem;
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
  {
    std::ofstream out(tmp);
    out << nlohmann::json(*table).dump(1) << "\n";
    if (!out) ec = std::make_error_code(std::errc::io_error);
  }
  if (!ec) fs::rename(tmp, path, ec);
  if (!ec) known_file = stamp_of(path);
  if (ec) {
    fs::remove(tmp, ec);
    static bool reported = false;
    if (verbose() && !reported) {
      reported = true;
      std::fprintf(stderr, "seqforge: cannot write autotune cache %s; choices kept in memory\n",
                   path.c_str());
    }
  }
}

}  // namespace seqforge::autotune
