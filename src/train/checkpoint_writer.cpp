#include "checkpoint_writer.hpp"

#include <algorithm>
#include <cstring>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/profiler.hpp"
#include "seqforge/core/threads.hpp"
#include "seqforge/io/safetensors.hpp"

namespace seqforge {

CheckpointWriter::CheckpointWriter() : thread_([this] { run(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CheckpointWriter::keep_constant(const Backend& backend, const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors) {
    Constant c{t, nullptr};
    if (backend.host_addressable())  // not owned: the tensor outlives the writer's jobs
      c.bytes = std::shared_ptr<const char>(std::shared_ptr<const char>(),
                                            static_cast<const char*>(t.data()));
    constants_.push_back(std::move(c));
  }
}

std::shared_ptr<const char> CheckpointWriter::snapshot(Backend& backend, const Tensor& t) {
  const auto constant = std::find_if(constants_.begin(), constants_.end(), [&](const Constant& c) {
    return c.tensor.data() == t.data() && c.tensor.nbytes() == t.nbytes();
  });
  if (constant != constants_.end() && constant->bytes) return constant->bytes;
  std::shared_ptr<char[]> copy = std::make_shared_for_overwrite<char[]>(t.nbytes());
  backend.download(copy.get(), t);
  std::shared_ptr<const char> bytes(copy, copy.get());
  if (constant != constants_.end()) constant->bytes = bytes;
  return bytes;
}

void CheckpointWriter::submit(const std::string& path, Backend& backend,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::vector<std::pair<std::string, Tensor>>& host_tensors,
                              std::map<std::string, std::string> metadata) {
  SF_PROFILE_SCOPE("checkpoint submit");
  Job job;
  job.path = path;
  job.metadata = std::move(metadata);
  for (const auto& [name, v] : tensors) {
    job.names.push_back(name);
    job.data.push_back(snapshot(backend, v));
    job.shapes.push_back(v.shape().to_vector());
    job.dtypes.push_back(v.dtype());
  }
  for (const auto& [name, v] : host_tensors) {
    job.names.push_back(name);
    std::shared_ptr<char[]> copy = std::make_shared_for_overwrite<char[]>(v.nbytes());
    std::memcpy(copy.get(), v.data(), v.nbytes());
    job.data.emplace_back(copy, copy.get());
    job.shapes.push_back(v.shape().to_vector());
    job.dtypes.push_back(v.dtype());
  }
  {
    std::lock_guard lock(mutex_);
    rethrow_locked();
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void CheckpointWriter::flush() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return jobs_.empty() && !busy_; });
  rethrow_locked();
}

void CheckpointWriter::rethrow_locked() {
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void CheckpointWriter::run() {
  profiler::set_thread_name("checkpoint writer");
  const CNumbers numbers;
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    // After a failed write, none that was submitted after it: a training state must never
    // count an epoch whose model file failed.
    if (failed_) {
      cv_.notify_all();  // a flush waiting for the queue to empty
      continue;
    }
    busy_ = true;
    lock.unlock();
    try {
      SF_PROFILE_SCOPE("checkpoint write");
      std::vector<io::SafetensorsTensor> tensors;
      for (size_t i = 0; i < job.names.size(); ++i)
        tensors.push_back({job.names[i], job.dtypes[i], job.shapes[i], job.data[i].get()});
      io::write_safetensors(job.path, tensors, job.metadata);
    } catch (...) {
      lock.lock();
      error_ = std::current_exception();
      failed_ = true;
      lock.unlock();
    }
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace seqforge
