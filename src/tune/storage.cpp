// The study storage over SQL (SQLite or PostgreSQL) in Optuna's RDB schema (Optuna 3.x, schema
// version 12, alembic v3.0.0.d), created here exactly as Optuna's SQLAlchemy models create it.
//
// What goes where:
//   studies, study_directions (objective 0)          the study and its direction
//   study_system_attributes seqforge:fingerprint      what makes trials comparable
//                           seqforge:space            the search space (seqforge's JSON)
//   trials (state RUNNING/COMPLETE/PRUNED/FAIL/WAITING, datetimes in local time as Optuna)
//   trial_params            a parameter's value in Optuna's internal form (a categorical's index
//                           into its choices) with its distribution_json
//   trial_values, trial_intermediate_values           doubles; +-inf and NaN as Optuna's types
//   trial_heartbeats        UTC, as Optuna's heartbeat
//   trial_system_attributes seqforge:host, seqforge:pid, seqforge:epochs, seqforge:message,
//                           seqforge:<driver number> (retries, retry_of, seconds, ...);
//                           fixed_params (Optuna's enqueue_trial), completed_rung_<k> (Optuna's
//                           successive halving key, shared with Optuna's pruner), grid_id and
//                           search_space (Optuna's GridSampler: a grid trial's point)
// Doubles are bound as doubles and read back with 17 digits, so values round-trip exactly.
#include "seqforge/tune/storage.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "db.hpp"
#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/train/config.hpp"
#include "seqforge/tune/samplers.hpp"
#include "seqforge/tune/space.hpp"

namespace seqforge::tune {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

std::string redacted_url(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t begin = scheme + 3, host = url.find_first_of("@/", begin);
  if (host == std::string::npos || url[host] != '@') return url;
  const size_t colon = url.find(':', begin);
  if (colon == std::string::npos || colon > host) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(host);
}

namespace {

using json = nlohmann::json;

constexpr const char* kPrefix = "seqforge:";

double real(const Value& v) {
  if (!v) return 0.0;
  const std::string& s = *v;
  if (s == "NaN" || s == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "Infinity" || s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-Infinity" || s == "-inf") return -std::numeric_limits<double>::infinity();
  return io::parse_double(s).value_or(0.0);
}
int64_t integer(const Value& v) { return v ? std::strtoll(v->c_str(), nullptr, 10) : 0; }
std::string str(int64_t v) { return std::to_string(v); }

// Datetimes as SQLAlchemy writes them: "YYYY-MM-DD HH:MM:SS.ffffff". Optuna's datetime_start and
// datetime_complete are local time (datetime.now()), its heartbeats UTC (the database's clock).
std::string datetime_text(double seconds, bool utc) {
  const time_t whole = time_t(std::floor(seconds));
  int64_t micro = int64_t(std::llround((seconds - double(whole)) * 1e6));
  time_t t = whole;
  if (micro >= 1000000) ++t, micro -= 1000000;
  std::tm tm{};
  if (utc)
    gmtime_r(&t, &tm);
  else
    localtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02d %02d:%02d:%02d.%06lld", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long long)micro);
  return buf;
}
double datetime_seconds(const Value& v, bool utc) {
  if (!v || v->size() < 19) return 0;
  std::tm tm{};
  double frac = 0;
  int sec = 0;
  if (std::sscanf(v->c_str(), "%d-%d-%d%*c%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &sec) != 6)
    return 0;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  tm.tm_sec = sec;
  tm.tm_isdst = -1;
  if (v->size() > 19 && (*v)[19] == '.')
    frac = io::parse_double(std::string_view(*v).substr(19)).value_or(0.0);
  const time_t t = utc ? timegm(&tm) : mktime(&tm);
  return double(t) + frac;
}

// A process that no longer runs: none has the pid, or it is a zombie (its parent, perhaps the
// worker that started it with tune.trials_per_device, has not reaped it yet).
bool process_gone(int64_t pid) {
  if (pid <= 0) return false;
  if (kill(pid_t(pid), 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t name_end = line.rfind(')');  // the state follows the parenthesised name
  return name_end != std::string::npos && name_end + 2 < line.size() &&
         (line[name_end + 2] == 'Z' || line[name_end + 2] == 'X');
}

TrialState state_from_optuna(const std::string& s, const std::string& where) {
  if (s == "WAITING") return TrialState::waiting;
  if (s == "RUNNING") return TrialState::running;
  if (s == "COMPLETE") return TrialState::complete;
  if (s == "PRUNED") return TrialState::pruned;
  if (s == "FAIL") return TrialState::failed;
  fail(where, ": unknown trial state '", s, "' in the study database");
}

// A double as Optuna stores it: (value or NULL, FINITE / INF_POS / INF_NEG / NAN).
std::pair<Arg, std::string> typed_value(double v) {
  if (std::isnan(v)) return {Arg(Value()), "NAN"};
  if (std::isinf(v)) return {Arg(Value()), v > 0 ? "INF_POS" : "INF_NEG"};
  return {Arg::number(v), "FINITE"};
}
// A number stored in the study file, or nullopt when it is not one (NULL, text).
std::optional<double> stored_number(const Value& v) {
  if (!v) return std::nullopt;
  const std::string& s = *v;
  if (s == "NaN" || s == "nan" || s == "Infinity" || s == "inf" || s == "-Infinity" || s == "-inf")
    return real(v);
  return io::parse_double(s);
}

// Optuna's (value, value_type) pair; nullopt when a FINITE value is not a number.
std::optional<double> from_typed(const Value& v, const Value& type) {
  const std::string t = type.value_or("FINITE");
  if (t == "NAN") return std::numeric_limits<double>::quiet_NaN();
  if (t == "INF_POS") return std::numeric_limits<double>::infinity();
  if (t == "INF_NEG") return -std::numeric_limits<double>::infinity();
  return stored_number(v);
}

bool same_choice(const json& a, const json& b) {
  if (a.is_number() && b.is_number() && !a.is_boolean() && !b.is_boolean())
    return a.get<double>() == b.get<double>();
  return a == b;
}

json distribution(const Param& p) {
  json attrs;
  if (p.kind == Param::Kind::categorical) {
    json choices = json::array();
    for (const auto& c : p.choices) choices.push_back(choice_json(c));
    return {{"name", "CategoricalDistribution"}, {"attributes", {{"choices", choices}}}};
  }
  if (p.kind == Param::Kind::integer)
    return {{"name", "IntDistribution"},
            {"attributes",
             {{"log", p.log},
              {"step", int64_t(p.step > 0 ? p.step : 1)},
              {"low", int64_t(p.low)},
              {"high", int64_t(p.high)}}}};
  return {{"name", "FloatDistribution"},
          {"attributes",
           {{"step", p.step > 0 ? json(p.step) : json(nullptr)},
            {"low", p.low},
            {"high", p.high},
            {"log", p.log}}}};
}

// The parameter an Optuna distribution describes (for studies Optuna created).
std::optional<Param> param_of(const std::string& name, const std::string& distribution_json) {
  const json d = json::parse(distribution_json, nullptr, false);
  if (!d.is_object() || !d.contains("attributes")) return std::nullopt;
  const std::string kind = d.value("name", "");
  const json& a = d["attributes"];
  Param p;
  p.name = name;
  if (kind == "CategoricalDistribution") {
    p.kind = Param::Kind::categorical;
    for (const auto& c : a.value("choices", json::array()))
      p.choices.push_back(c.is_string() ? c.get<std::string>() : c.dump());
    return p;
  }
  auto number = [&](const char* k) {
    return a.contains(k) && a[k].is_number() ? a[k].get<double>() : 0.0;
  };
  p.low = number("low");
  p.high = number("high");
  p.log = a.value("log", false);
  if (kind == "IntDistribution" || kind == "IntUniformDistribution" ||
      kind == "IntLogUniformDistribution") {
    p.kind = Param::Kind::integer;
    p.step = a.contains("step") && a["step"].is_number() ? a["step"].get<double>() : 1;
    if (kind == "IntLogUniformDistribution") p.log = true;
  } else {
    p.kind = Param::Kind::floating;
    p.step = number("step");
    if (kind == "LogUniformDistribution") p.log = true;
    if (kind == "DiscreteUniformDistribution") p.step = number("q");
  }
  return p;
}

const Param* find_param(const std::vector<Param>& space, const std::string& name) {
  for (const auto& p : space)
    if (p.name == name) return &p;
  return nullptr;
}

// A parameter value by value (categoricals as their choice), as Optuna's fixed_params holds it.
json value_json(const Param* p, double v) {
  if (!p) return v;
  if (p->kind == Param::Kind::categorical) {
    const size_t i = size_t(v);
    return i < p->choices.size() ? choice_json(p->choices[i]) : json(v);
  }
  if (p->kind == Param::Kind::integer) return int64_t(std::llround(v));
  return v;
}

// Fixed parameters (config key -> text) as Optuna stores them, each checked against `space`:
// a parameter of the study, one of its choices, or a number inside its range.
json fixed_params(const std::vector<Param>& space, const std::map<std::string, std::string>& fixed,
                  const std::string& where, const std::string& study) {
  json params = json::object();
  for (const auto& [name, text] : fixed) {
    const Param* p = find_param(space, name);
    if (!p) {
      std::string known;
      for (const auto& q : space) known += (known.empty() ? "" : ", ") + q.name;
      fail(where, ": --enqueue: '", name, "' is not a parameter of study '", study, "' (", known,
           ")");
    }
    if (p->kind == Param::Kind::categorical) {
      const json want = choice_json(text);
      bool found = false;
      for (const auto& c : p->choices) found = found || same_choice(choice_json(c), want);
      if (!found) {
        std::string list;
        for (const auto& c : p->choices) list += (list.empty() ? "" : ", ") + c;
        fail(where, ": --enqueue: ", name, "=", text, " is not one of the choices (", list, ")");
      }
      params[name] = want;
      continue;
    }
    double v = 0;
    const char* end = text.data() + text.size();
    const auto r = std::from_chars(text.data(), end, v);
    if (text.empty() || r.ec != std::errc() || r.ptr != end || !std::isfinite(v))
      fail(where, ": --enqueue: ", name, "=", text, ": expected a number");
    if (!p->contains(v))
      fail(where, ": --enqueue: ", name, "=", text, " is outside the space (",
           p->kind == Param::Kind::integer ? "int" : "float", " ", p->text(p->low), "..",
           p->text(p->high), p->step > 0 ? " step " + p->text(p->step) : std::string(),
           p->log ? ", log" : "", ")");
    params[name] = value_json(p, v);
  }
  return params;
}

class SqlStorage final : public Storage {
 public:
  SqlStorage(std::unique_ptr<Db> db, bool read_only) : db_(std::move(db)), read_only_(read_only) {
    check_schema();
  }

  void create_or_check(const StudyInfo& info) override {
    write([&] {
      const auto studies = db_->query("SELECT study_id, study_name FROM studies ORDER BY study_id");
      bool named = false;
      for (const auto& r : studies) named = named || *r[1] == info.name;
      // A seqforge study file holds one study; a file Optuna made may hold several, one of them
      // this one.
      if (!named && !studies.empty() && !db_->postgres())
        fail(where(), ": this study file holds study '", *studies[0][1], "', not '", info.name,
             "' (give another --study file)");
      for (const auto& r : studies) {
        if (*r[1] != info.name) continue;
        const int64_t id = integer(r[0]);
        const std::string direction = study_direction(id);
        if (direction != info.direction)
          fail(where(), ": study '", info.name, "' was created to ", direction, ", not to ",
               info.direction);
        const auto attrs = study_attrs(id);
        const std::vector<Param> mine = space_from_json(info.space);
        auto fp = attrs.find("seqforge:fingerprint");
        if (fp != attrs.end()) {
          const std::string stored = fp->second.is_string() ? fp->second.get<std::string>() : "";
          if (stored != info.fingerprint)
            fail(where(), ": study '", info.name,
                 "' was created with another metric or search space (stored: ", stored,
                 "; config: ", info.fingerprint, "); use a new study name or file");
        } else {
          // A study Optuna created: its parameters must fit this space as Optuna's own
          // distribution check demands (same kind and log; categoricals: the same choices).
          for (const auto& [name, dist] : stored_distributions(id)) {
            const Param* p = find_param(mine, name);
            if (!p)
              fail(where(), ": study '", info.name, "' has a parameter '", name,
                   "' that this config's tune.space does not search");
            const json want = distribution(*p);
            const json have = json::parse(dist, nullptr, false);
            const std::string kind = have.is_object() ? have.value("name", "") : "";
            bool ok = kind == want["name"];
            if (ok && p->kind == Param::Kind::categorical) {
              const json& a = have["attributes"]["choices"];
              const json& b = want["attributes"]["choices"];
              ok = a.size() == b.size();
              for (size_t i = 0; ok && i < a.size(); ++i) ok = same_choice(a[i], b[i]);
            } else if (ok) {
              ok = have["attributes"].value("log", false) == p->log;
            }
            if (!ok)
              fail(where(), ": study '", info.name, "' holds parameter '", name, "' as ", dist,
                   ", which does not fit tune.space (", want.dump(), ")");
          }
          set_study_attr(id, "seqforge:fingerprint", info.fingerprint);
          set_study_attr(id, "seqforge:space", json::parse(info.space, nullptr, false));
        }
        check_trial_config(id, info);
        use_study(id, info.name);
        return;
      }
      std::string upper = info.direction;
      for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
      const auto ins =
          db_->query("INSERT INTO studies (study_name) VALUES (?) RETURNING study_id", {info.name});
      const int64_t id = integer(ins[0][0]);
      db_->query("INSERT INTO study_directions (direction, study_id, objective) VALUES (?, ?, 0)",
                 {upper, str(id)});
      set_study_attr(id, "seqforge:fingerprint", info.fingerprint);
      set_study_attr(id, "seqforge:space", json::parse(info.space, nullptr, false));
      check_trial_config(id, info);
      use_study(id, info.name);
    });
  }

  // The study keeps the config its trials start from; another one is refused, naming the first
  // key that differs (a study from before it kept one takes this one).
  void check_trial_config(int64_t id, const StudyInfo& info) {
    if (info.trial_config.empty()) return;
    const json mine = json::parse(info.trial_config);
    const auto attrs = study_attrs(id);
    const auto stored = attrs.find("seqforge:trial_config");
    if (stored == attrs.end()) {
      set_study_attr(id, "seqforge:trial_config", mine);
      return;
    }
    if (!stored->second.is_object())
      fail(where(), ": study '", info.name,
           "': its attribute seqforge:trial_config (the settings its trials ran with) is not a "
           "JSON object: the study file is damaged; use another copy or a new study");
    for (const auto& [key, value] : mine.items()) {
      const auto it = stored->second.find(key);
      if (it == stored->second.end()) continue;  // a key a later version added
      const auto text = [](const json& v) {
        return v.is_string() ? v.get<std::string>() : v.dump();
      };
      if (*it != value && canonical_value(key, text(*it)) != canonical_value(key, text(value)))
        fail(where(), ": study '", info.name, "' ran its trials with ", key, " ", text(*it),
             ", this config gives ", text(value),
             ": trials of other settings do not compare; use a new study name (tune.name) or "
             "file");
    }
  }

  std::optional<StudyInfo> info(const std::string& name) override {
    for (const auto& r : db_->query("SELECT study_id, study_name FROM studies ORDER BY study_id")) {
      if (!name.empty() && *r[1] != name) continue;
      const int64_t id = integer(r[0]);
      use_study(id, *r[1]);
      const auto attrs = study_attrs(id);
      StudyInfo out{*r[1], study_direction(id), "", space_json(space_), ""};
      auto fp = attrs.find("seqforge:fingerprint");
      if (fp != attrs.end() && fp->second.is_string()) out.fingerprint = fp->second;
      return out;
    }
    return std::nullopt;
  }

  // Optuna's GridSampler search_space attribute: each parameter's values (categoricals by
  // value), parameters in name order.
  json grid_search_space(const Grid& grid) const {
    json space = json::object();
    for (const auto& [param, values] : grid.axes()) {
      json list = json::array();
      for (double v : values) list.push_back(value_json(&param, v));
      space[param.name] = list;
    }
    return space;
  }

  // The grid points a running or finished trial has taken (its grid_id, where its search_space
  // is this grid's: Optuna's GridSampler counts the same ones).
  std::set<int64_t> taken_grid_points(const Grid& grid) {
    const json mine = grid_search_space(grid);
    const auto same_space = [&](const json& theirs) {
      if (!theirs.is_object() || theirs.size() != mine.size()) return false;
      for (const auto& [name, values] : mine.items()) {
        const auto it = theirs.find(name);
        if (it == theirs.end() || !it->is_array() || it->size() != values.size()) return false;
        for (size_t i = 0; i < values.size(); ++i)
          if (!same_choice((*it)[i], values[i])) return false;
      }
      return true;
    };
    std::map<int64_t, std::pair<json, json>> attrs;  // trial -> (grid_id, search_space)
    for (const auto& r : db_->query(
             "SELECT x.trial_id, x.key, x.value_json FROM trial_system_attributes x JOIN trials t "
             "ON t.trial_id = x.trial_id WHERE t.study_id = ? AND t.state IN ('RUNNING', "
             "'COMPLETE', 'PRUNED', 'FAIL') AND x.key IN ('grid_id', 'search_space')",
             {str(study_id_)})) {
      if (!r[1] || !r[2]) continue;
      auto& [grid_id, space] = attrs[integer(r[0])];
      (*r[1] == "grid_id" ? grid_id : space) = json::parse(*r[2], nullptr, false);
    }
    std::set<int64_t> taken;
    for (const auto& [trial, a] : attrs)
      if (a.first.is_number_integer() && same_space(a.second)) taken.insert(a.first.get<int64_t>());
    return taken;
  }

  // A waiting trial with the parameters of failed trial `t`, unless it has none or was the
  // second retry already: they run again, as Optuna's RetryFailedTrialCallback has them.
  // A grid trial that died before its parameters were written is retried at its point.
  // Returns what became of them, for the trial's message: "" (run again, or none to run); and
  // in *queued whether they run again.
  std::string queue_retry(const Trial& t, const Grid* grid = nullptr, bool* queued = nullptr) {
    const double retries = t.attrs.count("retries") ? t.attrs.at("retries") : 0;
    std::map<std::string, double> params = t.params;
    if (const auto point = t.attrs.find("grid_id"); params.empty() && grid && !t.host.empty() &&
                                                    point != t.attrs.end() && point->second >= 0 &&
                                                    point->second < double(grid->size()))
      params = grid->point(int64_t(point->second));
    if (params.empty()) return "";
    if (retries >= 2)
      return "; its parameters have now failed 3 times (this trial and 2 retries): they do not "
             "run again";
    const int64_t id = insert_trial("WAITING", std::nullopt);
    set_trial_attr(id, "fixed_params", by_value(params));
    set_trial_attr(id, "failed_trial", t.number);  // Optuna's RetryFailedTrialCallback keys
    set_trial_attr(id, "seqforge:retries", retries + 1);
    set_trial_attr(id, "seqforge:retry_of", double(t.number));
    if (queued) *queued = true;
    return "";
  }

  std::optional<Trial> claim(int64_t n_trials, const Worker& worker, double grace,
                             const Grid* grid) override {
    std::optional<Trial> out;
    write([&] {
      need_study();
      const double now = now_seconds(), clock = heartbeat_clock();
      for (const Trial& t : load("t.study_id = ? AND t.state = 'RUNNING'", {str(study_id_)})) {
        const double idle = t.heartbeat > 0 ? clock - t.heartbeat : 0;
        const bool dead = !t.host.empty() && t.host == worker.host && process_gone(t.pid);
        if (idle <= grace && !dead) continue;
        const std::string who = t.host.empty() ? std::string("?") : t.host;
        const std::string why = dead ? "its worker (" + who + " pid " + str(t.pid) + ") died"
                                     : "no heartbeat from its worker (" + who + " pid " +
                                           str(t.pid) + ") for " + str(int64_t(idle)) + " s";
        db_->query("UPDATE trials SET state = 'FAIL', datetime_complete = ? WHERE trial_id = ?",
                   {datetime_text(now, false), str(t.id)});
        set_trial_attr(t.id, "seqforge:message", why + queue_retry(t, grid));
      }
      // n_trials bounds the study's total: a trial, waiting (enqueued, or the retry of a failed
      // one) or new, starts only while the trials that ran or run fall short of it.
      const auto count = db_->query(
          "SELECT count(*) FROM trials WHERE study_id = ? AND state IN ('RUNNING', 'COMPLETE', "
          "'PRUNED')",
          {str(study_id_)});
      if (integer(count[0][0]) >= n_trials) return;
      const std::set<int64_t> taken = grid ? taken_grid_points(*grid) : std::set<int64_t>();
      const auto waiting = db_->query(
          "SELECT trial_id FROM trials WHERE study_id = ? AND state = 'WAITING' "
          "ORDER BY trial_id LIMIT 1",
          {str(study_id_)});
      int64_t id = 0;
      std::optional<int64_t> point;
      if (!waiting.empty()) {
        id = integer(waiting[0][0]);
        db_->query("UPDATE trials SET state = 'RUNNING', datetime_start = ? WHERE trial_id = ?",
                   {datetime_text(now, false), str(id)});
        if (grid) {
          auto fixed = load("t.trial_id = ?", {str(id)});
          SF_CHECK(fixed.size() == 1, "trial ", id);
          point = grid->id_of(fixed[0].params);
          if (point && taken.count(*point)) point.reset();
        }
      } else {
        if (grid) {
          for (int64_t p : grid->order())
            if (!taken.count(p)) {
              point = p;
              break;
            }
          if (!point) return;  // every point is taken
        }
        id = insert_trial("RUNNING", now);
      }
      if (point) {
        set_trial_attr(id, "search_space", grid_search_space(*grid));
        set_trial_attr(id, "grid_id", *point);
      }
      set_trial_attr(id, "seqforge:host", worker.host);
      set_trial_attr(id, "seqforge:pid", worker.pid);
      beat(id);
      auto loaded = load("t.trial_id = ?", {str(id)});
      SF_CHECK(loaded.size() == 1, "trial ", id);
      out = std::move(loaded[0]);
    });
    return out;
  }

  void set_params(int64_t id, const std::map<std::string, double>& params) override {
    write([&] {
      check_running(id);
      for (const auto& [name, v] : params) {
        const Param* p = find_param(space_, name);
        json d;
        if (p) {
          d = distribution(*p);
        } else {  // not in the stored space: a one-point distribution keeps the value
          Param one;
          one.name = name;
          one.low = one.high = v;
          d = distribution(one);
        }
        db_->query("DELETE FROM trial_params WHERE trial_id = ? AND param_name = ?",
                   {str(id), name});
        db_->query(
            "INSERT INTO trial_params (trial_id, param_name, param_value, distribution_json) "
            "VALUES (?, ?, ?, ?)",
            {str(id), name, Arg::number(v), d.dump()});
      }
    });
  }

  void report(int64_t id, int64_t step, double value) override {
    write([&] {
      check_running(id);
      const auto [v, type] = typed_value(value);
      db_->query(
          "INSERT INTO trial_intermediate_values (trial_id, step, intermediate_value, "
          "intermediate_value_type) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
          {str(id), str(step), v, type});
    });
  }

  void set_attrs(int64_t id, const std::map<std::string, double>& attrs) override {
    if (attrs.empty()) return;
    write([&] {
      check_running(id);
      for (const auto& [k, v] : attrs) set_trial_attr(id, attr_key(k), v);
    });
  }

  void heartbeat(int64_t id) override {
    write([&] {
      const auto r = db_->query("SELECT state FROM trials WHERE trial_id = ?", {str(id)});
      if (!r.empty() && r[0][0] && *r[0][0] == "RUNNING") beat(id);
    });
  }

  bool finish(int64_t id, TrialState state, std::optional<double> value, int64_t epochs,
              const std::string& message, bool retry) override {
    bool queued = false;
    write([&] {
      check_running(id);
      std::string retried;
      queued = false;
      if (retry) {
        const auto t = load("t.trial_id = ?", {str(id)});
        SF_CHECK(t.size() == 1, "trial ", id);
        retried = queue_retry(t[0], nullptr, &queued);
      }
      const double now = now_seconds();
      db_->query("UPDATE trials SET state = ?, datetime_complete = ? WHERE trial_id = ?",
                 {optuna_state_name(state), datetime_text(now, false), str(id)});
      db_->query("DELETE FROM trial_values WHERE trial_id = ?", {str(id)});
      if (value && !std::isnan(*value)) {  // Optuna has no NaN objective value
        const auto [v, type] = typed_value(*value);
        db_->query(
            "INSERT INTO trial_values (trial_id, objective, value, value_type) VALUES (?, 0, ?, ?)",
            {str(id), v, type});
      }
      set_trial_attr(id, "seqforge:epochs", epochs);
      if (!message.empty() || !retried.empty())
        set_trial_attr(id, "seqforge:message", message + retried);
    });
    return queued;
  }

  int64_t enqueue(const std::map<std::string, std::string>& fixed) override {
    int64_t number = 0;
    write([&] {
      need_study();
      const json params = fixed_params(space_, fixed, where(), study_);
      const int64_t id = insert_trial("WAITING", std::nullopt);
      set_trial_attr(id, "fixed_params", params);
      number = integer(db_->query("SELECT number FROM trials WHERE trial_id = ?", {str(id)})[0][0]);
    });
    return number;
  }

  std::vector<Trial> trials() override {
    need_study();
    return load("t.study_id = ?", {str(study_id_)});
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

  void need_study() {
    if (study_id_ < 0) {
      if (!info("")) fail(where(), ": holds no study");
    }
  }

  void use_study(int64_t id, const std::string& name) {
    study_id_ = id;
    study_ = name;
    const auto attrs = study_attrs(id);
    auto sp = attrs.find("seqforge:space");
    space_.clear();
    if (sp != attrs.end() && sp->second.is_array()) space_ = space_from_json(sp->second.dump());
    // Parameters only Optuna knows about (a study it created): from their distributions.
    for (const auto& [pname, dist] : stored_distributions(id))
      if (!find_param(space_, pname))
        if (auto p = param_of(pname, dist)) space_.push_back(*p);
  }

  std::string study_direction(int64_t id) {
    const auto d = db_->query(
        "SELECT direction FROM study_directions WHERE study_id = ? ORDER BY objective", {str(id)});
    if (d.size() > 1)
      fail(where(), ": study ", id, " has ", d.size(), " objectives; seqforge studies have one");
    if (d.empty() || !d[0][0])
      fail(where(), ": study ", id, " has no direction in the study database (study_directions)");
    std::string s = *d[0][0];
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (s != "minimize" && s != "maximize")
      fail(where(), ": study ", id, "'s direction is '", *d[0][0],
           "' in the study database, not MINIMIZE or MAXIMIZE");
    return s;
  }

  std::map<std::string, json> study_attrs(int64_t id) {
    std::map<std::string, json> out;
    for (const auto& r : db_->query(
             "SELECT key, value_json FROM study_system_attributes WHERE study_id = ?", {str(id)}))
      if (r[0] && r[1]) out[*r[0]] = json::parse(*r[1], nullptr, false);
    return out;
  }

  // The first stored distribution of each parameter in the study.
  std::map<std::string, std::string> stored_distributions(int64_t id) {
    std::map<std::string, std::string> out;
    for (const auto& r :
         db_->query("SELECT p.param_name, p.distribution_json FROM trial_params p JOIN trials t "
                    "ON t.trial_id = p.trial_id WHERE t.study_id = ? ORDER BY p.param_id",
                    {str(id)}))
      if (r[0] && r[1]) out.emplace(*r[0], *r[1]);
    return out;
  }

  void set_study_attr(int64_t id, const std::string& key, const json& value) {
    db_->query("DELETE FROM study_system_attributes WHERE study_id = ? AND key = ?",
               {str(id), key});
    db_->query("INSERT INTO study_system_attributes (study_id, key, value_json) VALUES (?, ?, ?)",
               {str(id), key, value.dump()});
  }
  void set_trial_attr(int64_t id, const std::string& key, const json& value) {
    db_->query("DELETE FROM trial_system_attributes WHERE trial_id = ? AND key = ?",
               {str(id), key});
    db_->query("INSERT INTO trial_system_attributes (trial_id, key, value_json) VALUES (?, ?, ?)",
               {str(id), key, value.dump()});
  }

  // Pruner keys Optuna's own pruners share stay as they are; the driver's get the prefix.
  static std::string attr_key(const std::string& k) {
    return k.rfind("completed_rung_", 0) == 0 ? k : kPrefix + k;
  }

  // Heartbeats on the clock Optuna writes and reads them by, the database's: PostgreSQL's
  // LOCALTIMESTAMP (in the session's time zone, as its now() is stored), and on SQLite UTC, whose
  // CURRENT_TIMESTAMP has whole seconds: written a second early there, so that no heartbeat is
  // in Optuna's future (it takes one for a day old), and read back a second later.
  static constexpr double kSqliteHeartbeatLead = 1;
  void beat(int64_t id) {
    db_->query("DELETE FROM trial_heartbeats WHERE trial_id = ?", {str(id)});
    if (db_->postgres())
      db_->query("INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (?, LOCALTIMESTAMP)",
                 {str(id)});
    else
      db_->query("INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (?, ?)",
                 {str(id), datetime_text(now_seconds() - kSqliteHeartbeatLead, true)});
  }
  // Now on the heartbeats' clock (seconds, comparable with Trial::heartbeat).
  double heartbeat_clock() {
    if (!db_->postgres()) return now_seconds();
    const auto r = db_->query("SELECT LOCALTIMESTAMP");
    return r.empty() || r[0].empty() ? now_seconds() : datetime_seconds(r[0][0], true);
  }

  // Optuna numbers a trial by the count of the study's trials with a smaller trial_id, counted
  // after its insert (so numbers agree with Optuna workers that do not take seqforge's lock).
  int64_t insert_trial(const char* state, std::optional<double> started) {
    const auto ins = db_->query(
        "INSERT INTO trials (study_id, state, datetime_start) VALUES (?, ?, ?) RETURNING trial_id",
        {str(study_id_), state, started ? Value(datetime_text(*started, false)) : Value()});
    const int64_t id = integer(ins[0][0]);
    db_->query(
        "UPDATE trials SET number = (SELECT count(*) FROM trials WHERE study_id = ? AND trial_id "
        "< ?) WHERE trial_id = ?",
        {str(study_id_), str(id), str(id)});
    return id;
  }

  void check_running(int64_t id) {
    const auto r = db_->query("SELECT number, state FROM trials WHERE trial_id = ?", {str(id)});
    if (r.empty()) fail(where(), ": trial row ", id, " vanished from the study");
    if (r[0][1] && *r[0][1] == "RUNNING") return;
    std::string why;
    for (const auto& m :
         db_->query("SELECT value_json FROM trial_system_attributes WHERE trial_id = ? AND key = ?",
                    {str(id), "seqforge:message"})) {
      const json j = json::parse(m[0].value_or(""), nullptr, false);
      if (j.is_string()) why = j.get<std::string>();
    }
    throw TrialFinishedError(
        detail::concat(where(), ": trial ", r[0][0].value_or("?"), " is already ",
                       r[0][1].value_or("?"), why.empty() ? std::string() : " (" + why + ")",
                       " and cannot be updated"),
        why.empty() ? "state " + r[0][1].value_or("?") : why);
  }

  json by_value(const std::map<std::string, double>& params) const {
    json out = json::object();
    for (const auto& [k, v] : params) out[k] = value_json(find_param(space_, k), v);
    return out;
  }

  // Trials matching `where` (on trials t), with everything stored about them.
  std::vector<Trial> load(const std::string& cond, const std::vector<Arg>& args) {
    std::vector<Trial> out;
    std::map<int64_t, size_t> index;
    for (const auto& r : db_->query("SELECT t.trial_id, t.number, t.state, t.datetime_start, "
                                    "t.datetime_complete FROM trials t WHERE " +
                                        cond + " ORDER BY t.number, t.trial_id",
                                    args)) {
      Trial t;
      t.id = integer(r[0]);
      t.number = integer(r[1]);
      t.state = state_from_optuna(r[2].value_or(""), where());
      t.started = datetime_seconds(r[3], false);
      t.finished = datetime_seconds(r[4], false);
      index[t.id] = out.size();
      out.push_back(std::move(t));
    }
    if (out.empty()) return out;
    auto each = [&](const std::string& sql, auto&& f) {
      for (const auto& r :
           db_->query(sql + " JOIN trials t ON t.trial_id = x.trial_id WHERE " + cond, args)) {
        auto it = index.find(integer(r[0]));
        if (it != index.end()) f(out[it->second], r);
      }
    };
    std::map<int64_t, json> fixed;
    each("SELECT x.trial_id, x.key, x.value_json FROM trial_system_attributes x",
         [&](Trial& t, const Row& r) {
           if (!r[1] || !r[2]) return;
           const std::string& key = *r[1];
           const json v = json::parse(*r[2], nullptr, false);
           if (key == "fixed_params") {
             fixed[t.id] = v;
           } else if (key == "fail_reason" && t.message.empty() && v.is_string()) {
             t.message = v.get<std::string>();
           } else if ((key.rfind("completed_rung_", 0) == 0 || key == "grid_id") && v.is_number()) {
             t.attrs[key] = v.get<double>();
           } else if (key.rfind(kPrefix, 0) == 0) {
             const std::string k = key.substr(std::char_traits<char>::length(kPrefix));
             if (k == "host" && v.is_string())
               t.host = v.get<std::string>();
             else if (k == "message" && v.is_string())
               t.message = v.get<std::string>();
             else if (k == "pid" && v.is_number())
               t.pid = v.get<int64_t>();
             else if (k == "epochs" && v.is_number())
               t.epochs = v.get<int64_t>();
             else if (v.is_number())
               t.attrs[k] = v.get<double>();
           }
         });
    each("SELECT x.trial_id, x.param_name, x.param_value, x.distribution_json FROM trial_params x",
         [&](Trial& t, const Row& r) {
           if (!r[1]) return;
           const std::optional<double> stored = stored_number(r[2]);
           if (!stored || !std::isfinite(*stored))
             fail(where(), ": trial ", t.number, ": parameter '", *r[1], "' holds ",
                  r[2] ? "'" + *r[2] + "'" : std::string("NULL"), ", not a number");
           double v = *stored;
           const Param* p = find_param(space_, *r[1]);
           if (p && p->kind == Param::Kind::categorical) {  // the index into its choices
             bool known = false;
             const json d = r[3] ? json::parse(*r[3], nullptr, false) : json();
             const bool categorical =
                 d.is_object() && d.contains("attributes") && d["attributes"].is_object() &&
                 d.value("name", json()) == "CategoricalDistribution" &&
                 d["attributes"].contains("choices") && d["attributes"]["choices"].is_array() &&
                 !d["attributes"]["choices"].empty();
             if (!categorical)
               fail(where(), ": trial ", t.number, ": parameter '", *r[1],
                    "': its distribution_json is not a categorical distribution with choices: ",
                    io::quoted(r[3] ? *r[3] : std::string("NULL"), 80));
             if (v != std::floor(v))
               fail(where(), ": trial ", t.number, ": parameter '", *r[1], "' holds ", *r[2],
                    ", not the whole number of a choice");
             const json& choices = d["attributes"]["choices"];
             const bool listed = v >= 0 && v < double(choices.size());
             if (listed)
               for (size_t k = 0; k < p->choices.size() && !known; ++k)
                 if (same_choice(choice_json(p->choices[k]), choices[size_t(v)])) {
                   v = double(k);
                   known = true;
                 }
             if (!listed)
               fail(where(), ": trial ", t.number, ": parameter '", *r[1], "' holds choice ", *r[2],
                    " of the ", choices.size(), " its distribution_json lists");
             if (!known)
               fail(where(), ": trial ", t.number, ": parameter '", *r[1], "' holds ",
                    io::quoted(choices[size_t(v)].dump(), 40),
                    ", which is not one of the search space's ", p->choices.size(), " choices");
           } else if (p && p->log && v <= 0) {  // the samplers take its logarithm
             fail(where(), ": trial ", t.number, ": parameter '", *r[1], "' holds ", *r[2],
                  ", which its log-scale search space cannot hold (it must be positive)");
           } else if (p && p->kind == Param::Kind::integer && v != std::floor(v)) {
             fail(where(), ": trial ", t.number, ": parameter '", *r[1], "' holds ", *r[2],
                  ", not a whole number as its integer search space needs");
           }
           t.params[*r[1]] = v;
         });
    each("SELECT x.trial_id, x.value, x.value_type FROM trial_values x",
         [&](Trial& t, const Row& r) {
           const std::optional<double> v = from_typed(r[1], r[2]);
           if (!v)
             fail(where(), ": trial ", t.number, ": its value ",
                  r[1] ? "'" + *r[1] + "'" : std::string("NULL"), " is not a number");
           t.value = *v;
         });
    each(
        "SELECT x.trial_id, x.step, x.intermediate_value, x.intermediate_value_type FROM "
        "trial_intermediate_values x",
        [&](Trial& t, const Row& r) {
          const std::optional<double> step = stored_number(r[1]), v = from_typed(r[2], r[3]);
          if (!step || !(std::fabs(*step) < 9e15) || *step != std::floor(*step))
            fail(where(), ": trial ", t.number, ": a step value's step ",
                 r[1] ? "'" + *r[1] + "'" : std::string("NULL"), " is not a whole number");
          if (!v)
            fail(where(), ": trial ", t.number, ": its value at step ", int64_t(*step), " ",
                 r[2] ? "'" + *r[2] + "'" : std::string("NULL"), " is not a number");
          t.intermediate[int64_t(*step)] = *v;
        });
    each("SELECT x.trial_id, x.heartbeat FROM trial_heartbeats x", [&](Trial& t, const Row& r) {
      t.heartbeat = datetime_seconds(r[1], true);
      if (t.heartbeat > 0 && !db_->postgres()) t.heartbeat += kSqliteHeartbeatLead;
    });
    // Waiting or just claimed trials: fixed parameters (Optuna's enqueue_trial, a retry) that
    // are not set yet.
    for (const auto& [id, params] : fixed) {
      Trial& t = out[index[id]];
      if (!params.is_object()) continue;
      for (const auto& [k, v] : params.items()) {
        if (t.params.count(k)) continue;
        const Param* p = find_param(space_, k);
        if (!p) continue;  // as Optuna: a fixed parameter no one samples is not the trial's
        if (p->kind == Param::Kind::categorical) {
          bool found = false;
          for (size_t c = 0; c < p->choices.size() && !found; ++c)
            if (same_choice(choice_json(p->choices[c]), v)) {
              t.params[k] = double(c);
              found = true;
            }
          if (!found && t.message.empty())
            t.message = "fixed parameter " + k + "=" + v.dump() + " is not one of its choices";
        } else if (v.is_number()) {
          t.params[k] = v.get<double>();
        } else if (t.message.empty()) {
          t.message = "fixed parameter " + k + "=" + v.dump() + " is not a number";
        }
      }
    }
    // Epochs: as the worker recorded them, or the epochs reported (a trial that failed, one that
    // is still running, one Optuna ran).
    for (Trial& t : out) t.epochs = std::max(t.epochs, static_cast<int64_t>(t.intermediate.size()));
    return out;
  }

  // seqforge's former schema (seqforge_meta, schema_version 1): copied into Optuna's tables and
  // dropped, in the caller's transaction.
  void migrate_v1() {
    const auto v = db_->query("SELECT value FROM seqforge_meta WHERE key = 'schema_version'");
    const int64_t version = v.empty() ? -1 : integer(v[0][0]);
    if (version != kSchemaVersion)
      fail(where(), ": study database schema version ", version, "; this seqforge reads version ",
           kSchemaVersion, " (and Optuna's schema ", kOptunaSchemaVersion, ")");
    if (!has_table("studies")) create_optuna_schema(*db_);
    auto old_json = [](const Value& v) {
      std::map<std::string, double> out;
      if (!v || v->empty()) return out;
      const json j = json::parse(*v, nullptr, false);
      if (j.is_object())
        for (const auto& [k, x] : j.items())
          if (x.is_number()) out[k] = x.get<double>();
      return out;
    };
    auto when = [](const Value& v, bool utc) -> Value {
      const double s = real(v);
      return s > 0 ? Value(datetime_text(s, utc)) : Value();
    };
    for (const auto& s :
         db_->query("SELECT name, direction, fingerprint, space FROM seqforge_studies")) {
      const auto ins =
          db_->query("INSERT INTO studies (study_name) VALUES (?) RETURNING study_id", {*s[0]});
      const int64_t sid = integer(ins[0][0]);
      std::string upper = s[1].value_or("minimize");
      for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
      db_->query("INSERT INTO study_directions (direction, study_id, objective) VALUES (?, ?, 0)",
                 {upper, str(sid)});
      set_study_attr(sid, "seqforge:fingerprint", s[2].value_or(""));
      const json space = json::parse(s[3].value_or(""), nullptr, false);
      if (!space.is_array())  // the parameters' distributions cannot be known
        fail(where(), ": study '", *s[0],
             "' of seqforge's former schema has no readable search space, which converting it to "
             "Optuna's schema needs; start a new study file");
      set_study_attr(sid, "seqforge:space", space);
      study_id_ = sid;
      space_ = space_from_json(s[3].value_or("[]"));
      for (const auto& t : db_->query(
               "SELECT id, number, state, value, params, attrs, started, finished, heartbeat, "
               "epochs, host, pid, message FROM seqforge_trials WHERE study = ? ORDER BY number",
               {*s[0]})) {
        const TrialState st = state_of(t[2].value_or("failed"));
        const auto tin = db_->query(
            "INSERT INTO trials (number, study_id, state, datetime_start, datetime_complete) "
            "VALUES (?, ?, ?, ?, ?) RETURNING trial_id",
            {str(integer(t[1])), str(sid), optuna_state_name(st), when(t[6], false),
             when(t[7], false)});
        const int64_t tid = integer(tin[0][0]);
        const auto params = old_json(t[4]);
        if (st == TrialState::waiting) {
          if (!params.empty()) set_trial_attr(tid, "fixed_params", by_value(params));
        } else {
          for (const auto& [name, pv] : params) {
            const Param* p = find_param(space_, name);
            Param one;
            one.name = name;
            one.low = one.high = pv;
            db_->query(
                "INSERT INTO trial_params (trial_id, param_name, param_value, "
                "distribution_json) VALUES (?, ?, ?, ?)",
                {str(tid), name, Arg::number(pv), distribution(p ? *p : one).dump()});
          }
        }
        if (t[3]) {
          const auto [val, type] = typed_value(real(t[3]));
          if (type != "NAN")
            db_->query(
                "INSERT INTO trial_values (trial_id, objective, value, value_type) VALUES (?, 0, "
                "?, ?)",
                {str(tid), val, type});
        }
        for (const auto& [k, a] : old_json(t[5])) set_trial_attr(tid, attr_key(k), a);
        if (t[9]) set_trial_attr(tid, "seqforge:epochs", integer(t[9]));
        if (t[10] && !t[10]->empty()) set_trial_attr(tid, "seqforge:host", *t[10]);
        if (t[11]) set_trial_attr(tid, "seqforge:pid", integer(t[11]));
        if (t[12] && !t[12]->empty()) set_trial_attr(tid, "seqforge:message", *t[12]);
        if (st == TrialState::running && real(t[8]) > 0)
          db_->query("INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (?, ?)",
                     {str(tid), *when(t[8], true)});
        for (const auto& i : db_->query(
                 "SELECT step, value FROM seqforge_intermediate WHERE trial_id = ?", {*t[0]})) {
          const auto [val, type] = typed_value(real(i[1]));
          db_->query(
              "INSERT INTO trial_intermediate_values (trial_id, step, intermediate_value, "
              "intermediate_value_type) VALUES (?, ?, ?, ?)",
              {str(tid), str(integer(i[0])), val, type});
        }
      }
    }
    for (const char* t :
         {"seqforge_intermediate", "seqforge_trials", "seqforge_studies", "seqforge_meta"})
      db_->query(std::string("DROP TABLE ") + t);
    study_id_ = -1;
    space_.clear();
  }

  bool has_table(const std::string& name) {
    const auto t = db_->tables();
    return std::find(t.begin(), t.end(), name) != t.end();
  }

  void check_schema() {
    std::vector<std::string> tables = db_->tables();
    auto has = [&](const std::string& n) {
      return std::find(tables.begin(), tables.end(), n) != tables.end();
    };
    if (has("seqforge_meta")) {
      if (read_only_)
        fail(where(),
             ": a study in seqforge's former format; run `seqforge tune` on it once "
             "(it converts the file to Optuna's schema) before opening it read-only");
      write([&] {
        tables = db_->tables();  // another worker may have converted it meanwhile
        if (has("seqforge_meta")) migrate_v1();
      });
      tables = db_->tables();
    }
    if (!has("studies")) {
      if (!tables.empty() && !db_->postgres()) {
        std::string list;
        for (const auto& t : tables) list += (list.empty() ? "" : ", ") + t;
        fail(where(), ": not a seqforge study database (it holds tables ", list, ")");
      }
      if (read_only_) fail(where(), ": holds no seqforge study");
      write([&] {
        tables = db_->tables();  // another worker may have created it meanwhile
        if (!has("studies")) create_optuna_schema(*db_);
      });
      return;
    }
    if (!has("version_info") || !has("trials") || !has("trial_params"))
      fail(where(), ": not an Optuna study database (it has a studies table but no ",
           has("version_info") ? "trials" : "version_info", " table)");
    const auto v = db_->query("SELECT schema_version, library_version FROM version_info");
    const int64_t version = v.empty() ? -1 : integer(v[0][0]);
    std::string alembic = "none";
    if (has("alembic_version")) {
      const auto a = db_->query("SELECT version_num FROM alembic_version");
      if (!a.empty() && a[0][0]) alembic = *a[0][0];
    }
    if (version != kOptunaSchemaVersion || alembic != kOptunaAlembicRevision)
      fail(where(), ": Optuna schema version ", version, " (alembic ", alembic,
           "); this seqforge reads Optuna's schema ", kOptunaSchemaVersion, " (",
           kOptunaAlembicRevision, ", Optuna 3.x; `optuna storage upgrade` converts older ones)");
  }

  std::unique_ptr<Db> db_;
  bool read_only_;
  std::string study_;
  int64_t study_id_ = -1;
  std::vector<Param> space_;
};

}  // namespace

json choice_json(const std::string& text) {
  if (text == "null" || text == "~") return nullptr;  // YAML's null, Optuna's None
  if (text == "true" || text == "True") return true;
  if (text == "false" || text == "False") return false;
  int64_t i = 0;
  const char* end = text.data() + text.size();
  auto r = std::from_chars(text.data(), end, i);
  if (!text.empty() && r.ec == std::errc() && r.ptr == end) return i;
  double d = 0;
  auto rd = std::from_chars(text.data(), end, d);
  if (!text.empty() && rd.ec == std::errc() && rd.ptr == end && std::isfinite(d)) return d;
  return text;
}

void check_fixed_params(const std::vector<Param>& space,
                        const std::map<std::string, std::string>& fixed, const std::string& where,
                        const std::string& study) {
  fixed_params(space, fixed, where, study);
}

std::unique_ptr<Storage> Storage::open(const std::string& where, bool read_only) {
  if (where.rfind("postgresql://", 0) == 0 || where.rfind("postgres://", 0) == 0)
    return std::make_unique<SqlStorage>(open_postgres(where, read_only), read_only);
  int timeout_ms = 30000;
  if (const char* e = std::getenv("SEQFORGE_TUNE_BUSY_TIMEOUT_MS")) timeout_ms = std::atoi(e);
  return std::make_unique<SqlStorage>(open_sqlite(where, read_only, timeout_ms), read_only);
}

void mark_gone_workers(std::vector<Trial>& trials) {
  const std::string host = host_name();
  for (Trial& t : trials)
    t.worker_gone =
        t.state == TrialState::running && !t.host.empty() && t.host == host && process_gone(t.pid);
}

}  // namespace seqforge::tune
