// A small MPI program for the failure tests in test_comm.cpp (CommFailure.*), started by them
// through mpirun: `comm_worker <scenario>`.
//   late         rank 1 sleeps 60 s before step 4's all_reduce; the others' deadline expires,
//                main catches TimeoutError and returns 1, and the exit ends the job.
//   late_ignore  the same, but main swallows the exception and keeps running: the reaper aborts.
//   recv         rank 0 waits for a message rank 1 never sends.
//   kill         rank 1 kills itself with SIGKILL at step 3; mpirun must end the job.
//   exit         rank 1 returns from main at step 4 (exit status 0, finalising normally) while the
//                others wait for it: they must notice at once, not at their deadline.
//   mismatch     rank 1 passes one element fewer at step 3.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "ds/comm/group.h"

using namespace ds;
using namespace ds::comm;

int main(int argc, char** argv) {
  std::string scenario;  // the first argument that is not a flag (the launcher adds --local_rank)
  for (int i = 1; i < argc && scenario.empty(); ++i)
    if (argv[i][0] != '-') scenario = argv[i];
  std::shared_ptr<Group> g = init_from_environment();
  const int me = g->rank();
  std::vector<float> v(1 << 16, 1.0f);
  try {
    for (int step = 1; step <= 6; ++step) {
      const std::string ctx = "step " + std::to_string(step);
      if (me == 1 && step == 4 && (scenario == "late" || scenario == "late_ignore")) {
        std::this_thread::sleep_for(std::chrono::seconds(60));
        std::printf("rank 1 woke up\n");
      }
      if (me == 1 && step == 3 && scenario == "kill") {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are waiting
        raise(SIGKILL);
      }
      if (me == 1 && step == 4 && scenario == "exit") {
        std::printf("rank 1 leaves early\n");
        return 0;
      }
      if (me == 1 && step == 3 && scenario == "mismatch") {
        g->all_reduce(v.data(), v.size() - 1, DType::f32, ReduceOp::sum, ctx);
        continue;
      }
      if (scenario == "recv" && step == 2) {
        if (me == 0) {
          int32_t x = 0;
          g->recv(&x, 1, DType::i32, 1, 7, "halo");
        } else {
          std::this_thread::sleep_for(std::chrono::seconds(60));
        }
      }
      g->all_reduce(v.data(), v.size(), DType::f32, ReduceOp::sum, ctx);
    }
  } catch (const TimeoutError& e) {
    std::fprintf(stderr, "rank %d caught TimeoutError\n", me);
    if (scenario == "late_ignore") {
      std::fprintf(stderr, "rank %d ignores it and keeps computing\n", me);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    return 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d caught Error\n", me);
    return 1;
  }
  std::printf("rank %d done\n", me);
  return 0;
}
