// The MPI communicator, built as a module (libseqforge_mpi.so) that the library loads only when
// the process was started by mpirun. Collectives are nonblocking and polled against a deadline,
// so a rank that died or hangs ends the job with one clear line instead of a hang.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "seqforge/dist/communicator.hpp"

namespace seqforge::dist {
namespace {

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    v = v.substr(0, v.find_first_of(",\n"));
    name_ = "mpi (" + v + ")";
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  std::string name() const override { return name_; }
  void set_timeout(double seconds, std::string note) override {
    timeout_ = seconds;
    note_ = std::move(note);
  }

  Request all_reduce_start(std::span<float> data, ReduceOp op) override {
    if (data.size() > static_cast<size_t>(INT_MAX)) abort("all-reduce of more than INT_MAX floats");
    const Request id = take_slot();
    Slot& s = slots_[static_cast<size_t>(id)];
    s.data = data;
    s.op = op;
    MPI_Iallreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM,
                   MPI_COMM_WORLD, &s.request);
    return id;
  }

  bool test(Request id) override {
    Slot& s = slots_.at(static_cast<size_t>(id));
    if (s.done) return true;
    int flag = 0;
    MPI_Test(&s.request, &flag, MPI_STATUS_IGNORE);
    if (!flag) return false;
    if (s.op == ReduceOp::average) {
      const float inv = 1.0f / static_cast<float>(size_);
      for (float& x : s.data) x *= inv;
    }
    s.done = true;
    return true;
  }

  void wait(Request id) override {
    poll([&] { return test(id); });
    Slot& s = slots_[static_cast<size_t>(id)];
    s = Slot{};
    free_.push_back(id);
  }

  void all_reduce_sum(std::span<double> data) override {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_DOUBLE, MPI_SUM,
                   MPI_COMM_WORLD, &r);
    wait_request(r);
  }

  void broadcast(std::span<std::byte> data) override {
    for (size_t done = 0; done < data.size();) {  // MPI counts are int
      const size_t n = std::min<size_t>(data.size() - done, size_t{1} << 30);
      MPI_Request r;
      MPI_Ibcast(data.data() + done, static_cast<int>(n), MPI_BYTE, 0, MPI_COMM_WORLD, &r);
      wait_request(r);
      done += n;
    }
  }

  void barrier() override {
    MPI_Request r;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    wait_request(r);
  }

  [[noreturn]] void abort(const std::string& message) override {
    std::fprintf(stderr, "seqforge: error: rank %d: %s\n", rank_, message.c_str());
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

 private:
  struct Slot {
    MPI_Request request = MPI_REQUEST_NULL;
    std::span<float> data;
    ReduceOp op = ReduceOp::sum;
    bool done = false;
  };

  Request take_slot() {
    if (free_.empty()) {
      slots_.emplace_back();
      return static_cast<Request>(slots_.size() - 1);
    }
    const Request id = free_.back();
    free_.pop_back();
    return id;
  }

  void wait_request(MPI_Request& r) {
    poll([&] {
      int flag = 0;
      MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      return flag != 0;
    });
  }

  // Polls until done() or the deadline. Short spins first (an all-reduce on one machine takes
  // microseconds), then naps, so a waiting rank leaves the cores to ranks still computing.
  template <class Done>
  void poll(Done done) {
    using clock = std::chrono::steady_clock;
    const auto deadline = clock::now() + std::chrono::duration<double>(timeout_);
    for (int spins = 0; !done(); ++spins) {
      if (spins < 64) continue;
      if (clock::now() > deadline) {
        char line[160];
        std::snprintf(line, sizeof line, "no reply from rank(s) within %g s (a rank died?)",
                      timeout_);
        abort(note_.empty() ? std::string(line) : std::string(line) + "; " + note_);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 1024 ? 20 : 500));
    }
  }

  int rank_ = 0, size_ = 1, local_size_ = 1;
  std::string name_;
  double timeout_ = 120;
  std::string note_;
  std::vector<Slot> slots_;
  std::vector<Request> free_;
};

}  // namespace
}  // namespace seqforge::dist

extern "C" __attribute__((visibility("default"))) seqforge::dist::Communicator* seqforge_mpi_create(
    char* error, size_t error_size) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // Only the training thread calls MPI.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      std::snprintf(error, error_size, "MPI_Init_thread failed");
      return nullptr;
    }
  }
  try {
    return new seqforge::dist::MpiCommunicator();
  } catch (const std::exception& e) {
    std::snprintf(error, error_size, "%s", e.what());
    return nullptr;
  }
}
