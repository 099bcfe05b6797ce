// Built without MPI (-DDS_WITH_MPI=OFF or MPI not found): the world is a size-1 group; launching
// several ranks is an error that says how to rebuild.
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "comm/internal.h"

namespace ds::comm {
namespace {

std::mutex g_mu;
std::shared_ptr<Group> g_world;

bool launched_with_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", "PMI_SIZE"}) {
    const char* s = std::getenv(v);
    if (s && *s && std::atoi(s) > 1) return true;
  }
  return false;
}

}  // namespace

bool mpi_available() {
  return false;
}

std::shared_ptr<Group> init_from_environment() {
  std::lock_guard lk(g_mu);
  if (g_world) return g_world;
  DS_CHECK(!launched_with_ranks(),
           "[comm] launched as one of several ranks, but deepspeed.cpp was built without MPI; "
           "install libopenmpi-dev and rebuild with -DDS_WITH_MPI=ON");
  g_world = detail::make_single_world();
  return g_world;
}

std::shared_ptr<Group> world() {
  return init_from_environment();
}

void finalize() {}

bool job_failed() {
  return false;  // without MPI there is no group to break
}

void abort_job(int code, std::string_view why) {
  if (!why.empty()) std::fprintf(stderr, "%.*s\n", static_cast<int>(why.size()), why.data());
  std::fflush(stderr);
  std::exit(code);
}

}  // namespace ds::comm
