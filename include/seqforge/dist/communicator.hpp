#pragma once
// The communicator behind data-parallel training: a handful of collectives over the processes of
// one job. A single process gets LocalCommunicator (no MPI at run time); a process started by
// mpirun gets the MPI one, from a module loaded on demand (libseqforge_mpi.so), so the seqforge
// binary itself never links libmpi. A CUDA backend can put NCCL behind the same interface.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace seqforge::dist {

enum class ReduceOp { sum, average };

class Communicator {
 public:
  using Request = int64_t;  // a nonblocking operation under way

  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Processes of this job on this machine (for sizing compute threads).
  virtual int local_size() const = 0;
  virtual std::string name() const = 0;  // "local", "mpi (Open MPI v4.1.4)"

  // Every collective that does not complete within `seconds` ends the job (abort) with a line
  // that names this rank, the timeout and `note` (where the last checkpoint is, say).
  virtual void set_timeout(double seconds, std::string note) = 0;

  // Starts an in-place all-reduce of `data` over every rank; the buffer must stay untouched
  // until wait(). Every rank starts the same all-reduces in the same order.
  virtual Request all_reduce_start(std::span<float> data, ReduceOp op) = 0;
  // Lets operations under way progress; true when `request` is complete (it stays waitable).
  virtual bool test(Request request) = 0;
  virtual void wait(Request request) = 0;
  void all_reduce(std::span<float> data, ReduceOp op) { wait(all_reduce_start(data, op)); }
  // A blocking sum of a few doubles (loss sums, sample counts).
  virtual void all_reduce_sum(std::span<double> data) = 0;

  // Copies rank 0's bytes into every other rank's `data` (same size on every rank).
  virtual void broadcast(std::span<std::byte> data) = 0;
  virtual void barrier() = 0;
  // Prints "seqforge: error: rank R: message" and ends every process of the job.
  [[noreturn]] virtual void abort(const std::string& message) = 0;
};

// A single process: rank 0 of 1; collectives leave the data as it is.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_size() const override { return 1; }
  std::string name() const override { return "local"; }
  void set_timeout(double, std::string) override {}
  Request all_reduce_start(std::span<float>, ReduceOp) override { return 0; }
  bool test(Request) override { return true; }
  void wait(Request) override {}
  void all_reduce_sum(std::span<double>) override {}
  void broadcast(std::span<std::byte>) override {}
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message) override;
};

// Whether this process was started by a launcher (mpirun, srun with PMIx) as part of a job.
bool launched_by_mpi();

// The job's communicator, created on first use: MPI under a launcher (loading the module from
// SEQFORGE_MPI_MODULE, else next to the binary or library, else the install's lib directory;
// an error if it cannot be loaded), LocalCommunicator otherwise. Lives until the process exits.
Communicator& world();

}  // namespace seqforge::dist

// The module's entry point: returns a new communicator, or null with `error` filled.
extern "C" {
using seqforge_mpi_create_fn = seqforge::dist::Communicator* (*)(char* error, size_t error_size);
}
