#pragma once
// The little SQL the study storage needs, over SQLite or PostgreSQL: text or double parameters
// ('?'), rows of optional text (a double column reads back as text that parses to the same
// double), and an exclusive write transaction.
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace seqforge::tune {

using Value = std::optional<std::string>;
using Row = std::vector<Value>;

// A statement parameter: text (or NULL), or a double bound as a number so a FLOAT column keeps it
// exactly.
struct Arg {
  Value text;
  bool is_real = false;
  double real = 0;
  Arg(Value v) : text(std::move(v)) {}
  Arg(std::string v) : text(std::move(v)) {}
  Arg(const char* v) : text(std::string(v)) {}
  static Arg number(double v) {
    Arg a{Value()};
    a.is_real = true;
    a.real = v;
    return a;
  }
};

class Db {
 public:
  virtual ~Db() = default;
  virtual std::vector<Row> query(const std::string& sql, const std::vector<Arg>& args = {}) = 0;
  // A write transaction that excludes every other writer until commit or rollback.
  virtual void begin_write() = 0;
  virtual void commit() = 0;
  virtual void rollback() noexcept = 0;
  virtual bool postgres() const = 0;
  virtual std::vector<std::string> tables() = 0;  // the database's tables (current schema)
  virtual const std::string& where() const = 0;   // for messages
};

std::unique_ptr<Db> open_sqlite(const std::string& path, bool read_only, int busy_timeout_ms);
// Throws a clear error when seqforge was built without libpq.
std::unique_ptr<Db> open_postgres(const std::string& url, bool read_only);

// Creates Optuna's study schema (tables, indexes, PostgreSQL enum types, version rows) in `db`,
// in the caller's transaction.
void create_optuna_schema(Db& db);

}  // namespace seqforge::tune
