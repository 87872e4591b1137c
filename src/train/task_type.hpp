#pragma once
// What differs from task to task in training and evaluation, behind one interface: the head the
// model needs, the loss, the metrics of a split, and what a checkpoint stores to rebuild the
// task's data for eval, predict and generate. One implementation per TaskKind.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/data/datasets.hpp"
#include "seqforge/data/loader.hpp"
#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/train/config.hpp"

namespace seqforge {

// Sums over the batches of a split, turned into val_* metrics at the end.
class MetricSums {
 public:
  virtual ~MetricSums() = default;
  // The model's output `out` for batch `b`, whose windows start at `windows` (b.size).
  virtual void add(const float* out, const Batch& b, const int64_t* windows) = 0;
  // Adds the task's metrics to `m` (which holds val_loss).
  virtual void finish(std::map<std::string, double>* m) const = 0;
  // Why the task's metric `name` can have no value on this data, known before any output is
  // added; "" where it may have one.
  virtual std::string absent(const std::string& /*name*/) const { return ""; }
};

class TaskType {
 public:
  virtual ~TaskType() = default;
  virtual TaskKind kind() const = 0;
  virtual const char* samples() const { return "windows"; }  // what a split is made of
  // Sets the input, output and head of `m` for the task's data.
  virtual void shape_model(const Config& c, const Dataset& d, ModelOptions* m) const = 0;
  // Bytes of one batch's buffers per window step, for the loader's memory budget.
  virtual int64_t bytes_per_step(const Dataset& d) const = 0;
  // The batch's mean loss into `loss` (one f64 in the backend's memory, not waited for); its
  // gradient goes to `dout`.
  // `regression`: the regression tasks' loss (train.loss).
  virtual void loss(Backend& be, const RegressionLoss& regression, Tensor out, const Batch& b,
                    Tensor dout, Tensor loss) const = 0;
  // The terms the mean loss of the batch's examples [first, end) averages over (windows, masked
  // steps, characters), and whether they vary from batch to batch beyond the examples' count.
  virtual int64_t loss_terms(const Dataset& d, const Batch& b, int64_t first,
                             int64_t end) const = 0;
  virtual bool loss_terms_vary() const { return false; }
  // The val_* metrics an epoch can watch besides val_loss: those `d` gives, or with none, those
  // any data of the task can give.
  virtual std::vector<std::string> metric_names(const Dataset* d) const = 0;
  virtual std::unique_ptr<MetricSums> metric_sums(const Dataset& d) const = 0;
  // Checkpoint metadata that rebuilds the task's data later (normalisation, vocabulary, ...),
  // and the reverse into `stored`; `where` names the checkpoint in errors.
  virtual void store(const Config& c, const Dataset& d,
                     std::map<std::string, std::string>* meta) const = 0;
  virtual void restore(const std::map<std::string, std::string>& meta, const std::string& where,
                       Dataset* stored) const = 0;
};

const TaskType& task_type(TaskKind kind);

}  // namespace seqforge
