#include <algorithm>
#include <csignal>
#include <cstring>

#include "run.hpp"
#include "seqforge/core/interrupt.hpp"
#include "seqforge/core/profiler.hpp"
#include "seqforge/report/report.hpp"
#include "seqforge/train/trainer.hpp"
#include "task_type.hpp"

namespace seqforge {

void loss_of(Backend& be, const Task& t, Tensor out, const Batch& b, Tensor dout, Tensor loss) {
  task_type(t.kind).loss(be, t.loss, out, b, dout, loss);
}

double macro_f1(const std::vector<int64_t>& tp, const std::vector<int64_t>& fp,
                const std::vector<int64_t>& fn) {
  double sum = 0;
  int64_t present = 0;
  for (size_t k = 0; k < tp.size(); ++k) {
    const double denom = 2.0 * tp[k] + fp[k] + fn[k];
    if (denom == 0) continue;  // in neither the truth nor the predictions
    sum += 2.0 * tp[k] / denom;
    ++present;
  }
  return present > 0 ? sum / present : 0.0;
}

std::vector<std::string> metric_names(const Task& t) {
  std::vector<std::string> out = {"train_loss", "val_loss"};
  for (std::string& name : task_type(t.kind).metric_names(&t)) out.push_back(std::move(name));
  return out;
}

std::string metric_absent(const Task& t, const std::string& name) {
  return task_type(t.kind).metric_sums(t)->absent(name);
}

bool task_can_report(const Config& c, const std::string& name) {
  const TaskKind kind = parse_task(c.str("data.task"), c.origin("data.task"));
  if (name == "train_loss" || name == "val_loss") return true;
  const auto names = task_type(kind).metric_names(nullptr);
  if (std::find(names.begin(), names.end(), name) != names.end()) return true;
  // A forecast of several steps reports each step's errors.
  for (const char* prefix : {"val_mae_h", "val_rmse_h"})
    if (kind == TaskKind::forecast && name.rfind(prefix, 0) == 0 &&
        name.size() > std::strlen(prefix) &&
        name.find_first_not_of("0123456789", std::strlen(prefix)) == std::string::npos)
      return true;
  return false;
}

// Metrics over a split (no training, no dropout).
std::map<std::string, double> evaluate_split(Backend& be, Model& model, const Task& t,
                                             const std::vector<int64_t>& starts, Loader& loader,
                                             bool interruptible) {
  SF_PROFILE_SCOPE("validation");
  std::map<std::string, double> m;
  if (starts.empty()) return m;
  const TaskType& type = task_type(t.kind);
  std::unique_ptr<MetricSums> sums = type.metric_sums(t);
  Buffer dout_buf, loss_buf;
  const Tensor loss = loss_buf.get(be, DType::f64, {1});
  Rng rng(0);
  double loss_sum = 0;
  int64_t count = 0;
  loader.start(starts, INT64_MAX, {}, 0);
  for (size_t done = 0; done < starts.size();) {
    if (const int sig = interruptible ? interrupt_requested() : 0)
      throw Interrupted(
          sig, detail::concat("interrupted (", sig == SIGINT ? "SIGINT" : "SIGTERM", ") after ",
                              done, " of ", starts.size(), " ", task_type(t.kind).samples()));
    const Batch& b = loader.next();
    const int64_t* windows = starts.data() + done;  // (b.size) the batch's window starts
    done += b.size;
    model.set_token_layout(b.lengths, b.segments);
    Tensor out = model.forward(be, b.input, {}, {}, false, rng);
    Tensor dout = dout_buf.get(be, DType::f32, out.shape());
    const int64_t n = type.loss_terms(t, b, 0, b.size);
    type.loss(be, t.loss, out, b, dout, loss);
    double value = 0;
    be.download(&value, loss);
    loss_sum += value * double(n);
    count += n;
    sums->add(HostView(be, out).data<float>(), b, windows);
  }
  m["val_loss"] = loss_sum / double(count);
  sums->finish(&m);
  return m;
}

std::string format_metrics(const std::map<std::string, double>& m) {
  // Of a direct forecast's errors per step ahead, the first and the last step's.
  std::map<std::string, int> last_step;
  for (const auto& [k, v] : m)
    if (const int step = metric_step(k)) {
      int& last = last_step[k.substr(0, k.rfind("_h"))];
      last = std::max(last, step);
    }
  std::string out;
  char buf[64];
  for (const auto& [k, v] : m) {
    if (const int step = metric_step(k); step > 1 && step != last_step[k.substr(0, k.rfind("_h"))])
      continue;
    std::snprintf(buf, sizeof buf, "  %s %.5g", k.c_str(), v);
    out += buf;
  }
  return out;
}

}  // namespace seqforge
