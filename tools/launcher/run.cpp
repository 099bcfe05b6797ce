// Starting and supervising rank processes: the local launcher (fork per rank), the hidden rank
// wrapper that runs under mpirun/srun, and exec of mpirun/srun themselves.
//
// Signals: the supervisor blocks SIGCHLD and the termination signals and takes them synchronously
// with sigtimedwait(), so there are no handlers and no races between a child exiting and a signal
// arriving. Every rank runs in its own process group so that stopping it also stops whatever it
// started (a shell's children, a data-loader process).
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/core/error.h"
#include "launcher.h"

extern char** environ;

namespace ds::launcher {

namespace {

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

// Shell convention: a process killed by signal S reports 128+S.
int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("was killed by {} (exit code {})", signal_name(WTERMSIG(status)),
                       exit_code_of(status));
  return fmt::format("exited with code {}", exit_code_of(status));
}

std::vector<int> allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cores.push_back(c);
  }
  if (cores.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < std::max(n, 1L); ++c) cores.push_back(static_cast<int>(c));
  }
  return cores;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

EnvList current_environment() {
  EnvList env;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string_view::npos)
      env.emplace_back(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

// The signals a supervisor takes synchronously: child exits and requests to stop.
sigset_t supervisor_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaddset(&set, s);
  return set;
}

// In a forked child: become the rank and exec the program. Never returns.
[[noreturn]] void exec_rank(const RankSpec& spec, const RankInfo& r, const sigset_t& old_mask) {
  try {
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    for (const auto& [k, v] : spec.exports) setenv(k.c_str(), v.c_str(), 1);
    for (const auto& [k, v] : rank_env(r, spec.master_addr, spec.master_port))
      setenv(k.c_str(), v.c_str(), 1);
    if (!spec.visible_devices.empty() &&
        !spec.visible_devices[static_cast<size_t>(r.cross_rank)].empty())
      setenv("CUDA_VISIBLE_DEVICES",
             spec.visible_devices[static_cast<size_t>(r.cross_rank)].c_str(), 1);

    const std::vector<int> cores =
        spec.bind_core_list.empty() ? allowed_cores() : parse_core_list(spec.bind_core_list);
    if (spec.bind_cores) {
      const std::vector<int> mine = cores_for_rank(cores, r.local_size, r.local_rank);
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c : mine) CPU_SET(c, &set);
      if (sched_setaffinity(0, sizeof(set), &set) != 0)
        fmt::print(stderr, "[deepspeed] rank {}: cannot bind to cores {}: {}\n", r.rank,
                   fmt::join(mine, ","), std::strerror(errno));
      setenv("OMP_NUM_THREADS", std::to_string(mine.size()).c_str(), 1);
    } else if (!std::getenv("OMP_NUM_THREADS")) {
      // Like torchrun: N ranks on a node share its cores instead of each starting one OpenMP
      // thread per core (4 ranks x 2 threads on 2 cores thrash). Set OMP_NUM_THREADS to override.
      const size_t per_rank = std::max<size_t>(1, cores.size() / static_cast<size_t>(r.local_size));
      setenv("OMP_NUM_THREADS", std::to_string(per_rank).c_str(), 1);
    }

    if (!spec.log_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(spec.log_dir, ec);
      const std::string path =
          fmt::format("{}/{}_rank{}.log", spec.log_dir, spec.log_prefix, r.rank);
      const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      DS_CHECK(fd >= 0, "[deepspeed] rank {}: cannot open log {}: {}", r.rank, path,
               std::strerror(errno));
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }

    const std::vector<std::string> args = rank_argv(spec, r.local_rank);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    fmt::print(stderr, "[deepspeed] rank {}: cannot run '{}': {}\n", r.rank, args[0],
               std::strerror(errno));
    std::fflush(stderr);
    _exit(127);  // the shell's "command not found"
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    std::fflush(stderr);
    _exit(1);
  }
}

struct Child {
  pid_t pid;
  int rank;
};

void signal_groups(const std::vector<Child>& alive, int sig) {
  for (const Child& c : alive) kill(-c.pid, sig);
}

}  // namespace

// --- the local launcher --------------------------------------------------------------------------

int run_local(const Plan& p) {
  const RankSpec& spec = p.spec;
  const std::string host = host_name();
  const sigset_t set = supervisor_signals();
  sigset_t old_mask;
  sigprocmask(SIG_BLOCK, &set, &old_mask);

  std::vector<Child> alive;
  for (int r = 0; r < p.world_size(); ++r) {
    const RankInfo info = rank_info(spec.layout, r);
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      signal_groups(alive, SIGKILL);
      while (wait(nullptr) > 0) {
      }
      sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      DS_THROW("[deepspeed] fork failed for rank {}: {}", r, std::strerror(err));
    }
    if (pid == 0) {
      setpgid(0, 0);
      // Ranks are not in the terminal's foreground group, so they must not read it; no rank of a
      // training job reads stdin anyway (mpirun gives all but rank 0 /dev/null too).
      const int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, STDIN_FILENO);
      exec_rank(spec, info, old_mask);
    }
    setpgid(pid, pid);  // also in the parent: whichever runs first, the group exists before kill()
    alive.push_back({pid, r});
  }

  using Clock = std::chrono::steady_clock;
  int result = 0;
  bool killed = false;
  int stop_signal = 0;  // non-zero once the job is being stopped
  Clock::time_point deadline{};
  auto stop = [&](int sig) {
    stop_signal = sig;
    signal_groups(alive, sig);
    deadline = Clock::now() + std::chrono::seconds(kStopGraceSeconds);
  };

  while (!alive.empty()) {
    // A short timeout: SIGCHLD can coalesce, and the SIGKILL deadline must be noticed.
    timespec ts{0, 200'000'000};
    siginfo_t si;
    const int sig = sigtimedwait(&set, &si, &ts);
    if (sig > 0 && sig != SIGCHLD) {
      if (!stop_signal) {
        fmt::print(stderr, "[deepspeed] received {}; stopping the job\n", signal_name(sig));
        result = 128 + sig;
        stop(sig);
      } else {
        deadline = Clock::now();  // asked twice (a second Ctrl-C): no more grace
      }
    }
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      const auto it =
          std::find_if(alive.begin(), alive.end(), [&](const Child& c) { return c.pid == pid; });
      if (it == alive.end()) continue;
      const Child done = *it;
      alive.erase(it);
      if (exit_code_of(status) != 0 && !stop_signal) {
        fmt::print(stderr, "[deepspeed] rank {} (pid {}, host {}) {}; stopping the job\n",
                   done.rank, done.pid, host, describe_exit(status));
        std::fflush(stderr);
        result = exit_code_of(status);
        stop(SIGTERM);
      }
    }
    if (stop_signal && !killed && !alive.empty() && Clock::now() >= deadline) {
      std::vector<int> ranks;
      for (const Child& c : alive) ranks.push_back(c.rank);
      fmt::print(stderr, "[deepspeed] rank(s) {} still running after {}; sending SIGKILL\n",
                 fmt::join(ranks, ","), signal_name(stop_signal));
      signal_groups(alive, SIGKILL);
      killed = true;
    }
  }
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  return result;
}

// --- the rank wrapper
// ------------------------------------------------------------------------------

int rank_wrapper_main(const std::vector<std::string>& args) {
  const auto [kind, spec] = parse_wrapper_args(args);
  const RankInfo info = rank_info_from_env(kind, spec.layout, current_environment());

  const sigset_t set = supervisor_signals();
  sigset_t old_mask;
  sigprocmask(SIG_BLOCK, &set, &old_mask);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  DS_CHECK(pid >= 0, "[deepspeed] rank {}: fork failed: {}", info.rank, std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    // If mpirun SIGKILLs the wrapper, the program must not live on as an orphan.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    exec_rank(spec, info, old_mask);
  }
  setpgid(pid, pid);

  int forwarded = 0, status = 0;
  while (true) {
    timespec ts{0, 500'000'000};  // SIGCHLD is only a hint; waitpid below decides
    siginfo_t si;
    const int sig = sigtimedwait(&set, &si, &ts);
    if (sig > 0 && sig != SIGCHLD) {
      // mpirun/srun stopping the job (another rank failed, or Ctrl-C): pass it on.
      forwarded = sig;
      kill(-pid, sig);
    }
    if (waitpid(pid, &status, WNOHANG) == pid) break;
  }
  const int code = exit_code_of(status);
  // A rank that dies because the job is being stopped is not news; the first failure is.
  if (code != 0 && forwarded == 0) {
    fmt::print(stderr, "[deepspeed] rank {} on host {} {}\n", info.rank, host_name(),
               describe_exit(status));
    std::fflush(stderr);
  }
  return code;
}

// --- helpers -------------------------------------------------------------------------------------

[[noreturn]] void exec_command(const std::vector<std::string>& args) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  DS_THROW("[deepspeed] cannot run {}: {}", args[0], std::strerror(errno));
}

Machine this_machine() {
  Machine m;
  m.cores = static_cast<int>(allowed_cores().size());
  m.hostname = host_name();
  m.is_root = geteuid() == 0;
  m.environment = current_environment();
  char buf[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(buf, sizeof(buf), "%Y%m%d%H%M%S", &tm);
  m.timestamp = buf;
  return m;
}

std::string self_exe() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  DS_CHECK(!ec, "[deepspeed] cannot find the launcher's own path (/proc/self/exe): {}",
           ec.message());
  return p.string();
}

bool find_in_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::string_view rest(path);
  while (true) {
    const size_t colon = rest.find(':');
    std::string_view dir = rest.substr(0, colon);
    if (dir.empty()) dir = ".";
    if (access(fmt::format("{}/{}", dir, name).c_str(), X_OK) == 0) return true;
    if (colon == std::string_view::npos) return false;
    rest.remove_prefix(colon + 1);
  }
}

}  // namespace ds::launcher
