// deepspeed: DeepSpeed's launcher for deepspeed.cpp programs.
//
//   deepspeed --num_procs 2 build/ds_train --config configs/ds_demo.json
//   deepspeed -H hostfile -i "worker-0@worker-1:0,2" --launcher openmpi build/ds_train ...
//   deepspeed --launcher local --num_procs 4 ./my_program args
//
// Same flags, hostfile format and .deepspeed_env as DeepSpeed's `deepspeed`; ranks are started by
// mpirun (default), srun or fork(). See docs/launcher.md and tools/launcher/launcher.h.
//
// Exit codes: the failing rank's exit code; 1 for launcher errors (bad hostfile, --include, ...);
// 2 for command-line errors (argparse's convention).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ds/core/error.h"
#include "launcher.h"

namespace dl = ds::launcher;

namespace {

void print_local_ranks(const dl::Plan& p) {
  for (int r = 0; r < p.world_size(); ++r) {
    const dl::RankInfo info = dl::rank_info(p.spec.layout, r);
    std::string vars;
    for (const auto& [k, v] : dl::rank_env(info, p.spec.master_addr, p.spec.master_port))
      vars += fmt::format("{}={} ", k, v);
    fmt::print("[deepspeed] cmd = {}{}\n", vars,
               dl::shell_join(dl::rank_argv(p.spec, info.local_rank)));
  }
  std::fflush(stdout);
}

int launch(dl::Options& o) {
  const dl::LauncherKind kind = dl::parse_launcher(o.launcher);
  if (!o.each_rank_log.empty()) {
    std::error_code ec;
    DS_CHECK(!std::filesystem::exists(o.each_rank_log, ec) ||
                 std::filesystem::is_directory(o.each_rank_log, ec),
             "[deepspeed] {} should not be a file, it should be a directory.", o.each_rank_log);
  }
  // Under Slurm without a hostfile srun knows the nodes; "local resources only" would mislead.
  const std::optional<dl::HostPool> pool =
      dl::fetch_hostfile(o.hostfile, /*warn=*/kind != dl::LauncherKind::kSlurm);
  const char* home = std::getenv("HOME");
  const dl::EnvList env_files =
      dl::load_env_files(home ? home : "", std::filesystem::current_path().string());
  const dl::Machine machine = dl::this_machine();
  const dl::Plan plan = dl::make_plan(o, pool, env_files, machine);

  switch (plan.kind) {
    case dl::LauncherKind::kLocal:
      print_local_ranks(plan);
      return o.dry_run ? 0 : dl::run_local(plan);
    case dl::LauncherKind::kOpenMPI: {
      const std::vector<std::string> cmd = dl::mpirun_command(plan, dl::self_exe(), machine);
      fmt::print("[deepspeed] cmd = {}\n", dl::shell_join(cmd));
      if (o.dry_run) return 0;
      DS_CHECK(dl::find_in_path("mpirun"),
               "[deepspeed] launcher 'openmpi' not installed: no mpirun on PATH; install OpenMPI "
               "(apt install openmpi-bin) or use --launcher local");
      dl::exec_command(cmd);  // mpirun's exit code is the first failing rank's
    }
    case dl::LauncherKind::kSlurm: {
      const std::vector<std::string> cmd = dl::srun_command(plan, dl::self_exe());
      fmt::print("[deepspeed] cmd = {}\n", dl::shell_join(cmd));
      if (o.dry_run) return 0;
      DS_CHECK(dl::find_in_path("srun"),
               "[deepspeed] launcher 'slurm' not installed: no srun on PATH; run inside a Slurm "
               "allocation or use --launcher openmpi");
      // Values srun's --export cannot carry (commas) reach the ranks through --export=ALL.
      for (const auto& [k, v] : plan.spec.exports) setenv(k.c_str(), v.c_str(), 1);
      dl::exec_command(cmd);
    }
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The hidden per-rank mode, started by mpirun/srun through the command this program builds.
  if (argc >= 2 && std::string_view(argv[1]) == "--_rank_wrapper") {
    try {
      return dl::rank_wrapper_main(std::vector<std::string>(argv + 2, argv + argc));
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}\n", e.what());
      return 1;
    }
  }

  CLI::App app{
      "DeepSpeed's launcher for deepspeed.cpp programs: starts one process per slot on the hosts "
      "of a hostfile (or on this machine) through mpirun, srun or fork, and gives each rank RANK, "
      "LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT and "
      "--local_rank=<n>.\nUsage: deepspeed [options] program [args...]",
      "deepspeed"};
  dl::Options o;
  app.add_option("-H,--hostfile", o.hostfile,
                 "Hostfile (MPI style, `worker-0 slots=4` per line) defining the hosts and slots "
                 "of the job; when missing, the job runs on this machine only")
      ->capture_default_str();
  app.add_option("-i,--include", o.include,
                 "Resources to use: NODE_SPEC[@NODE_SPEC ...] with NODE_SPEC=NAME[:SLOT[,SLOT "
                 "...]]; e.g. \"worker-0@worker-1:0,2\" uses all slots of worker-0 and slots 0 "
                 "and 2 of worker-1");
  app.add_option("-e,--exclude", o.exclude,
                 "Resources NOT to use, same syntax as --include (mutually exclusive with it); "
                 "e.g. \"worker-1:0\"");
  app.add_option("--num_nodes", o.num_nodes,
                 "Number of nodes to run on: the first N hosts of the hostfile")
      ->capture_default_str();
  app.add_option("--num_gpus,--num_accelerators,--num_procs", o.num_procs,
                 "Ranks per node (slots 0..N-1 of each host); without a hostfile, the number of "
                 "ranks on this machine (default: its number of cores)")
      ->capture_default_str();
  app.add_option("--master_addr", o.master_addr,
                 "Address of rank 0 given to every rank as MASTER_ADDR (default: 127.0.0.1 "
                 "without a hostfile, else the first host)");
  app.add_option("--master_port", o.master_port, "Port given to every rank as MASTER_PORT")
      ->capture_default_str();
  app.add_option("--launcher", o.launcher,
                 "How ranks are started: openmpi (mpirun, also on one machine), slurm (srun) or "
                 "local (fork on this machine, no MPI)")
      ->capture_default_str();
  app.add_option("--launcher_args", o.launcher_args,
                 "Extra arguments for mpirun/srun, as one quoted string, e.g. "
                 "--launcher_args=\"--mca btl_tcp_if_include eth0\"");
  app.add_flag("--no_local_rank", o.no_local_rank, "Do not pass --local_rank=<n> to the program");
  app.add_flag("--no_python", o.no_python,
               "Run a program ending in .py directly instead of with `python3 -u`");
  app.add_flag("--force_multi", o.force_multi,
               "Accepted for DeepSpeed compatibility; every job already goes through the chosen "
               "launcher");
  app.add_flag("--bind_cores_to_rank", o.bind_cores_to_rank,
               "Bind each rank to its own share of the node's cores and set OMP_NUM_THREADS to it");
  app.add_option("--bind_core_list", o.bind_core_list,
                 "Cores to share out with --bind_cores_to_rank, e.g. 1,3-5,7 (default: all)");
  app.add_option("--enable_each_rank_log", o.each_rank_log,
                 "Folder receiving each rank's stdout and stderr as <timestamp>_rank<R>.log");
  app.add_flag("--dry_run", o.dry_run, "Print the command(s) without running anything");
  // Everything from the program on belongs to the program, including its own --options.
  app.prefix_command();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  o.program = app.remaining();
  if (!o.program.empty() && o.program.front() == "--") o.program.erase(o.program.begin());
  if (!o.program.empty() && o.program.front().starts_with("-")) {
    // prefix_command() hands over the first argument it does not know: here a mistyped option.
    fmt::print(stderr, "[deepspeed] unknown option {} (see --help)\n", o.program.front());
    return 2;
  }
  if (o.program.empty()) {
    fmt::print(stderr,
               "[deepspeed] no program given: deepspeed [options] program [args...] (see "
               "--help)\n");
    return 2;
  }

  try {
    return launch(o);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
