// The MPI backend's process-wide part: MPI initialisation from mpirun's environment, the world
// group, the custom reduction ops (16-bit sums rounded once, NaN-propagating max), finalisation and
// ending the job. Per-group execution is in mpi_group.cpp, deadlines in mpi_deadlines.cpp, the
// shared-memory collectives in shm.cpp.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/mpi_state.h"
#include "ds/comm/group.h"

namespace ds::comm {
namespace detail {

Runtime& rt() {
  static Runtime* r = new Runtime();  // leaked on purpose: it must outlive static destructors
  return *r;
}

std::atomic<bool> g_any_broken{false};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string rank_list(const std::vector<int>& rs) {
  std::string s = rs.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < rs.size(); ++i) s += (i ? ", " : "") + std::to_string(rs[i]);
  return s;
}

Clock::duration seconds_to_duration(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

namespace {

// ---- custom reductions: 16-bit floats combined in fp32 and rounded once; NaN-propagating max ----
template <DType D, ReduceOp R>
void user_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* srcs[2] = {in, inout};
  reduce_n(inout, srcs, 2, static_cast<size_t>(*len), D, R);
}

MPI_Op g_bf16_sum, g_bf16_max, g_f16_sum, g_f16_max, g_f32_max;

void create_ops() {
  auto make = [](MPI_User_function* fn) {
    MPI_Op op;
    check_mpi(MPI_Op_create(fn, 1, &op), "MPI_Op_create");
    rt().ops.push_back(op);
    return op;
  };
  g_bf16_sum = make(&user_op<DType::bf16, ReduceOp::sum>);
  g_bf16_max = make(&user_op<DType::bf16, ReduceOp::max>);
  g_f16_sum = make(&user_op<DType::f16, ReduceOp::sum>);
  g_f16_max = make(&user_op<DType::f16, ReduceOp::max>);
  g_f32_max = make(&user_op<DType::f32, ReduceOp::max>);
}

}  // namespace

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  DS_THROW("[comm] {} failed: {}", what, std::string(msg, len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(DType t, ReduceOp op) {
  switch (t) {
    case DType::f32:
      return op == ReduceOp::sum ? MPI_SUM : g_f32_max;
    case DType::bf16:
      return op == ReduceOp::sum ? g_bf16_sum : g_bf16_max;
    case DType::f16:
      return op == ReduceOp::sum ? g_f16_sum : g_f16_max;
    default:
      return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
  }
}

void abort_now(int code) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  std::fflush(stdout);
  std::fflush(stderr);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace detail

using detail::GroupState;

namespace {

void finalize_at_exit() {
  finalize();
}

}  // namespace

bool mpi_available() {
  return true;
}

std::shared_ptr<Group> init_from_environment() {
  detail::Runtime& R = detail::rt();
  {
    std::lock_guard lk(R.mu);
    if (R.world) return R.world;
    DS_CHECK(!R.finalized, "[comm] init_from_environment() after finalize()");
  }
  const std::string ompi_size = detail::env("OMPI_COMM_WORLD_SIZE");
  const std::string pmix = detail::env("PMIX_RANK");
  const std::string ws = detail::env("WORLD_SIZE");
  const bool under_mpirun = !ompi_size.empty() || !pmix.empty();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!under_mpirun && !initialized) {
    DS_CHECK(ws.empty() || ws == "1",
             "[comm] WORLD_SIZE={} but this process was not started by mpirun (no "
             "OMPI_COMM_WORLD_SIZE / PMIX_RANK): start it with `deepspeed --launcher openmpi` or "
             "mpirun -np {} ...",
             ws, ws);
    std::lock_guard lk(R.mu);
    R.world = detail::make_single_world();
    return R.world;
  }
  int provided = 0;
  if (!initialized) {
    detail::check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                      "MPI_Init_thread");
    R.mpi_initialized = true;
  } else {
    MPI_Query_thread(&provided);
  }
  DS_CHECK(provided >= MPI_THREAD_MULTIPLE,
           "[comm] this MPI provides thread level {} but the communication threads need "
           "MPI_THREAD_MULTIPLE ({}); use an MPI built with thread support (OpenMPI 4.1: "
           "ompi_info | grep MPI_THREAD_MULTIPLE)",
           provided, MPI_THREAD_MULTIPLE);
  int wrank = 0, wsize = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  if (!ws.empty())
    DS_CHECK(std::to_string(wsize) == ws,
             "[comm] WORLD_SIZE={} but MPI started {} processes; launch with the same count", ws,
             wsize);
  // Host names, for messages that say where a rank lives.
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  std::vector<char> all(static_cast<size_t>(wsize) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  {
    std::lock_guard lk(R.mu);
    for (int i = 0; i < wsize; ++i) R.hosts.emplace_back(&all[size_t(i) * MPI_MAX_PROCESSOR_NAME]);
  }
  detail::create_ops();
  MPI_Comm comm;
  detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  std::shared_ptr<Group> w = detail::make_group(comm, "world");
  {
    std::lock_guard lk(R.mu);
    R.world = w;
  }
  if (R.mpi_initialized) std::atexit(finalize_at_exit);
  return w;
}

std::shared_ptr<Group> world() {
  return init_from_environment();
}

void finalize() {
  detail::Runtime& R = detail::rt();
  std::vector<std::shared_ptr<GroupState>> states;
  {
    std::lock_guard lk(R.mu);
    if (R.finalized || R.states.empty()) return;
    states = R.states;
  }
  if (detail::g_any_broken) detail::abort_now(detail::kTimeoutExitCode);
  // Tell the peers this rank will issue nothing more (shutdown() does too, group by group): a peer
  // waiting for it in a collective fails at once (see check_peers) instead of at its deadline.
  for (auto& st : states) st->set_exiting();
  for (auto& st : states) st->shutdown();  // drains; a deadline expiring here breaks the group
  if (detail::g_any_broken) detail::abort_now(detail::kTimeoutExitCode);
  for (auto& st : states) st->free_mpi();
  for (MPI_Op& op : R.ops) MPI_Op_free(&op);
  {
    std::lock_guard lk(R.mu);
    R.finalized = true;
    R.states.clear();
    R.world.reset();
  }
  if (R.mpi_initialized) MPI_Finalize();  // else the program initialised MPI and finalises it
}

bool job_failed() {
  return detail::g_any_broken;
}

void abort_job(int code, std::string_view why) {
  if (!why.empty()) {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(why.size()), why.data());
    std::fflush(stderr);
  }
  detail::abort_now(code);
}

}  // namespace ds::comm
