// `seqforge tune --export csv|json STUDY`: every trial of a study, parameters by value (a
// categorical as its choice), doubles with the digits that read back the same value.
#include <charconv>
#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>
#include <set>

#include "seqforge/core/error.hpp"
#include "seqforge/tune/storage.hpp"
#include "seqforge/tune/study.hpp"

namespace seqforge::tune {

namespace {

using OrderedJson = nlohmann::ordered_json;  // keys in the order written

std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char s[40];  // the shortest text that reads back as v
  return std::string(s, std::to_chars(s, s + sizeof s, v).ptr);
}

// A double as JSON: a number when finite, else "nan", "inf" or "-inf" (JSON has none of them).
OrderedJson number_json(double v) {
  return std::isfinite(v) ? OrderedJson(v) : OrderedJson(number_text(v));
}

// Local time, as Optuna's datetime_start and datetime_complete.
std::string datetime_text(double seconds) {
  if (seconds <= 0) return "";
  const time_t whole = time_t(std::floor(seconds));
  int64_t micro = int64_t(std::llround((seconds - double(whole)) * 1e6));
  time_t t = whole;
  if (micro >= 1000000) ++t, micro -= 1000000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02d %02d:%02d:%02d.%06lld", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long long)micro);
  return buf;
}

// A parameter by value: a categorical as its choice (a number or a boolean when the choice is
// one), an int as an integer.
OrderedJson param_json(const Param* p, double v) {
  if (!p) return number_json(v);
  if (p->kind == Param::Kind::categorical) {
    const size_t i = size_t(v);
    if (v < 0 || i >= p->choices.size()) return number_json(v);
    return OrderedJson(choice_json(p->choices[i]));
  }
  if (p->kind == Param::Kind::integer && v == std::floor(v)) return int64_t(v);
  return number_json(v);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string scalar_text(const OrderedJson& j) {
  if (j.is_null()) return "";
  if (j.is_string()) return j.get<std::string>();
  if (j.is_number_float()) return number_text(j.get<double>());
  return j.dump();
}

}  // namespace

std::map<std::string, std::string> parse_enqueue(const std::string& spec) {
  std::map<std::string, std::string> out;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = spec.find(',', start);
    const std::string item =
        spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      fail("--enqueue '", spec, "': expected key=value[,key=value...], got '", item, "'");
    const std::string key = item.substr(0, eq);
    if (!out.emplace(key, item.substr(eq + 1)).second)
      fail("--enqueue '", spec, "': '", key, "' twice");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int run_tune_export(const std::string& study, const std::string& name, const std::string& format,
                    std::ostream& out) {
  if (format != "csv" && format != "json")
    fail("tune: --export: expected csv or json, got '", format, "'");
  auto storage = Storage::open(study, /*read_only=*/true);
  const auto info = storage->info(name);
  if (!info)
    fail(study, name.empty() ? ": holds no study" : ": holds no study named '" + name + "'");
  const std::vector<Param> space = space_from_json(info->space);
  const std::vector<Trial> trials = storage->trials();
  auto param = [&](const std::string& n) -> const Param* {
    for (const auto& p : space)
      if (p.name == n) return &p;
    return nullptr;
  };
  std::vector<OrderedJson> rows;
  for (const auto& t : trials) {
    OrderedJson r;
    r["number"] = t.number;
    r["state"] = optuna_state_name(t.state);
    r["value"] = t.value ? number_json(*t.value) : OrderedJson(nullptr);
    r["datetime_start"] =
        t.started > 0 ? OrderedJson(datetime_text(t.started)) : OrderedJson(nullptr);
    r["datetime_complete"] =
        t.finished > 0 ? OrderedJson(datetime_text(t.finished)) : OrderedJson(nullptr);
    r["duration_seconds"] = t.started > 0 && t.finished > 0 ? OrderedJson(t.finished - t.started)
                                                            : OrderedJson(nullptr);
    OrderedJson params = OrderedJson::object();
    for (const auto& [k, v] : t.params) params[k] = param_json(param(k), v);
    r["params"] = params;
    OrderedJson inter = OrderedJson::object();
    for (const auto& [step, v] : t.intermediate) inter[std::to_string(step)] = number_json(v);
    r["intermediate_values"] = inter;
    OrderedJson attrs = OrderedJson::object();
    attrs["host"] = t.host.empty() ? OrderedJson(nullptr) : OrderedJson(t.host);
    attrs["pid"] = t.pid > 0 ? OrderedJson(t.pid) : OrderedJson(nullptr);
    attrs["epochs"] = t.epochs;
    attrs["message"] = t.message;
    for (const auto& [k, v] : t.attrs) attrs[k] = number_json(v);
    r["seqforge"] = attrs;
    rows.push_back(std::move(r));
  }
  if (format == "json") {
    OrderedJson doc = {{"study", info->name},
                       {"direction", info->direction},
                       {"fingerprint", info->fingerprint},
                       {"trials", rows}};
    out << doc.dump(1) << "\n";
    return 0;
  }
  // CSV: one row per trial; params_<name> and seqforge_<attr> columns over all trials,
  // intermediate values as a JSON object {"step": value}.
  std::set<std::string> param_names, attr_names;
  for (const auto& p : space) param_names.insert(p.name);
  for (const auto& r : rows) {
    for (const auto& [k, v] : r["params"].items()) param_names.insert(k);
    for (const auto& [k, v] : r["seqforge"].items()) attr_names.insert(k);
  }
  std::vector<std::string> header = {
      "number", "state", "value", "datetime_start", "datetime_complete", "duration_seconds"};
  for (const auto& p : param_names) header.push_back("params_" + p);
  header.push_back("intermediate_values");
  for (const auto& a : attr_names) header.push_back("seqforge_" + a);
  for (size_t i = 0; i < header.size(); ++i) out << (i ? "," : "") << csv_field(header[i]);
  out << "\n";
  for (const auto& r : rows) {
    std::vector<std::string> f = {scalar_text(r["number"]),
                                  scalar_text(r["state"]),
                                  scalar_text(r["value"]),
                                  scalar_text(r["datetime_start"]),
                                  scalar_text(r["datetime_complete"]),
                                  scalar_text(r["duration_seconds"])};
    for (const auto& p : param_names)
      f.push_back(r["params"].contains(p) ? scalar_text(r["params"][p]) : "");
    std::string inter = "{";
    for (const auto& [k, v] : r["intermediate_values"].items())
      inter += (inter.size() > 1 ? ", \"" : "\"") + k +
               "\": " + (v.is_string() ? v.dump() : scalar_text(v));
    f.push_back(inter + "}");
    for (const auto& a : attr_names)
      f.push_back(r["seqforge"].contains(a) ? scalar_text(r["seqforge"][a]) : "");
    for (size_t i = 0; i < f.size(); ++i) out << (i ? "," : "") << csv_field(f[i]);
    out << "\n";
  }
  return 0;
}

}  // namespace seqforge::tune
