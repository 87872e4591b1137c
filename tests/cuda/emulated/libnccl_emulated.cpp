// The host emulation's NCCL: a shared library named libnccl.so.2, found by the CUDA backend's
// dlopen in the emulated tests. The ranks of a communicator are backends in one process: a
// rank's all-reduce is held until every rank has made its call of the same index, and the last
// one sums them all (in rank order, in double) into every rank's buffer as it calls (after the
// work enqueued before it on its stream). It refuses what the real one would: a type or operation
// other than f32 sum, a count that differs between the ranks, a rank joined twice.
#include <dlfcn.h>

#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "device_open.h"

namespace {

constexpr int kSuccess = 0, kInvalidArgument = 4, kFloat32 = 7, kSum = 0;

struct Call {
  const float* send;
  float* recv;
  size_t count;
};

struct Group {
  int size = 0;
  std::vector<bool> joined;
  std::vector<std::vector<Call>> calls;  // per rank, in order
  size_t done = 0;                       // calls summed, for every rank
};

struct Comm {
  std::shared_ptr<Group> group;
  int rank = 0;
};

std::mutex mutex;
std::map<long, std::shared_ptr<Group>>& groups() {
  static std::map<long, std::shared_ptr<Group>> g;
  return g;
}

// Sums every call that all ranks have made.
int reduce_ready(Group& g) {
  for (;;) {
    for (const auto& calls : g.calls)
      if (calls.size() <= g.done) return kSuccess;
    const size_t n = g.calls[0][g.done].count;
    for (const auto& calls : g.calls)
      if (calls[g.done].count != n) return kInvalidArgument;
    const DeviceOpen device;
    std::vector<double> sum(n, 0.0);
    for (const auto& calls : g.calls)
      for (size_t i = 0; i < n; ++i) sum[i] += calls[g.done].send[i];
    for (const auto& calls : g.calls)
      for (size_t i = 0; i < n; ++i) calls[g.done].recv[i] = static_cast<float>(sum[i]);
    ++g.done;
  }
}

}  // namespace

extern "C" {

struct ncclUniqueId {
  char internal[128];
};

int ncclGetVersion(int* version) {
  *version = 22800;
  return kSuccess;
}

const char* ncclGetErrorString(int result) {
  return result == kSuccess ? "no error" : "invalid argument (host emulation)";
}

int ncclGetUniqueId(ncclUniqueId* id) {
  static long next = 1;
  std::lock_guard lock(mutex);
  std::memset(id->internal, 0, sizeof id->internal);
  const long key = next++;
  std::memcpy(id->internal, &key, sizeof key);
  return kSuccess;
}

int ncclCommInitRank(void** comm, int size, ncclUniqueId id, int rank) {
  long key = 0;
  std::memcpy(&key, id.internal, sizeof key);
  std::lock_guard lock(mutex);
  std::shared_ptr<Group>& g = groups()[key];
  if (!g) {
    g = std::make_shared<Group>();
    g->size = size;
    g->joined.assign(size_t(size), false);
    g->calls.resize(size_t(size));
  }
  if (key == 0 || size != g->size || rank < 0 || rank >= size || g->joined[size_t(rank)])
    return kInvalidArgument;
  g->joined[size_t(rank)] = true;
  *comm = new Comm{g, rank};
  return kSuccess;
}

int ncclCommDestroy(void* comm) {
  delete static_cast<Comm*>(comm);
  return kSuccess;
}

int ncclAllReduce(const void* send, void* recv, size_t count, int type, int op, void* comm,
                  void* stream) {
  if (type != kFloat32 || op != kSum || !comm) return kInvalidArgument;
  // The work before it on its stream runs first (the emulated runtime's queue): it wrote `send`.
  using Synchronize = void (*)(void*);
  static const Synchronize synchronize =
      reinterpret_cast<Synchronize>(dlsym(RTLD_DEFAULT, "sf_emu_synchronize"));
  if (synchronize) synchronize(stream);
  Comm& c = *static_cast<Comm*>(comm);
  std::lock_guard lock(mutex);
  c.group->calls[size_t(c.rank)].push_back(
      {static_cast<const float*>(send), static_cast<float*>(recv), count});
  return reduce_ready(*c.group);
}

}  // extern "C"
