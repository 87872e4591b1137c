#pragma once
// Averaging gradients across ranks while backward still runs: the flat gradient arena is cut into
// buckets of about bucket_bytes, from the last parameter back (the order backward produces
// them), and each bucket's all-reduce starts as soon as every parameter it covers is final.
// A backend with collectives of its own (NCCL on GPUs) sums the buckets on the device, queued
// with its ops; otherwise the communicator sums them, through a host copy where the host cannot
// address the backend's memory.
#include <cstddef>
#include <string>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/dist/communicator.hpp"
#include "seqforge/nn/parameters.hpp"

namespace seqforge::dist {

class GradientSync {
 public:
  // Sums gradients over the ranks (each rank weights its own beforehand).
  GradientSync(Communicator& comm, Backend& backend, Parameters& params, size_t bucket_bytes);
  // A new step: every parameter's gradient is pending.
  void begin_step();
  // Parameters [first, end) have their final gradients: starts the buckets now complete, in
  // order, and lets those under way progress.
  void ready(size_t first, size_t end);
  // Starts whatever is left (a rank without samples this step contributes zeros) and waits
  // for every bucket.
  void finish();
  size_t buckets() const { return buckets_.size(); }
  // Whether the backend sums on the device, and if not, why.
  bool on_device() const { return on_device_; }
  const std::string& why_host() const { return why_host_; }

 private:
  struct Bucket {
    size_t begin = 0, end = 0;  // elements of the gradient arena
    size_t pending = 0;         // parameters not yet ready
    Communicator::Request request = 0;
  };
  void start_ready_buckets();
  void join_device_collectives();

  Communicator& comm_;
  Backend& backend_;
  Parameters& params_;
  std::vector<float> host_;        // (gradient arena elements) the host copy, when one is needed
  std::vector<Bucket> buckets_;    // buckets_[0] holds the last parameters
  std::vector<size_t> bucket_of_;  // per parameter
  std::vector<char> ready_;        // per parameter, this step
  size_t started_ = 0;             // buckets [0, started_) are under way
  bool on_device_ = false;         // the backend's all_reduce_sum (join_collectives succeeded)
  std::string why_host_;
};

}  // namespace seqforge::dist
