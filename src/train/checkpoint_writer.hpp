#pragma once
// Writes checkpoints on a thread of its own, so the training loop never waits for the disk.
// Each write is atomic (write_safetensors: temporary file, fsync, rename).
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "seqforge/core/tensor.hpp"

namespace seqforge {

class Backend;

class CheckpointWriter {
 public:
  CheckpointWriter();
  ~CheckpointWriter();  // writes what was submitted, then stops
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // Tensors of `backend` that keep their values while the writer lives (a frozen base's weights):
  // a later submit takes them as they are where the host can read them, else downloads them
  // once, rather than copying a large base for every checkpoint.
  void keep_constant(const Backend& backend, const std::vector<Tensor>& tensors);
  // Snapshots the tensors now (`tensors` from `backend`, `host_tensors` from host memory);
  // writes them later.
  void submit(const std::string& path, Backend& backend,
              const std::vector<std::pair<std::string, Tensor>>& tensors,
              const std::vector<std::pair<std::string, Tensor>>& host_tensors,
              std::map<std::string, std::string> metadata);
  // Waits until everything submitted is on disk; rethrows a failed write. A failed write is
  // rethrown once, by this or the next submit; nothing submitted after it is written.
  void flush();

 private:
  struct Job {
    std::string path;
    std::vector<std::string> names;
    std::vector<std::shared_ptr<const char>> data;
    std::map<std::string, std::string> metadata;
    std::vector<std::vector<int64_t>> shapes;
    std::vector<DType> dtypes;
  };
  void rethrow_locked();
  void run();
  std::shared_ptr<const char> snapshot(Backend& backend, const Tensor& t);

  struct Constant {
    Tensor tensor;
    std::shared_ptr<const char> bytes;  // null until first submitted
  };
  std::vector<Constant> constants_;  // used by the submitting thread only

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false, busy_ = false;
  bool failed_ = false;  // a write failed: later jobs are dropped
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace seqforge
