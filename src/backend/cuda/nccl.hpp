#pragma once
// NCCL, loaded at run time (libnccl.so.2) like cuBLASLt, so that a binary built with the CUDA
// backend starts where NCCL is missing: the ranks of a data-parallel job, one GPU each, sum
// device buffers on the GPUs, in stream order.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>

namespace seqforge::cuda {

class Nccl {
 public:
  static constexpr size_t kIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

  // The library, or null with `why` saying what is missing.
  static std::unique_ptr<Nccl> load(std::string* why);
  ~Nccl();
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;

  // Rank 0's new communicator id, which every rank then passes to join().
  void unique_id(std::span<std::byte, kIdBytes> id);
  // Joins the job's communicator on the current GPU; every rank calls it (it blocks until all
  // have). Throws a one-line error naming NCCL's.
  void join(int rank, int size, std::span<const std::byte, kIdBytes> id);
  // data (n floats, device memory) summed over the ranks in place, queued on `stream`.
  void all_reduce_sum(float* data, size_t n, cudaStream_t stream);
  std::string version() const;  // "2.28.3"

 private:
  struct Api;
  Nccl() = default;
  void check(int result, const char* what) const;
  void* library_ = nullptr;
  Api* api_ = nullptr;
  void* comm_ = nullptr;  // ncclComm_t
};

}  // namespace seqforge::cuda
