// Collectives: ours (ds::comm, shared-memory path within a node) against OpenMPI's own, measured in
// the same run on the same buffers, and how much of a large all_reduce hides behind computation.
//
//   build/bench/bench_comm [--np 2] [--max-mib 128] [--overlap-mib 64]
//
// Started without mpirun it re-launches itself under mpirun -np N (oversubscribed, as root
// allowed). Per size: the median over repetitions of the slowest rank's time. Lines:
//   BENCH comm op=<op> bytes=<n> mpi_ms=<a> ours_ms=<b> speedup=<a/b> bus_gbps=<ours>
//   BENCH comm op=overlap bytes=<n> comm_ms=<c> compute_ms=<k> both_ms=<b> overlap=<f> ...
// bytes is the larger buffer (reduce_scatter: the input; all_gather: the output); bus bandwidth
// follows nccl-tests (all_reduce 2(N-1)/N, reduce_scatter and all_gather (N-1)/N of bytes, reduce
// and broadcast 1).
// overlap = (comm + compute - both) / min(comm, compute): 1 when the collective is fully hidden.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ds/comm/group.h"
#include "ds/comm/logger.h"
#include "ds/core/error.h"

using namespace ds;
using namespace ds::comm;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median over `reps` of the slowest rank's duration of fn() (all ranks start together).
double time_op(MPI_Comm comm, int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    MPI_Barrier(comm);
    const double t0 = now_s();
    fn();
    double dt = now_s() - t0, worst = 0;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, comm);
    t.push_back(worst);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Compute-bound work on a cache-resident array (leaves memory bandwidth to the collective).
double compute(int64_t iters) {
  float a[256];
  for (int i = 0; i < 256; ++i) a[i] = i * 1e-3f;
  for (int64_t k = 0; k < iters; ++k)
    for (int i = 0; i < 256; ++i) a[i] = a[i] * 0.999f + 1e-4f * std::sqrt(a[i] + 1.0f);
  double s = 0;
  for (float v : a) s += v;
  return s;
}

// bf16 sum for MPI's reference reduce_scatter: widen, add, round (what any MPI user would write).
void bf16_sum_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  const int np = arg_int(argc, argv, "--np", 2);
  const int max_mib = arg_int(argc, argv, "--max-mib", 128);
  const int overlap_mib = arg_int(argc, argv, "--overlap-mib", 64);
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) {
    // Not under mpirun: start ourselves under it.
    std::vector<std::string> a = {DS_MPIEXEC,        DS_MPIEXEC_NUMPROC_FLAG, std::to_string(np),
                                  "--oversubscribe", "--allow-run-as-root",   argv[0]};
    for (int i = 1; i < argc; ++i) a.push_back(argv[i]);
    std::vector<char*> av;
    for (auto& s : a) av.push_back(s.data());
    av.push_back(nullptr);
    std::fflush(stdout);
    execvp(av[0], av.data());
    std::perror("execvp mpirun");
    return 1;
  }
  std::shared_ptr<Group> g = init_from_environment();
  const int n = g->size(), me = g->rank();
  MPI_Comm ref;  // MPI's collectives run on their own communicator
  MPI_Comm_dup(MPI_COMM_WORLD, &ref);
  MPI_Op bf16_sum;
  MPI_Op_create(&bf16_sum_fn, 1, &bf16_sum);
  if (me == 0) std::printf("bench_comm: %d ranks, ours: %s\n", n, g->capabilities().str().c_str());

  auto report = [&](const char* op, size_t bytes, double mpi, double ours, double factor) {
    if (me != 0) return;
    std::printf("BENCH comm op=%s bytes=%zu mpi_ms=%.3f ours_ms=%.3f speedup=%.2f bus_gbps=%.2f\n",
                op, bytes, mpi * 1e3, ours * 1e3, mpi / ours, bytes * factor / ours / 1e9);
    std::fflush(stdout);
  };

  // Small messages (latency: the hand-off to the communication thread and back), then 1 MiB up.
  std::vector<size_t> sizes = {size_t(64) * n, size_t(64) << 10};
  for (size_t mib = 1; mib <= static_cast<size_t>(max_mib); mib *= 2) sizes.push_back(mib << 20);
  for (size_t bytes : sizes) {
    const size_t mib = bytes >> 20;
    const size_t count = bytes / 4, chunk = count / n;
    const int reps = mib < 1 ? 101 : (mib <= 8 ? 9 : (mib <= 32 ? 5 : 3));
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = float((i + me) % 17);
    // Warm up both (first touch, windows, MPI's connections).
    MPI_Reduce_scatter_block(in.data(), out.data(), int(chunk), MPI_FLOAT, MPI_SUM, ref);
    g->reduce_scatter(in.data(), out.data(), chunk, DType::f32);

    double mpi = time_op(ref, reps, [&] {
      MPI_Reduce_scatter_block(in.data(), out.data(), int(chunk), MPI_FLOAT, MPI_SUM, ref);
    });
    double ours =
        time_op(ref, reps, [&] { g->reduce_scatter(in.data(), out.data(), chunk, DType::f32); });
    report("reduce_scatter", bytes, mpi, ours, double(n - 1) / n);

    // bf16 (ZeRO's communication dtype): MPI needs a user-defined MPI_Op (what ours uses across
    // nodes); ours sums in fp32 and rounds once on the shared-memory path.
    {
      const size_t c16 = bytes / 2 / n;
      std::vector<uint16_t> in16(c16 * n), out16(c16);
      for (size_t i = 0; i < in16.size(); ++i) in16[i] = float_to_bf16(float((i + me) % 17));
      MPI_Reduce_scatter_block(in16.data(), out16.data(), int(c16), MPI_UINT16_T, bf16_sum, ref);
      g->reduce_scatter(in16.data(), out16.data(), c16, DType::bf16);
      mpi = time_op(ref, reps, [&] {
        MPI_Reduce_scatter_block(in16.data(), out16.data(), int(c16), MPI_UINT16_T, bf16_sum, ref);
      });
      ours = time_op(ref, reps,
                     [&] { g->reduce_scatter(in16.data(), out16.data(), c16, DType::bf16); });
      report("reduce_scatter_bf16", bytes, mpi, ours, double(n - 1) / n);
    }

    MPI_Allreduce(MPI_IN_PLACE, out.data(), int(count), MPI_FLOAT, MPI_SUM, ref);
    mpi = time_op(ref, reps, [&] {
      MPI_Allreduce(MPI_IN_PLACE, in.data(), int(count), MPI_FLOAT, MPI_SUM, ref);
    });
    ours = time_op(ref, reps, [&] { g->all_reduce(in.data(), count, DType::f32); });
    report("all_reduce", bytes, mpi, ours, 2.0 * (n - 1) / n);

    // reduce to rank 0 (ZeRO-2 reduces each bucket piece to its owner).
    MPI_Reduce(me == 0 ? MPI_IN_PLACE : in.data(), in.data(), int(count), MPI_FLOAT, MPI_SUM, 0, ref);
    mpi = time_op(ref, reps, [&] {
      MPI_Reduce(me == 0 ? MPI_IN_PLACE : in.data(), in.data(), int(count), MPI_FLOAT, MPI_SUM, 0, ref);
    });
    ours = time_op(ref, reps, [&] { g->reduce(in.data(), count, DType::f32, 0); });
    report("reduce", bytes, mpi, ours, 1.0);

    mpi = time_op(ref, reps, [&] {
      MPI_Allgather(in.data(), int(chunk), MPI_FLOAT, out.data(), int(chunk), MPI_FLOAT, ref);
    });
    ours = time_op(ref, reps, [&] { g->all_gather(in.data(), out.data(), chunk, DType::f32); });
    report("all_gather", bytes, mpi, ours, double(n - 1) / n);

    mpi = time_op(ref, reps, [&] { MPI_Bcast(in.data(), int(count), MPI_FLOAT, 0, ref); });
    ours = time_op(ref, reps, [&] { g->broadcast(in.data(), count, DType::f32, 0); });
    report("broadcast", bytes, mpi, ours, 1.0);
  }

  // ---- overlap: a large all_reduce issued asynchronously while this rank computes ----
  {
    const size_t bytes = size_t(overlap_mib) << 20, count = bytes / 4;
    std::vector<float> buf(count, 1.0f);
    g->all_reduce(buf.data(), count, DType::f32);
    const double comm = time_op(ref, 5, [&] { g->all_reduce(buf.data(), count, DType::f32); });
    // Calibrate the computation to last about as long as the collective (twice: the first
    // estimate comes from a short run).
    volatile double sink = 0;
    int64_t iters = 1000;
    for (int round = 0; round < 3; ++round) {
      const double t = time_op(ref, 1, [&] { sink = compute(iters); });
      iters = std::max<int64_t>(1, static_cast<int64_t>(iters * comm / t));
      MPI_Allreduce(MPI_IN_PLACE, &iters, 1, MPI_INT64_T, MPI_MIN, ref);
    }
    const double comp = time_op(ref, 5, [&] { sink = compute(iters); });
    const double both = time_op(ref, 5, [&] {
      Work w = g->all_reduce_async(buf.data(), count, DType::f32, ReduceOp::sum, "overlap");
      sink = compute(iters);
      w.wait();
    });
    // The same with MPI's non-blocking all_reduce and no communication thread: it progresses only
    // inside MPI calls, so almost nothing happens during the computation.
    const double nbc = time_op(ref, 5, [&] {
      MPI_Request r;
      MPI_Iallreduce(MPI_IN_PLACE, buf.data(), int(count), MPI_FLOAT, MPI_SUM, ref, &r);
      sink = compute(iters);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    });
    (void)sink;
    auto frac = [&](double c, double k, double b) { return (c + k - b) / std::min(c, k); };
    if (me == 0)
      std::printf(
          "BENCH comm op=overlap bytes=%zu comm_ms=%.1f compute_ms=%.1f both_ms=%.1f "
          "overlap=%.2f mpi_iallreduce_both_ms=%.1f mpi_iallreduce_overlap=%.2f\n",
          bytes, comm * 1e3, comp * 1e3, both * 1e3, frac(comm, comp, both), nbc * 1e3,
          frac(comm, comp, nbc));
    // The same with a wait that uses no CPU instead of the computation (a GPU kernel, file I/O):
    // what the communication thread hides when a core is free for it.
    const auto idle = std::chrono::duration<double>(comm);
    const double idle_s = time_op(ref, 5, [&] { std::this_thread::sleep_for(idle); });
    const double both_idle = time_op(ref, 5, [&] {
      Work w = g->all_reduce_async(buf.data(), count, DType::f32, ReduceOp::sum, "overlap");
      std::this_thread::sleep_for(idle);
      w.wait();
    });
    const double nbc_idle = time_op(ref, 5, [&] {
      MPI_Request r;
      MPI_Iallreduce(MPI_IN_PLACE, buf.data(), int(count), MPI_FLOAT, MPI_SUM, ref, &r);
      std::this_thread::sleep_for(idle);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    });
    if (me == 0)
      std::printf(
          "BENCH comm op=overlap_idle bytes=%zu comm_ms=%.1f idle_ms=%.1f both_ms=%.1f "
          "overlap=%.2f mpi_iallreduce_both_ms=%.1f mpi_iallreduce_overlap=%.2f\n",
          bytes, comm * 1e3, idle_s * 1e3, both_idle * 1e3, frac(comm, idle_s, both_idle),
          nbc_idle * 1e3, frac(comm, idle_s, nbc_idle));
  }

  MPI_Op_free(&bf16_sum);
  MPI_Comm_free(&ref);
  if (me == 0 && comms_logger().enabled()) std::printf("%s", comms_logger().table().c_str());
  return 0;
}
