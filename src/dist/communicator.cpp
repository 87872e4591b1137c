#include "seqforge/dist/communicator.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "seqforge/core/error.hpp"

namespace seqforge::dist {

namespace fs = std::filesystem;

void LocalCommunicator::abort(const std::string& message) {
  std::fprintf(stderr, "seqforge: error: rank 0: %s\n", message.c_str());
  std::fflush(nullptr);
  std::_Exit(1);
}

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var)) return true;
  return false;
}

namespace {

constexpr const char* kModule = "libseqforge_mpi.so";

// Where the module may be: the override, next to this code's binary (the build tree, or an
// installed shared library), the install's lib directory relative to it and absolute.
std::vector<std::string> module_candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("SEQFORGE_MPI_MODULE"); env && *env) {
    out.emplace_back(env);
    return out;
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&module_candidates), &info) && info.dli_fname) {
    std::error_code ec;
    fs::path self = fs::canonical(info.dli_fname, ec);
    if (ec) self = info.dli_fname;
    out.push_back((self.parent_path() / kModule).string());
#ifdef SEQFORGE_INSTALL_LIBDIR
    out.push_back((self.parent_path().parent_path() / SEQFORGE_INSTALL_LIBDIR / kModule).string());
#endif
  }
#ifdef SEQFORGE_INSTALL_FULL_LIBDIR
  out.push_back((fs::path(SEQFORGE_INSTALL_FULL_LIBDIR) / kModule).string());
#endif
  return out;
}

std::unique_ptr<Communicator> make_world() {
  if (!launched_by_mpi()) return std::make_unique<LocalCommunicator>();
#ifndef SEQFORGE_HAVE_MPI_MODULE
  fail(
      "this process was started by mpirun, but this seqforge was built without MPI "
      "(SEQFORGE_MPI=OFF; install libopenmpi-dev and rebuild)");
#else
  std::string tried;
  for (const std::string& path : module_candidates()) {
    if (!fs::exists(path)) {
      tried += "; " + path + ": not found";
      continue;
    }
    // Global symbols: Open MPI's own plugins resolve libmpi's symbols when it loads them.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
      tried += "; " + path + ": " + dlerror();
      continue;
    }
    auto create = reinterpret_cast<seqforge_mpi_create_fn>(dlsym(handle, "seqforge_mpi_create"));
    if (!create) fail(path, ": not a seqforge MPI module (no seqforge_mpi_create)");
    char error[512] = {};
    Communicator* comm = create(error, sizeof error);
    if (!comm) fail(path, ": MPI did not start: ", error);
    return std::unique_ptr<Communicator>(comm);  // the module stays loaded until exit
  }
  fail("this process was started by mpirun, but the MPI module ", kModule,
       " could not be loaded (set SEQFORGE_MPI_MODULE to its path)", tried);
#endif
}

}  // namespace

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world();
  return *w;
}

}  // namespace seqforge::dist
