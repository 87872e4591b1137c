#include "seqforge/core/autotune.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "seqforge/core/cpu.hpp"

namespace seqforge::autotune {

namespace {

std::mutex mutex;
std::map<std::string, std::string>* table = nullptr;  // loaded on first use

void load_locked() {
  if (table) return;
  table = new std::map<std::string, std::string>();
  std::ifstream in(cache_path());
  if (!in) return;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& [key, value] : j.items())
      if (value.is_string()) (*table)[key] = value.get<std::string>();
  } catch (const std::exception& e) {
    if (verbose())
      std::fprintf(stderr, "seqforge: autotune cache %s unreadable (%s); starting afresh\n",
                   cache_path().c_str(), e.what());
  }
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
  return model + "|" + std::to_string(threads) + " threads|seqforge " SEQFORGE_VERSION "|";
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
  const fs::path path = cache_path();
  const fs::path tmp = path.string() + ".tmp." + std::to_string(getpid());
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  {
    std::ofstream out(tmp);
    out << nlohmann::json(*table).dump(1) << "\n";
    if (!out) ec = std::make_error_code(std::errc::io_error);
  }
  if (!ec) fs::rename(tmp, path, ec);
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
