// SQLite for study files: WAL so readers never block the writer, a busy timeout so concurrent
// workers wait for each other instead of failing, BEGIN IMMEDIATE for every read-modify-write.
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "db.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::tune {

namespace {

class SqliteDb final : public Db {
 public:
  SqliteDb(const std::string& path, bool read_only, int busy_timeout_ms)
      : path_(path), timeout_ms_(busy_timeout_ms) {
    namespace fs = std::filesystem;
    if (fs::is_directory(path))
      fail(path, ": is a directory; a study is a database file in it, e.g. ",
           (fs::path(path) / "study.db").string());
    if (read_only && !fs::exists(path)) fail(path, ": no such study file");
    if (fs::exists(path) && !fs::is_regular_file(path))
      fail(path, ": not a regular file; a study is a database file");
    if (!read_only && fs::exists(path) && access(path.c_str(), W_OK) != 0)
      fail(path, ": the study database is read-only (no write permission)");
    if (!read_only) {
      const fs::path dir = fs::absolute(path).parent_path();
      if (!fs::is_directory(dir))
        fail(path, ": the study's directory ", dir.string(), " does not exist");
      if (access(dir.c_str(), W_OK) != 0)
        fail(path, ": cannot write in ", dir.string(),
             " (SQLite needs the directory for its WAL and lock files)");
    }
    const int flags = read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    if (sqlite3_open_v2(path.c_str(), &db_, flags | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
      const std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      db_ = nullptr;
      fail(path, ": cannot open the study database: ", msg);
    }
    sqlite3_busy_timeout(db_, timeout_ms_);
    try {
      if (!read_only) {
        if (sqlite3_db_readonly(db_, "main") == 1)
          fail(path, ": the study database is read-only (no write permission)");
        switch_to_wal();
        query("PRAGMA synchronous=NORMAL", {});
      } else {
        query("SELECT count(*) FROM sqlite_master", {});
      }
    } catch (...) {
      sqlite3_close(db_);
      db_ = nullptr;
      throw;
    }
  }
  ~SqliteDb() override {
    if (db_) sqlite3_close(db_);
  }

  std::vector<Row> query(const std::string& sql, const std::vector<Arg>& args) override {
    sqlite3_stmt* st = nullptr;
    int rc = sqlite3_prepare_v2(db_, sql.c_str(), int(sql.size()), &st, nullptr);
    if (rc != SQLITE_OK) raise(rc, sql);
    std::vector<Row> rows;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].is_real)
        sqlite3_bind_double(st, int(i + 1), args[i].real);
      else if (args[i].text)
        sqlite3_bind_text(st, int(i + 1), args[i].text->c_str(), int(args[i].text->size()),
                          SQLITE_TRANSIENT);
      else
        sqlite3_bind_null(st, int(i + 1));
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      Row row;
      for (int c = 0, n = sqlite3_column_count(st); c < n; ++c) {
        if (sqlite3_column_type(st, c) == SQLITE_FLOAT) {  // SQLite's own text keeps 15 digits
          char buf[40];
          std::snprintf(buf, sizeof buf, "%.17g", sqlite3_column_double(st, c));
          row.push_back(Value(buf));
          continue;
        }
        const unsigned char* t = sqlite3_column_text(st, c);
        row.push_back(t ? Value(reinterpret_cast<const char*>(t)) : Value());
      }
      rows.push_back(std::move(row));
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) raise(rc, sql);
    return rows;
  }
  void begin_write() override { query("BEGIN IMMEDIATE", {}); }
  void commit() override { query("COMMIT", {}); }
  void rollback() noexcept override {
    if (!sqlite3_get_autocommit(db_)) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  bool postgres() const override { return false; }
  std::vector<std::string> tables() override {
    std::vector<std::string> out;
    for (const auto& r : query("SELECT name FROM sqlite_master WHERE type = 'table'", {}))
      if (r[0] && r[0]->rfind("sqlite_", 0) != 0) out.push_back(*r[0]);
    return out;
  }
  const std::string& where() const override { return path_; }

 private:
  // Workers opening a new study file at the same time race to switch it to WAL, and SQLite
  // reports the loser busy at once instead of calling the busy handler: retry until the timeout.
  void switch_to_wal() {
    const char* sql = "PRAGMA journal_mode=WAL";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    for (;;) {
      const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
      if (rc == SQLITE_OK) return;
      const int code = rc & 0xff;
      if ((code != SQLITE_BUSY && code != SQLITE_LOCKED) ||
          std::chrono::steady_clock::now() >= deadline)
        raise(rc, sql);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  [[noreturn]] void raise(int rc, const std::string& sql) {
    const int code = rc & 0xff;
    const std::string msg = sqlite3_errmsg(db_);
    if (code == SQLITE_BUSY || code == SQLITE_LOCKED)
      fail(path_, ": the study database stayed locked by another process for ",
           timeout_ms_ / 1000.0, " s (", msg, ")");
    if (code == SQLITE_READONLY) fail(path_, ": the study database is read-only (", msg, ")");
    if (code == SQLITE_NOTADB) fail(path_, ": not a seqforge study database (", msg, ")");
    if (code == SQLITE_CORRUPT) fail(path_, ": the study database is corrupt (", msg, ")");
    fail(path_, ": sqlite: ", msg, " (in: ", sql.substr(0, 60), ")");
  }
  std::string path_;
  int timeout_ms_;
  sqlite3* db_ = nullptr;
};

}  // namespace

std::unique_ptr<Db> open_sqlite(const std::string& path, bool read_only, int busy_timeout_ms) {
  return std::make_unique<SqliteDb>(path, read_only, busy_timeout_ms);
}

}  // namespace seqforge::tune
