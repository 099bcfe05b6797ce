// NVMe offload (ZeRO-Infinity): the aio layer (io/aio.h, io/swap_dir.h) and the optimizer state on
// NVMe (zero/state_store.h). Offloaded training must equal in-RAM training bitwise (the Adam step
// is elementwise and sub-groups start on 2048-element boundaries, so every element sees the same
// arithmetic), checkpoints move freely between offloaded and in-RAM runs, and I/O failures are
// clear errors on every rank. Run plainly and under mpirun -np 2 (tests/cmake/offload.cmake);
// tiny sub-groups and few buffers force many sub-groups and a full read-ahead/write-behind ring.
#include <gtest/gtest.h>

#include <fcntl.h>

#include <signal.h>

#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <optional>
#include <thread>

#include "ds/comm/group.h"
#include "ds/core/rng.h"
#include "ds/io/aio.h"
#include "ds/io/swap_dir.h"
#include "ds/models/gpt.h"
#include "ds/nn/module.h"
#include "ds/ops/ops.h"
#include "ds/runtime/engine.h"
#include "ds/train/fit.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kT = 16, kVocab = 64;

// A folder shared by the ranks of this run (one job on one nvme_path: ranks must not collide).
fs::path scratch(const std::string& name) {
  // The ranks of one mpirun share a parent (the launcher's daemon); separate runs do not.
  fs::path p = fs::temp_directory_path() / fmt::format("ds_offload_{}_{}", ::getppid(), name);
  fs::create_directories(p);
  return p;
}

// Removes this run's scratch folders when the tests end (the ranks of one mpirun share them: the
// first rank removes them after all are done).
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    comm::world()->barrier("offload test scratch cleanup");
    if (comm::world()->rank() != 0) return;
    const std::string prefix = fmt::format("ds_offload_{}_", ::getppid());
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec))
      if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove_all(e.path(), ec);
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

struct EnvGuard {
  std::string key;
  EnvGuard(const std::string& k, const std::string& v) : key(k) {
    ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~EnvGuard() { ::unsetenv(key.c_str()); }
};

void expect_contains(const std::string& what, const std::vector<std::string>& parts) {
  for (const auto& p : parts)
    EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
}

// ---------------------------------------------------------------------------------------------
// The aio layer.

class Aio : public ::testing::TestWithParam<io::AioOptions::Kind> {};

TEST_P(Aio, RoundTripManyPiecesDirectAndBuffered) {
  const fs::path dir = scratch("aio");
  for (bool direct : {true, false}) {
    std::string why;
    if (direct && !io::direct_io_supported(dir.string(), &why)) continue;  // e.g. tmpfs /tmp
    io::AioOptions o;
    o.kind = GetParam();
    o.block_size = 8192;
    o.queue_depth = 3;
    o.threads = 2;
    auto engine = io::make_engine(o);
    EXPECT_STREQ(engine->kind(),
                 GetParam() == io::AioOptions::Kind::Threads ? "threads" : "io_uring");
    const std::string path = (dir / fmt::format("rt_{}_{}", direct, ::getpid())).string();
    io::File f = io::File::open(path, io::File::kReadWrite | io::File::kCreate, direct);
    const int64_t bytes = 37 * 4096;  // not a multiple of block_size: a short last piece
    f.reserve(bytes + 4096);
    io::AlignedBuffer out(bytes), in(bytes);
    for (int64_t i = 0; i < bytes / 4; ++i)
      out.as<int32_t>()[i] = static_cast<int32_t>(i * 2654435761u);
    const int64_t half = 18 * 4096;  // two requests in flight at once
    io::Ticket a = engine->write(f, out.data(), half, 4096);
    io::Ticket b = engine->write(f, out.as<char>() + half, bytes - half, 4096 + half);
    engine->wait(b);
    engine->wait(a);
    engine->wait(engine->read(f, in.data(), bytes, 4096));
    EXPECT_EQ(std::memcmp(out.data(), in.data(), static_cast<size_t>(bytes)), 0)
        << "direct " << direct;
    const io::Counters c = engine->counters();
    EXPECT_EQ(c.bytes_written, bytes);
    EXPECT_EQ(c.bytes_read, bytes);
    EXPECT_THROW(engine->wait(a), Error);  // waited for once
    fs::remove(path);
  }
}

TEST_P(Aio, InjectedFaultNamesFileOffsetAndErrnoAndEngineStaysUsable) {
  const fs::path dir = scratch("fault");
  const std::string path = (dir / fmt::format("f_{}", ::getpid())).string();
  io::AioOptions o;
  o.kind = GetParam();
  o.block_size = 4096;
  o.queue_depth = 1;  // sequential pieces: the fault hits exactly the third
  o.threads = 1;
  io::AlignedBuffer buf(4 * 4096);
  io::File f = io::File::open(path, io::File::kReadWrite | io::File::kCreate, false);
  {
    EnvGuard fault("DS_IO_FAULT", "write:ENOSPC:8192");
    auto engine = io::make_engine(o);
    try {
      engine->wait(engine->write(f, buf.data(), 4 * 4096, 0));
      FAIL() << "no error";
    } catch (const Error& e) {
      expect_contains(e.what(), {path, "offset 8192", "ENOSPC", "disk is full"});
    }
  }
  {
    EnvGuard fault("DS_IO_FAULT", "read:EIO:0");
    auto engine = io::make_engine(o);
    try {
      engine->wait(engine->read(f, buf.data(), 4096, 0));
      FAIL() << "no error";
    } catch (const Error& e) {
      expect_contains(e.what(), {path, "offset 0", "EIO", "dmesg"});
    }
  }
  // Reading past the end of a file is an error, not a silent short read.
  auto engine = io::make_engine(o);
  try {
    engine->wait(engine->read(f, buf.data(), 4 * 4096, 1 << 20));
    FAIL() << "no error";
  } catch (const Error& e) {
    expect_contains(e.what(), {"end of file", path});
  }
  engine->wait(engine->write(f, buf.data(), 4096, 0));  // still usable
  fs::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Kinds, Aio,
                         ::testing::Values(io::AioOptions::Kind::Uring,
                                           io::AioOptions::Kind::Threads),
                         [](const auto& info) {
                           return info.param == io::AioOptions::Kind::Uring ? "io_uring"
                                                                            : "threads";
                         });

TEST(AioFiles, ProbeAndReserveGiveReasons) {
  std::string why;
  EXPECT_FALSE(io::direct_io_supported("/nonexistent/ds_probe", &why));
  EXPECT_NE(why.find("open"), std::string::npos) << why;
  const fs::path dir = scratch("reserve");
  io::File f = io::File::open((dir / fmt::format("r_{}", ::getpid())).string(),
                              io::File::kReadWrite | io::File::kCreate, false);
  try {
    f.reserve(int64_t{1} << 60);  // an exbibyte: no filesystem here has it
    FAIL() << "no error";
  } catch (const Error& e) {
    expect_contains(e.what(), {"cannot reserve", "GiB available", f.path()});
  }
  EXPECT_TRUE(f.reserve(1 << 20) || fs::file_size(f.path()) >= (1u << 20));
  fs::remove(f.path());
  EXPECT_THROW(io::File::open("/nonexistent/x", io::File::kRead, false), Error);
}

// ds_train's start-up free-space check runs before this run's SwapDir removes a killed run's
// folder: that folder is dead by its lock (however young) and counts as free, and the message
// names every swap folder there and whether its run is alive.
TEST(AioFiles, FreeSpaceCheckCountsDeadRunsByTheirLockAndNamesThem) {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const fs::path root = scratch(fmt::format("swapspace_{}", rank ? rank : "0"));
  const fs::path swap = root / "ds_swap";
  auto fill = [](const fs::path& file, size_t bytes) {  // real blocks, not a sparse file
    std::ofstream(file, std::ios::binary) << std::string(bytes, 'x');
  };
  // A run killed a second ago: its lock file is there, nobody holds it.
  const fs::path dead = swap / "deadhost-1-rank0-optimizer";
  fs::create_directories(dead);
  std::ofstream(dead / "lock") << "";
  fill(dead / "optimizer_state.swp", 32 << 20);
  // A live run: its lock held (by this process).
  const fs::path live = swap / "livehost-2-rank0-optimizer";
  fs::create_directories(live);
  const int fd = ::open((live / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  fill(live / "optimizer_state.swp", 8 << 20);

  const io::SwapSpace space = io::swap_space(root.string());
  EXPECT_GE(space.reclaimable, 32 << 20);  // the dead run's bytes, not the live one's
  EXPECT_LT(space.reclaimable, 40 << 20);
  expect_contains(space.folders, {dead.string(), "its run is gone", live.string(),
                                  "a running process holds its lock"});

  // Through ds_train's check: a need no disk has fails naming both folders.
  train::FitPlan plan;
  plan.nvme = int64_t{1} << 60;
  plan.nvme_path = root.string();
  const auto mc = models::GPTConfig::preset("test-gpt2");
  try {
    train::check_fit(plan, 0, mc.num_parameters(), config::DeepSpeedConfig{}, 1, root.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    expect_contains(e.what(), {"[ds_train]", "is free there", dead.string(), "counted as free",
                               live.string(), "holds its lock"});
  }
  // More than is free, but not more than free plus the dead run's 32 MiB, fits (other writers
  // may change the free space meanwhile: 16 MiB of slack either way).
  const int64_t free = io::available_bytes(root.string());
  ASSERT_GT(free, 0);
  plan.nvme = free + (16 << 20);
  EXPECT_NO_THROW(train::check_fit(plan, 0, mc.num_parameters(), config::DeepSpeedConfig{}, 1, root.string()));
  ::close(fd);
  fs::remove_all(root);
}

TEST(AioFiles, SwapDirsAreUniqueLockedAndRemoved) {
  // Not collective: each rank of an mpirun its own root, or one rank could remove the stale
  // folder the other planted.
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const fs::path root = scratch(fmt::format("swapdir_{}", rank ? rank : "0"));
  std::string a_path;
  {
    io::SwapDir a(root.string(), "rank0-optimizer"), b(root.string(), "rank1-optimizer");
    EXPECT_NE(a.path(), b.path());
    EXPECT_TRUE(fs::exists(fs::path(a.path()) / "lock"));
    a_path = a.path();
    std::ofstream(a.path() + "/data.swp") << "x";
  }
  EXPECT_FALSE(fs::exists(a_path)) << "swap folder left after a clean exit";
  // A folder left by a run that died goes at the next start, however young it is (a resume right
  // after kill -9 must get the space back): its lock file is there and nobody holds it.
  char host_buf[256] = {0};
  ::gethostname(host_buf, sizeof(host_buf) - 1);
  const std::string host = host_buf;
  const fs::path swap = root / "ds_swap";
  const fs::path stale = swap / "deadhost-1-rank0-optimizer";
  fs::create_directories(stale);
  std::ofstream(stale / "lock") << "";
  std::ofstream(stale / "optimizer_state.swp") << "old";
  // A run that is alive: its lock is held (here by this process, through its own open file).
  const fs::path held = swap / "otherhost-7-rank0-optimizer";
  fs::create_directories(held);
  const int held_fd = ::open((held / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(held_fd, 0);
  ASSERT_EQ(::flock(held_fd, LOCK_EX | LOCK_NB), 0);
  // No lock file yet: a run on this host between mkdir and its lock (alive: this pid), and one
  // that died right there.
  const fs::path starting = swap / fmt::format("{}-{}-starting", host, ::getpid());
  fs::create_directories(starting);
  // (A pid above any pid_max: no such process. Not fork(): this test also runs under mpirun.)
  const pid_t gone = 2147480000;
  ASSERT_NE(::kill(gone, 0), 0);
  const fs::path dead_early = swap / fmt::format("{}-{}-rank1-optimizer", host, gone);
  fs::create_directories(dead_early);
  // The disk-full message names the folders beside a run's own and says which are gone.
  const std::string others = io::other_swap_dirs((swap / "mine" / "x.swp").string());
  expect_contains(others, {stale.string(), "its run is gone", held.string(),
                           "a running process holds its lock"});
  std::vector<std::string> notes;
  {
    io::SwapDir c(root.string(), "rank0-optimizer",
                  [&](const std::string& m) { notes.push_back(m); });
    EXPECT_FALSE(fs::exists(stale));
    EXPECT_FALSE(fs::exists(dead_early));
    EXPECT_TRUE(fs::exists(held));
    EXPECT_TRUE(fs::exists(starting));
  }
  ::close(held_fd);
  fs::remove_all(held);
  fs::remove_all(starting);
  ASSERT_EQ(notes.size(), 2u);
  const std::string all_notes = notes[0] + notes[1];
  EXPECT_NE(all_notes.find("deadhost-1-rank0-optimizer"), std::string::npos);
  EXPECT_NE(all_notes.find(dead_early.filename().string()), std::string::npos);
  EXPECT_THROW(io::SwapDir("/nonexistent/nvme", "x"), Error);
}

// Two runs starting on one disk at once (two ranks of a job): each one's start-up scan must never
// take the other's folder for a dead run's. A lock file that existed unlocked for a moment (made,
// then locked) let a scan delete a rank's folder right after it was created, and that rank's
// swap file then could not be opened (test_offload_np2 failed so, now and then).
TEST(AioFiles, SwapDirsStartingTogetherKeepEachOthersFolders) {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const fs::path root = scratch(fmt::format("swapdir_race_{}", rank ? rank : "0"));
  std::atomic<bool> stop{false};
  std::atomic<int> lost{0};
  std::thread other([&] {
    while (!stop.load()) io::SwapDir b(root.string(), "b");  // scans, creates, removes its own
  });
  for (int i = 0; i < 300; ++i) {
    io::SwapDir a(root.string(), "a");
    // The folder and its held lock are in place the moment the constructor returns, and stay.
    std::ofstream f(a.path() + "/state.swp");
    if (!f || !fs::exists(fs::path(a.path()) / "lock") ||
        fs::exists(fs::path(a.path()) / "lock.tmp"))
      ++lost;
  }
  stop = true;
  other.join();
  EXPECT_EQ(lost.load(), 0) << "a starting run's swap folder was removed by another's scan";
}

// ---------------------------------------------------------------------------------------------
// Training with the optimizer state on NVMe.

void sample_tokens(int64_t s, int32_t* x, int32_t* y) {
  for (int64_t t = 0; t <= kT; ++t) {
    const int32_t v = static_cast<int32_t>((s * 5 + t * 3 + (t / 4) * 7) % kVocab);
    if (t < kT) x[t] = v;
    if (t > 0) y[t - 1] = v;
  }
}

struct RunSpec {
  int stage = 2;
  std::string precision = "fp32";
  std::string nvme;  // empty: in RAM
  double ratio = 1.0;
  int64_t buffer_count = 3;
  std::string extra;  // more offload_optimizer keys (", ...")
  // "optimizer" (offload_optimizer only), "params" (offload_param only) or "both".
  std::string what = "optimizer";
  int64_t max_in_cpu = 0;
  double clip = 0.5;  // gradient_clipping; 0 lets stage 3 step the optimizer during backward
  int gas = 1;        // gradient_accumulation_steps
  // Stage 3: build the model piecewise (nn::PartitionedInit), as ds_train does; with the optimizer
  // state on NVMe its initial values then go straight to the swap files, sub-group by sub-group.
  bool piecewise = false;
  // deepspeed.cpp's scheduling keys in offload_optimizer (", ..."), given with the optimizer on
  // NVMe or not (they apply to offloaded parameters alone too).
  std::string schedule;
  bool direct_io = true;  // aio.use_direct_io
};

std::string config(const RunSpec& r) {
  // "bf16-grads": gradients accumulate in bf16 too (widened per sub-group when offloaded).
  const std::string prec =
      r.precision == "bf16" ? R"("bf16": {"enabled": true},)"
      : r.precision == "bf16-grads"
          ? R"("bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"},)"
          : "";
  std::string off;
  if (!r.nvme.empty() && r.what != "params")
    off += fmt::format(R"(, "offload_optimizer": {{"device": "nvme", "nvme_path": "{}",
                        "buffer_count": {}, "ratio": {}{}{}}})",
                       r.nvme, r.buffer_count, r.ratio, r.extra, r.schedule);
  else if (!r.schedule.empty())
    off += fmt::format(R"(, "offload_optimizer": {{"device": "none"{}}})", r.schedule);
  // Small buffers: most parameters are read ahead one or two at a time, some split.
  if (!r.nvme.empty() && r.what != "optimizer")
    off += fmt::format(R"(, "offload_param": {{"device": "nvme", "nvme_path": "{}",
                        "buffer_count": 2, "buffer_size": 1500, "max_in_cpu": {}}})",
                       r.nvme, r.max_in_cpu);
  if (!off.empty()) off += R"(, "sub_group_size": 3000)";
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": {},
    "gradient_clipping": {}, {}
    "aio": {{"block_size": 8192, "queue_depth": 4, "use_direct_io": {}}},
    "zero_optimization": {{"stage": {}, "reduce_bucket_size": 4000,
      "stage3_param_persistence_threshold": 100{}}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 5e-3, "weight_decay": 0.1}}}}}})",
                     r.gas, r.clip, prec, r.direct_io, r.stage, off);
}

std::unique_ptr<runtime::Engine> engine(const RunSpec& r, std::vector<std::string>* log = nullptr) {
  rng::dropout_state() = {};
  std::optional<nn::PartitionedInit> pieces;
  if (r.piecewise) pieces.emplace();
  auto model = std::make_shared<models::GPT>(models::GPTConfig::preset("test-gpt2"));
  pieces.reset();
  runtime::InitOptions opt;
  opt.log = [log](const std::string& m) {
    if (log) log->push_back(m);
  };
  return runtime::initialize(model, config(r), opt);
}

std::vector<float> train(runtime::Engine& e, int steps, int64_t first = 0) {
  const int n = e.world_size(), r = e.rank();
  std::vector<float> losses;
  for (int64_t s = first; s < first + steps; ++s) {
    Tensor x = Tensor::empty({2, kT}, DType::i32), y = Tensor::empty({2, kT}, DType::i32);
    for (int64_t i = 0; i < 2; ++i)
      sample_tokens((s * n + r) * 2 + i, x.data<int32_t>() + i * kT, y.data<int32_t>() + i * kT);
    Tensor loss = e.forward(x, y);
    e.backward(loss);
    e.step();
    float l = loss.item();
    e.group().all_reduce(&l, 1, DType::f32);
    losses.push_back(l);
  }
  return losses;
}

class Offload : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(Offload, SameLossesAsInRamBitwise) {
  const auto [stage, precision] = GetParam();
  const fs::path nvme = scratch(fmt::format("train_{}_{}", stage, precision));
  auto ram = engine({stage, precision});
  const auto want = train(*ram, 20);
  std::vector<std::string> log;
  RunSpec spec{stage, precision, nvme.string()};
  spec.piecewise = stage == 3;  // against the reference built whole
  auto off = engine(spec, &log);
  const zero::StoreStats before = off->strategy().state().stats();
  EXPECT_GT(before.disk_bytes, 0);
  const auto got = train(*off, 20);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(got[i], want[i]) << "stage " << stage << " " << precision << " step " << i;
  // The state really went through the disk, 20 reads and writes of all of it (the last step may
  // still run in the background under stage 3).
  off->synchronize();
  const zero::StoreStats after = off->strategy().state().stats();
  EXPECT_EQ(after.bytes_read - before.bytes_read, 20 * before.disk_bytes);
  EXPECT_EQ(after.bytes_written - before.bytes_written, 20 * before.disk_bytes);
  // The working weights match as well (stage 3 only holds pieces; compare the gathered whole).
  auto wa = ram->full_weights(), wb = off->full_weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i)
    EXPECT_EQ(wa[i].second.to_vector(), wb[i].second.to_vector()) << wa[i].first;
  bool described = false;
  for (const auto& m : log)
    described = described || m.find("sub-groups of 4096 elements") != std::string::npos;
  if (off->rank() == 0) EXPECT_TRUE(described) << "no start-up line about the NVMe store";
  off.reset();
  comm::world()->barrier("swap folders removed");  // the other ranks share nvme_path
  EXPECT_TRUE(fs::is_empty(nvme / "ds_swap")) << "swap files left after a clean exit";
}

INSTANTIATE_TEST_SUITE_P(Stages, Offload,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::Values("fp32", "bf16", "bf16-grads")),
                         [](const auto& info) {
                           std::string p = std::get<1>(info.param);
                           std::replace(p.begin(), p.end(), '-', '_');
                           return fmt::format("stage{}_{}", std::get<0>(info.param), p);
                         });

// Stage 3 with the parameters on NVMe (optimizer in RAM, or both on NVMe), all of them on disk or
// some kept in RAM by max_in_cpu: the same losses and weights as in RAM, bitwise.
class OffloadParams
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, int64_t>> {};

TEST_P(OffloadParams, SameLossesAsInRamBitwise) {
  const auto [what, precision, max_in_cpu] = GetParam();
  const fs::path nvme = scratch(fmt::format("params_{}_{}_{}", what, precision, max_in_cpu));
  auto ram = engine({3, precision});
  const auto want = train(*ram, 12);
  RunSpec spec{3, precision, nvme.string()};
  spec.what = what;
  spec.max_in_cpu = max_in_cpu;
  spec.piecewise = what == "both";  // initial values streamed to both swap files
  std::vector<std::string> log;
  auto off = engine(spec, &log);
  EXPECT_EQ(train(*off, 12), want) << config(spec);
  auto wa = ram->full_weights(), wb = off->full_weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i)
    EXPECT_EQ(wa[i].second.to_vector(), wb[i].second.to_vector()) << wa[i].first;
  std::string all;
  for (const auto& m : log) all += m + "\n";
  if (off->rank() == 0) expect_contains(all, {"parameters (" + precision + ") on NVMe"});
  // Only max_in_cpu elements of the pieces stay in RAM.
  EXPECT_LE(off->memory_budget().params, max_in_cpu * (precision == "bf16" ? 2 : 4) + 64 * 1024)
      << "persistent parameters aside, the pieces should be on disk";
  if (what == "both") EXPECT_EQ(off->memory_budget().master_weights, 0);
  off.reset();
  comm::world()->barrier("swap folders removed");
  EXPECT_TRUE(fs::is_empty(nvme / "ds_swap"));
}

INSTANTIATE_TEST_SUITE_P(Modes, OffloadParams,
                         ::testing::Values(std::tuple{"params", "bf16", int64_t{0}},
                                           std::tuple{"both", "bf16", int64_t{0}},
                                           std::tuple{"both", "fp32", int64_t{0}},
                                           std::tuple{"params", "bf16", int64_t{10240}}),
                         [](const auto& info) {
                           return fmt::format("{}_{}_cpu{}", std::get<0>(info.param),
                                              std::get<1>(info.param), std::get<2>(info.param));
                         });

// Stage 3 offloaded without gradient clipping steps each sub-group during backward, as soon as its
// gradients are final, top down, then the rest bottom up after backward (strategy.h): the same
// losses and weights as in RAM, bitwise, with gradient accumulation too. The step really could
// start during backward: some sub-groups were ready before their backward ended.
struct InBackwardCase {
  std::string what, precision;
  int gas;
};

class OffloadStepInBackward : public ::testing::TestWithParam<InBackwardCase> {};

TEST_P(OffloadStepInBackward, SameLossesAsInRamBitwise) {
  const InBackwardCase c = GetParam();
  const fs::path nvme = scratch(fmt::format("in_backward_{}_{}_{}", c.what, c.precision, c.gas));
  RunSpec ref{3, c.precision};
  ref.clip = 0;
  ref.gas = c.gas;
  auto ram = engine(ref);
  const auto want = train(*ram, 12);
  RunSpec spec = ref;
  spec.nvme = nvme.string();
  spec.what = c.what;
  spec.piecewise = c.what != "params";
  std::vector<std::string> log;
  auto off = engine(spec, &log);
  EXPECT_EQ(train(*off, 12), want) << config(spec);
  off->synchronize();
  auto wa = ram->full_weights(), wb = off->full_weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i)
    EXPECT_EQ(wa[i].second.to_vector(), wb[i].second.to_vector()) << wa[i].first;
  // The reported norm is the same sum taken in sub-group pieces.
  EXPECT_NEAR(off->last_grad_norm(), ram->last_grad_norm(), 1e-5 * ram->last_grad_norm());
  std::string all;
  for (const auto& m : log) all += m + "\n";
  if (off->rank() == 0) expect_contains(all, {"steps each sub-group during backward"});
  // Gradients became final while the backward ran, so the worker could step them then (whether
  // it did depends on thread scheduling: reported, not asserted).
  const auto stats = off->strategy().offload_stats();
  EXPECT_GT(stats.final_in_backward, 0) << "no sub-group was ready before its backward ended";
  std::printf("sub-groups ready during backward: %lld, stepped then: %lld\n",
              static_cast<long long>(stats.final_in_backward),
              static_cast<long long>(stats.stepped_in_backward));
  // step_in_backward = false steps after backward, overlap_step = false on the training thread,
  // prefetch_in_backward = false reads nothing ahead during backward: the same losses again.
  const std::vector<float> first(want.begin(), want.begin() + 4);
  for (const char* keys : {R"(, "step_in_backward": false)", R"(, "overlap_step": false)",
                           R"(, "prefetch_in_backward": false, "step_in_backward": false)"}) {
    RunSpec other = spec;
    other.schedule = keys;
    auto later = engine(other);
    EXPECT_EQ(train(*later, 4), first) << config(other);
    EXPECT_EQ(later->strategy().offload_stats().final_in_backward, 0) << config(other);
  }
}

// The environment variables that came before the keys still turn their feature off, with a
// warning that names the key.
TEST(OffloadStepInBackward, DeprecatedEnvironmentVariableStillWorks) {
  const fs::path nvme = scratch("in_backward_env");
  RunSpec spec{3, "bf16", nvme.string()};
  spec.clip = 0;
  spec.what = "both";
  auto ram_spec = spec;
  ram_spec.nvme.clear();
  auto ram = engine(ram_spec);
  const auto want = train(*ram, 3);
  EnvGuard after("DS_OFFLOAD_STEP_IN_BACKWARD", "0");
  std::vector<std::string> log;
  auto e = engine(spec, &log);
  EXPECT_EQ(train(*e, 3), want);
  EXPECT_EQ(e->strategy().offload_stats().final_in_backward, 0);
  std::string all;
  for (const auto& m : log) all += m + "\n";
  // Warned once per process: this is the only test that sets the variable.
  if (e->rank() == 0)
    expect_contains(all, {"DS_OFFLOAD_STEP_IN_BACKWARD=0 is deprecated",
                          "zero_optimization.offload_optimizer.step_in_backward"});
}

INSTANTIATE_TEST_SUITE_P(Modes, OffloadStepInBackward,
                         ::testing::Values(InBackwardCase{"both", "bf16", 1},
                                           InBackwardCase{"both", "bf16-grads", 2},
                                           InBackwardCase{"optimizer", "fp32", 1},
                                           InBackwardCase{"params", "bf16", 2}),
                         [](const auto& info) {
                           std::string p = info.param.precision;
                           std::replace(p.begin(), p.end(), '-', '_');
                           return fmt::format("{}_{}_gas{}", info.param.what, p, info.param.gas);
                         });

// A non-finite gradient cannot be skipped once the step ran during backward: the run stops on
// every rank with a message that says how to get skipping back.
TEST(OffloadStepInBackward, NonFiniteGradientStopsEveryRank) {
  const fs::path nvme = scratch("in_backward_nan");
  RunSpec spec{3, "bf16", nvme.string()};
  spec.clip = 0;
  spec.what = "both";
  auto e = engine(spec);
  train(*e, 2);
  const int n = e->world_size(), r = e->rank();
  Tensor x = Tensor::empty({2, kT}, DType::i32), y = Tensor::empty({2, kT}, DType::i32);
  for (int64_t i = 0; i < 2; ++i)
    sample_tokens(i + r * 2 + n, x.data<int32_t>() + i * kT, y.data<int32_t>() + i * kT);
  Tensor loss = e->forward(x, y);
  e->backward(ops::mul(loss, std::numeric_limits<float>::infinity()));
  try {
    e->step();
    FAIL() << "a non-finite gradient norm was accepted";
  } catch (const Error& err) {
    expect_contains(err.what(), {"step 3", "not finite", "step_in_backward = false"});
  }
}

// A backward that started a step but never finished (an error in it) must not leave the worker
// waiting for gradients: tearing the engine down ends it.
TEST(OffloadStepInBackward, AnUnfinishedBackwardDoesNotHangTheTeardown) {
  const fs::path nvme = scratch("in_backward_unfinished");
  RunSpec spec{3, "bf16", nvme.string()};
  spec.clip = 0;
  spec.what = "both";
  auto e = engine(spec);
  train(*e, 1);
  e->strategy().plan_step_in_backward(e->optimizer(), 1.0f);
  e->strategy().begin_backward(/*boundary=*/true, "step 2");  // the worker starts; no gradients
  const auto t0 = std::chrono::steady_clock::now();
  e.reset();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
}

TEST(OffloadOptions, PartialRatioSyncRingAndThreadPoolAgree) {
  const fs::path nvme = scratch("ratio");
  auto ram = engine({2, "bf16"});
  const auto want = train(*ram, 6);
  // Half the sub-groups in RAM; one buffer and no overlap; the pread/pwrite pool; buffered I/O.
  struct Case {
    RunSpec run;
    const char* engine_kind;
  };
  for (const Case& c : {Case{{2, "bf16", nvme.string(), 0.5}, "auto"},
                        Case{{2, "bf16", nvme.string(), 1.0, 1,
                              R"(, "pipeline_read": false, "pipeline_write": false)"},
                             "auto"},
                        Case{{3, "bf16", nvme.string(), 1.0, 4}, "threads"}}) {
    EnvGuard kind("DS_AIO_ENGINE", c.engine_kind);
    RunSpec run = c.run;
    run.direct_io = run.buffer_count != 4;  // the thread pool case: buffered I/O
    std::unique_ptr<runtime::Engine> ref;
    if (run.stage != 2) ref = engine({run.stage, "bf16"});
    const auto expect = ref ? train(*ref, 6) : want;
    std::vector<std::string> log;
    auto off = engine(run, &log);
    EXPECT_EQ(train(*off, 6), expect) << config(run);
    std::string all;
    for (const auto& m : log) all += m + "\n";
    if (off->rank() != 0) continue;
    if (c.run.ratio == 0.5) {
      const int64_t groups = static_cast<int64_t>(std::stoll(all.substr(all.find("NVMe: ") + 6)));
      expect_contains(all, {fmt::format("{} in RAM", groups - (groups + 1) / 2)});
    }
    if (c.run.buffer_count == 1) expect_contains(all, {"read-ahead 0, write-behind off"});
    if (c.run.buffer_count == 4) expect_contains(all, {"threads", "(buffered)"});
  }
}

TEST(OffloadCheckpoint, ResumesAcrossOffloadedAndInRamRuns) {
  const fs::path nvme = scratch("resume"), ck = scratch("resume_ck");
  for (int stage : {2, 3}) {
    const RunSpec in_ram{stage, "bf16"};
    RunSpec on_nvme{stage, "bf16", nvme.string()};
    if (stage == 3) on_nvme.what = "both";
    for (const auto& [writer, reader] : {std::pair{on_nvme, in_ram}, std::pair{in_ram, on_nvme}}) {
      const std::string tag = fmt::format("s{}_{}", stage, writer.nvme.empty() ? "ram" : "nvme");
      auto a = engine(writer);
      train(*a, 3);
      a->save_checkpoint(ck.string(), tag);
      const auto cont = train(*a, 3, 3);
      a.reset();
      auto b = engine(reader);
      b->load_checkpoint(ck.string(), tag);
      EXPECT_EQ(train(*b, 3, 3), cont)
          << tag << " resumed " << (reader.nvme.empty() ? "in RAM" : "on NVMe");
    }
  }
}

TEST(OffloadFaults, IoErrorsReachEveryRankAndKeepTheCheckpoint) {
  const fs::path nvme = scratch("faults"), ck = scratch("faults_ck");
  const RunSpec run{2, "bf16", nvme.string()};
  {
    auto a = engine(run);
    train(*a, 2);
    a->save_checkpoint(ck.string(), "good");
  }
  // Bytes written before the first step: the initial state, then the checkpoint streamed in.
  int64_t before_step = 0;
  {
    auto probe = engine(run);
    before_step = 2 * probe->strategy().state().stats().disk_bytes;
  }
  auto fails_on_every_rank = [&](const std::string& fault, const std::vector<std::string>& parts) {
    // Only the last rank's disk fails; every rank must get the error (none left waiting).
    const int rank =
        std::getenv("OMPI_COMM_WORLD_RANK") ? std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")) : 0;
    const int size =
        std::getenv("OMPI_COMM_WORLD_SIZE") ? std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")) : 1;
    std::optional<EnvGuard> guard;
    if (rank == size - 1) guard.emplace("DS_IO_FAULT", fault);
    auto e = engine(run);
    e->load_checkpoint(ck.string(), "good");  // streams into the swap file: writes only
    try {
      train(*e, 1);
      FAIL() << "no error for " << fault;
    } catch (const Error& err) {
      expect_contains(err.what(), {"optimizer step"});
      if (rank == size - 1)
        expect_contains(err.what(), parts);
      else
        expect_contains(err.what(), {fmt::format("failed on rank {}", size - 1)});
    }
  };
  fails_on_every_rank("read:EIO:0", {"EIO", "optimizer_state.swp"});
  fails_on_every_rank(fmt::format("write:ENOSPC:{}", before_step), {"ENOSPC", "disk is full"});
  {
    // The disk fills while the checkpoint streams into the swap file (after the initial state):
    // load_checkpoint itself fails on every rank.
    const int rank =
        std::getenv("OMPI_COMM_WORLD_RANK") ? std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")) : 0;
    const int size =
        std::getenv("OMPI_COMM_WORLD_SIZE") ? std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")) : 1;
    std::optional<EnvGuard> guard;
    if (rank == size - 1) guard.emplace("DS_IO_FAULT", fmt::format("write:ENOSPC:{}", before_step / 2));
    auto e = engine(run);
    try {
      e->load_checkpoint(ck.string(), "good");
      FAIL() << "no error for a full disk during the load";
    } catch (const Error& err) {
      if (rank == size - 1)
        expect_contains(err.what(), {"ENOSPC", "optimizer_state.swp"});
      else
        expect_contains(err.what(),
                        {"loading checkpoint", fmt::format("failed on rank {}", size - 1)});
    }
  }
  // The checkpoint is untouched and loads.
  auto c = engine({2, "bf16"});
  c->load_checkpoint(ck.string(), "good");
  EXPECT_EQ(train(*c, 1).size(), 1u);
}

// Stage 3 with everything on NVMe steps the optimizer in the background and reads parameters in
// the gathers: a failure in either surfaces on every rank at the next backward (a failing rank
// keeps taking part in the gathers until then, so no rank waits for it).
TEST(OffloadFaults, Stage3BackgroundStepAndGatherFailuresReachEveryRank) {
  const fs::path nvme = scratch("faults3");
  RunSpec run{3, "bf16", nvme.string()};
  run.what = "both";
  run.piecewise = true;
  int64_t initial_state = 0;  // bytes the optimizer store writes at start-up
  {
    auto probe = engine(run);
    initial_state = probe->strategy().state().stats().disk_bytes;
  }
  const int rank =
      std::getenv("OMPI_COMM_WORLD_RANK") ? std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")) : 0;
  const int size =
      std::getenv("OMPI_COMM_WORLD_SIZE") ? std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")) : 1;
  auto fails_on_every_rank = [&](const std::string& fault, int steps,
                                 const std::vector<std::string>& parts) {
    std::optional<EnvGuard> guard;
    if (rank == size - 1) guard.emplace("DS_IO_FAULT", fault);
    auto e = engine(run);
    guard.reset();
    try {
      train(*e, steps);
      FAIL() << "no error for " << fault;
    } catch (const Error& err) {
      if (rank == size - 1)
        expect_contains(err.what(), parts);
      else
        expect_contains(err.what(), {fmt::format("failed on rank {}", size - 1)});
    }
  };
  // With clipping the step runs during the next forward; without, from the backward on.
  for (double clip : {0.5, 0.0}) {
    SCOPED_TRACE(fmt::format("gradient_clipping {}", clip));
    run.clip = clip;
    // The first forward's gathers read the pieces: the read fails, the backward reports it.
    fails_on_every_rank("read:EIO:0", 1, {"EIO", "params.swp", "reading parameter"});
    // The first optimizer step (in the background) cannot write the state back; the second
    // step's backward reports it.
    fails_on_every_rank(fmt::format("write:ENOSPC:{}", initial_state), 2,
                        {"ENOSPC", "optimizer_state.swp", "optimizer step"});
  }
}

TEST(OffloadConfig, RefusalsNameTheKey) {
  auto parse = [](const std::string& json) {
    try {
      config::parse_config(json, {});
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  expect_contains(
      parse(
          R"({"train_batch_size": 2, "zero_optimization": {"stage": 2, "aio": {"block_size": 1048576}}})"),
      {"aio is a top-level section"});
  expect_contains(parse(R"({"train_batch_size": 2, "aio": {"use_gds": true}})"), {"aio.use_gds"});
  expect_contains(
      parse(
          R"({"train_batch_size": 2, "optimizer": {"type": "Lamb"}, "zero_allow_untested_optimizer": true,
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}})"),
      {"needs the Adam or AdamW"});
  expect_contains(parse(R"({"train_batch_size": 2, "zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "nvme"}}})"),
                  {"nvme_path is required"});
}

}  // namespace
