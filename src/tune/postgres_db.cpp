// PostgreSQL for studies shared by several machines. Writers serialise on one advisory lock per
// transaction, which keeps the trial bookkeeping identical to SQLite's BEGIN IMMEDIATE.
#include "db.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/tune/storage.hpp"

#ifdef SEQFORGE_HAVE_LIBPQ
#include <libpq-fe.h>

#include <cstdio>
#endif

namespace seqforge::tune {

#ifdef SEQFORGE_HAVE_LIBPQ
namespace {

class PostgresDb final : public Db {
 public:
  PostgresDb(const std::string& url, bool read_only) : where_(redacted_url(url)) {
    // A server that accepts the connection and never answers (a stuck proxy, a firewall that
    // drops the packets) would hold the study for ever: the connection gets 10 s and a dead peer
    // is noticed within about a minute, unless the URL says otherwise (its values come later
    // and win).
    const char* keys[] = {
        "connect_timeout",  "keepalives",       "keepalives_idle", "keepalives_interval",
        "keepalives_count", "tcp_user_timeout", "dbname",          nullptr};
    const char* values[] = {"10", "1", "30", "10", "3", "60000", url.c_str(), nullptr};
    conn_ = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
    if (PQstatus(conn_) != CONNECTION_OK) {
      std::string msg = PQerrorMessage(conn_);
      while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
      for (char& c : msg)
        if (c == '\n') c = ' ';
      PQfinish(conn_);
      conn_ = nullptr;
      fail(where_, ": cannot connect to PostgreSQL: ", msg);
    }
    query("SET client_min_messages = warning", {});
    query("SET extra_float_digits = 3", {});  // doubles read back exactly on any server version
    // The session keeps the database's time zone, as Optuna's do: heartbeats are written and
    // read on its LOCALTIMESTAMP.
    if (read_only) query("SET default_transaction_read_only = on", {});
  }
  ~PostgresDb() override {
    if (conn_) PQfinish(conn_);
  }
  std::vector<Row> query(const std::string& sql, const std::vector<Arg>& args) override {
    std::string text;
    int n = 0;
    for (char c : sql) {
      if (c == '?') {
        text += '$';
        text += std::to_string(++n);
      } else {
        text += c;
      }
    }
    std::vector<std::string> reals;
    reals.reserve(args.size());
    std::vector<const char*> values;
    for (const auto& a : args) {
      if (a.is_real) {  // float8 input is correctly rounded: 17 digits read back the same double
        char buf[40];
        std::snprintf(buf, sizeof buf, "%.17g", a.real);
        reals.push_back(buf);
        values.push_back(reals.back().c_str());
      } else {
        values.push_back(a.text ? a.text->c_str() : nullptr);
      }
    }
    PGresult* r = PQexecParams(conn_, text.c_str(), int(values.size()), nullptr, values.data(),
                               nullptr, nullptr, 0);
    const ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
      std::string msg = PQresultErrorMessage(r);
      PQclear(r);
      while (!msg.empty() && msg.back() == '\n') msg.pop_back();
      for (char& c : msg)
        if (c == '\n') c = ' ';
      if (PQstatus(conn_) != CONNECTION_OK) fail(where_, ": lost the PostgreSQL connection: ", msg);
      fail(where_, ": postgresql: ", msg);
    }
    std::vector<Row> rows;
    for (int i = 0, rows_n = PQntuples(r); i < rows_n; ++i) {
      Row row;
      for (int c = 0, cols = PQnfields(r); c < cols; ++c)
        row.push_back(PQgetisnull(r, i, c) ? Value() : Value(PQgetvalue(r, i, c)));
      rows.push_back(std::move(row));
    }
    PQclear(r);
    return rows;
  }
  void begin_write() override {
    query("BEGIN", {});
    try {
      query("SELECT pg_advisory_xact_lock(7300551)", {});  // "seqforge" in spirit: one app lock
    } catch (...) {
      rollback();
      throw;
    }
  }
  void commit() override { query("COMMIT", {}); }
  void rollback() noexcept override {
    if (PQtransactionStatus(conn_) != PQTRANS_IDLE) PQclear(PQexec(conn_, "ROLLBACK"));
  }
  bool postgres() const override { return true; }
  std::vector<std::string> tables() override {
    std::vector<std::string> out;
    for (const auto& r : query("SELECT table_name FROM information_schema.tables "
                               "WHERE table_schema = current_schema()",
                               {}))
      if (r[0]) out.push_back(*r[0]);
    return out;
  }
  const std::string& where() const override { return where_; }

 private:
  std::string where_;
  PGconn* conn_ = nullptr;
};

}  // namespace

std::unique_ptr<Db> open_postgres(const std::string& url, bool read_only) {
  return std::make_unique<PostgresDb>(url, read_only);
}
#else
std::unique_ptr<Db> open_postgres(const std::string& url, bool) {
  fail(url, ": this seqforge was built without PostgreSQL support (install libpq-dev, rebuild)");
}
#endif

}  // namespace seqforge::tune
