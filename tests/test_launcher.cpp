// The `deepspeed` launcher (tools/deepspeed.cpp, tools/launcher/): hostfile, --include/--exclude,
// .deepspeed_env and rank variables as pure functions, the exact mpirun/srun command lines, and
// end-to-end runs of the built tool with the local and the openmpi launcher, including the
// first failing rank's exit code. Error texts follow DeepSpeed's deepspeed/launcher/runner.py.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ds/core/error.h"
#include "launcher.h"

namespace fs = std::filesystem;
using namespace ds::launcher;

namespace {

// Expects `fn` to throw ds::Error whose message contains `text`.
template <typename Fn>
void expect_error(Fn&& fn, const std::string& text) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing: " << text;
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << text;
    EXPECT_TRUE(std::string(e.what()).starts_with("[deepspeed] ")) << e.what();
  }
}

Resources hosts4x2() {
  return {{"worker-0", {0, 1, 2, 3}}, {"worker-1", {0, 1, 2, 3}}};
}

Machine test_machine() {
  Machine m;
  m.cores = 2;
  m.hostname = "vm";
  m.is_root = true;
  m.timestamp = "20240102030405";
  return m;
}

Options opts(std::vector<std::string> program = {"./train"}) {
  Options o;
  o.program = std::move(program);
  return o;
}

// A fresh folder per test, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ds_launcher_XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& text, bool executable = false) {
    const fs::path p = path / name;
    std::ofstream(p) << text;
    if (executable) fs::permissions(p, fs::perms::owner_all, fs::perm_options::add);
    return p.string();
  }
};

struct RunResult {
  int code = -1;
  std::string output;  // stdout and stderr
  double seconds = 0;
};

// Runs the built launcher through the shell in `dir`, with HOME=dir so that the user's own
// ~/.deepspeed_env does not leak in.
RunResult run_launcher(const TempDir& dir, const std::string& args) {
  const std::string cmd = "cd '" + dir.path.string() + "' && HOME='" + dir.path.string() + "' " +
                          DS_LAUNCHER_EXE + " " + args + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  FILE* f = popen(cmd.c_str(), "r");
  RunResult r;
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) r.output.append(buf, n);
  const int status = pclose(f);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// A rank program printing what it got: one line `probe rank=.. ... args=..` per rank.
constexpr const char* kProbe = R"(#!/bin/sh
echo "probe rank=$RANK local_rank=$LOCAL_RANK world_size=$WORLD_SIZE local_size=$LOCAL_SIZE cross_rank=$CROSS_RANK cross_size=$CROSS_SIZE master=$MASTER_ADDR:$MASTER_PORT from_env_file=$FROM_ENV_FILE args=$*"
)";

// probe lines keyed by RANK.
std::map<int, std::string> probe_lines(const std::string& output) {
  std::map<int, std::string> lines;
  static const std::regex re(R"(probe rank=(\d+) .*)");
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, re)) lines[std::stoi(m[1])] = line;
  }
  return lines;
}

}  // namespace

// --- hostfile ------------------------------------------------------------------------------------

TEST(Hostfile, ParsesSlotsCommentsAndBlankLines) {
  const HostPool pool = parse_hostfile(
      "# the cluster\n"
      "worker-0 slots=4\n"
      "\n"
      "   worker-1\tslots=2   # trailing text is ignored, as in DeepSpeed\n"
      "worker-2 slots=8 max_slots=16\r\n");
  EXPECT_EQ(pool, (HostPool{{"worker-0", 4}, {"worker-1", 2}, {"worker-2", 8}}));
}

// Editors on Windows save a byte order mark; it is not part of the first host's name.
TEST(Hostfile, ByteOrderMarkIsNotPartOfTheFirstHost) {
  EXPECT_EQ(parse_hostfile("\xef\xbb\xbfworker-0 slots=4\nworker-1 slots=2\n"),
            (HostPool{{"worker-0", 4}, {"worker-1", 2}}));
  EXPECT_EQ(parse_env_file("\xef\xbb\xbfNCCL_DEBUG=INFO\n", "f"), (EnvList{{"NCCL_DEBUG", "INFO"}}));
}

// DNS names are case-insensitive: two spellings of one host are one host listed twice (it used to
// pass here and fail later, blaming --launcher_args).
TEST(Hostfile, HostNamesAreComparedWithoutCase) {
  expect_error([] { parse_hostfile("localhost slots=1\nLOCALHOST slots=1\n"); },
               "multiple entries for LOCALHOST (and localhost)");
  const HostPool pool = parse_hostfile("Worker-0 slots=2\nworker-1 slots=2\n");
  Resources hosts;
  for (const auto& e : pool) hosts.push_back(HostSlots{e.host, {0, 1}});
  const Resources kept = parse_resource_filter(hosts, "worker-0:1", "");
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].host, "Worker-0");  // the hostfile's spelling
  EXPECT_EQ(kept[0].slots, std::vector<int>{1});
  EXPECT_EQ(parse_resource_filter(hosts, "", "WORKER-1").size(), 1u);
}

TEST(Hostfile, DeepSpeedErrorMessages) {
  expect_error([] { parse_hostfile("worker-0 slots=4\nworker-0 slots=2\n"); },
               "Hostfile contains multiple entries for worker-0, unable to proceed with launching");
  expect_error([] { parse_hostfile("worker-0 slots=4\nworker-1 gpus=2\n"); },
               "Hostfile contains a bad entry: worker-1 gpus=2, unable to proceed with launching");
  expect_error([] { parse_hostfile("worker-1\n"); }, "Hostfile contains a bad entry: worker-1");
  expect_error([] { parse_hostfile("worker-1 slots=x\n"); },
               "Hostfile contains a bad entry: worker-1 slots=x");
  expect_error([] { parse_hostfile("worker-1 slots=-1\n"); },
               "Hostfile contains a bad entry: worker-1 slots=-1");
  expect_error([] { parse_hostfile(""); },
               "Hostfile is empty or not formatted correctly, unable to proceed with launching.");
  expect_error([] { parse_hostfile("# only a comment\n\n"); },
               "Hostfile is empty or not formatted correctly");
}

TEST(Hostfile, MissingFileMeansLocalOnlyAndErrorsNameTheFile) {
  TempDir dir;
  EXPECT_FALSE(fetch_hostfile((dir.path / "nope").string(), false).has_value());
  const std::string good = dir.write("good", "a slots=1\nb slots=2\n");
  EXPECT_EQ(*fetch_hostfile(good), (HostPool{{"a", 1}, {"b", 2}}));
  const std::string bad = dir.write("bad", "a slots=1\na slots=1\n");
  expect_error([&] { fetch_hostfile(bad); }, "(hostfile " + bad + ")");
}

// --- include / exclude (DeepSpeed's tests/unit/launcher/test_run.py cases)
// -------------------------

TEST(ResourceFilter, SingleNode) {
  const Resources hosts = {{"worker-0", {0, 1, 2, 3}}};
  EXPECT_EQ(parse_resource_filter(hosts, "", ""), hosts);
  EXPECT_EQ(parse_resource_filter(hosts, "worker-0:1", ""), (Resources{{"worker-0", {1}}}));
  EXPECT_EQ(parse_resource_filter(hosts, "worker-0:1,3", ""), (Resources{{"worker-0", {1, 3}}}));
  EXPECT_EQ(parse_resource_filter(hosts, "", "worker-0:1"), (Resources{{"worker-0", {0, 2, 3}}}));
  EXPECT_EQ(parse_resource_filter(hosts, "", "worker-0:1,2"), (Resources{{"worker-0", {0, 3}}}));
  EXPECT_EQ(parse_resource_filter(hosts, "worker-0:1,1,0", ""),
            (Resources{{"worker-0", {1, 0}}}));  // duplicates go, the given order stays
  EXPECT_EQ(parse_resource_filter(hosts, "", "worker-0"), Resources{});
}

TEST(ResourceFilter, MultiNode) {
  const Resources hosts = hosts4x2();
  EXPECT_EQ(parse_resource_filter(hosts, "worker-0", ""), (Resources{{"worker-0", {0, 1, 2, 3}}}));
  EXPECT_EQ(parse_resource_filter(hosts, "", "worker-1"), (Resources{{"worker-0", {0, 1, 2, 3}}}));
  EXPECT_EQ(parse_resource_filter(hosts, "worker-0@worker-1:1", ""),
            (Resources{{"worker-0", {0, 1, 2, 3}}, {"worker-1", {1}}}));
  EXPECT_EQ(parse_resource_filter(hosts, "", "worker-0@worker-1:1"),
            (Resources{{"worker-1", {0, 2, 3}}}));
  // Hostfile order decides rank order, whatever the order in the spec.
  EXPECT_EQ(parse_resource_filter(hosts, "worker-1:0,2@worker-0:3", ""),
            (Resources{{"worker-0", {3}}, {"worker-1", {0, 2}}}));
  // DeepSpeed crashes removing a slot twice; we treat it as already gone.
  EXPECT_EQ(parse_resource_filter(hosts, "", "worker-1@worker-1:0"),
            (Resources{{"worker-0", {0, 1, 2, 3}}}));
}

TEST(ResourceFilter, Errors) {
  const Resources hosts = hosts4x2();
  expect_error([&] { parse_resource_filter(hosts, "A", "B"); }, "mutually exclusive");
  expect_error([&] { parse_resource_filter(hosts, "jeff", ""); },
               "Hostname 'jeff' not found in hostfile");
  expect_error([&] { parse_resource_filter(hosts, "", "jeff"); },
               "Hostname 'jeff' not found in hostfile");
  expect_error([&] { parse_resource_filter(hosts, "worker-1:4", ""); },
               "No slot '4' specified on host 'worker-1'");
  expect_error([&] { parse_resource_filter(hosts, "", "worker-1:4"); },
               "No slot '4' specified on host 'worker-1'");
  expect_error([&] { parse_resource_filter(hosts, "worker-1@worker-0:1@5", ""); },
               "Hostname '5' not found in hostfile");
  expect_error([&] { parse_resource_filter(hosts, "worker-1:x", ""); }, "bad slot 'x'");
  expect_error([&] { parse_resource_filter(hosts, "worker-1:0:1", ""); }, "bad resource");
}

TEST(ResourceFilter, FromHostPool) {
  const HostPool pool = {{"a", 2}, {"b", 3}};
  EXPECT_EQ(parse_inclusion_exclusion(pool, "", ""), (Resources{{"a", {0, 1}}, {"b", {0, 1, 2}}}));
  EXPECT_EQ(parse_inclusion_exclusion(pool, "", "b:1"), (Resources{{"a", {0, 1}}, {"b", {0, 2}}}));
}

// --- .deepspeed_env ------------------------------------------------------------------------------

TEST(EnvFile, ParsesKeyValueLines) {
  const EnvList env = parse_env_file(
      "# comment\n"
      "NCCL_DEBUG=INFO\n"
      "\n"
      "  PATHS = /a:/b  \n"
      "EQ=a=b=c\n"
      "QUOTED=\"two words\"\n"
      "SINGLE='x'\n"
      "EMPTY=\n"
      "NCCL_DEBUG=WARN\n",
      "f");
  EXPECT_EQ(env, (EnvList{{"NCCL_DEBUG", "WARN"},
                          {"PATHS", "/a:/b"},
                          {"EQ", "a=b=c"},
                          {"QUOTED", "two words"},
                          {"SINGLE", "x"},
                          {"EMPTY", ""}}));
  expect_error([] { parse_env_file("A=1\nno equals sign\n", "/home/u/.deepspeed_env"); },
               "/home/u/.deepspeed_env:2: expected KEY=VALUE, got 'no equals sign'");
  expect_error([] { parse_env_file("=1\n", "f"); }, "expected KEY=VALUE");
}

TEST(EnvFile, WorkingFolderOverridesHome) {
  TempDir home, work;
  home.write(".deepspeed_env", "A=home\nB=home\n");
  work.write(".deepspeed_env", "B=work\nC=work\n");
  EXPECT_EQ(load_env_files(home.path.string(), work.path.string()),
            (EnvList{{"A", "home"}, {"B", "work"}, {"C", "work"}}));
  EXPECT_EQ(load_env_files((home.path / "none").string(), ""), EnvList{});
}

// --- rank variables ------------------------------------------------------------------------------

TEST(Ranks, InfoFromLayout) {
  // 2 nodes x 2 ranks: rank 3 is the second rank of node 1.
  EXPECT_EQ(rank_info({2, 2}, 0), (RankInfo{0, 0, 4, 2, 0, 2}));
  EXPECT_EQ(rank_info({2, 2}, 3), (RankInfo{3, 1, 4, 2, 1, 2}));
  // Uneven nodes (after --include): 3 ranks, then 1.
  EXPECT_EQ(rank_info({3, 1}, 2), (RankInfo{2, 2, 4, 3, 0, 2}));
  EXPECT_EQ(rank_info({3, 1}, 3), (RankInfo{3, 0, 4, 1, 1, 2}));
  expect_error([] { rank_info({2, 2}, 4); }, "rank 4 outside a job of 4 ranks");
}

TEST(Ranks, Environment) {
  EXPECT_EQ(rank_env(RankInfo{5, 1, 8, 4, 1, 2}, "10.0.0.1", 1234),
            (EnvList{{"RANK", "5"},
                     {"LOCAL_RANK", "1"},
                     {"WORLD_SIZE", "8"},
                     {"LOCAL_SIZE", "4"},
                     {"CROSS_RANK", "1"},
                     {"CROSS_SIZE", "2"},
                     {"MASTER_ADDR", "10.0.0.1"},
                     {"MASTER_PORT", "1234"}}));
}

TEST(Ranks, FromMpirunAndSrunEnvironment) {
  const EnvList ompi = {{"OMPI_COMM_WORLD_RANK", "3"},
                        {"OMPI_COMM_WORLD_SIZE", "4"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  EXPECT_EQ(rank_info_from_env(LauncherKind::kOpenMPI, {2, 2}, ompi), (RankInfo{3, 1, 4, 2, 1, 2}));
  // mpirun placed ranks round-robin (--map-by node): CROSS_RANK would be wrong, so refuse.
  EnvList by_node = ompi;
  env_set(by_node, "OMPI_COMM_WORLD_LOCAL_RANK", "0");
  expect_error(
      [&] {
        rank_info_from_env(LauncherKind::kOpenMPI, {2, 2}, by_node);
      },
      "ranks must fill nodes in order");
  expect_error(
      [&] {
        rank_info_from_env(LauncherKind::kOpenMPI, {2, 2, 2}, ompi);
      },
      "mpirun started 4 ranks but the launcher planned 6");
  expect_error([] { rank_info_from_env(LauncherKind::kOpenMPI, {2}, {}); },
               "OMPI_COMM_WORLD_RANK is not set");

  const EnvList slurm = {
      {"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "1"}};
  EXPECT_EQ(rank_info_from_env(LauncherKind::kSlurm, {2, 2}, slurm), (RankInfo{2, 0, 4, 2, 1, 2}));
  EnvList cyclic = slurm;
  env_set(cyclic, "SLURM_NODEID", "0");
  expect_error(
      [&] {
        rank_info_from_env(LauncherKind::kSlurm, {2, 2}, cyclic);
      },
      "ranks must fill nodes in order");
}

TEST(Ranks, CoreBinding) {
  const std::vector<int> cores = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(cores_for_rank(cores, 2, 1), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(cores_for_rank(cores, 3, 2), (std::vector<int>{4, 5}));  // 8/3 = 2 cores each
  EXPECT_EQ(cores_for_rank({0, 1}, 4, 3), (std::vector<int>{1}));    // oversubscribed: shared
  EXPECT_EQ(parse_core_list("1,3-5,7"), (std::vector<int>{1, 3, 4, 5, 7}));
  expect_error([] { parse_core_list("3-1"); }, "bad --bind_core_list");
  expect_error([] { parse_core_list("a"); }, "bad --bind_core_list");
}

TEST(Ranks, LocalRankArgumentGoesAfterTheScript) {
  RankSpec s;
  s.program = {"./train", "--config", "x.json"};
  EXPECT_EQ(rank_argv(s, 1),
            (std::vector<std::string>{"./train", "--local_rank=1", "--config", "x.json"}));
  s.program = {"python3", "-u", "train.py", "--x"};
  s.local_rank_at = 3;
  EXPECT_EQ(rank_argv(s, 0),
            (std::vector<std::string>{"python3", "-u", "train.py", "--local_rank=0", "--x"}));
  s.local_rank_arg = false;
  EXPECT_EQ(rank_argv(s, 0), s.program);
}

// --- planning ------------------------------------------------------------------------------------

TEST(Plan, NoHostfileRunsOnLocalhost) {
  Options o = opts();
  o.num_procs = 4;
  const Plan p = make_plan(o, std::nullopt, {}, test_machine());
  EXPECT_EQ(p.active, (Resources{{"localhost", {0, 1, 2, 3}}}));
  EXPECT_EQ(p.spec.layout, std::vector<int>{4});
  EXPECT_EQ(p.spec.master_addr, "127.0.0.1");
  EXPECT_EQ(p.spec.master_port, 29500);
  EXPECT_TRUE(p.oversubscribed);  // 4 ranks, 2 cores
  EXPECT_TRUE(p.spec.visible_devices.empty());

  // Without --num_procs: one rank per core.
  EXPECT_EQ(make_plan(opts(), std::nullopt, {}, test_machine()).spec.layout, std::vector<int>{2});

  Options two_nodes = opts();
  two_nodes.num_nodes = 2;
  expect_error([&] { make_plan(two_nodes, std::nullopt, {}, test_machine()); },
               "Num nodes is >1 but no extra nodes available via hostfile");
}

TEST(Plan, IncludeExcludeConflicts) {
  const HostPool pool = {{"worker-0", 4}, {"worker-1", 4}};
  for (auto [nodes, procs, inc, exc] :
       {std::tuple{1, -1, "worker-0", ""}, std::tuple{1, 1, "worker-0", ""},
        std::tuple{-1, 1, "", "worker-0"}}) {
    Options o = opts();
    o.num_nodes = nodes;
    o.num_procs = procs;
    o.include = inc;
    o.exclude = exc;
    expect_error([&] { make_plan(o, pool, {}, test_machine()); },
                 "Cannot specify num_nodes/gpus with include/exclude");
  }
  Options o = opts();
  o.include = "worker-0";
  o.exclude = "worker-1";
  expect_error([&] { make_plan(o, pool, {}, test_machine()); }, "mutually exclusive");
  o.include = "";
  o.exclude = "worker-0@worker-1";
  expect_error([&] { make_plan(o, pool, {}, test_machine()); }, "no slots left");
}

TEST(Plan, HostfileWithFilters) {
  const HostPool pool = {{"worker-0", 4}, {"worker-1", 4}, {"worker-2", 4}};
  Options o = opts();
  o.include = "worker-0@worker-1:0,2";
  Plan p = make_plan(o, pool, {}, test_machine());
  EXPECT_EQ(p.spec.layout, (std::vector<int>{4, 2}));
  EXPECT_EQ(p.spec.master_addr, "worker-0");
  EXPECT_FALSE(p.oversubscribed);  // remote hosts: their slots are their business
  // Picked slots become the devices a rank sees; untouched nodes keep the user's setting.
  EXPECT_EQ(p.spec.visible_devices, (std::vector<std::string>{"", "0,2"}));

  o = opts();
  o.num_nodes = 2;
  o.num_procs = 1;
  o.master_addr = "10.1.1.1";
  o.master_port = 1234;
  p = make_plan(o, pool, {}, test_machine());
  EXPECT_EQ(p.active, (Resources{{"worker-0", {0}}, {"worker-1", {0}}}));
  EXPECT_EQ(p.spec.master_addr, "10.1.1.1");
  EXPECT_EQ(p.spec.master_port, 1234);

  // Rank 0 on this machine: loopback only if every rank is here.
  EXPECT_EQ(make_plan(opts(), HostPool{{"localhost", 2}}, {}, test_machine()).spec.master_addr,
            "127.0.0.1");
  EXPECT_EQ(make_plan(opts(), HostPool{{"localhost", 2}, {"worker-1", 2}}, {}, test_machine())
                .spec.master_addr,
            "vm");

  // --num_gpus may exceed the hostfile's slots (DeepSpeed does not check either).
  o = opts();
  o.num_procs = 6;
  EXPECT_EQ(make_plan(o, pool, {}, test_machine()).spec.layout, (std::vector<int>{6, 6, 6}));
}

TEST(Plan, LaunchersProgramsAndExports) {
  Options o = opts({"train.py", "--lr", "1"});
  o.launcher = "LOCAL";
  o.num_procs = 2;
  o.each_rank_log = "/tmp/logs/";
  Machine m = test_machine();
  m.environment = {{"NCCL_DEBUG", "INFO"},
                   {"HOME", "/root"},
                   {"OMP_NUM_THREADS", "1"},
                   {"DS_COMM_TIMEOUT", "60"}};
  const Plan p = make_plan(o, std::nullopt, {{"NCCL_DEBUG", "WARN"}, {"X", "1"}}, m);
  EXPECT_EQ(p.kind, LauncherKind::kLocal);
  EXPECT_EQ(p.spec.program, (std::vector<std::string>{"python3", "-u", "train.py", "--lr", "1"}));
  EXPECT_EQ(p.spec.local_rank_at, 3);
  // Forwarded prefixes first, .deepspeed_env on top; HOME is not forwarded.
  EXPECT_EQ(p.spec.exports, (EnvList{{"NCCL_DEBUG", "WARN"},
                                     {"OMP_NUM_THREADS", "1"},
                                     {"DS_COMM_TIMEOUT", "60"},
                                     {"X", "1"}}));
  EXPECT_EQ(p.spec.log_dir, "/tmp/logs/");
  EXPECT_EQ(p.spec.log_prefix, "20240102030405");

  o.no_python = true;
  EXPECT_EQ(make_plan(o, std::nullopt, {}, m).spec.program[0], "train.py");

  // The local launcher cannot reach other hosts; this host under its own name is fine.
  Options remote = opts();
  remote.launcher = "local";
  expect_error(
      [&] {
        make_plan(remote, HostPool{{"worker-0", 2}}, {}, m);
      },
      "--launcher local runs ranks on this machine only");
  EXPECT_EQ(make_plan(remote, HostPool{{"vm", 2}}, {}, m).spec.layout, std::vector<int>{2});

  Options pdsh = opts();
  pdsh.launcher = "pdsh";
  expect_error([&] { make_plan(pdsh, std::nullopt, {}, m); },
               "launcher 'pdsh' is not supported by deepspeed.cpp; use --launcher openmpi");
  pdsh.launcher = "torchrun";
  expect_error([&] { make_plan(pdsh, std::nullopt, {}, m); }, "Unknown launcher torchrun");
}

TEST(Plan, SlurmWithoutHostfileUsesTheAllocation) {
  Options o = opts();
  o.launcher = "slurm";
  Machine m = test_machine();
  m.environment = {{"SLURM_JOB_NUM_NODES", "2"},
                   {"SLURM_NTASKS_PER_NODE", "4"},
                   {"SLURM_JOB_NODELIST", "gpu[07-08]"}};
  const Plan p = make_plan(o, std::nullopt, {}, m);
  EXPECT_EQ(p.spec.layout, (std::vector<int>{4, 4}));
  EXPECT_FALSE(p.hosts_known);
  EXPECT_EQ(p.spec.master_addr, "gpu07");
  EXPECT_EQ(first_slurm_host("a[01-04,07],b"), "a01");
  EXPECT_EQ(first_slurm_host("host1,host2"), "host1");
  EXPECT_EQ(first_slurm_host("x[3,5]-ib"), "x3-ib");
  m.environment = {};
  expect_error([&] { make_plan(o, std::nullopt, {}, m); }, "pass --master_addr");
}

// --- command lines
// ---------------------------------------------------------------------------------

TEST(Commands, MpirunOneHostFourProcsAsRoot) {
  Options o = opts({"./ds_train", "--steps", "5"});
  o.num_procs = 4;
  Machine m = test_machine();  // root, 2 cores
  const Plan p = make_plan(o, std::nullopt, {{"FOO", "a b"}}, m);
  EXPECT_EQ(mpirun_command(p, "/opt/ds/deepspeed", m),
            (std::vector<std::string>{"mpirun",
                                      "-np",
                                      "4",
                                      "--host",
                                      "localhost:4",
                                      "--allow-run-as-root",
                                      "--oversubscribe",
                                      "--mca",
                                      "mpi_yield_when_idle",
                                      "1",
                                      "--map-by",
                                      "slot",
                                      "--bind-to",
                                      "none",
                                      "-x",
                                      "FOO=a b",
                                      "/opt/ds/deepspeed",
                                      "--_rank_wrapper",
                                      "--launcher",
                                      "openmpi",
                                      "--layout",
                                      "4",
                                      "--master_addr",
                                      "127.0.0.1",
                                      "--master_port",
                                      "29500",
                                      "--",
                                      "./ds_train",
                                      "--steps",
                                      "5"}));
}

TEST(Commands, MpirunTwoHostsFromHostfile) {
  TempDir dir;
  const std::string hostfile =
      dir.write("hostfile", "# two nodes\nnode-a slots=2\nnode-b slots=2\n");
  Options o = opts({"./ds_train"});
  o.hostfile = hostfile;
  o.launcher_args = "--mca btl_tcp_if_include 'eth0'";
  o.no_local_rank = true;
  o.bind_cores_to_rank = true;
  o.each_rank_log = "/logs";
  Machine m = test_machine();
  m.is_root = false;
  const Plan p = make_plan(o, fetch_hostfile(hostfile), {}, m);
  EXPECT_EQ(mpirun_command(p, "/opt/ds/deepspeed", m),
            (std::vector<std::string>{"mpirun",
                                      "-np",
                                      "4",
                                      "--host",
                                      "node-a:2,node-b:2",
                                      "--map-by",
                                      "slot",
                                      "--bind-to",
                                      "none",
                                      "--mca",
                                      "btl_tcp_if_include",
                                      "eth0",
                                      "/opt/ds/deepspeed",
                                      "--_rank_wrapper",
                                      "--launcher",
                                      "openmpi",
                                      "--layout",
                                      "2,2",
                                      "--master_addr",
                                      "node-a",
                                      "--master_port",
                                      "29500",
                                      "--no_local_rank",
                                      "--bind_cores_to_rank",
                                      "--log_dir",
                                      "/logs",
                                      "--log_prefix",
                                      "20240102030405",
                                      "--",
                                      "./ds_train"}));
}

TEST(Commands, Srun) {
  Options o = opts({"./ds_train"});
  o.launcher = "slurm";
  o.num_procs = 2;
  const HostPool pool = {{"n1", 8}, {"n2", 8}};
  const Plan p = make_plan(o, pool, {{"A", "1"}, {"LIST", "x,y"}}, test_machine());
  EXPECT_EQ(srun_command(p, "/opt/ds/deepspeed"), (std::vector<std::string>{"srun",
                                                                            "-N",
                                                                            "2",
                                                                            "-n",
                                                                            "4",
                                                                            "--ntasks-per-node=2",
                                                                            "--nodelist=n1,n2",
                                                                            "--export=ALL,A=1",
                                                                            "/opt/ds/deepspeed",
                                                                            "--_rank_wrapper",
                                                                            "--launcher",
                                                                            "slurm",
                                                                            "--layout",
                                                                            "2,2",
                                                                            "--master_addr",
                                                                            "n1",
                                                                            "--master_port",
                                                                            "29500",
                                                                            "--",
                                                                            "./ds_train"}));
  Options uneven = opts();
  uneven.launcher = "slurm";
  uneven.include = "n1@n2:0";
  expect_error([&] { srun_command(make_plan(uneven, pool, {}, test_machine()), "/x"); },
               "needs the same number of ranks on every node");
}

TEST(Commands, WrapperArgumentsRoundTrip) {
  RankSpec s;
  s.layout = {3, 1};
  s.visible_devices = {"", "1"};
  s.master_addr = "h";
  s.master_port = 7;
  s.local_rank_arg = false;
  s.local_rank_at = 3;
  s.bind_cores = true;
  s.bind_core_list = "0-3";
  s.log_dir = "/l";
  s.log_prefix = "p";
  s.program = {"python3", "-u", "t.py", "--", "-x"};
  const auto [kind, back] = parse_wrapper_args(wrapper_args(LauncherKind::kSlurm, s));
  EXPECT_EQ(kind, LauncherKind::kSlurm);
  EXPECT_EQ(back, s);
  expect_error([] { parse_wrapper_args({"--layout", "2"}); }, "needs --layout and `-- program");
}

TEST(Commands, ShellQuoting) {
  EXPECT_EQ(shell_split("  -x 'a b' \"c \\\"d\\\"\" e\\ f ''"),
            (std::vector<std::string>{"-x", "a b", "c \"d\"", "e f", ""}));
  expect_error([] { shell_split("'open"); }, "unbalanced");
  EXPECT_EQ(shell_join({"mpirun", "-x", "FOO=a b", "it's", ""}),
            "mpirun -x 'FOO=a b' 'it'\"'\"'s' ''");
}

// --- the built tool, end to end
// --------------------------------------------------------------------

TEST(Tool, UsageAndConfigurationErrors) {
  TempDir dir;
  RunResult r = run_launcher(dir, "--no_such_flag prog");
  EXPECT_EQ(r.code, 2) << r.output;
  r = run_launcher(dir, "--num_procs 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no program given"), std::string::npos) << r.output;
  r = run_launcher(dir, "--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("--num_gpus,--num_accelerators,--num_procs"), std::string::npos);

  dir.write("hostfile", "a slots=1\na slots=2\n");
  r = run_launcher(dir, "-H hostfile --dry_run prog");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("[deepspeed] Hostfile contains multiple entries for a"),
            std::string::npos)
      << r.output;
  r = run_launcher(dir, "-H none --launcher pdsh prog");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("not supported"), std::string::npos) << r.output;
  r = run_launcher(dir, "-H none --dry_run --num_procs 3 prog");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Unable to find hostfile, will proceed with training with local "
                          "resources only."),
            std::string::npos);
  EXPECT_NE(r.output.find("[deepspeed] cmd = mpirun -np 3 --host localhost:3"), std::string::npos)
      << r.output;
}

// Every rank of a local run gets its variables, --local_rank and the .deepspeed_env values.
TEST(Tool, LocalLauncherSetsRankVariables) {
  TempDir dir;
  dir.write("probe.sh", kProbe, true);
  dir.write(".deepspeed_env", "FROM_ENV_FILE=yes\n");
  const RunResult r =
      run_launcher(dir, "-H none --launcher local --num_procs 2 --master_port 4321 ./probe.sh x y");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto lines = probe_lines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(lines.at(rank),
              fmt::format("probe rank={0} local_rank={0} world_size=2 local_size=2 cross_rank=0 "
                          "cross_size=1 master=127.0.0.1:4321 from_env_file=yes "
                          "args=--local_rank={0} x y",
                          rank));
}

TEST(Tool, LocalLauncherEachRankLogAndCoreBinding) {
  TempDir dir;
  dir.write("bind.sh",
            "#!/bin/sh\necho \"rank=$RANK omp=$OMP_NUM_THREADS $(grep Cpus_allowed_list "
            "/proc/self/status)\"\n",
            true);
  const RunResult r = run_launcher(
      dir,
      "-H none --launcher local --num_procs 2 --bind_cores_to_rank --bind_core_list 0,1 "
      "--enable_each_rank_log logs --no_local_rank ./bind.sh");
  ASSERT_EQ(r.code, 0) << r.output;
  std::map<int, std::string> logs;
  for (const auto& e : fs::directory_iterator(dir.path / "logs")) {
    const std::string name = e.path().filename().string();
    const std::smatch m = [&] {
      std::smatch sm;
      std::regex_match(name, sm, std::regex(R"(\d{14}_rank(\d+)\.log)"));
      return sm;
    }();
    ASSERT_FALSE(m.empty()) << name;
    std::ifstream f(e.path());
    std::getline(f, logs[std::stoi(m[1])]);
  }
  ASSERT_EQ(logs.size(), 2u);
  // Two ranks share cores 0,1: one core and one OpenMP thread each.
  EXPECT_EQ(logs[0], "rank=0 omp=1 Cpus_allowed_list:\t0");
  EXPECT_EQ(logs[1], "rank=1 omp=1 Cpus_allowed_list:\t1");
}

TEST(Tool, MpirunLauncherSetsRankVariables) {
  if (!find_in_path("mpirun")) GTEST_SKIP() << "OpenMPI's mpirun is not installed";
  TempDir dir;
  dir.write("probe.sh", kProbe, true);
  dir.write(".deepspeed_env", "FROM_ENV_FILE=yes\n");
  dir.write("hostfile", "localhost slots=2\n");
  const RunResult r = run_launcher(dir, "-H hostfile ./probe.sh --flag");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[deepspeed] cmd = mpirun -np 2 --host localhost:2"), std::string::npos)
      << r.output;
  const auto lines = probe_lines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(lines.at(rank),
              fmt::format("probe rank={0} local_rank={0} world_size=2 local_size=2 cross_rank=0 "
                          "cross_size=1 master=127.0.0.1:29500 from_env_file=yes "
                          "args=--local_rank={0} --flag",
                          rank));
}

// One rank exits 3 while the others would sleep 30 s (in a child shell, so that stopping must
// reach the whole process group): the job ends promptly with code 3 and names the rank.
constexpr const char* kFailer = R"(#!/bin/sh
if [ "$RANK" = 1 ]; then sleep 0.5; exit 3; fi
sh -c 'sleep 30'
echo "rank $RANK was not stopped"
)";

TEST(Tool, LocalLauncherFirstFailingRankEndsTheJob) {
  TempDir dir;
  dir.write("fail.sh", kFailer, true);
  const RunResult r = run_launcher(dir, "-H none --launcher local --num_procs 3 ./fail.sh");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\[deepspeed\] rank 1 \(pid \d+, host \S+\) exited with code 3; )"
                           R"(stopping the job)")))
      << r.output;
  EXPECT_EQ(r.output.find("was not stopped"), std::string::npos) << r.output;
}

TEST(Tool, LocalLauncherKillsRanksThatIgnoreSigterm) {
  TempDir dir;
  dir.write("stubborn.sh",
            "#!/bin/sh\nif [ \"$RANK\" = 1 ]; then sleep 0.5; exit 4; fi\ntrap '' TERM\n"
            "sleep 30\n",
            true);
  const RunResult r = run_launcher(dir, "-H none --launcher local --num_procs 2 ./stubborn.sh");
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_LT(r.seconds, kStopGraceSeconds + 5) << r.output;
  EXPECT_NE(r.output.find("rank(s) 0 still running"), std::string::npos) << r.output;
}

TEST(Tool, MpirunLauncherFirstFailingRankEndsTheJob) {
  if (!find_in_path("mpirun")) GTEST_SKIP() << "OpenMPI's mpirun is not installed";
  TempDir dir;
  dir.write("fail.sh", kFailer, true);
  const RunResult r = run_launcher(dir, "-H none --num_procs 3 ./fail.sh");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_LT(r.seconds, 15) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\[deepspeed\] rank 1 on host \S+ exited with code 3)")))
      << r.output;
  EXPECT_EQ(r.output.find("was not stopped"), std::string::npos) << r.output;
}

TEST(Tool, MissingProgramIsNamed) {
  TempDir dir;
  const RunResult r = run_launcher(dir, "-H none --launcher local --num_procs 1 ./does_not_exist");
  EXPECT_EQ(r.code, 127) << r.output;
  EXPECT_NE(r.output.find("rank 0: cannot run './does_not_exist'"), std::string::npos) << r.output;
}
