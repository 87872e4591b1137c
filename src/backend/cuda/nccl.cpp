#include "backend/cuda/nccl.hpp"

#include <dlfcn.h>

#include <cstring>
#include <type_traits>

#include "seqforge/core/error.hpp"

namespace seqforge::cuda {

namespace {

// NCCL 2's C interface (nccl.h), declared here so that only the library itself is needed at run
// time: results are ints (ncclSuccess 0), ncclFloat32 is 7 and ncclSum 0.
constexpr int kSuccess = 0, kFloat32 = 7, kSum = 0;
struct UniqueId {
  char internal[Nccl::kIdBytes];
};

}  // namespace

struct Nccl::Api {
  int (*get_version)(int*);
  int (*get_unique_id)(UniqueId*);
  int (*comm_init_rank)(void**, int, UniqueId, int);
  int (*comm_destroy)(void*);
  int (*all_reduce)(const void*, void*, size_t, int, int, void*, cudaStream_t);
  const char* (*error_string)(int);
};

std::unique_ptr<Nccl> Nccl::load(std::string* why) {
  void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    *why = std::string("cannot load NCCL (libnccl.so.2): ") + dlerror();
    return nullptr;
  }
  std::unique_ptr<Nccl> nccl(new Nccl);
  nccl->library_ = library;
  nccl->api_ = new Api;
  bool complete = true;
  auto resolve = [&](auto* slot, const char* symbol) {
    void* p = dlsym(library, symbol);
    if (!p) {
      *why = std::string("NCCL (libnccl.so.2) has no ") + symbol;
      complete = false;
    }
    *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(p);
  };
  resolve(&nccl->api_->get_version, "ncclGetVersion");
  resolve(&nccl->api_->get_unique_id, "ncclGetUniqueId");
  resolve(&nccl->api_->comm_init_rank, "ncclCommInitRank");
  resolve(&nccl->api_->comm_destroy, "ncclCommDestroy");
  resolve(&nccl->api_->all_reduce, "ncclAllReduce");
  resolve(&nccl->api_->error_string, "ncclGetErrorString");
  return complete ? std::move(nccl) : nullptr;
}

Nccl::~Nccl() {
  if (comm_) api_->comm_destroy(comm_);
  delete api_;
  if (library_) dlclose(library_);
}

void Nccl::check(int result, const char* what) const {
  if (result != kSuccess) fail("nccl: ", what, ": ", api_->error_string(result));
}

void Nccl::unique_id(std::span<std::byte, kIdBytes> id) {
  UniqueId u{};
  check(api_->get_unique_id(&u), "ncclGetUniqueId");
  std::memcpy(id.data(), u.internal, kIdBytes);
}

void Nccl::join(int rank, int size, std::span<const std::byte, kIdBytes> id) {
  UniqueId u{};
  std::memcpy(u.internal, id.data(), kIdBytes);
  check(api_->comm_init_rank(&comm_, size, u, rank), "ncclCommInitRank");
}

void Nccl::all_reduce_sum(float* data, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  SF_CHECK(comm_, "nccl: all-reduce before joining the job's communicator");
  check(api_->all_reduce(data, data, n, kFloat32, kSum, comm_, stream), "ncclAllReduce");
}

std::string Nccl::version() const {
  int v = 0;
  if (api_->get_version(&v) != kSuccess) return "unknown";
  // 2.9 on: major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

}  // namespace seqforge::cuda
