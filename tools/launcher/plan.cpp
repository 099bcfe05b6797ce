// Pure decisions of the launcher: hostfile, --include/--exclude, .deepspeed_env, rank layout and
// the mpirun/srun command lines. Nothing here starts a process; see run.cpp for that.
#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/core/error.h"
#include "ds/core/text.h"
#include "launcher.h"

namespace ds::launcher {

namespace {

constexpr std::string_view kSpace = " \t\r\n\v\f";

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(kSpace);
  return s.substr(b, e - b + 1);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

// Whole-string non-negative integer (Python's int() on a stripped string, minus signs).
std::optional<int> to_int(std::string_view s) {
  s = trim(s);
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DS_CHECK(f, "[deepspeed] cannot read {}", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool is_identity(const std::vector<int>& slots) {
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i] != static_cast<int>(i)) return false;
  return true;
}

}  // namespace

// --- hostfile ----------------------------------------------------------------------------------

HostPool parse_hostfile(std::string_view text) {
  HostPool pool;
  // A file saved by Windows editors starts with a byte order mark: not part of the first name.
  for (std::string_view raw : split(strip_utf8_bom(text), '\n')) {
    const std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#') continue;
    // DeepSpeed's regex ^(\S+)\s+slots=(\d+): a name, blanks, slots=digits; the rest is ignored
    // (so `worker-0 slots=4 # comment` and OpenMPI's `max_slots=` suffix are accepted).
    std::optional<HostEntry> entry;
    const size_t name_end = line.find_first_of(kSpace);
    if (name_end != std::string_view::npos) {
      std::string_view rest = line.substr(line.find_first_not_of(kSpace, name_end));
      if (rest.starts_with("slots=")) {
        rest.remove_prefix(6);
        int slots = 0;
        const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), slots);
        if (ec == std::errc() && end != rest.data() && rest.front() != '-' && rest.front() != '+')
          entry = HostEntry{std::string(line.substr(0, name_end)), slots};
      }
    }
    DS_CHECK(entry,
             "[deepspeed] Hostfile contains a bad entry: {}, unable to proceed with launching",
             line);
    // Host names are case-insensitive (DNS): `localhost` and `LOCALHOST` are one machine, and two
    // entries for it would start two sets of ranks on the same slots.
    const auto dup = std::find_if(pool.begin(), pool.end(),
                                  [&](const HostEntry& e) { return iequals(e.host, entry->host); });
    DS_CHECK(dup == pool.end(),
             "[deepspeed] Hostfile contains multiple entries for {}{}, unable to proceed with "
             "launching; host names are compared without regard to case: keep one line per host",
             entry->host,
             dup != pool.end() && dup->host != entry->host ? fmt::format(" (and {})", dup->host)
                                                            : std::string());
    pool.push_back(*entry);
  }
  DS_CHECK(!pool.empty(),
           "[deepspeed] Hostfile is empty or not formatted correctly, unable to proceed with "
           "launching.");
  return pool;
}

std::optional<HostPool> fetch_hostfile(const std::string& path, bool warn) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    if (warn)
      fmt::print(stderr,
                 "[deepspeed] Unable to find hostfile, will proceed with training with local "
                 "resources only.\n");
    return std::nullopt;
  }
  try {
    return parse_hostfile(read_file(path));
  } catch (const Error& e) {
    throw Error(fmt::format("{} (hostfile {})", e.what(), path));
  }
}

// --- include / exclude -------------------------------------------------------------------------

Resources parse_resource_filter(const Resources& hosts, std::string_view include,
                                std::string_view exclude) {
  DS_CHECK(include.empty() || exclude.empty(),
           "[deepspeed] --include and --exclude are mutually exclusive; pass only one of them");
  if (include.empty() && exclude.empty()) return hosts;
  const bool including = !include.empty();
  const std::string_view spec = including ? include : exclude;

  auto find = [](Resources& r, std::string_view name) {
    return std::find_if(r.begin(), r.end(), [&](const HostSlots& h) { return iequals(h.host, name); });
  };
  Resources known = hosts;  // lookups only
  Resources filtered = including ? Resources{} : hosts;

  for (std::string_view node : split(spec, '@')) {
    const std::vector<std::string_view> parts = split(node, ':');
    DS_CHECK(parts.size() <= 2,
             "[deepspeed] bad resource '{}' in '{}': expected NAME[:SLOT[,SLOT...]][@NAME...]",
             node, spec);
    const std::string name(parts[0]);
    const auto host = find(known, name);
    DS_CHECK(host != known.end(), "[deepspeed] Hostname '{}' not found in hostfile", name);

    if (parts.size() == 1) {  // the whole node
      auto it = find(filtered, name);
      if (it == filtered.end()) it = filtered.insert(filtered.end(), HostSlots{host->host, {}});
      it->slots = including ? host->slots : std::vector<int>{};
      continue;
    }
    std::vector<int> slots;
    for (std::string_view s : split(parts[1], ',')) {
      const std::optional<int> slot = to_int(s);
      DS_CHECK(slot, "[deepspeed] bad slot '{}' in '{}': expected NAME[:SLOT[,SLOT...]][@NAME...]",
               s, spec);
      DS_CHECK(std::find(host->slots.begin(), host->slots.end(), *slot) != host->slots.end(),
               "[deepspeed] No slot '{}' specified on host '{}'", *slot, name);
      slots.push_back(*slot);
    }
    auto it = find(filtered, name);
    if (including) {
      if (it == filtered.end()) it = filtered.insert(filtered.end(), HostSlots{host->host, {}});
      it->slots = slots;  // a later spec for the same host replaces an earlier one, as in DeepSpeed
    } else {
      // Excluding a slot already gone (`w@w:0`, `w:0,0`) is a no-op; DeepSpeed crashes there.
      for (int s : slots) std::erase(it->slots, s);
    }
  }

  // Hostfile order decides rank order; duplicates and emptied hosts go.
  Resources out;
  for (const HostSlots& h : hosts) {
    auto it = find(filtered, h.host);
    if (it == filtered.end()) continue;
    std::vector<int> unique;
    for (int s : it->slots)
      if (std::find(unique.begin(), unique.end(), s) == unique.end()) unique.push_back(s);
    if (!unique.empty()) out.push_back({h.host, std::move(unique)});
  }
  return out;
}

Resources parse_inclusion_exclusion(const HostPool& pool, std::string_view include,
                                    std::string_view exclude) {
  Resources all;
  for (const HostEntry& e : pool) {
    std::vector<int> slots(static_cast<size_t>(e.slots));
    std::iota(slots.begin(), slots.end(), 0);
    all.push_back({e.host, std::move(slots)});
  }
  return parse_resource_filter(all, include, exclude);
}

// --- environment files -------------------------------------------------------------------------

void env_set(EnvList& env, const std::string& key, const std::string& value) {
  for (auto& [k, v] : env)
    if (k == key) {
      v = value;
      return;
    }
  env.emplace_back(key, value);
}

const std::string* env_get(const EnvList& env, std::string_view key) {
  for (const auto& [k, v] : env)
    if (k == key) return &v;
  return nullptr;
}

EnvList parse_env_file(std::string_view text, std::string_view origin) {
  EnvList env;
  int lineno = 0;
  for (std::string_view raw : split(strip_utf8_bom(text), '\n')) {
    ++lineno;
    const std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#') continue;
    const size_t eq = line.find('=');
    const std::string_view key = eq == std::string_view::npos ? "" : trim(line.substr(0, eq));
    DS_CHECK(!key.empty() && key.find_first_of(kSpace) == std::string_view::npos,
             "[deepspeed] {}:{}: expected KEY=VALUE, got '{}'", origin, lineno, line);
    std::string_view value = trim(line.substr(eq + 1));
    // Users write .deepspeed_env like a shell file (DeepSpeed's pdsh runner feeds it to `export`).
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
        value.back() == value.front())
      value = value.substr(1, value.size() - 2);
    env_set(env, std::string(key), std::string(value));
  }
  return env;
}

EnvList load_env_files(const std::string& home_dir, const std::string& work_dir) {
  EnvList env;
  for (const std::string& dir : {home_dir, work_dir}) {
    if (dir.empty()) continue;
    const std::string path = (std::filesystem::path(dir) / kEnvFileName).string();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) continue;
    for (const auto& [k, v] : parse_env_file(read_file(path), path)) env_set(env, k, v);
  }
  return env;
}

// --- ranks ---------------------------------------------------------------------------------------

RankInfo rank_info(const std::vector<int>& layout, int rank) {
  const int world = std::accumulate(layout.begin(), layout.end(), 0);
  DS_CHECK(rank >= 0 && rank < world, "[deepspeed] rank {} outside a job of {} ranks (layout {})",
           rank, world, fmt::join(layout, ","));
  int first = 0;
  for (size_t node = 0; node < layout.size(); ++node) {
    if (rank < first + layout[node])
      return {rank,         rank - first,           world,
              layout[node], static_cast<int>(node), static_cast<int>(layout.size())};
    first += layout[node];
  }
  DS_THROW("[deepspeed] unreachable: rank {} in layout {}", rank, fmt::join(layout, ","));
}

EnvList rank_env(const RankInfo& r, const std::string& master_addr, int master_port) {
  return {{"RANK", std::to_string(r.rank)},
          {"LOCAL_RANK", std::to_string(r.local_rank)},
          {"WORLD_SIZE", std::to_string(r.world_size)},
          {"LOCAL_SIZE", std::to_string(r.local_size)},
          {"CROSS_RANK", std::to_string(r.cross_rank)},
          {"CROSS_SIZE", std::to_string(r.cross_size)},
          {"MASTER_ADDR", master_addr},
          {"MASTER_PORT", std::to_string(master_port)}};
}

std::string_view launcher_name(LauncherKind k) {
  switch (k) {
    case LauncherKind::kOpenMPI:
      return "openmpi";
    case LauncherKind::kSlurm:
      return "slurm";
    case LauncherKind::kLocal:
      return "local";
  }
  return "?";
}

LauncherKind parse_launcher(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "openmpi") return LauncherKind::kOpenMPI;
  if (lower == "slurm") return LauncherKind::kSlurm;
  if (lower == "local") return LauncherKind::kLocal;
  for (const char* other : {"pdsh", "mpich", "impi", "mvapich", "mpi"})
    DS_CHECK(lower != other,
             "[deepspeed] launcher '{}' is not supported by deepspeed.cpp; use --launcher openmpi "
             "(mpirun, also for one machine), slurm (srun, inside a Slurm allocation) or local "
             "(fork on this machine, no MPI)",
             name);
  DS_THROW("[deepspeed] Unknown launcher {}; choose openmpi, slurm or local", name);
}

namespace {

int env_int(const EnvList& env, std::string_view key, std::string_view launcher) {
  const std::string* v = env_get(env, key);
  DS_CHECK(v,
           "[deepspeed] {} is not set: the hidden --_rank_wrapper mode runs under {}, started by "
           "the deepspeed launcher",
           key, launcher);
  const std::optional<int> n = to_int(*v);
  DS_CHECK(n, "[deepspeed] {}={} is not a number", key, *v);
  return *n;
}

}  // namespace

RankInfo rank_info_from_env(LauncherKind kind, const std::vector<int>& layout, const EnvList& env) {
  RankInfo got;
  std::string_view who;
  if (kind == LauncherKind::kOpenMPI) {
    who = "mpirun";
    got.rank = env_int(env, "OMPI_COMM_WORLD_RANK", who);
    got.world_size = env_int(env, "OMPI_COMM_WORLD_SIZE", who);
    got.local_rank = env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", who);
    got.local_size = env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", who);
  } else if (kind == LauncherKind::kSlurm) {
    who = "srun";
    got.rank = env_int(env, "SLURM_PROCID", who);
    got.world_size = env_int(env, "SLURM_NTASKS", who);
    got.local_rank = env_int(env, "SLURM_LOCALID", who);
    got.cross_rank = env_int(env, "SLURM_NODEID", who);
  } else {
    DS_THROW("[deepspeed] the rank wrapper runs under --launcher openmpi or slurm only");
  }
  const int world = std::accumulate(layout.begin(), layout.end(), 0);
  DS_CHECK(got.world_size == world,
           "[deepspeed] {} started {} ranks but the launcher planned {} (layout {}); do not change "
           "the number of ranks with --launcher_args",
           who, got.world_size, world, fmt::join(layout, ","));
  const RankInfo want = rank_info(layout, got.rank);
  const bool same = kind == LauncherKind::kOpenMPI
                        ? got.local_rank == want.local_rank && got.local_size == want.local_size
                        : got.local_rank == want.local_rank && got.cross_rank == want.cross_rank;
  DS_CHECK(same,
           "[deepspeed] rank {}: {} placed it as local rank {}{} but the launcher planned "
           "local rank {} of {} on node {} (layout {}); ranks must fill nodes in order: do not "
           "change the mapping with --launcher_args (--map-by, --rank-by, --npernode, "
           "--distribution)",
           got.rank, who, got.local_rank,
           kind == LauncherKind::kOpenMPI ? fmt::format(" of {}", got.local_size)
                                          : fmt::format(" on node {}", got.cross_rank),
           want.local_rank, want.local_size, want.cross_rank, fmt::join(layout, ","));
  return want;
}

std::vector<int> cores_for_rank(const std::vector<int>& cores, int local_size, int local_rank) {
  DS_CHECK(!cores.empty() && local_size > 0 && local_rank >= 0 && local_rank < local_size,
           "[deepspeed] cannot bind local rank {} of {} to {} cores", local_rank, local_size,
           cores.size());
  const int n = static_cast<int>(cores.size());
  if (n < local_size) return {cores[static_cast<size_t>(local_rank % n)]};
  const int per = n / local_size;
  return {cores.begin() + local_rank * per, cores.begin() + (local_rank + 1) * per};
}

std::vector<int> parse_core_list(std::string_view spec) {
  std::vector<int> cores;
  for (std::string_view item : split(spec, ',')) {
    const size_t dash = item.find('-');
    const std::optional<int> lo = to_int(item.substr(0, dash));
    const std::optional<int> hi =
        dash == std::string_view::npos ? lo : to_int(item.substr(dash + 1));
    DS_CHECK(lo && hi && *lo <= *hi,
             "[deepspeed] bad --bind_core_list '{}': expected numbers and ranges like 1,3-5,7",
             spec);
    for (int c = *lo; c <= *hi; ++c)
      if (std::find(cores.begin(), cores.end(), c) == cores.end()) cores.push_back(c);
  }
  return cores;
}

// --- the plan ------------------------------------------------------------------------------------

int Plan::world_size() const {
  return std::accumulate(spec.layout.begin(), spec.layout.end(), 0);
}

bool is_local_host(std::string_view host, std::string_view hostname) {
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") return true;
  if (hostname.empty()) return false;
  auto short_name = [](std::string_view h) { return h.substr(0, h.find('.')); };
  return host == hostname || short_name(host) == short_name(hostname);
}

std::string first_slurm_host(std::string_view nodelist) {
  nodelist = trim(nodelist);
  const size_t bracket = nodelist.find('[');
  const size_t comma = nodelist.find(',');
  if (bracket == std::string_view::npos || (comma != std::string_view::npos && comma < bracket))
    return std::string(nodelist.substr(0, comma));
  const size_t close = nodelist.find(']', bracket);
  DS_CHECK(close != std::string_view::npos, "[deepspeed] bad Slurm node list '{}'", nodelist);
  std::string_view first = nodelist.substr(bracket + 1, close - bracket - 1);
  first = first.substr(0, first.find(','));
  first = first.substr(0, first.find('-'));
  std::string_view suffix = nodelist.substr(close + 1);
  suffix = suffix.substr(0, suffix.find(','));
  return fmt::format("{}{}{}", nodelist.substr(0, bracket), first, suffix);
}

namespace {

// The hosts to run on without a hostfile: inside a Slurm allocation srun knows the nodes (only
// their number and ranks per node are needed), otherwise this machine. Sets *master from
// SLURM_JOB_NODELIST or to loopback when it is still empty.
HostPool default_hosts(const Options& o, LauncherKind kind, const Machine& m, bool& hosts_known,
                       std::string& master) {
  HostPool hosts;
  if (kind != LauncherKind::kSlurm) {
    DS_CHECK(o.num_nodes <= 1,
             "[deepspeed] Num nodes is >1 but no extra nodes available via "
             "hostfile");
    hosts.push_back({"localhost", o.num_procs > 0 ? o.num_procs : m.cores});
    if (master.empty()) master = "127.0.0.1";
    return hosts;
  }
  auto from_env = [&](std::initializer_list<const char*> keys) -> std::optional<int> {
    for (const char* k : keys)
      if (const std::string* v = env_get(m.environment, k)) {
        // SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE look like "4" or "4(x2)".
        const std::optional<int> n = to_int(std::string_view(*v).substr(0, v->find('(')));
        if (n && *n > 0) return n;
      }
    return std::nullopt;
  };
  const int nodes =
      o.num_nodes > 0 ? o.num_nodes : from_env({"SLURM_JOB_NUM_NODES", "SLURM_NNODES"}).value_or(1);
  const int per_node =
      o.num_procs > 0 ? o.num_procs : from_env({"SLURM_NTASKS_PER_NODE"}).value_or(m.cores);
  for (int i = 0; i < nodes; ++i) hosts.push_back({fmt::format("node{}", i), per_node});
  hosts_known = false;
  if (master.empty())
    if (const std::string* list = env_get(m.environment, "SLURM_JOB_NODELIST"))
      master = first_slurm_host(*list);
  return hosts;
}

// The hosts and slots the job runs on: --include/--exclude, then --num_nodes and --num_gpus.
std::vector<HostSlots> active_hosts(const Options& o, const HostPool& hosts, bool from_hostfile) {
  std::vector<HostSlots> active = parse_inclusion_exclusion(hosts, o.include, o.exclude);
  if (o.num_nodes > 0 && static_cast<int>(active.size()) > o.num_nodes)
    active.resize(static_cast<size_t>(o.num_nodes));
  if (o.num_procs > 0)
    for (HostSlots& h : active) {
      h.slots.resize(static_cast<size_t>(o.num_procs));
      std::iota(h.slots.begin(), h.slots.end(), 0);
    }
  std::erase_if(active, [](const HostSlots& h) { return h.slots.empty(); });
  DS_CHECK(!active.empty(),
           "[deepspeed] no slots left to run on (hostfile {}, --include '{}', --exclude '{}')",
           from_hostfile ? o.hostfile : "none", o.include, o.exclude);
  return active;
}

// The master address when none was given: loopback only when every rank is on this machine;
// remote ranks need a reachable name.
std::string choose_master(const Plan& p, const Machine& m) {
  const bool all_local = std::all_of(p.active.begin(), p.active.end(), [&](const HostSlots& h) {
    return is_local_host(h.host, m.hostname);
  });
  const std::string& first = p.active[0].host;
  return all_local                                                 ? "127.0.0.1"
         : is_local_host(first, m.hostname) && !m.hostname.empty() ? m.hostname
                                                                   : first;
}

// --launcher local runs on this machine only; more ranks than cores here is oversubscribed.
void check_placement(Plan& p, const Machine& m) {
  if (p.kind == LauncherKind::kLocal) {
    const bool local = p.active.size() == 1 && is_local_host(p.active[0].host, m.hostname);
    std::vector<std::string> names;
    for (const HostSlots& h : p.active) names.push_back(h.host);
    DS_CHECK(local,
             "[deepspeed] --launcher local runs ranks on this machine only, but the job names "
             "{} ({}); use --launcher openmpi or slurm for other hosts",
             names.size() == 1 ? "host" : "hosts", fmt::join(names, ", "));
  }
  for (const HostSlots& h : p.active)
    if (p.hosts_known && is_local_host(h.host, m.hostname) &&
        static_cast<int>(h.slots.size()) > m.cores)
      p.oversubscribed = true;
}

// What every rank gets: the layout, devices, master, program line, core binding, logs and the
// forwarded environment (forwarded variables first, .deepspeed_env on top: DeepSpeed's order).
RankSpec rank_spec(const Options& o, const Plan& p, const std::string& master,
                   const EnvList& env_files, const Machine& m) {
  RankSpec s;
  bool narrowed = false;
  for (const HostSlots& h : p.active) {
    s.layout.push_back(static_cast<int>(h.slots.size()));
    narrowed = narrowed || !is_identity(h.slots);
  }
  // CUDA_VISIBLE_DEVICES only when --include/--exclude picked particular slots: then LOCAL_RANK i
  // must mean the i-th picked device. Otherwise the user's own setting is left alone.
  if (narrowed)
    for (const HostSlots& h : p.active)
      s.visible_devices.push_back(
          is_identity(h.slots) ? "" : fmt::format("{}", fmt::join(h.slots, ",")));
  s.master_addr = master;
  s.master_port = o.master_port;
  s.local_rank_arg = !o.no_local_rank;
  const std::string& script = o.program[0];
  // DeepSpeed runs the user script with the Python interpreter (`python -u script`).
  const bool python = !o.no_python && script.size() > 3 && script.ends_with(".py");
  if (python) s.program = {"python3", "-u"};
  s.local_rank_at = python ? 3 : 1;
  s.program.insert(s.program.end(), o.program.begin(), o.program.end());
  s.bind_cores = o.bind_cores_to_rank;
  s.bind_core_list = o.bind_core_list;
  if (!s.bind_core_list.empty()) parse_core_list(s.bind_core_list);  // validate early
  if (!o.each_rank_log.empty()) {
    s.log_dir = std::filesystem::absolute(o.each_rank_log).lexically_normal().string();
    s.log_prefix = m.timestamp;
  }
  for (const auto& [k, v] : m.environment)
    for (const char* prefix : kForwardedPrefixes)
      if (k.starts_with(prefix)) {
        env_set(s.exports, k, v);
        break;
      }
  for (const auto& [k, v] : env_files) env_set(s.exports, k, v);
  return s;
}

}  // namespace

Plan make_plan(const Options& o, const std::optional<HostPool>& pool, const EnvList& env_files,
               const Machine& m) {
  Plan p;
  p.kind = parse_launcher(o.launcher);
  DS_CHECK(!o.program.empty(), "[deepspeed] no program given: deepspeed [options] program [args]");
  if (o.num_nodes >= 0 || o.num_procs >= 0)
    DS_CHECK(o.include.empty() && o.exclude.empty(),
             "[deepspeed] Cannot specify num_nodes/gpus with include/exclude");
  DS_CHECK(o.master_port > 0 && o.master_port < 65536, "[deepspeed] bad --master_port {}",
           o.master_port);
  std::string master = o.master_addr;
  const HostPool hosts = pool ? *pool : default_hosts(o, p.kind, m, p.hosts_known, master);
  p.active = active_hosts(o, hosts, pool.has_value());
  if (master.empty() && p.hosts_known) master = choose_master(p, m);
  DS_CHECK(!master.empty(),
           "[deepspeed] cannot tell the master address (no hostfile, no SLURM_JOB_NODELIST): pass "
           "--master_addr");
  check_placement(p, m);
  p.spec = rank_spec(o, p, master, env_files, m);
  p.launcher_args = shell_split(o.launcher_args);
  return p;
}

// --- the wrapper's arguments ---------------------------------------------------------------------

std::vector<std::string> wrapper_args(LauncherKind kind, const RankSpec& s) {
  std::vector<std::string> a = {"--launcher", std::string(launcher_name(kind)), "--layout",
                                fmt::format("{}", fmt::join(s.layout, ","))};
  if (!s.visible_devices.empty())
    a.insert(a.end(), {"--visible_devices", fmt::format("{}", fmt::join(s.visible_devices, ";"))});
  a.insert(a.end(),
           {"--master_addr", s.master_addr, "--master_port", std::to_string(s.master_port)});
  if (!s.local_rank_arg) a.push_back("--no_local_rank");
  if (s.local_rank_at != 1) a.insert(a.end(), {"--local_rank_at", std::to_string(s.local_rank_at)});
  if (s.bind_cores) a.push_back("--bind_cores_to_rank");
  if (!s.bind_core_list.empty()) a.insert(a.end(), {"--bind_core_list", s.bind_core_list});
  if (!s.log_dir.empty()) a.insert(a.end(), {"--log_dir", s.log_dir, "--log_prefix", s.log_prefix});
  a.push_back("--");
  a.insert(a.end(), s.program.begin(), s.program.end());
  return a;
}

std::pair<LauncherKind, RankSpec> parse_wrapper_args(const std::vector<std::string>& args) {
  LauncherKind kind = LauncherKind::kOpenMPI;
  RankSpec s;
  size_t i = 0;
  auto value = [&](const std::string& flag) -> const std::string& {
    DS_CHECK(i + 1 < args.size(), "[deepspeed] --_rank_wrapper: {} needs a value", flag);
    return args[++i];
  };
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      s.program.assign(args.begin() + static_cast<long>(i) + 1, args.end());
      break;
    } else if (a == "--launcher") {
      kind = parse_launcher(value(a));
    } else if (a == "--layout") {
      for (std::string_view n : split(value(a), ',')) {
        const std::optional<int> v = to_int(n);
        DS_CHECK(v && *v > 0, "[deepspeed] --_rank_wrapper: bad --layout");
        s.layout.push_back(*v);
      }
    } else if (a == "--visible_devices") {
      for (std::string_view d : split(value(a), ';')) s.visible_devices.emplace_back(d);
    } else if (a == "--master_addr") {
      s.master_addr = value(a);
    } else if (a == "--master_port") {
      s.master_port = to_int(value(a)).value_or(0);
    } else if (a == "--no_local_rank") {
      s.local_rank_arg = false;
    } else if (a == "--local_rank_at") {
      s.local_rank_at = to_int(value(a)).value_or(1);
    } else if (a == "--bind_cores_to_rank") {
      s.bind_cores = true;
    } else if (a == "--bind_core_list") {
      s.bind_core_list = value(a);
    } else if (a == "--log_dir") {
      s.log_dir = value(a);
    } else if (a == "--log_prefix") {
      s.log_prefix = value(a);
    } else {
      DS_THROW("[deepspeed] --_rank_wrapper: unknown argument '{}'", a);
    }
  }
  DS_CHECK(!s.layout.empty() && !s.program.empty(),
           "[deepspeed] --_rank_wrapper needs --layout and `-- program [args]`");
  DS_CHECK(s.visible_devices.empty() || s.visible_devices.size() == s.layout.size(),
           "[deepspeed] --_rank_wrapper: --visible_devices needs one entry per node");
  return {kind, s};
}

// --- mpirun / srun -------------------------------------------------------------------------------

std::vector<std::string> mpirun_command(const Plan& p, const std::string& self_exe,
                                        const Machine& m) {
  std::vector<std::string> hosts;
  for (const HostSlots& h : p.active) hosts.push_back(fmt::format("{}:{}", h.host, h.slots.size()));
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(p.world_size()), "--host",
                                  fmt::format("{}", fmt::join(hosts, ","))};
  // OpenMPI refuses to start as root without this; CI runs as root.
  if (m.is_root) cmd.push_back("--allow-run-as-root");
  // Slots are explicit, so mpirun would not notice that ranks outnumber cores and would busy-poll
  // in every wait; yielding keeps oversubscribed ranks from starving each other.
  if (p.oversubscribed)
    cmd.insert(cmd.end(), {"--oversubscribe", "--mca", "mpi_yield_when_idle", "1"});
  // Ranks fill each node in hostfile order (the wrapper's CROSS_RANK relies on it). Binding, when
  // asked for, is done by the wrapper, identically for all three launchers.
  cmd.insert(cmd.end(), {"--map-by", "slot", "--bind-to", "none"});
  for (const auto& [k, v] : p.spec.exports) cmd.insert(cmd.end(), {"-x", k + "=" + v});
  cmd.insert(cmd.end(), p.launcher_args.begin(), p.launcher_args.end());
  cmd.push_back(self_exe);
  cmd.push_back("--_rank_wrapper");
  for (std::string& a : wrapper_args(LauncherKind::kOpenMPI, p.spec)) cmd.push_back(std::move(a));
  return cmd;
}

std::vector<std::string> srun_command(const Plan& p, const std::string& self_exe) {
  const std::vector<int>& layout = p.spec.layout;
  DS_CHECK(std::all_of(layout.begin(), layout.end(), [&](int n) { return n == layout[0]; }),
           "[deepspeed] --launcher slurm needs the same number of ranks on every node (got {}); "
           "use --num_gpus N or a hostfile with equal slots",
           fmt::join(layout, ","));
  std::vector<std::string> cmd = {"srun",
                                  "-N",
                                  std::to_string(layout.size()),
                                  "-n",
                                  std::to_string(p.world_size()),
                                  fmt::format("--ntasks-per-node={}", layout[0])};
  if (p.hosts_known) {
    std::vector<std::string> names;
    for (const HostSlots& h : p.active) names.push_back(h.host);
    cmd.push_back(fmt::format("--nodelist={}", fmt::join(names, ",")));
  }
  // srun splits --export at commas: such values travel in srun's own environment instead (ALL),
  // which the launcher sets before starting srun.
  std::string exports = "--export=ALL";
  for (const auto& [k, v] : p.spec.exports)
    if (v.find(',') == std::string::npos) exports += fmt::format(",{}={}", k, v);
  cmd.push_back(exports);
  cmd.insert(cmd.end(), p.launcher_args.begin(), p.launcher_args.end());
  cmd.push_back(self_exe);
  cmd.push_back("--_rank_wrapper");
  for (std::string& a : wrapper_args(LauncherKind::kSlurm, p.spec)) cmd.push_back(std::move(a));
  return cmd;
}

std::vector<std::string> rank_argv(const RankSpec& spec, int local_rank) {
  std::vector<std::string> argv = spec.program;
  if (spec.local_rank_arg) {
    const size_t at = std::min(static_cast<size_t>(std::max(spec.local_rank_at, 0)), argv.size());
    argv.insert(argv.begin() + static_cast<long>(at), fmt::format("--local_rank={}", local_rank));
  }
  return argv;
}

// --- shell quoting -------------------------------------------------------------------------------

std::vector<std::string> shell_split(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\'') {
      const size_t end = s.find('\'', i + 1);
      DS_CHECK(end != std::string_view::npos, "[deepspeed] unbalanced ' in '{}'", s);
      cur.append(s.substr(i + 1, end - i - 1));
      i = end;
      in_word = true;
    } else if (c == '"') {
      bool closed = false;
      for (++i; i < s.size(); ++i) {
        if (s[i] == '"') {
          closed = true;
          break;
        }
        if (s[i] == '\\' && i + 1 < s.size() &&
            std::string_view("\\\"$`").find(s[i + 1]) != std::string_view::npos)
          ++i;
        cur.push_back(s[i]);
      }
      DS_CHECK(closed, "[deepspeed] unbalanced \" in '{}'", s);
      in_word = true;
    } else if (c == '\\' && i + 1 < s.size()) {
      cur.push_back(s[++i]);
      in_word = true;
    } else if (kSpace.find(c) != std::string_view::npos) {
      if (in_word) out.push_back(std::move(cur));
      cur.clear();
      in_word = false;
    } else {
      cur.push_back(c);
      in_word = true;
    }
  }
  if (in_word) out.push_back(std::move(cur));
  return out;
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out.push_back(' ');
    const bool safe = !a.empty() && std::all_of(a.begin(), a.end(), [](unsigned char c) {
      return std::isalnum(c) ||
             std::string_view("@%+=:,./_-").find(static_cast<char>(c)) != std::string_view::npos;
    });
    if (safe) {
      out += a;
      continue;
    }
    out.push_back('\'');
    for (char c : a) {
      if (c == '\'')
        out += "'\"'\"'";
      else
        out.push_back(c);
    }
    out.push_back('\'');
  }
  return out;
}

}  // namespace ds::launcher
