#include "seqforge/tune/space.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "seqforge/core/error.hpp"
#include "seqforge/train/config.hpp"
#include "train/yaml_limits.hpp"

namespace seqforge::tune {

namespace {

// v to 15 significant digits: a value on a decimal step as its decimal (3 * 0.1 is 0.3, not
// 0.30000000000000004).
double decimal15(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return std::strtod(buf, nullptr);
}

}  // namespace

const char* state_name(TrialState s) {
  switch (s) {
    case TrialState::waiting:
      return "waiting";
    case TrialState::running:
      return "running";
    case TrialState::complete:
      return "complete";
    case TrialState::pruned:
      return "pruned";
    case TrialState::failed:
      return "failed";
  }
  return "";
}

const char* optuna_state_name(TrialState s) {
  switch (s) {
    case TrialState::waiting:
      return "WAITING";
    case TrialState::running:
      return "RUNNING";
    case TrialState::complete:
      return "COMPLETE";
    case TrialState::pruned:
      return "PRUNED";
    case TrialState::failed:
      return "FAIL";
  }
  return "FAIL";
}

TrialState state_of(const std::string& name) {
  for (TrialState s : {TrialState::waiting, TrialState::running, TrialState::complete,
                       TrialState::pruned, TrialState::failed})
    if (name == state_name(s)) return s;
  fail("unknown trial state '", name, "' in the study database");
}

const char* direction_name(Direction d) {
  return d == Direction::minimize ? "minimize" : "maximize";
}

namespace {

std::string real_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // The shortest text that reads back the same value.
  for (int p = 1; p <= 17; ++p) {
    char s[32];
    std::snprintf(s, sizeof s, "%.*g", p, v);
    if (std::strtod(s, nullptr) == v) return s;
  }
  return buf;
}

struct Reader {
  std::string source;
  bool lines = true;
  std::string at(const YAML::Node& n) const {
    return lines ? source + ":" + std::to_string(n.Mark().line + 1) : source;
  }
  double number(const YAML::Node& n, const std::string& key) const {
    double v = 0;
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || !std::isfinite(v))
      fail(at(n), ": ", key, ": expected a number, got '", s, "'");
    return v;
  }
  int64_t integer(const YAML::Node& n, const std::string& key) const {
    int64_t v = 0;
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size())
      fail(at(n), ": ", key, ": expected an integer, got '", s, "'");
    return v;
  }
  bool boolean(const YAML::Node& n, const std::string& key) const {
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    if (s == "true" || s == "True" || s == "yes") return true;
    if (s == "false" || s == "False" || s == "no") return false;
    fail(at(n), ": ", key, ": expected true or false, got '", s, "'");
  }
  std::string text(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) fail(at(n), ": ", key, ": expected a string");
    return n.Scalar();
  }
  // Rejects keys of `map` outside `known`.
  void only(const YAML::Node& map, const std::string& prefix,
            const std::vector<std::string>& known) const {
    if (!map.IsMap()) fail(at(map), ": ", prefix, ": expected a map");
    for (const auto& kv : map) {
      const std::string k = yaml_key(kv.first, at(kv.first));
      if (std::find(known.begin(), known.end(), k) == known.end()) {
        std::string list;
        for (const auto& s : known) list += (list.empty() ? "" : ", ") + s;
        const std::string typo = closest_word(k, known);
        fail(at(kv.first), ": unknown key '", prefix, ".", k, "' (",
             typo.empty() ? "" : "did you mean '" + prefix + "." + typo + "'? ", "known: ", list,
             ")");
      }
    }
  }
};

}  // namespace

const std::vector<std::string>& param_fields() {
  static const std::vector<std::string> fields = {"type", "low",     "high", "log",
                                                  "step", "choices", "grid"};
  return fields;
}

namespace {

const ConfigKey* config_key(const std::string& name) {
  for (const auto& k : config_keys())
    if (k.path == name) return &k;
  return nullptr;
}

Param read_param(const Reader& r, const std::string& name, const YAML::Node& n) {
  const std::string key = "tune.space." + name;
  const ConfigKey* ck = config_key(name);
  if (!ck)
    fail(r.at(n), ": ", key, ": '", name, "' is not a config key", config_key_suggestion(name));
  if (name == "train.run_dir" || name == "data.path")
    fail(r.at(n), ": ", key, ": '", name, "' cannot be searched");
  if (name == "train.save" || name == "train.early_stopping.monitor" ||
      name == "train.early_stopping.mode")
    fail(r.at(n), ": ", key, ": '", name,
         "' cannot be searched: the study sets it in every trial (from tune.value, tune.metric "
         "and tune.direction), so that each trial keeps the checkpoint its value comes from");
  r.only(n, key, param_fields());
  if (!n["type"]) fail(r.at(n), ": ", key, ": give a type: float, int or categorical");
  const std::string type = r.text(n["type"], key + ".type");
  Param p;
  p.name = name;
  p.where = r.at(n);
  if (type == "categorical") {
    p.kind = Param::Kind::categorical;
    const YAML::Node c = n["choices"];
    if (!c || !c.IsSequence() || c.size() == 0)
      fail(r.at(n), ": ", key, ".choices: expected a non-empty list");
    for (const auto& item : c) {
      if (!item.IsScalar()) fail(r.at(item), ": ", key, ".choices: expected scalar choices");
      p.choices.push_back(item.Scalar());
    }
    std::set<std::string> seen;
    for (const auto& ch : p.choices) {
      if (!seen.insert(ch).second) fail(r.at(c), ": ", key, ".choices: '", ch, "' twice");
      try {
        Config::parse("", r.source, {name + "=" + ch});
      } catch (const Error& e) {
        fail(r.at(c), ": ", key, ".choices: '", ch, "' is not a valid value: ", e.what());
      }
    }
    for (const char* k : {"low", "high", "log", "step"})
      if (n[k]) fail(r.at(n[k]), ": ", key, ".", k, ": not used by a categorical parameter");
    return p;
  }
  if (type != "float" && type != "int")
    fail(r.at(n["type"]), ": ", key, ".type: expected float, int or categorical, got '", type, "'");
  if (n["choices"]) fail(r.at(n["choices"]), ": ", key, ".choices: only for categorical");
  p.kind = type == "float" ? Param::Kind::floating : Param::Kind::integer;
  if (p.kind == Param::Kind::floating && ck->type == ConfigKey::Type::integer)
    fail(r.at(n), ": ", key, ": '", name, "' takes whole numbers: search it with type: int");
  if (p.kind == Param::Kind::floating && ck->type != ConfigKey::Type::number)
    fail(r.at(n), ": ", key, ": a float parameter needs a numeric config key");
  if (p.kind == Param::Kind::integer && ck->type != ConfigKey::Type::integer &&
      ck->type != ConfigKey::Type::number)
    fail(r.at(n), ": ", key, ": an int parameter needs an integer config key");
  if (!n["low"] || !n["high"]) fail(r.at(n), ": ", key, ": give low and high");
  if (p.kind == Param::Kind::integer) {
    p.low = double(r.integer(n["low"], key + ".low"));
    p.high = double(r.integer(n["high"], key + ".high"));
    p.step = n["step"] ? double(r.integer(n["step"], key + ".step")) : 1;
  } else {
    p.low = r.number(n["low"], key + ".low");
    p.high = r.number(n["high"], key + ".high");
    p.step = n["step"] ? r.number(n["step"], key + ".step") : 0;
  }
  p.log = n["log"] ? r.boolean(n["log"], key + ".log") : false;
  // A study stores parameters as doubles (as Optuna does): integers beyond 2^53 would not read
  // back as themselves, and a float range must have a finite width to be drawn from.
  constexpr int64_t kExactIntegers = int64_t{1} << 53;
  if (p.kind == Param::Kind::integer)
    for (const char* bound : {"low", "high", "step"})
      if (const int64_t v = n[bound] ? r.integer(n[bound], key + "." + bound) : 0;
          v > kExactIntegers || v < -kExactIntegers)
        fail(r.at(n[bound]), ": ", key, ".", bound, ": ", n[bound].Scalar(),
             " is beyond 2^53 = 9007199254740992, the largest integer a study stores exactly");
  if (!std::isfinite(p.high - p.low))
    fail(r.at(n), ": ", key, ": the range from ", p.low, " to ", p.high,
         " is wider than a double holds");
  if (!(p.low <= p.high))
    fail(r.at(n), ": ", key, ": low (", p.low, ") must not exceed high (", p.high, ")");
  if (p.log && p.low <= 0) fail(r.at(n), ": ", key, ": log needs low > 0, got ", p.low);
  if (n["step"] && p.step <= 0) fail(r.at(n["step"]), ": ", key, ".step: must be positive");
  if (p.log && n["step"] && !(p.kind == Param::Kind::integer && p.step == 1))
    fail(r.at(n["step"]), ": ", key, ": step and log cannot be combined");
  if (p.step > 0)  // as Optuna: high is lowered onto the last step, in decimal (0.3 * 3 is 0.9)
    p.high = decimal15(p.low + std::floor((p.high - p.low) / p.step + 1e-9) * p.step);
  if (const YAML::Node g = n["grid"]) {
    if (!g.IsSequence() || g.size() == 0)
      fail(r.at(g), ": ", key, ".grid: expected a non-empty list");
    for (const auto& item : g) {
      const double v = r.number(item, key + ".grid");
      if (!p.contains(v))
        fail(r.at(item), ": ", key, ".grid: ", item.Scalar(), " is outside the range");
      p.grid.push_back(v);
    }
  }
  return p;
}

}  // namespace

std::string Param::text(double v) const {
  switch (kind) {
    case Kind::categorical:
      return choices.at(static_cast<size_t>(v));
    case Kind::integer:
      return std::to_string(static_cast<int64_t>(std::llround(v)));
    case Kind::floating:
      return real_text(v);
  }
  return "";
}

double Param::snap(double v) const {
  if (kind == Kind::categorical) return std::clamp(std::round(v), 0.0, double(choices.size()) - 1);
  if (step > 0) v = decimal15(low + std::round((v - low) / step) * step);
  if (kind == Kind::integer) v = std::round(v);
  return std::clamp(v, low, high);
}

bool Param::contains(double v) const {
  if (kind == Kind::categorical) return v >= 0 && v < double(choices.size()) && v == std::floor(v);
  if (!(v >= low && v <= high)) return false;
  if (kind == Kind::integer && v != std::floor(v)) return false;
  if (step > 0) {
    const double k = (v - low) / step;
    return std::abs(k - std::round(k)) < 1e-6;
  }
  return true;
}

const Param& TuneSettings::param(const std::string& name) const {
  for (const auto& p : space)
    if (p.name == name) return p;
  fail(source, ": the study has no parameter '", name, "'");
}

std::string TuneSettings::fingerprint() const {
  std::ostringstream s;
  s << tune::direction_name(direction) << ";" << metric;
  if (value != "best") s << ";value=" << value;  // studies from before tune.value keep theirs
  for (const auto& p : space) {
    s << ";" << p.name << ":"
      << (p.kind == Param::Kind::categorical ? "categorical"
          : p.kind == Param::Kind::integer   ? "int"
                                             : "float");
    if (p.kind == Param::Kind::categorical) {
      for (const auto& c : p.choices) s << "," << c;
    } else {
      s << "," << real_text(p.low) << "," << real_text(p.high) << "," << real_text(p.step)
        << (p.log ? ",log" : "");
    }
  }
  return s.str();
}

TuneSettings parse_tune_settings(const std::string& yaml, const std::string& source,
                                 const std::string& default_metric, Direction default_direction,
                                 const std::string& file, bool lines) {
  TuneSettings s;
  s.direction = default_direction;
  s.source = source;
  s.name = std::filesystem::path(file.empty() ? source : file).stem().string();
  s.metric = default_metric;
  Reader r{source, lines};
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    fail(source, ":", e.mark.line + 1, ": not valid YAML: ", yaml_error(e));
  }
  check_yaml_expansion(root, source);
  const YAML::Node t = root.IsMap() ? root["tune"] : YAML::Node();
  if (!t) fail(source, ": no `tune:` section (tune.space lists the parameters to search)");
  r.only(t, "tune",
         {"name", "direction", "metric", "value", "n_trials", "timeout", "heartbeat_interval",
          "grace_period", "trials_per_device", "sampler", "pruner", "space"});
  if (t["name"]) s.name = r.text(t["name"], "tune.name");
  if (s.name.empty()) fail(r.at(t), ": tune.name: must not be empty");
  if (t["direction"]) {
    const std::string d = r.text(t["direction"], "tune.direction");
    if (d == "minimize" || d == "min")
      s.direction = Direction::minimize;
    else if (d == "maximize" || d == "max")
      s.direction = Direction::maximize;
    else
      fail(r.at(t["direction"]), ": tune.direction: expected minimize or maximize, got '", d, "'");
  }
  if (t["metric"]) {
    s.metric = r.text(t["metric"], "tune.metric");
    // A metric of its own: the direction is the metric's, not the early stopping's.
    if (!t["direction"])
      s.direction = higher_is_better(s.metric) ? Direction::maximize : Direction::minimize;
  }
  if (t["value"]) {
    s.value = r.text(t["value"], "tune.value");
    if (s.value != "best" && s.value != "last")
      fail(r.at(t["value"]), ": tune.value: expected best or last, got '", s.value, "'");
  }
  if (t["n_trials"]) {
    s.n_trials = r.integer(t["n_trials"], "tune.n_trials");
    if (s.n_trials <= 0) fail(r.at(t["n_trials"]), ": tune.n_trials: must be positive");
  }
  auto positive = [&](const char* k, double* out) {
    if (!t[k]) return;
    *out = r.number(t[k], std::string("tune.") + k);
    if (!(*out >= 0) || !std::isfinite(*out))
      fail(r.at(t[k]), ": tune.", k, ": must be a finite number, not negative");
  };
  positive("timeout", &s.timeout);
  positive("heartbeat_interval", &s.heartbeat_interval);
  positive("grace_period", &s.grace_period);
  if (const YAML::Node n = t["trials_per_device"]) {
    if (n.IsScalar() && n.Scalar() == "auto") {
      s.trials_per_device_auto = true;
    } else {
      s.trials_per_device = r.integer(n, "tune.trials_per_device");
      if (s.trials_per_device < 1 || s.trials_per_device > 64)
        fail(r.at(n), ": tune.trials_per_device: expected auto or 1 to 64, got ",
             s.trials_per_device);
    }
  }
  if (s.heartbeat_interval <= 0) fail(r.at(t), ": tune.heartbeat_interval: must be positive");
  if (s.grace_period <= s.heartbeat_interval)
    fail(r.at(t), ": tune.grace_period (", s.grace_period,
         " s) must exceed tune.heartbeat_interval (", s.heartbeat_interval, " s)");

  if (const YAML::Node n = t["sampler"]) {
    // `sampler: tpe` is short for `sampler: {kind: tpe}`.
    const YAML::Node m = n.IsScalar() ? YAML::Node(YAML::NodeType::Map) : n;
    if (n.IsScalar()) s.sampler.kind = n.Scalar();
    r.only(m, "tune.sampler", {"kind", "seed", "n_startup_trials", "n_ei_candidates"});
    if (m["kind"]) s.sampler.kind = r.text(m["kind"], "tune.sampler.kind");
    if (s.sampler.kind != "tpe" && s.sampler.kind != "random" && s.sampler.kind != "grid")
      fail(r.at(n), ": tune.sampler.kind: expected tpe, random or grid, got '", s.sampler.kind,
           "'");
    if (m["seed"]) s.sampler.seed = uint64_t(r.integer(m["seed"], "tune.sampler.seed"));
    if (m["n_startup_trials"])
      s.sampler.n_startup_trials =
          r.integer(m["n_startup_trials"], "tune.sampler.n_startup_trials");
    if (m["n_ei_candidates"])
      s.sampler.n_ei_candidates = r.integer(m["n_ei_candidates"], "tune.sampler.n_ei_candidates");
    if (s.sampler.n_startup_trials < 0 || s.sampler.n_ei_candidates < 1)
      fail(r.at(n), ": tune.sampler: n_startup_trials >= 0 and n_ei_candidates >= 1 needed");
    if (m["seed"] && r.integer(m["seed"], "tune.sampler.seed") < 0)
      fail(r.at(m["seed"]), ": tune.sampler.seed: must be 0 or more");
    // A setting another sampler reads is said to be unused, not ignored without a word.
    if (s.sampler.kind != "tpe")
      for (const char* k : {"n_startup_trials", "n_ei_candidates"})
        if (m[k])
          s.unused.push_back(r.at(m[k]) + ": tune.sampler." + k + ": the " + s.sampler.kind +
                             " sampler has no use for it (a tpe sampler's setting)");
  }
  if (const YAML::Node n = t["pruner"]) {
    const YAML::Node m = n.IsScalar() ? YAML::Node(YAML::NodeType::Map) : n;
    if (n.IsScalar()) s.pruner.kind = n.Scalar();
    r.only(m, "tune.pruner",
           {"kind", "percentile", "n_startup_trials", "n_warmup_steps", "interval_steps",
            "n_min_trials", "min_resource", "reduction_factor", "min_early_stopping_rate",
            "bootstrap_count"});
    PrunerSettings& p = s.pruner;
    if (m["kind"]) p.kind = r.text(m["kind"], "tune.pruner.kind");
    if (p.kind != "median" && p.kind != "percentile" && p.kind != "successive_halving" &&
        p.kind != "none")
      fail(r.at(n), ": tune.pruner.kind: expected median, percentile, successive_halving or none, ",
           "got '", p.kind, "'");
    if (m["percentile"]) p.percentile = r.number(m["percentile"], "tune.pruner.percentile");
    if (p.kind == "percentile" && !m["percentile"])
      fail(r.at(n), ": tune.pruner.percentile: required by the percentile pruner");
    if (p.percentile < 0 || p.percentile > 100)
      fail(r.at(n), ": tune.pruner.percentile: must be within [0, 100]");
    auto integer = [&](const char* k, int64_t* out, int64_t least) {
      if (!m[k]) return;
      *out = r.integer(m[k], std::string("tune.pruner.") + k);
      if (*out < least) fail(r.at(m[k]), ": tune.pruner.", k, ": must be at least ", least);
    };
    integer("n_startup_trials", &p.n_startup_trials, 0);
    integer("n_warmup_steps", &p.n_warmup_steps, 0);
    integer("interval_steps", &p.interval_steps, 1);
    integer("n_min_trials", &p.n_min_trials, 1);
    integer("min_resource", &p.min_resource, 1);
    integer("reduction_factor", &p.reduction_factor, 2);
    integer("min_early_stopping_rate", &p.min_early_stopping_rate, 0);
    integer("bootstrap_count", &p.bootstrap_count, 0);
    if (p.kind == "median") p.percentile = 50;
    // A setting another pruner reads is said to be unused, not ignored without a word.
    const std::map<std::string, std::set<std::string>> used = {
        {"median", {"n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials"}},
        {"percentile",
         {"percentile", "n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials"}},
        {"successive_halving",
         {"min_resource", "reduction_factor", "min_early_stopping_rate", "bootstrap_count"}},
        {"none", {}}};
    for (const auto& kv : m) {
      const std::string k = kv.first.Scalar();
      if (k != "kind" && !used.at(p.kind).count(k))
        s.unused.push_back(r.at(kv.first) + ": tune.pruner." + k + ": the " + p.kind +
                           (p.kind == "none" ? " pruner prunes nothing and reads no setting"
                                             : " pruner has no use for it"));
    }
    if (p.bootstrap_count > 0 && p.min_resource == 0)
      fail(r.at(n), ": tune.pruner.bootstrap_count needs a min_resource (as in Optuna)");
  }
  const YAML::Node space = t["space"];
  if (!space || !space.IsMap() || space.size() == 0)
    fail(r.at(t), ": tune.space: expected a map of config keys to distributions");
  for (const auto& kv : space) {
    const std::string name = yaml_key(kv.first, r.at(kv.first));
    for (const auto& p : s.space)
      if (p.name == name) fail(r.at(kv.first), ": tune.space: '", name, "' twice");
    s.space.push_back(read_param(r, name, kv.second));
  }
  if (s.sampler.kind == "grid")
    for (const auto& p : s.space) {
      const bool enumerable = p.kind != Param::Kind::floating || p.step > 0 || !p.grid.empty();
      if (!enumerable)
        fail(p.where, ": tune.space.", p.name,
             ": the grid sampler needs a list of values (grid: [...]) or a step");
    }
  return s;
}

std::vector<std::string> param_overrides(const TuneSettings& s,
                                         const std::map<std::string, double>& params) {
  std::vector<std::string> out;
  for (const auto& p : s.space) {
    auto it = params.find(p.name);
    if (it != params.end()) out.push_back(p.name + "=" + p.text(it->second));
  }
  return out;
}

std::string describe_params(const TuneSettings& s, const std::map<std::string, double>& params) {
  std::string out;
  for (const auto& o : param_overrides(s, params)) out += (out.empty() ? "" : " ") + o;
  return out;
}

std::string space_json(const std::vector<Param>& space) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& p : space)
    j.push_back({{"name", p.name},
                 {"kind", p.kind == Param::Kind::categorical ? "categorical"
                          : p.kind == Param::Kind::integer   ? "int"
                                                             : "float"},
                 {"low", p.low},
                 {"high", p.high},
                 {"step", p.step},
                 {"log", p.log},
                 {"choices", p.choices}});
  return j.dump();
}

std::vector<Param> space_from_json(const std::string& text) {
  std::vector<Param> out;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_array()) return out;
  for (const auto& e : j) {
    Param p;
    p.name = e.value("name", "");
    const std::string kind = e.value("kind", "float");
    p.kind = kind == "categorical" ? Param::Kind::categorical
             : kind == "int"       ? Param::Kind::integer
                                   : Param::Kind::floating;
    p.low = e.value("low", 0.0);
    p.high = e.value("high", 0.0);
    p.step = e.value("step", 0.0);
    p.log = e.value("log", false);
    p.choices = e.value("choices", std::vector<std::string>{});
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace seqforge::tune
