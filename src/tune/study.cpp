#include "seqforge/tune/study.hpp"

#include <signal.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "io/file_util.hpp"
#include "report/chart.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/interrupt.hpp"
#include "seqforge/core/threads.hpp"
#include "seqforge/dist/communicator.hpp"
#include "seqforge/train/config.hpp"
#include "seqforge/train/trainer.hpp"
#include "train/run_dir.hpp"
#include "train/yaml_limits.hpp"
#include "tune/workers.hpp"

namespace seqforge::tune {

namespace fs = std::filesystem;

namespace {

// How a trial that kept its best epoch and then diverged begins its message.
constexpr std::string_view kDivergedNote = "diverged after its best epoch: ";

double steady_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string fmt_value(std::optional<double> v) {
  if (!v) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", *v);
  return buf;
}

// Keeps a claimed trial's heartbeat fresh from its own connection while the trial trains.
class Heartbeat {
 public:
  Heartbeat(const std::string& where, int64_t trial_id, double interval)
      : thread_([this, where, trial_id, interval] {
          const CNumbers numbers;
          std::unique_ptr<Storage> storage;
          std::unique_lock<std::mutex> lock(mu_);
          while (!cv_.wait_for(lock, std::chrono::duration<double>(interval),
                               [this] { return stop_; })) {
            lock.unlock();
            try {
              if (!storage) storage = Storage::open(where);
              storage->heartbeat(trial_id);
            } catch (const std::exception&) {
              storage.reset();  // retried next beat; a long outage shows as a failed trial
            }
            lock.lock();
          }
        }) {}
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

class Context final : public TrialContext {
 public:
  Context(Trial& trial, Storage& storage, Pruner& pruner, Direction d, double* hook_seconds)
      : t_(trial), storage_(storage), pruner_(pruner), d_(d), hook_seconds_(hook_seconds) {}
  int64_t number() const override { return t_.number; }
  const std::map<std::string, double>& params() const override { return t_.params; }
  bool report(int64_t step, double value) override {
    const double t0 = steady_now();
    if (t_.intermediate.count(step)) return !pruned;  // as Optuna: the first report of a step wins
    storage_.report(t_.id, step, value);
    t_.intermediate[step] = value;
    std::map<std::string, double> attrs;
    pruned = pruner_.prune(storage_.trials(), t_, d_, &attrs);
    if (!attrs.empty()) {
      storage_.set_attrs(t_.id, attrs);
      for (const auto& [k, v] : attrs) t_.attrs[k] = v;
    }
    *hook_seconds_ += steady_now() - t0;
    return !pruned;
  }
  bool pruned = false;

 private:
  Trial& t_;
  Storage& storage_;
  Pruner& pruner_;
  Direction d_;
  double* hook_seconds_;
};

}  // namespace

Study::Study(std::unique_ptr<Storage> storage, TuneSettings settings, std::string where)
    : storage_(std::move(storage)),
      settings_(std::move(settings)),
      where_(std::move(where)),
      sampler_(make_sampler(settings_)),
      pruner_(make_pruner(settings_.pruner)) {
  storage_->create_or_check(
      {settings_.name, direction_name(settings_.direction), settings_.fingerprint(),
       space_json(settings_.space),
       settings_.trial_config.empty() ? "" : nlohmann::json(settings_.trial_config).dump()});
}

std::optional<double> trial_value(const Trial& trial, const TuneSettings& settings,
                                  std::string* why) {
  const std::string& metric = settings.metric;
  if (trial.intermediate.empty()) {
    *why = "reported no " + metric;
    return std::nullopt;
  }
  auto epoch_text = [](int64_t step) { return "epoch " + std::to_string(step + 1); };
  auto value_text = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  if (settings.value == "last") {
    const auto& [step, v] = *trial.intermediate.rbegin();
    if (std::isfinite(v)) return v;
    *why = metric + " was " + value_text(v) + " at its last epoch (" + epoch_text(step) + ")";
    return std::nullopt;
  }
  // The trainer's rule for the best checkpoint: an epoch improves on the best so far by more
  // than min_delta (the trial's own where the study searches it); NaN never improves.
  double min_delta = settings.min_delta;
  for (const Param& p : settings.space)
    if (p.name == "train.early_stopping.min_delta" && trial.params.count(p.name))
      min_delta = Config::parse("", settings.name, {p.name + "=" + p.text(trial.params.at(p.name))})
                      .number(p.name);
  const bool min = settings.direction == Direction::minimize;
  double best = min ? INFINITY : -INFINITY;
  std::optional<int64_t> at;
  for (const auto& [step, v] : trial.intermediate)
    if (min ? v < best - min_delta : v > best + min_delta) best = v, at = step;
  if (!at) {
    *why = metric + " was never finite (NaN or " + (min ? "inf" : "-inf") + " at every epoch)";
    return std::nullopt;
  }
  if (!std::isfinite(best)) {
    *why = metric + " was " + value_text(best) + " at " + epoch_text(*at);
    return std::nullopt;
  }
  return best;
}

std::optional<Trial> best_trial(const std::vector<Trial>& trials, Direction d) {
  std::optional<Trial> best;
  for (const auto& t : trials) {
    if (t.state != TrialState::complete || !t.value || std::isnan(*t.value)) continue;
    if (!best || (d == Direction::minimize ? *t.value < *best->value : *t.value > *best->value))
      best = t;
  }
  return best;
}

OptimizeStats Study::optimize(const Objective& objective, const OptimizeOptions& options,
                              std::ostream& console) {
  OptimizeStats stats;
  const Worker me{host_name(), int64_t(getpid())};
  const int64_t n_trials = options.n_trials;
  const Grid* grid = sampler_->grid();
  if (grid) console << "the grid has " << grid->size() << " points\n";
  const int64_t max_failures =
      options.max_failures > 0 ? options.max_failures : std::max<int64_t>(n_trials, 3);
  const double start = steady_now();
  const InterruptScope interrupts;  // SIGINT, SIGTERM: the trial under way stops at a step
  for (;;) {
    if (const int sig = interrupt_requested())
      throw Interrupted(sig, detail::concat("interrupted (", sig == SIGINT ? "SIGINT" : "SIGTERM",
                                            "): no new trial; run seqforge tune again to go on"));
    if (options.timeout > 0 && steady_now() - start >= options.timeout) {
      console << "timeout: " << options.timeout << " s passed, no new trial\n";
      break;
    }
    const double t0 = steady_now();
    std::optional<Trial> claimed = storage_->claim(n_trials, me, settings_.grace_period, grid);
    if (!claimed) break;
    Trial trial = std::move(*claimed);
    // A waiting trial may bring fixed parameters (Optuna's enqueue_trial, a retry): the sampler
    // draws the others.
    std::string claim_problem = trial.message;
    trial.message.clear();
    std::optional<std::string> discarded;  // set when another worker failed this trial
    bool complete_params = true;
    for (const auto& p : settings_.space)
      complete_params = complete_params && trial.params.count(p.name);
    try {
      if (!complete_params && claim_problem.empty()) {  // a trial that fails takes no draw
        std::map<std::string, double> sampled;
        try {
          sampled = sampler_->sample(storage_->trials(), trial);
        } catch (const Error& e) {  // the trial fails; the study goes on
          if (claim_problem.empty()) claim_problem = e.what();
        }
        for (const auto& [k, v] : trial.params) sampled[k] = v;
        trial.params = std::move(sampled);
      }
      storage_->set_params(trial.id, trial.params);
    } catch (const TrialFinishedError& e) {
      discarded = e.reason;
    }
    training_seconds_ = 0;
    double hook_seconds = 0;
    Context ctx(trial, *storage_, *pruner_, settings_.direction, &hook_seconds);
    TrialState state = TrialState::complete;
    std::optional<double> value;
    std::string message;
    int64_t epochs = 0;
    bool abort = false;
    int interrupted = 0;  // the signal that stopped this trial
    if (!claim_problem.empty() && !discarded) {
      state = TrialState::failed;
      message = claim_problem;
    } else if (!discarded) {
      Heartbeat beat(where_, trial.id, settings_.heartbeat_interval);
      try {
        epochs = objective(ctx);
        if (ctx.pruned) {
          state = TrialState::pruned;
          value = trial.intermediate.rbegin()->second;
        } else {
          const auto counted = trial_value(trial, settings_, &message);
          if (counted) {
            value = counted;
          } else {
            state = TrialState::failed;
          }
        }
      } catch (const TrialFinishedError& e) {
        discarded = e.reason;
      } catch (const Diverged& e) {
        // Under tune.value: best the trial keeps its best epoch: its value and its checkpoint,
        // saved before the divergence.
        std::string why;
        value = settings_.value == "best" ? trial_value(trial, settings_, &why) : std::nullopt;
        state = value ? TrialState::complete : TrialState::failed;
        message = value ? std::string(kDivergedNote) + e.what() : e.what();
        epochs = static_cast<int64_t>(trial.intermediate.size());
      } catch (const Interrupted& e) {  // recorded as failed, as Optuna does, then the worker ends
        state = TrialState::failed;
        message = e.what();
        value.reset();
        interrupted = e.signal();
      } catch (const std::exception& e) {
        state = TrialState::failed;
        message = e.what();
        value.reset();
        abort = dynamic_cast<const StudyError*>(&e) != nullptr;
      }
    }
    if (state == TrialState::failed)  // the epochs it reported before it failed
      epochs = std::max(epochs, static_cast<int64_t>(trial.intermediate.size()));
    const double elapsed = steady_now() - t0;
    const double training = std::max(0.0, training_seconds_ - hook_seconds);
    stats.overhead_seconds.push_back(std::max(0.0, elapsed - training));
    // The result is written even through a busy or briefly unreachable database; never into a
    // trial another worker has failed meanwhile (it queued a retry of the parameters).
    bool runs_again = false;
    for (int attempt = 0; !discarded; ++attempt) {
      try {
        storage_->set_attrs(
            trial.id, {{"seconds", elapsed}, {"overhead_seconds", stats.overhead_seconds.back()}});
        runs_again = storage_->finish(trial.id, state, value, epochs, message, interrupted != 0);
        break;
      } catch (const TrialFinishedError& e) {
        discarded = e.reason;
      } catch (const std::exception& e) {
        if (attempt >= 5) throw;
        console << "trial " << trial.number << ": retrying its result: " << e.what() << "\n";
        std::this_thread::sleep_for(std::chrono::milliseconds(200 << attempt));
      }
    }
    if (discarded) {
      console << "trial " << trial.number
              << ": failed by another worker while this worker was paused (" << *discarded
              << "); its result is discarded\n"
              << std::flush;
      ++stats.discarded;
      continue;
    }
    ++stats.trials;
    stats.complete += state == TrialState::complete;
    stats.pruned += state == TrialState::pruned;
    stats.failed += state == TrialState::failed;
    if (state == TrialState::failed) stats.last_failure = message;
    char head[160];
    std::snprintf(head, sizeof head, "trial %-4lld %-8s %s %-10s epochs %-3lld %7.1f s  ",
                  (long long)trial.number, state_name(state), settings_.metric.c_str(),
                  fmt_value(value).c_str(), (long long)epochs, elapsed);
    console << head << describe_params(settings_, trial.params);
    if (state == TrialState::failed) console << "\n  failed: " << message;
    if (state == TrialState::complete && !message.empty()) console << "\n  " << message;
    if (const auto best = best_trial(storage_->trials(), settings_.direction))
      console << "  (best: trial " << best->number << ", " << fmt_value(best->value) << ")";
    console << "\n" << std::flush;
    if (interrupted)
      throw Interrupted(
          interrupted, detail::concat("interrupted (", interrupted == SIGINT ? "SIGINT" : "SIGTERM",
                                      ") during trial ", trial.number,
                                      ", recorded as failed; run seqforge tune again to go on",
                                      runs_again             ? " (its parameters run again first)"
                                      : trial.params.empty() ? ""
                                                             : " (its parameters do not run "
                                                               "again: they have failed 3 times)"));
    if (abort) throw StudyError(message);
    if (stats.failed >= max_failures) {
      console << "giving up: " << stats.failed << " trials failed in this worker\n";
      break;
    }
  }
  return stats;
}

namespace {
// A trial as a report shows its state: a running one whose worker is gone is said so.
std::string shown_state(const Trial& t) {
  return t.worker_gone ? "running (worker gone)" : state_name(t.state);
}
std::string gone_note(const Trial& t) {
  return "its worker (" + t.host + " pid " + std::to_string(t.pid) +
         ") is gone: the next seqforge tune records the trial as failed and runs its parameters "
         "again";
}
}  // namespace

std::string trials_table(const std::vector<Trial>& trials, const TuneSettings* settings) {
  std::vector<std::vector<std::string>> rows{
      {"trial", "state", "value", "epochs", "time s", "parameters"}};
  for (const auto& t : trials) {
    char secs[32] = "-";
    if (t.finished > 0 && t.started > 0)
      std::snprintf(secs, sizeof secs, "%.1f", t.finished - t.started);
    else if (t.state == TrialState::running && t.started > 0 && !t.worker_gone)
      std::snprintf(secs, sizeof secs, "%.1f+", now_seconds() - t.started);
    std::string params;
    if (settings) {
      params = describe_params(*settings, t.params);
    } else {
      for (const auto& [k, v] : t.params)
        params += (params.empty() ? "" : " ") + k + "=" + fmt_value(v);
    }
    if (t.state != TrialState::running && !t.message.empty())
      params += "  [" + t.message.substr(0, 100) + "]";
    if (t.worker_gone) params += "  [" + gone_note(t) + "]";
    rows.push_back({std::to_string(t.number), shown_state(t), fmt_value(t.value),
                    std::to_string(t.epochs), secs, params});
  }
  std::vector<size_t> width(6, 0);
  for (const auto& r : rows)
    for (size_t c = 0; c + 1 < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::ostringstream out;
  for (const auto& r : rows) {
    for (size_t c = 0; c + 1 < r.size(); ++c)
      out << r[c] << std::string(width[c] - r[c].size() + 2, ' ');
    out << r.back() << "\n";
  }
  return out.str();
}

namespace {}  // namespace

std::string html_report(const std::string& study_name, const std::string& metric,
                        const std::vector<Trial>& trials, Direction direction,
                        const std::vector<Param>& space) {
  using report::escape;
  TuneSettings names;
  names.space = space;
  auto color = [](TrialState s) {
    return s == TrialState::complete  ? "#2563eb"
           : s == TrialState::pruned  ? "#9ca3af"
           : s == TrialState::running ? "#16a34a"
                                      : "#dc2626";
  };
  // A trial's point: its value, or (pruned, failed, running) its last reported one.
  auto shown_value = [](const Trial& t) -> std::optional<double> {
    if (t.value) return t.value;
    if (!t.intermediate.empty()) return t.intermediate.rbegin()->second;
    return std::nullopt;
  };
  std::map<TrialState, int64_t> counts;
  for (const auto& t : trials) ++counts[t.state];
  std::map<TrialState, report::Series> history;
  report::Series best_line("best so far");
  best_line.style = report::Series::Style::steps;
  best_line.color = "#111";
  std::optional<double> best;
  for (const auto& t : trials) {
    if (const auto v = shown_value(t)) {
      report::Series& s = history[t.state];
      s.name = state_name(t.state);
      s.color = color(t.state);
      s.style = report::Series::Style::points;
      s.x.push_back(double(t.number));
      s.y.push_back(*v);
      s.tips.push_back("trial " + std::to_string(t.number) + " (" + state_name(t.state) +
                       "): " + fmt_value(*v) + "  " + describe_params(names, t.params));
    }
    if (t.state == TrialState::complete && t.value &&
        (!best || (direction == Direction::minimize ? *t.value < *best : *t.value > *best)))
      best = *t.value;
    if (best) best_line.x.push_back(double(t.number)), best_line.y.push_back(*best);
  }
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>seqforge study "
    << escape(study_name) << "</title><style>" << report::kStyle << "</style></head><body>\n"
    << "<h1>seqforge study: " << escape(study_name) << "</h1><p class=\"meta\">" << trials.size()
    << " trials";
  for (const auto& [state, n] : counts) h << " &middot; " << n << " " << state_name(state);
  h << " &middot; " << direction_name(direction) << (metric.empty() ? "" : " " + escape(metric))
    << ". Pruned, failed and running trials at their last reported value.</p>\n";
  report::Chart c;
  c.title = "Optimisation history";
  c.x_label = "trial";
  c.x_kind = report::XKind::integer;
  for (auto& [state, s] : history) c.series.push_back(std::move(s));
  if (best_line.x.size() > 0) c.series.push_back(best_line);
  c.width = 560;
  h << "<div class=\"grid\">" << report::render(c);
  // Every trial's metric epoch by epoch, running and killed ones too.
  report::Chart curves;
  curves.title = metric.empty() ? "Metric per epoch" : metric + " per epoch";
  curves.x_label = "epoch";
  curves.x_kind = report::XKind::integer;
  curves.width = 560;
  for (const auto& t : trials) {
    report::Series line;
    line.color = color(t.state);
    line.opacity = t.state == TrialState::pruned ? 0.5 : 0.8;
    for (const auto& [step, v] : t.intermediate) {
      line.x.push_back(double(step + 1));
      line.y.push_back(v);
    }
    curves.series.push_back(std::move(line));
  }
  h << report::render(curves) << "</div>\n<h2>Parameters</h2><div class=\"grid\">";
  for (const auto& p : space) {
    report::Chart pc;
    pc.title = p.name;
    pc.x_label = p.name;
    pc.x_scale = p.log ? report::Scale::log : report::Scale::linear;
    if (p.kind == Param::Kind::categorical) pc.x_categories = p.choices;
    std::map<TrialState, report::Series> by_state;
    for (const auto& t : trials) {
      const auto it = t.params.find(p.name);
      const auto v = shown_value(t);
      if (it == t.params.end() || !v) continue;
      report::Series& s = by_state[t.state];
      s.name = state_name(t.state);
      s.color = color(t.state);
      s.style = report::Series::Style::points;
      s.x.push_back(it->second);
      s.y.push_back(*v);
      s.tips.push_back("trial " + std::to_string(t.number) + ": " + p.text(it->second) + " -> " +
                       fmt_value(*v));
    }
    for (auto& [state, s] : by_state) pc.series.push_back(std::move(s));
    h << report::render(pc);
  }
  h << "</div>\n<h2>Trials</h2><table><tr><th>trial</th><th class=\"text\">state</th>"
       "<th>value</th><th>epochs reported</th><th>time s</th><th class=\"text\">parameters</th>"
       "<th class=\"text\">note</th></tr>";
  for (const auto& t : trials) {
    char secs[32] = "";
    if (t.finished > 0 && t.started > 0)
      std::snprintf(secs, sizeof secs, "%.1f", t.finished - t.started);
    else if (t.state == TrialState::running && t.started > 0 && !t.worker_gone)
      std::snprintf(secs, sizeof secs, "%.1f so far", now_seconds() - t.started);
    h << "<tr" << (t.state == TrialState::failed ? " class=\"failed\"" : "") << "><td>" << t.number
      << "</td><td class=\"text\">" << shown_state(t) << "</td><td>" << fmt_value(t.value)
      << "</td><td>" << t.intermediate.size() << "</td><td>" << secs << "</td><td class=\"text\">"
      << escape(describe_params(names, t.params)) << "</td><td class=\"text\">"
      << escape(t.worker_gone ? gone_note(t) : t.message) << "</td></tr>";
  }
  h << "</table></body></html>\n";
  return h.str();
}

namespace {

void write_text(const fs::path& path, const std::string& text) {
  io::write_file_atomically(path.string(), {{text.data(), text.size()}});
}

bool is_url(const std::string& s) { return s.find("://") != std::string::npos; }

// `from`'s keys set in `into`, a map within a map merged the same way.
void merge_map(YAML::Node into, const YAML::Node& from) {
  for (const auto& kv : from) {
    const std::string key = kv.first.as<std::string>();
    if (YAML::Node inner = into[key]; kv.second.IsMap() && inner.IsMap())
      merge_map(inner, kv.second);
    else
      into[key] = kv.second;
  }
}

// The config's YAML with `tune.a.b=value` overrides set in its tune: section.
std::string with_tune_overrides(const std::string& yaml, const std::string& source,
                                const std::vector<std::string>& overrides) {
  if (overrides.empty()) return yaml;
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    fail(source, ":", e.mark.line + 1, ": not valid YAML: ", yaml_error(e));
  }
  check_yaml_expansion(root, source);
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos) fail("override '", o, "': expected key.path=value");
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      fail("override '", o, "': not valid YAML: ", yaml_error(e));
    }
    std::vector<std::string> path;
    std::stringstream keys(o.substr(0, eq));
    for (std::string k; std::getline(keys, k, '.');) path.push_back(k);
    // Under tune.space a config key's dots are part of its name (tune.space.optim.lr.low).
    if (path.size() > 3 && path[0] == "tune" && path[1] == "space") {
      const auto joined = [&](size_t end) {  // path[2], ..., path[end - 1] as one name
        std::string name = path[2];
        for (size_t i = 3; i < end; ++i) name += "." + path[i];
        return name;
      };
      bool named = false;
      for (size_t end = path.size(); end > 3 && !named; --end) {
        const std::string name = joined(end);
        const auto& all = config_keys();
        if (std::none_of(all.begin(), all.end(),
                         [&](const ConfigKey& k) { return k.path == name; }))
          continue;
        path.erase(path.begin() + 3, path.begin() + std::ptrdiff_t(end));
        path[2] = name;
        named = true;
      }
      if (!named) {
        // Otherwise the first part would become a parameter of its own ('model').
        const auto& fields = param_fields();
        const bool field = std::find(fields.begin(), fields.end(), path.back()) != fields.end();
        const std::string name = joined(field ? path.size() - 1 : path.size());
        fail("override '", o, "': '", name, "' is not a config key", config_key_suggestion(name));
      }
    }
    // Walks down from the root, making the maps the path needs; YAML::Node assignment rebinds,
    // hence the recursion rather than a loop over references.
    auto set = [&](auto&& self, YAML::Node node, size_t i) -> void {
      if (node.IsDefined() && !node.IsMap() && !node.IsNull())
        fail("override '", o, "': ", i == 0 ? std::string("the config") : path[i - 1], " in ",
             source, " is not a map");
      if (i + 1 == path.size()) {
        // A map merges into the section it names, as a training override's does
        // ('tune.sampler={seed: 5}' keeps the file's sampler kind).
        if (YAML::Node section = node[path[i]]; value.IsMap() && section.IsMap())
          merge_map(section, value);
        else
          node[path[i]] = value;
        return;
      }
      YAML::Node child = node[path[i]];
      self(self, child, i + 1);
    };
    set(set, root, 0);
  }
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

}  // namespace

int run_tune(const TuneCommand& cmd_in, std::ostream& console) {
  if (cmd_in.config.empty())
    fail("tune: give a CONFIG.yaml with a tune: section, or --report STUDY");
  // Each rank would be a worker of its own whose trials wait for the others' in every step.
  if (dist::launched_by_mpi() && dist::world().size() > 1)
    fail("tune: under mpirun with ", dist::world().size(),
         " processes: each trial runs in one process; start seqforge tune without mpirun (more "
         "workers: more seqforge tune processes on the same study)");
  TuneCommand cmd = cmd_in;  // tune.* overrides set the study's settings, the others its trials'
  std::vector<std::string> tune_overrides;
  std::erase_if(cmd.overrides, [&](const std::string& o) {
    if (o.rfind("tune.", 0) != 0) return false;
    tune_overrides.push_back(o);
    return true;
  });
  const Config base = Config::load(cmd.config, cmd.overrides);
  TuneSettings settings = parse_tune_settings(
      with_tune_overrides(io::read_file(cmd.config), cmd.config, tune_overrides),
      tune_overrides.empty() ? cmd.config : cmd.config + " (as the tune.* overrides leave it)",
      base.str("train.early_stopping.monitor"),
      base.str("train.early_stopping.mode") == "max" ? Direction::maximize : Direction::minimize,
      cmd.config, tune_overrides.empty());
  if (!cmd.name.empty()) settings.name = cmd.name;
  if (!task_can_report(base, settings.metric)) {
    const bool monitor = settings.metric == base.str("train.early_stopping.monitor");
    fail(monitor ? base.origin("train.early_stopping.monitor") : cmd.config, ": ",
         monitor ? "train.early_stopping.monitor (the study's metric)" : "tune.metric", ": '",
         settings.metric, "' is not a metric of a ", base.str("data.task"),
         " run (see train.early_stopping.monitor in docs/config.md)");
  }
  if ((settings.direction == Direction::maximize) != higher_is_better(settings.metric))
    console << "warning: the study " << direction_name(settings.direction) << "s "
            << settings.metric << ", which is better "
            << (higher_is_better(settings.metric) ? "higher" : "lower")
            << ": its best trial is the worst (tune.direction)\n";
  settings.min_delta = base.number("train.early_stopping.min_delta");
  // Each trial sets its searched keys: an override of one would be recorded but never run.
  for (const Param& p : settings.space)
    if (base.origin(p.name).rfind("override '", 0) == 0)
      fail(base.origin(p.name), ": ", p.name, " is searched (", p.where,
           "): each trial sets it to its sampled value; drop the override, or take ", p.name,
           " out of tune.space");
  // A trial's refusal of its monitored metric (the study's) in the study's words; "" for any
  // other error.
  const auto as_study_metric = [&](const std::string& what) -> std::string {
    const std::string key = "train.early_stopping.monitor";
    const size_t at = what.find(": " + key);
    if (at == std::string::npos) return "";
    return (settings.metric == base.str(key)
                ? base.origin(key) + ": " + key + " (the study's metric)"
                : cmd.config + ": tune.metric") +
           what.substr(at + 2 + key.size());
  };
  // Where and how fast a trial runs changes none of its numbers, and the study sets what the
  // trial watches and keeps; the rest must stay the same for the study's trials to compare.
  const Config absolute = base.with_absolute_paths(io::current_directory());
  for (const ConfigKey& k : config_keys()) {
    static const std::set<std::string> not_compared = {"train.run_dir",
                                                       "train.threads",
                                                       "data.num_workers",
                                                       "data.prefetch_factor",
                                                       "train.progress_seconds",
                                                       "train.device",
                                                       "train.early_stopping.monitor",
                                                       "train.early_stopping.mode",
                                                       "train.save"};
    if (k.path.rfind("tune.", 0) == 0 || not_compared.count(k.path) ||
        std::any_of(settings.space.begin(), settings.space.end(),
                    [&](const Param& p) { return p.name == k.path; }))
      continue;
    settings.trial_config[k.path] = absolute.str(k.path);
  }
  // The trainer keeps the checkpoint of the epoch the trial's value comes from: for `best`, its
  // early stopping follows the study's metric and direction; for `last`, it saves the last epoch.
  const std::vector<std::string> value_overrides = {
      "train.early_stopping.monitor=" + settings.metric,
      std::string("train.early_stopping.mode=") +
          (settings.direction == Direction::maximize ? "max" : "min"),
      "train.save=" + settings.value};
  // Every parameter's extremes must make a valid config (catches e.g. an unknown choice).
  for (const auto& p : settings.space) {
    if (p.kind == Param::Kind::categorical) continue;
    for (double v : {p.low, p.high}) {
      std::vector<std::string> o = cmd.overrides;
      const std::string value = p.text(p.snap(v));
      o.push_back(p.name + "=" + value);
      try {
        check_settings(Config::load(cmd.config, o));
      } catch (const Error& e) {  // named as the space's bound, not as an override never given
        std::string why = e.what();
        const std::string given = "override '" + o.back() + "': ";
        if (const size_t at = why.find(given); at != std::string::npos) why.erase(at, given.size());
        fail(cmd.config, ": tune.space.", p.name, v == p.low ? ".low" : ".high", ": ", value,
             " makes no valid trial config: ", why);
      }
    }
  }
  {  // what every trial's config ignores (a tuned adapter.rank without an adapter), said once;
     // a setting every trial shares that a trial would refuse (augment.*, optim.*), before any
    std::vector<std::string> o = cmd.overrides;
    for (const auto& p : settings.space)
      o.push_back(p.name + "=" + p.text(p.kind == Param::Kind::categorical ? 0.0 : p.snap(p.low)));
    const Config first = Config::load(cmd.config, o);
    check_settings(first);
    for (const std::string& w : ignored_settings(first)) console << "warning: " << w << "\n";
    for (const std::string& w : settings.unused) console << "warning: " << w << "\n";
    // and what a trial would refuse once it reads the data (a missing column, a metric this data
    // does not give), before the study exists rather than as one failed trial after another
    o.insert(o.end(), value_overrides.begin(), value_overrides.end());
    try {
      check_before_training(Config::load(cmd.config, o));
    } catch (const Error& e) {
      if (const std::string why = as_study_metric(e.what()); !why.empty()) fail(why);
      if (settings.space.empty()) throw;
      std::string values;  // the values may be the space's, not the config's
      for (size_t i = 0; i < settings.space.size(); ++i)
        values += (i ? ", " : "") + o[cmd.overrides.size() + i];
      fail(cmd.config, ": the trial of the space's low bounds and first choices (", values,
           ") is refused before training: ", e.what());
    }
  }
  const fs::path dir = base.str("train.run_dir").empty() ? fs::path("runs") / settings.name
                                                         : fs::path(base.str("train.run_dir"));
  const std::string where = cmd.study.empty() ? (dir / "study.db").string() : cmd.study;
  OptimizeOptions options;
  options.n_trials = cmd.n_trials >= 0 ? cmd.n_trials : settings.n_trials;
  options.timeout = cmd.timeout >= 0 ? cmd.timeout : settings.timeout;
  std::vector<std::map<std::string, std::string>> fixed;  // all valid before the study is opened
  for (const auto& spec : cmd.enqueue) {
    fixed.push_back(parse_enqueue(spec));
    check_fixed_params(settings.space, fixed.back(), where, settings.name);
    if (settings.sampler.kind == "grid")
      for (const auto& p : settings.space)
        if (!fixed.back().count(p.name))
          fail("--enqueue '", spec, "': a grid study's trial gives every parameter; ", p.name,
               " is missing");
  }
  // The trials' directories are one study's: another study of the same name (in another
  // database) would overwrite its checkpoints and best.yaml.
  const fs::path owner_file = dir / "study.json";
  const std::string storage =
      is_url(where) ? redacted_url(where) : fs::weakly_canonical(fs::absolute(where)).string();
  const auto check_owner = [&] {
    if (!fs::exists(owner_file)) return;
    const auto owner = nlohmann::json::parse(io::read_file(owner_file.string()), nullptr, false);
    if (!owner.is_object() || owner.value("storage", "") != storage ||
        owner.value("study", "") != settings.name)
      fail(dir.string(), " holds the trials of ",
           owner.is_object()
               ? "study '" + owner.value("study", "?") + "' in " + owner.value("storage", "?")
               : "another study (" + owner_file.string() + " is damaged)",
           ", not of study '", settings.name, "' in ", storage,
           ": give this study its own directory (train.run_dir) or name (tune.name)");
  };
  check_owner();  // before a directory is made
  // A run's directory (one a training may be starting in) is not a study's: their report.html
  // would replace each other.
  if (holds_a_run(dir) || fs::exists(dir / ".lock"))
    fail(dir.string(), ": holds a training run's files (",
         holds_a_run(dir) ? "its metrics, model or training state" : "its .lock",
         "), not a study's: give the study its own directory (train.run_dir) or name (tune.name)");
  // A study that cannot be opened leaves no directory behind.
  fs::path made = fs::absolute(dir);
  while (!made.parent_path().empty() && made.parent_path() != made &&
         !fs::exists(made.parent_path()))
    made = made.parent_path();
  if (fs::exists(made)) made.clear();
  fs::create_directories(dir);
  std::unique_ptr<Study> opened;
  {
    // Another study started at the same moment checks and claims the directory after this one;
    // one that made and claimed it first keeps it whole, whatever this one's fate (the lock is
    // held until what this one made is gone).
    const io::FileLock claim((dir / ".study.lock").string());
    try {
      if (!made.empty()) {  // what this process made holds only the way down to its lock
        const fs::path base = made.lexically_normal();
        fs::path at = base;
        std::error_code ec;
        const fs::path way = fs::absolute(dir).lexically_normal().lexically_relative(base);
        for (const fs::path& step : way) {
          if (step.empty() || step == ".") continue;
          for (const auto& entry : fs::directory_iterator(at, ec))
            if (entry.path().filename() != step) made.clear();
          at /= step;
        }
        for (const auto& entry : fs::directory_iterator(at, ec))
          if (entry.path().filename() != ".study.lock") made.clear();
      }
      check_owner();
      opened = std::make_unique<Study>(Storage::open(where), settings, where);
      if (!fs::exists(owner_file)) {
        const std::string owner =
            nlohmann::json{{"storage", storage}, {"study", settings.name}}.dump();
        io::write_file_atomically(owner_file.string(), {{owner.data(), owner.size()}});
      }
    } catch (...) {
      std::error_code ignored;
      if (!made.empty()) fs::remove_all(made, ignored);
      throw;
    }
  }
  Study& study = *opened;
  for (size_t i = 0; i < fixed.size(); ++i) {
    const int64_t number = study.enqueue(fixed[i]);
    console << "enqueued trial " << number << ": " << cmd.enqueue[i] << "\n";
  }
  if (!fixed.empty()) {  // the total bounds waiting trials too: say which will not run now
    int64_t ran = 0, waiting = 0;
    for (const Trial& t : study.trials()) {
      waiting += t.state == TrialState::waiting;
      ran += t.state == TrialState::running || t.state == TrialState::complete ||
             t.state == TrialState::pruned;
    }
    if (ran + waiting > options.n_trials)
      console << "note: " << waiting << " trials wait but the study's total (--n-trials) leaves "
              << std::max<int64_t>(0, options.n_trials - ran)
              << " to run: the others wait for a tune with a larger --n-trials\n";
  }
  console << "seqforge tune: study '" << settings.name << "' in " << redacted_url(where) << ": "
          << (settings.sampler.kind == "grid" ? "up to " : "") << options.n_trials
          << (options.n_trials == 1 ? " trial" : " trials")
          << (options.timeout > 0 ? detail::concat(" or ", options.timeout, " s") : "") << ", "
          << settings.direction_name() << " " << settings.metric << ", sampler "
          << settings.sampler.kind << ", pruner " << settings.pruner.kind << "; runs in "
          << (dir / "trial-N").string() << " (log: train.log)\n"
          << std::flush;
  // Trials side by side on a CPU share its cores: each worker's trials take their share of the
  // threads (no worker spins on another's cores), unless train.threads or OMP_NUM_THREADS says.
  std::string cpu_share;  // a train.threads override for every trial of every worker, or none
  const Objective objective = [&](TrialContext& ctx) -> int64_t {
    const fs::path run = dir / ("trial-" + std::to_string(ctx.number()));
    fs::create_directories(run);
    std::vector<std::string> o = cmd.overrides;
    if (!cpu_share.empty()) o.push_back(cpu_share);
    for (const auto& p : param_overrides(settings, ctx.params())) o.push_back(p);
    for (const auto& v : value_overrides) o.push_back(v);
    o.push_back("train.run_dir=" + yaml_string(run.string()));
    const Config c = Config::load(cmd.config, o);
    std::ofstream log(run / "train.log");
    log << "# trial " << ctx.number() << ": " << describe_params(settings, ctx.params()) << "\n";
    TrainHooks hooks;
    hooks.on_epoch_stop = "pruned";
    hooks.on_epoch = [&](int64_t epoch, const std::map<std::string, double>& m) {
      auto it = m.find(settings.metric);
      if (it == m.end()) {
        std::string have;
        for (const auto& [k, v] : m) have += (have.empty() ? "" : ", ") + k;
        throw StudyError(detail::concat(cmd.config, ": tune.metric: '", settings.metric,
                                        "' is not a metric of this task (", have, ")"));
      }
      return ctx.report(epoch - 1, it->second);
    };
    const double t0 = steady_now();
    TrainSummary s;
    try {
      s = train(c, log, "", hooks, /*overwrite=*/true);  // the study owns its trial directories
    } catch (const Interrupted& e) {
      study.add_training_seconds(steady_now() - t0);
      // A trial goes on as a new trial of the study, not as a resumed run.
      std::string what = e.what();
      what = what.substr(0, what.find("; continue with: seqforge train --resume"));
      throw Interrupted(e.signal(), what);
    } catch (const Error& e) {
      study.add_training_seconds(steady_now() - t0);
      log << "error: " << e.what() << "\n" << std::flush;
      // The trainer checks the monitored metric (the study's) before the epoch hook does.
      if (const std::string why = as_study_metric(e.what()); !why.empty()) throw StudyError(why);
      throw;
    } catch (...) {
      study.add_training_seconds(steady_now() - t0);
      throw;
    }
    study.add_training_seconds(steady_now() - t0);
    return s.epochs;
  };
  // More workers on this device: at once for a given count; for auto on a GPU, once the first
  // trial has shown what one takes (the memory pool keeps its peak).
  HelperWorkers helpers;
  const bool auto_workers = settings.trials_per_device_auto;
  const bool on_gpu = (auto_workers || settings.trials_per_device > 1) &&
                      make_run_backend(base.str("train.device"))->name() == "cuda";
  auto share_cpus = [&](int workers) {
    const int cpus = usable_cpus();
    const bool tuned = std::any_of(settings.space.begin(), settings.space.end(),
                                   [](const Param& p) { return p.name == "train.threads"; });
    const char* omp = std::getenv("OMP_NUM_THREADS");
    if (const int64_t threads = base.integer("train.threads") > 0 ? base.integer("train.threads")
                                : omp                             ? std::atoll(omp)
                                                                  : 0;
        threads > 0 || tuned || omp) {
      if (threads * workers > cpus)
        console << "warning: tune.trials_per_device: " << workers << " workers of " << threads
                << " threads each (train.threads or OMP_NUM_THREADS) on " << cpus
                << " CPUs: their threads will wait for each other\n";
      return std::string();
    }
    const int each = std::max(1, cpus / workers);
    console << "tune.trials_per_device: " << workers << " trials at once on " << cpus << " CPUs, "
            << each << (each == 1 ? " thread" : " threads") << " each\n";
    return "train.threads=" + std::to_string(each);
  };
  auto start_helpers = [&](int count) {
    if (count < 1) return;
    if (cmd.executable.empty())
      fail(cmd.config, ": tune.trials_per_device: more workers need the seqforge command");
    if (!on_gpu) cpu_share = share_cpus(count + 1);
    std::vector<std::string> args = {"tune", cmd.config};
    args.insert(args.end(), cmd.overrides.begin(), cmd.overrides.end());
    for (const std::string& o : tune_overrides)
      if (o.rfind("tune.trials_per_device=", 0) != 0) args.push_back(o);
    if (!cpu_share.empty()) args.push_back(cpu_share);
    args.insert(args.end(), {"tune.trials_per_device=1", "--study", where, "--name", settings.name,
                             "--n-trials", std::to_string(options.n_trials)});
    if (options.timeout > 0) args.insert(args.end(), {"--timeout", fmt_value(options.timeout)});
    const int first = helpers.count() + 1;
    helpers.start(count, cmd.executable, args, dir);
    console << "tune.trials_per_device: " << count << " more worker" << (count > 1 ? "s" : "")
            << " on this " << (on_gpu ? "GPU" : "CPU")
            << " (log: " << (dir / ("worker-" + std::to_string(first) + ".log")).string()
            << (count > 1 ? ", ..." : "") << ")\n"
            << std::flush;
  };
  size_t free_before = 0, total = 0;
  bool measure = auto_workers && on_gpu && cuda_free_memory(&free_before, &total);
  if (auto_workers && !on_gpu)
    console << "tune.trials_per_device auto: one trial at a time (the trials train on the CPU)\n";
  if (!auto_workers) start_helpers(static_cast<int>(settings.trials_per_device) - 1);
  // After the first trial that trained, however it ended (the memory pool keeps its peak).
  const auto measure_and_start = [&](int64_t number) {
    size_t free_after = 0;
    if (!cuda_free_memory(&free_after, &total)) return;
    const double took = free_before > free_after ? double(free_before - free_after) : 0.0;
    const int fit = trials_that_fit(double(free_after), took);
    console << "tune.trials_per_device auto: trial " << number << " took "
            << int64_t(took / (1 << 20)) << " MiB of the GPU, " << int64_t(free_after >> 20)
            << " MiB are free: " << fit << " trials at once\n";
    start_helpers(fit - 1);
  };
  const Objective with_helpers = [&](TrialContext& ctx) -> int64_t {
    if (!measure) return objective(ctx);
    measure = false;
    int64_t epochs = 0;
    try {
      epochs = objective(ctx);
    } catch (const Diverged&) {  // it trained: its memory counts
      measure_and_start(ctx.number());
      throw;
    } catch (...) {  // it may have failed before it used the GPU: the next trial measures
      measure = true;
      throw;
    }
    measure_and_start(ctx.number());
    return epochs;
  };
  const OptimizeStats stats = study.optimize(with_helpers, options, console);
  for (const std::string& problem : helpers.wait()) console << "warning: " << problem << "\n";
  std::vector<Trial> trials = study.trials();
  mark_gone_workers(trials);
  console << "\n" << trials_table(trials, &settings);
  write_text(dir / "report.html", html_report(settings.name, settings.metric, trials,
                                              settings.direction, settings.space));
  const auto best = best_trial(trials, settings.direction);
  // No trial has completed, none of this worker's failed (it found none to claim, or pruned
  // them) and other workers' trials still run (none a dead process of this host): no failure.
  const auto running = std::count_if(trials.begin(), trials.end(), [](const Trial& t) {
    return t.state == TrialState::running && !t.worker_gone;
  });
  if (!best && stats.failed == 0 && running > 0) {
    console << "no trial of study '" << settings.name << "' has completed yet; " << running
            << " running in other workers (seqforge tune --report " << where << " --name "
            << settings.name
            << " shows them when they end)\nreport: " << (dir / "report.html").string() << "\n";
    return 0;
  }
  if (!best) {
    console << "report: " << (dir / "report.html").string() << "\n";
    fail(where, ": no trial of study '", settings.name, "' completed (", stats.failed,
         " failed in this worker; see the table and trial-N/train.log)",
         stats.last_failure.empty() ? "" : "; the last failed with: " + stats.last_failure);
  }
  const fs::path best_dir = dir / ("trial-" + std::to_string(best->number));
  const std::string best_config = (best_dir / "config.resolved.yaml").string();
  console << "best: trial " << best->number << ", " << settings.metric << " "
          << fmt_value(best->value) << ", " << describe_params(settings, best->params);
  if (fs::exists(best_config)) {
    // Its run directory left to default: `seqforge train best.yaml` trains in runs/best, not
    // over the trial.
    const Config trial =
        Config::load(best_config).with_values({{"train.run_dir", "''"}}, "best.yaml");
    const bool diverged = best->message.starts_with(kDivergedNote);
    const std::string diverged_note =
        "trial " + std::to_string(best->number) +
        " diverged after its best epoch, whose checkpoint it kept: trained anew, this config "
        "may diverge again";
    write_text(dir / "best.yaml",
               (diverged ? "# " + diverged_note + "\n" : std::string()) + trial.resolved_yaml());
    console << "\n  config: " << (dir / "best.yaml").string()
            << "\n  checkpoint: " << (best_dir / "model.safetensors").string();
    if (diverged) console << "\n  note: " << diverged_note;
  } else {  // a trial another program (Optuna) ran, or a worker of another train.run_dir
    console << "\n  (no run directory " << best_dir.string()
            << ": the trial ran in another train.run_dir, or outside seqforge; its parameters "
               "are above)";
  }
  console << "\n  report: " << (dir / "report.html").string() << "\n";
  if (!stats.overhead_seconds.empty()) {
    std::vector<double> o = stats.overhead_seconds;
    std::sort(o.begin(), o.end());
    char buf[96];
    std::snprintf(buf, sizeof buf, "per-trial overhead (median of %zu): %.1f ms\n", o.size(),
                  1000 * (o[(o.size() - 1) / 2] + o[o.size() / 2]) / 2);
    console << buf;
  }
  return 0;
}

int run_tune_report(const std::string& study, const std::string& name, const std::string& html,
                    std::ostream& console) {
  auto storage = Storage::open(study, /*read_only=*/true);
  const auto info = storage->info(name);
  if (!info)
    fail(study, name.empty() ? ": holds no study" : ": holds no study named '" + name + "'");
  const Direction d = info->direction == "maximize" ? Direction::maximize : Direction::minimize;
  TuneSettings names;
  names.space = space_from_json(info->space);
  std::vector<Trial> trials = storage->trials();
  mark_gone_workers(trials);
  int64_t counts[5] = {}, gone = 0;
  for (const auto& t : trials) ++counts[int(t.state)], gone += t.worker_gone;
  // The metric is the fingerprint's second field ("maximize;val_skill;..."); a study Optuna
  // made has none.
  const size_t first = info->fingerprint.find(';');
  const std::string metric =
      first == std::string::npos
          ? ""
          : info->fingerprint.substr(first + 1, info->fingerprint.find(';', first + 1) - first - 1);
  // Names and values come from the study file: printed escaped, line by line.
  std::ostringstream text;
  text << "study '" << info->name << "' (" << info->direction
       << (metric.empty() ? "" : " " + metric) << "): " << trials.size() << " trials, "
       << counts[int(TrialState::complete)] << " complete, " << counts[int(TrialState::pruned)]
       << " pruned, " << counts[int(TrialState::failed)] << " failed, "
       << counts[int(TrialState::running)] << " running"
       << (gone ? " (" + std::to_string(gone) + " of them with their worker gone)" : "") << ", "
       << counts[int(TrialState::waiting)] << " waiting\n\n"
       << trials_table(trials, &names);
  if (const auto best = best_trial(trials, d))
    text << "best: trial " << best->number << ", value " << fmt_value(best->value) << ", "
         << describe_params(names, best->params) << "\n";
  std::istringstream lines(text.str());
  for (std::string line; std::getline(lines, line);) console << printable(line) << "\n";
  std::string out = html;
  if (out.empty())
    out = is_url(study) ? info->name + "-report.html"
                        : (fs::absolute(study).parent_path() / "report.html").string();
  write_text(out, html_report(info->name, metric, trials, d, names.space));
  console << "report: " << out << "\n";
  return 0;
}

}  // namespace seqforge::tune
