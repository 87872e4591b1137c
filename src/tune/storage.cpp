// The study storage over SQL (SQLite or PostgreSQL). Numbers are stored as text ("%.17g") so
// values round-trip exactly on both databases; NaN is "nan".
#include "seqforge/tune/storage.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "db.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::tune {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

namespace {

std::string num(double v) {
  if (std::isnan(v)) return "nan";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
double real(const Value& v) { return v ? std::strtod(v->c_str(), nullptr) : 0.0; }
int64_t integer(const Value& v) { return v ? std::strtoll(v->c_str(), nullptr, 10) : 0; }

std::string to_json(const std::map<std::string, double>& m) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : m) j[k] = v;
  return j.dump();
}
std::map<std::string, double> from_json(const Value& v) {
  std::map<std::string, double> out;
  if (!v || v->empty()) return out;
  const auto j = nlohmann::json::parse(*v, nullptr, false);
  if (!j.is_object()) return out;
  for (const auto& [k, x] : j.items())
    if (x.is_number()) out[k] = x.get<double>();
  return out;
}

bool process_gone(int64_t pid) { return pid > 0 && kill(pid_t(pid), 0) != 0 && errno == ESRCH; }

constexpr const char* kTrialColumns =
    "id, number, state, value, params, attrs, started, finished, heartbeat, epochs, host, pid, "
    "message";

class SqlStorage final : public Storage {
 public:
  SqlStorage(std::unique_ptr<Db> db, bool read_only) : db_(std::move(db)), read_only_(read_only) {
    check_schema();
  }

  void create_or_check(const StudyInfo& info) override {
    write([&] {
      const auto rows = db_->query("SELECT name, direction, fingerprint FROM seqforge_studies");
      for (const auto& r : rows) {
        if (*r[0] != info.name) {
          if (!db_->postgres())
            fail(where(), ": this study file holds study '", *r[0], "', not '", info.name,
                 "' (give another --study file)");
          continue;
        }
        if (*r[1] != info.direction)
          fail(where(), ": study '", info.name, "' was created to ", *r[1], ", not to ",
               info.direction);
        if (*r[2] != info.fingerprint)
          fail(where(), ": study '", info.name,
               "' was created with another metric or search space (stored: ", *r[2],
               "; config: ", info.fingerprint, "); use a new study name or file");
        study_ = info.name;
        return;
      }
      db_->query(
          "INSERT INTO seqforge_studies (name, direction, fingerprint, space, created) "
          "VALUES (?, ?, ?, ?, ?)",
          {info.name, info.direction, info.fingerprint, info.space, num(now_seconds())});
      study_ = info.name;
    });
  }

  std::optional<StudyInfo> info(const std::string& name) override {
    for (const auto& r : db_->query("SELECT name, direction, fingerprint, space FROM "
                                    "seqforge_studies ORDER BY created")) {
      if (!name.empty() && *r[0] != name) continue;
      study_ = *r[0];
      return StudyInfo{*r[0], *r[1], *r[2], r[3].value_or("[]")};
    }
    return std::nullopt;
  }

  std::optional<Trial> claim(int64_t n_trials, const Worker& worker, double grace,
                             bool count_failed) override {
    std::optional<Trial> out;
    write([&] {
      const double now = now_seconds();
      for (const auto& r :
           db_->query("SELECT id, number, host, pid, heartbeat, params, attrs FROM seqforge_trials "
                      "WHERE study = ? AND state = 'running'",
                      {study_})) {
        const double idle = now - real(r[4]);
        const bool dead = r[2] && *r[2] == worker.host && process_gone(integer(r[3]));
        if (idle <= grace && !dead) continue;
        const std::string why =
            dead ? "its worker (" + r[2].value_or("?") + " pid " + r[3].value_or("?") + ") died"
                 : "no heartbeat from its worker (" + r[2].value_or("?") + " pid " +
                       r[3].value_or("?") + ") for " + std::to_string(int64_t(idle)) + " s";
        db_->query(
            "UPDATE seqforge_trials SET state = 'failed', finished = ?, message = ? "
            "WHERE id = ?",
            {num(now), why, *r[0]});
        std::map<std::string, double> attrs = from_json(r[6]);
        const double retries = attrs.count("retries") ? attrs["retries"] : 0;
        if (r[5] && retries < 2) {  // run its parameters again
          std::map<std::string, double> a{{"retries", retries + 1},
                                          {"retry_of", double(integer(r[1]))}};
          db_->query(
              "INSERT INTO seqforge_trials (study, number, state, params, attrs) "
              "VALUES (?, ?, 'waiting', ?, ?)",
              {study_, std::to_string(next_number()), *r[5], to_json(a)});
        }
      }
      const auto waiting = db_->query(
          "SELECT id FROM seqforge_trials WHERE study = ? AND state = 'waiting' "
          "ORDER BY number LIMIT 1",
          {study_});
      std::string id;
      if (!waiting.empty()) {
        id = *waiting[0][0];
        db_->query(
            "UPDATE seqforge_trials SET state = 'running', started = ?, heartbeat = ?, "
            "host = ?, pid = ? WHERE id = ?",
            {num(now), num(now), worker.host, std::to_string(worker.pid), id});
      } else {
        const auto count = db_->query(
            std::string("SELECT count(*) FROM seqforge_trials WHERE study = ? AND state IN "
                        "('running', 'complete', 'pruned'") +
                (count_failed ? ", 'failed')" : ")"),
            {study_});
        if (integer(count[0][0]) >= n_trials) return;
        const auto ins = db_->query(
            "INSERT INTO seqforge_trials (study, number, state, started, heartbeat, host, pid, "
            "attrs) VALUES (?, ?, 'running', ?, ?, ?, ?, '{}') RETURNING id",
            {study_, std::to_string(next_number()), num(now), num(now), worker.host,
             std::to_string(worker.pid)});
        id = *ins[0][0];
      }
      out = load_one(id);
    });
    return out;
  }

  void set_params(int64_t id, const std::map<std::string, double>& params) override {
    db_->query("UPDATE seqforge_trials SET params = ? WHERE id = ?",
               {to_json(params), std::to_string(id)});
  }

  void report(int64_t id, int64_t step, double value) override {
    db_->query(
        "INSERT INTO seqforge_intermediate (trial_id, step, value) VALUES (?, ?, ?) "
        "ON CONFLICT DO NOTHING",
        {std::to_string(id), std::to_string(step), num(value)});
  }

  void set_attrs(int64_t id, const std::map<std::string, double>& attrs) override {
    if (attrs.empty()) return;
    write([&] {
      const auto r =
          db_->query("SELECT attrs FROM seqforge_trials WHERE id = ?", {std::to_string(id)});
      std::map<std::string, double> all =
          r.empty() ? std::map<std::string, double>{} : from_json(r[0][0]);
      for (const auto& [k, v] : attrs) all[k] = v;
      db_->query("UPDATE seqforge_trials SET attrs = ? WHERE id = ?",
                 {to_json(all), std::to_string(id)});
    });
  }

  void heartbeat(int64_t id) override {
    db_->query("UPDATE seqforge_trials SET heartbeat = ? WHERE id = ? AND state = 'running'",
               {num(now_seconds()), std::to_string(id)});
  }

  void finish(int64_t id, TrialState state, std::optional<double> value, int64_t epochs,
              const std::string& message) override {
    write([&] {
      const auto r = db_->query("SELECT number, state FROM seqforge_trials WHERE id = ?",
                                {std::to_string(id)});
      if (r.empty()) fail(where(), ": trial row ", id, " vanished from the study");
      // A trial taken for dead that finishes after all keeps its result; its queued retry goes.
      if (*r[0][1] == "failed" && state != TrialState::failed) {
        for (const auto& w : db_->query("SELECT id, attrs FROM seqforge_trials WHERE study = ? "
                                        "AND state = 'waiting'",
                                        {study_})) {
          const auto a = from_json(w[1]);
          if (a.count("retry_of") && int64_t(a.at("retry_of")) == integer(r[0][0]))
            db_->query("DELETE FROM seqforge_trials WHERE id = ?", {*w[0]});
        }
      }
      db_->query(
          "UPDATE seqforge_trials SET state = ?, value = ?, epochs = ?, message = ?, "
          "finished = ? WHERE id = ?",
          {std::string(state_name(state)), value ? Value(num(*value)) : Value(),
           std::to_string(epochs), message, num(now_seconds()), std::to_string(id)});
    });
  }

  std::vector<Trial> trials() override {
    std::vector<Trial> out;
    std::map<int64_t, size_t> index;
    for (const auto& r : db_->query(std::string("SELECT ") + kTrialColumns +
                                        " FROM seqforge_trials WHERE study = ? ORDER BY number",
                                    {study_})) {
      index[integer(r[0])] = out.size();
      out.push_back(parse(r));
    }
    for (const auto& r :
         db_->query("SELECT i.trial_id, i.step, i.value FROM seqforge_intermediate i "
                    "JOIN seqforge_trials t ON t.id = i.trial_id WHERE t.study = ?",
                    {study_})) {
      auto it = index.find(integer(r[0]));
      if (it != index.end()) out[it->second].intermediate[integer(r[1])] = real(r[2]);
    }
    return out;
  }

  const std::string& where() const override { return db_->where(); }

 private:
  template <typename F>
  void write(F&& f) {
    if (read_only_) fail(where(), ": opened read-only");
    db_->begin_write();
    try {
      f();
      db_->commit();
    } catch (...) {
      db_->rollback();
      throw;
    }
  }

  int64_t next_number() {
    const auto r = db_->query("SELECT max(number) FROM seqforge_trials WHERE study = ?", {study_});
    return r.empty() || !r[0][0] ? 0 : integer(r[0][0]) + 1;
  }

  Trial parse(const Row& r) const {
    Trial t;
    t.id = integer(r[0]);
    t.number = integer(r[1]);
    t.state = state_of(r[2].value_or(""));
    if (r[3]) t.value = real(r[3]);
    t.params = from_json(r[4]);
    t.attrs = from_json(r[5]);
    t.started = real(r[6]);
    t.finished = real(r[7]);
    t.heartbeat = real(r[8]);
    t.epochs = integer(r[9]);
    t.host = r[10].value_or("");
    t.pid = integer(r[11]);
    t.message = r[12].value_or("");
    return t;
  }

  Trial load_one(const std::string& id) {
    const auto r = db_->query(
        std::string("SELECT ") + kTrialColumns + " FROM seqforge_trials WHERE id = ?", {id});
    SF_CHECK(!r.empty(), "trial ", id);
    Trial t = parse(r[0]);
    for (const auto& i :
         db_->query("SELECT step, value FROM seqforge_intermediate WHERE trial_id = ?", {id}))
      t.intermediate[integer(i[0])] = real(i[1]);
    return t;
  }

  void check_schema() {
    auto has = [](const std::vector<std::string>& t, const std::string& n) {
      return std::find(t.begin(), t.end(), n) != t.end();
    };
    std::vector<std::string> tables = db_->tables();
    if (!has(tables, "seqforge_meta")) {
      if (!tables.empty() && !db_->postgres()) {
        std::string list;
        for (const auto& t : tables) list += (list.empty() ? "" : ", ") + t;
        fail(where(), ": not a seqforge study database (it holds tables ", list, ")");
      }
      if (read_only_) fail(where(), ": holds no seqforge study");
      write([&] {
        tables = db_->tables();  // another worker may have created it meanwhile
        if (has(tables, "seqforge_meta")) return;
        const bool pg = db_->postgres();
        const std::string id = pg ? "BIGSERIAL PRIMARY KEY" : "INTEGER PRIMARY KEY AUTOINCREMENT";
        const std::string big = pg ? "BIGINT" : "INTEGER";
        db_->query("CREATE TABLE seqforge_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)");
        db_->query(
            "CREATE TABLE seqforge_studies (name TEXT PRIMARY KEY, direction TEXT NOT "
            "NULL, fingerprint TEXT NOT NULL, space TEXT, created TEXT)");
        db_->query("CREATE TABLE seqforge_trials (id " + id + ", study TEXT NOT NULL, number " +
                   big +
                   " NOT NULL, state TEXT NOT NULL, value TEXT, params TEXT, attrs TEXT, started "
                   "TEXT, finished TEXT, heartbeat TEXT, epochs " +
                   big + ", host TEXT, pid " + big + ", message TEXT, UNIQUE (study, number))");
        db_->query("CREATE TABLE seqforge_intermediate (trial_id " + big + " NOT NULL, step " +
                   big + " NOT NULL, value TEXT, PRIMARY KEY (trial_id, step))");
        db_->query("INSERT INTO seqforge_meta (key, value) VALUES ('schema_version', ?)",
                   {std::to_string(kSchemaVersion)});
      });
      return;
    }
    const auto r = db_->query("SELECT value FROM seqforge_meta WHERE key = 'schema_version'");
    const int64_t v = r.empty() ? -1 : integer(r[0][0]);
    if (v != kSchemaVersion)
      fail(where(), ": study database schema version ", v, "; this seqforge reads version ",
           kSchemaVersion);
  }

  std::unique_ptr<Db> db_;
  bool read_only_;
  std::string study_;
};

}  // namespace

std::unique_ptr<Storage> Storage::open(const std::string& where, bool read_only) {
  if (where.rfind("postgresql://", 0) == 0 || where.rfind("postgres://", 0) == 0)
    return std::make_unique<SqlStorage>(open_postgres(where, read_only), read_only);
  int timeout_ms = 30000;
  if (const char* e = std::getenv("SEQFORGE_TUNE_BUSY_TIMEOUT_MS")) timeout_ms = std::atoi(e);
  return std::make_unique<SqlStorage>(open_sqlite(where, read_only, timeout_ms), read_only);
}

}  // namespace seqforge::tune
