#pragma once
// The `deepspeed` launcher: DeepSpeed's command line, hostfile, --include/--exclude and
// .deepspeed_env, with ranks started by OpenMPI's mpirun, Slurm's srun or fork() (local).
//
// Everything that decides *what* to run is a pure function here (plan.cpp), so the tests check
// hostfiles, filters, rank variables and the exact mpirun/srun command lines without starting a
// process. Starting and supervising processes lives in run.cpp. See docs/launcher.md.
//
// Rank variables that mpirun and srun cannot set per rank (RANK, LOCAL_RANK, CROSS_RANK, ...) are
// set by the launcher itself, re-invoked on every rank in a hidden mode:
//
//   mpirun ... /path/to/deepspeed --_rank_wrapper --launcher openmpi --layout 2,2 ... -- prog args
//
// The wrapper reads OMPI_COMM_WORLD_* (or SLURM_*), sets the variables, starts the program with
// --local_rank=<n>, waits for it and names the rank on stderr if it fails.
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ds::launcher {

// DeepSpeed's defaults (deepspeed/launcher/runner.py).
inline constexpr const char* kDefaultHostfile = "/job/hostfile";
inline constexpr int kDefaultMasterPort = 29500;
inline constexpr const char* kEnvFileName = ".deepspeed_env";
// Variables of the launcher's environment forwarded to every rank (mpirun -x / srun --export):
// DeepSpeed's list, plus OMP_ and OPENBLAS_ which decide CPU training speed here, and DS_, our
// own settings (DS_COMM_TIMEOUT, ...). Ranks on the launcher's machine inherit everything anyway;
// this list is what reaches the other hosts.
inline constexpr const char* kForwardedPrefixes[] = {"MLFLOW", "NCCL", "PYTHON",    "MV2",
                                                     "UCX",    "OMP_", "OPENBLAS_", "DS_"};
// Seconds between SIGTERM and SIGKILL when the local launcher stops the remaining ranks.
inline constexpr int kStopGraceSeconds = 5;

using EnvList = std::vector<std::pair<std::string, std::string>>;  // ordered KEY=VALUE

// One line of a hostfile: `worker-0 slots=4`.
struct HostEntry {
  std::string host;
  int slots = 0;
  bool operator==(const HostEntry&) const = default;
};
using HostPool = std::vector<HostEntry>;  // hostfile order: decides rank order

// A host and the slots (device indices) used on it after --include/--exclude/--num_gpus.
struct HostSlots {
  std::string host;
  std::vector<int> slots;
  bool operator==(const HostSlots&) const = default;
};
using Resources = std::vector<HostSlots>;

// --- hostfile, filters, .deepspeed_env -----------------------------------------------------

// Parses hostfile text with DeepSpeed's rules: `NAME slots=N` (anything after N is ignored), lines
// starting with `#` and blank lines skipped. Throws DeepSpeed's messages: "Hostfile contains
// multiple entries for {host}", "Hostfile contains a bad entry: {line}", "Hostfile is empty or not
// formatted correctly".
HostPool parse_hostfile(std::string_view text);
// Reads and parses `path`; nullopt (and DeepSpeed's warning on stderr) when there is no such file.
std::optional<HostPool> fetch_hostfile(const std::string& path, bool warn = true);

// DeepSpeed's parse_resource_filter: `include`/`exclude` are NAME[:SLOT[,SLOT...]][@NAME...].
// Include keeps only what it names; exclude removes it. Hosts left without slots are dropped;
// hostfile order is kept. Unknown hosts or slots, and include+exclude together, throw.
Resources parse_resource_filter(const Resources& hosts, std::string_view include,
                                std::string_view exclude);
// Every host with slots 0..N-1, then the filter above.
Resources parse_inclusion_exclusion(const HostPool& pool, std::string_view include,
                                    std::string_view exclude);

// KEY=VALUE lines of a .deepspeed_env file. Blank lines and `#` comments are skipped; key and value
// are trimmed and one pair of matching quotes around the value is removed. `origin` names the file
// in errors.
EnvList parse_env_file(std::string_view text, std::string_view origin);
// $HOME/.deepspeed_env then ./.deepspeed_env (later entries win, as in DeepSpeed).
EnvList load_env_files(const std::string& home_dir, const std::string& work_dir);
// Sets key=value in `env`, replacing an earlier value of the same key in place.
void env_set(EnvList& env, const std::string& key, const std::string& value);

// --- ranks -----------------------------------------------------------------------------------

// Where a rank sits in the job. Nodes hold contiguous ranks in node order (mpirun --map-by slot,
// srun's block distribution), as in DeepSpeed's launch.py.
struct RankInfo {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_size = 1;
  int cross_rank = 0;  // node index
  int cross_size = 1;  // number of nodes
  bool operator==(const RankInfo&) const = default;
};

// `layout[i]` = ranks on node i. Throws when rank is outside the job.
RankInfo rank_info(const std::vector<int>& layout, int rank);
// RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT.
EnvList rank_env(const RankInfo& r, const std::string& master_addr, int master_port);

enum class LauncherKind { kOpenMPI, kSlurm, kLocal };
std::string_view launcher_name(LauncherKind k);
// "openmpi" | "slurm" | "local" (case-insensitive); DeepSpeed's other launchers get an error that
// says what to use instead.
LauncherKind parse_launcher(std::string_view name);

// What the wrapper learns from mpirun's (OMPI_COMM_WORLD_*) or srun's (SLURM_*) environment.
// Checks that the placement matches `layout`: a --map-by in --launcher_args would otherwise give
// silently wrong CROSS_RANKs.
RankInfo rank_info_from_env(LauncherKind kind, const std::vector<int>& layout, const EnvList& env);
// Value of `key` in `env`, or nullptr.
const std::string* env_get(const EnvList& env, std::string_view key);

// Cores a rank is bound to with --bind_cores_to_rank: `cores` split into `local_size` contiguous
// equal chunks (DeepSpeed's cores_per_rank = cores / local_size); when ranks outnumber cores, each
// rank gets one core, shared round-robin.
std::vector<int> cores_for_rank(const std::vector<int>& cores, int local_size, int local_rank);
// "1,3-5,7" -> {1,3,4,5,7} (DeepSpeed's --bind_core_list).
std::vector<int> parse_core_list(std::string_view spec);

// --- the job ---------------------------------------------------------------------------------

// The command line (see tools/deepspeed.cpp for help texts).
struct Options {
  std::string hostfile = kDefaultHostfile;
  std::string include, exclude;
  int num_nodes = -1;
  int num_procs = -1;  // --num_gpus / --num_accelerators / --num_procs
  std::string master_addr;
  int master_port = kDefaultMasterPort;
  std::string launcher = "openmpi";
  std::string launcher_args;
  bool no_local_rank = false;
  bool no_python = false;
  bool force_multi = false;
  bool bind_cores_to_rank = false;
  std::string bind_core_list;
  std::string each_rank_log;  // folder; empty: ranks write to the launcher's stdout/stderr
  bool dry_run = false;
  std::vector<std::string> program;  // the program and its arguments
};

// Facts about the machine the launcher runs on, passed in so planning stays pure.
struct Machine {
  int cores = 1;          // cores this process may run on
  std::string hostname;   // gethostname()
  bool is_root = false;   // geteuid() == 0
  EnvList environment;    // the launcher's environment (for forwarded prefixes, SLURM_*)
  std::string timestamp;  // %Y%m%d%H%M%S, prefix of --enable_each_rank_log files
};

// What every rank needs, independent of its rank: this is what the wrapper receives.
struct RankSpec {
  std::vector<int> layout;                   // ranks per node, node order
  std::vector<std::string> visible_devices;  // per node CUDA_VISIBLE_DEVICES; empty: leave as is
  std::string master_addr;
  int master_port = kDefaultMasterPort;
  bool local_rank_arg = true;  // append --local_rank=<n> after the script
  int local_rank_at = 1;       // index in `program` where it goes
  bool bind_cores = false;
  std::string bind_core_list;
  std::string log_dir, log_prefix;  // --enable_each_rank_log
  std::vector<std::string> program;
  EnvList exports;  // .deepspeed_env + forwarded variables
  bool operator==(const RankSpec&) const = default;
};

struct Plan {
  LauncherKind kind = LauncherKind::kOpenMPI;
  Resources active;             // hosts in rank order
  bool hosts_known = true;      // false under Slurm without a hostfile: srun picks the nodes
  bool oversubscribed = false;  // this machine runs more ranks than it has cores
  RankSpec spec;
  std::vector<std::string> launcher_args;  // --launcher_args split like a shell
  int world_size() const;
};

// DeepSpeed's runner.main() decisions: hostfile or localhost, --include/--exclude, --num_nodes,
// --num_gpus, master address, exports. `pool` is the parsed hostfile (nullopt: none found);
// `env_files` the parsed .deepspeed_env files. Throws ds::Error on invalid combinations.
Plan make_plan(const Options& o, const std::optional<HostPool>& pool, const EnvList& env_files,
               const Machine& m);

bool is_local_host(std::string_view host, std::string_view hostname);
// First host of a Slurm node list ("node[01-04,07],gpu1" -> "node01"): the master address under
// Slurm without a hostfile.
std::string first_slurm_host(std::string_view nodelist);

// The hidden wrapper's arguments (after `deepspeed --_rank_wrapper`; exports travel as mpirun -x
// or srun --export instead) and their parser (the inverse).
std::vector<std::string> wrapper_args(LauncherKind kind, const RankSpec& spec);
std::pair<LauncherKind, RankSpec> parse_wrapper_args(const std::vector<std::string>& args);

// mpirun -np W --host h0:s0,h1:s1 [--allow-run-as-root] [--oversubscribe --mca
// mpi_yield_when_idle 1] --map-by slot --bind-to none -x K=V... [launcher args] SELF
// --_rank_wrapper ... -- program args
std::vector<std::string> mpirun_command(const Plan& p, const std::string& self_exe,
                                        const Machine& m);
// srun -N nodes -n W --ntasks-per-node=K [--nodelist=h0,h1] --export=ALL,K=V... [launcher args]
// SELF --_rank_wrapper ... -- program args
std::vector<std::string> srun_command(const Plan& p, const std::string& self_exe);

// The program's argv for one rank: --local_rank=<n> inserted after the script unless disabled.
std::vector<std::string> rank_argv(const RankSpec& spec, int local_rank);

// shlex.split / shlex.join equivalents: --launcher_args is one shell-quoted string, and the
// printed `cmd = ...` can be pasted back into a shell.
std::vector<std::string> shell_split(std::string_view s);
std::string shell_join(const std::vector<std::string>& argv);

// --- processes (run.cpp) -----------------------------------------------------------------------

// Runs the local launcher: forks one process per rank on this machine, waits, and on the first
// failure stops the others (SIGTERM, SIGKILL after kStopGraceSeconds) and returns its exit code.
int run_local(const Plan& p);
// Replaces this process with argv (mpirun/srun). Throws when it cannot be started.
[[noreturn]] void exec_command(const std::vector<std::string>& argv);
// The hidden --_rank_wrapper mode: `args` are the arguments after --_rank_wrapper.
int rank_wrapper_main(const std::vector<std::string>& args);

Machine this_machine();
std::string self_exe();
// Whether `name` resolves to an executable on PATH (or is an executable path).
bool find_in_path(const std::string& name);

}  // namespace ds::launcher
