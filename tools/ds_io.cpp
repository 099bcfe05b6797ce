// ds_io: disk bandwidth of the aio layer (io/aio.h) with given `aio` settings, like DeepSpeed's
// ds_io / ds_nvme_tune commands (deepspeed/nvme/): what NVMe offload can expect from a folder.
//
//   ds_io --path DIR [--size 1G] [--read|--write|--both] [--block_size 1M] [--queue_depth 8]
//         [--threads 1] [--single_submit] [--no_overlap_events] [--engine auto|uring|threads]
//         [--buffered] [--loops 3] [--sweep]
//
// A temporary file DIR/ds_io.<pid>.tmp of --size bytes is preallocated (fallocate) and removed at
// exit, on errors and on Ctrl-C/SIGTERM. Each loop writes the whole file, then reads it back, with
// one io::Engine built from the flags (threads = intra_op_parallelism; queue_depth pieces of
// block_size in flight per thread). Requests of up to 256 MiB cover the file and are all queued at
// once, all on one io::AlignedBuffer (as the offload swap buffers are; reads overwrite each other:
// the data is discarded). What is timed:
//   write: first submit to last completion, in GB/s = 1e9 bytes/s. The fsync that follows each
//          write pass is NOT in that number (as in DeepSpeed's ds_io and fio's default): it is
//          printed on its own with the rate including it, since a virtual disk may acknowledge
//          O_DIRECT writes from a host cache and pay at the fsync. With buffered I/O the fsync IS
//          included (otherwise the number is a copy into the page cache).
//   read:  first submit to last completion, with O_DIRECT so the page cache cannot serve it.
// Where O_DIRECT is unsupported (tmpfs, overlayfs) or --buffered is given, the page cache is used;
// pages are dropped after the fsync (posix_fadvise, best effort), and the output says that read
// numbers may then be memory speed. --read alone first writes the file untimed (reading an
// unwritten extent returns zeros without touching the disk).
// Output: one line per loop, then the best loop per operation:
//   BENCH ds_io op=<read|write> gbps=<x> block_size=<b> queue_depth=<q> threads=<t>
//         engine=<io_uring|threads> direct=<0|1>
// --sweep tries block_size 256K/1M/4M x queue_depth 4/8/32 x threads 1/2 (1 loop each unless
// --loops is given), prints the best read and the best write as BENCH lines, and the `"aio"`
// section of the fastest write+read combination (least total time) to paste into a DeepSpeed
// config.
// Exit codes: 0 ok; 2 bad flags, with a one-line message naming the flag (syntax, alignment,
// --path not a folder, --size over the free space); 1 I/O failure (folder not writable, device
// errors), naming the path.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ds/core/error.h"
#include "ds/io/aio.h"

namespace {

namespace io = ds::io;

// A mistake on the command line (exit code 2), as opposed to an I/O failure (exit code 1).
struct FlagError : ds::Error {
  using ds::Error::Error;
};

// "1G", "256K", "4MiB", "4096": bytes, binary multiples.
int64_t parse_size(const std::string& flag, const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) unit.pop_back();
  const size_t power = unit.size() == 1
                           ? std::string("KMGT").find(static_cast<char>(std::toupper(unit[0])))
                           : std::string::npos;
  if (!unit.empty() && power == std::string::npos) used = 0;  // unknown unit
  const double mult = unit.empty() ? 1.0 : static_cast<double>(int64_t{1} << (10 * (power + 1)));
  if (used == 0 || !(v > 0))
    throw FlagError(
        fmt::format("[ds_io] {} '{}': expected a size such as 4096, 256K, 1M or 2G", flag, s));
  return static_cast<int64_t>(v * mult);
}

std::string human(int64_t b) {
  if (b % (1 << 30) == 0) return fmt::format("{}G", b >> 30);
  if (b % (1 << 20) == 0) return fmt::format("{}M", b >> 20);
  if (b % (1 << 10) == 0) return fmt::format("{}K", b >> 10);
  return std::to_string(b);
}

// The temporary file: removed by the destructor, or by the signal handler on Ctrl-C.
char g_tmp_path[4096] = {0};
void on_signal(int sig) {
  if (g_tmp_path[0]) ::unlink(g_tmp_path);  // async-signal-safe
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
struct TempFile {
  std::string path;
  explicit TempFile(std::string p) : path(std::move(p)) {
    std::snprintf(g_tmp_path, sizeof g_tmp_path, "%s", path.c_str());
    for (int s : {SIGINT, SIGTERM, SIGHUP}) std::signal(s, on_signal);
  }
  ~TempFile() {
    ::unlink(path.c_str());
    g_tmp_path[0] = 0;
  }
};

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Result {
  double write_gbps = 0, read_gbps = 0;
  std::string engine;  // io_uring or threads
};

struct Bench {
  std::string file;
  int64_t size = 0;
  bool direct = true, do_read = true, do_write = true;
  int loops = 3;
  io::AlignedBuffer buf;

  // Queues the whole file as requests of buf.bytes(), waits, returns seconds.
  double pass(io::Engine& e, const io::File& f, bool write) {
    const auto t0 = Clock::now();
    std::vector<io::Ticket> tickets;
    for (int64_t off = 0; off < size; off += buf.bytes()) {
      const int64_t n = std::min(buf.bytes(), size - off);
      tickets.push_back(write ? e.write(f, buf.data(), n, off) : e.read(f, buf.data(), n, off));
    }
    for (io::Ticket t : tickets) e.wait(t);
    return since(t0);
  }

  // Writes (durably) then reads the file `loops` times with `o`; best GB/s of each.
  Result run(const io::AioOptions& o, bool verbose) {
    auto engine = io::make_engine(o);
    const std::string tag =
        fmt::format("block_size={} queue_depth={} threads={} engine={} direct={}", o.block_size,
                    o.queue_depth, o.threads, engine->kind(), direct ? 1 : 0);
    io::File f = io::File::open(file, io::File::kReadWrite, direct);
    Result best;
    best.engine = engine->kind();
    for (int loop = 1; loop <= loops; ++loop) {
      if (do_write || (loop == 1 && !written_)) {
        const double s = pass(*engine, f, true);
        const auto t0 = Clock::now();
        if (::fsync(f.fd()) != 0)
          throw ds::Error(fmt::format("[ds_io] fsync of {}: {}", file, std::strerror(errno)));
        const double fs = since(t0);
        if (!direct) ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);  // drop cached pages
        written_ = true;
        if (do_write) {
          const double gbps = static_cast<double>(size) / (direct ? s : s + fs) / 1e9;
          best.write_gbps = std::max(best.write_gbps, gbps);
          if (verbose)
            fmt::print(
                "loop {}/{} write: {:.3f} GB/s ({:.3f} s; then fsync {:.3f} s: {:.3f} GB/s "
                "with it) {}\n",
                loop, loops, gbps, s, fs, static_cast<double>(size) / (s + fs) / 1e9, tag);
        }
      }
      if (do_read) {
        const double gbps = static_cast<double>(size) / pass(*engine, f, false) / 1e9;
        best.read_gbps = std::max(best.read_gbps, gbps);
        if (verbose) fmt::print("loop {}/{} read:  {:.3f} GB/s {}\n", loop, loops, gbps, tag);
      }
      std::fflush(stdout);
    }
    for (const char* op : {"write", "read"}) {
      const double g = op[0] == 'w' ? best.write_gbps : best.read_gbps;
      if (g > 0 && verbose) fmt::print("BENCH ds_io op={} gbps={:.3f} {}\n", op, g, tag);
    }
    return best;
  }

 private:
  bool written_ = false;
};

void sweep(Bench& b, io::AioOptions o) {
  struct Row {
    io::AioOptions o;
    Result r;
  };
  std::vector<Row> rows;
  for (int64_t bs : {int64_t{256} << 10, int64_t{1} << 20, int64_t{4} << 20})
    for (int qd : {4, 8, 32})
      for (int t : {1, 2}) {
        o.block_size = bs, o.queue_depth = qd, o.threads = t;
        rows.push_back({o, b.run(o, false)});
        fmt::print(
            "sweep block_size={:>4} queue_depth={:>2} threads={}  write {:.3f} GB/s  read "
            "{:.3f} GB/s\n",
            human(bs), qd, t, rows.back().r.write_gbps, rows.back().r.read_gbps);
        std::fflush(stdout);
      }
  auto line = [&](const char* op, const Row& r, double g) {
    fmt::print(
        "BENCH ds_io op={} gbps={:.3f} block_size={} queue_depth={} threads={} engine={} "
        "direct={}\n",
        op, g, r.o.block_size, r.o.queue_depth, r.o.threads, r.r.engine, b.direct ? 1 : 0);
  };
  auto by = [](auto key) { return [key](const Row& a, const Row& c) { return key(a) < key(c); }; };
  if (b.do_write) {
    const Row& w = *std::max_element(rows.begin(), rows.end(),
                                     by([](const Row& r) { return r.r.write_gbps; }));
    line("write", w, w.r.write_gbps);
  }
  if (b.do_read) {
    const Row& r =
        *std::max_element(rows.begin(), rows.end(), by([](const Row& r) { return r.r.read_gbps; }));
    line("read", r, r.r.read_gbps);
  }
  // Least time to write and read the same bytes once (only the measured operations count).
  const Row& best = *std::min_element(rows.begin(), rows.end(), by([](const Row& r) {
                                        return (r.r.write_gbps > 0 ? 1 / r.r.write_gbps : 0) +
                                               (r.r.read_gbps > 0 ? 1 / r.r.read_gbps : 0);
                                      }));
  fmt::print(
      "\nSuggested DeepSpeed config section (write {:.3f} GB/s, read {:.3f} GB/s):\n"
      "\"aio\": {{\n  \"block_size\": {},\n  \"queue_depth\": {},\n  "
      "\"intra_op_parallelism\": {},\n  \"single_submit\": {},\n  \"overlap_events\": {}\n}}\n",
      best.r.write_gbps, best.r.read_gbps, best.o.block_size, best.o.queue_depth, best.o.threads,
      best.o.single_submit, best.o.overlap_events);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Disk bandwidth of the aio layer for NVMe offload (DeepSpeed's ds_io / "
      "ds_nvme_tune): writes then reads a temporary file in --path.",
      "ds_io"};
  std::string dir, size_s = "1G", bs_s = "1M", engine_s = "auto";
  io::AioOptions o;
  bool rd = false, wr = false, both = false, no_overlap = false, buffered = false, do_sweep = false;
  int loops = 3;
  app.add_option("--path", dir, "Folder to test (the nvme_path of the offload config)")->required();
  app.add_option("--size", size_s, "File size (K/M/G, binary)")->capture_default_str();
  auto* r_opt = app.add_flag("--read", rd, "Measure reads only");
  auto* w_opt = app.add_flag("--write", wr, "Measure writes only")->excludes(r_opt);
  app.add_flag("--both", both, "Measure writes then reads (default)")->excludes(r_opt, w_opt);
  app.add_option("--block_size", bs_s, "aio.block_size: bytes per piece")->capture_default_str();
  app.add_option("--queue_depth", o.queue_depth, "aio.queue_depth: pieces in flight per thread")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--threads", o.threads, "aio.intra_op_parallelism")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_flag("--single_submit", o.single_submit, "aio.single_submit = true");
  app.add_flag("--no_overlap_events", no_overlap, "aio.overlap_events = false");
  app.add_option("--engine", engine_s, "io_uring or a pread/pwrite thread pool")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "uring", "threads"}));
  app.add_flag("--buffered", buffered, "No O_DIRECT (page cache)");
  auto* l_opt = app.add_option("--loops", loops, "Passes; the best is reported")
                    ->capture_default_str()
                    ->check(CLI::Range(1, 1000));
  app.add_flag("--sweep", do_sweep, "Try a grid of block_size x queue_depth x threads");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    Bench b;
    // Flag checks (exit 2).
    o.block_size = parse_size("--block_size", bs_s);
    if (o.block_size % io::kAlignment != 0)
      throw FlagError(fmt::format("[ds_io] --block_size {} is not a multiple of {} bytes",
                                  o.block_size, io::kAlignment));
    b.size = parse_size("--size", size_s);
    if (b.size % io::kAlignment != 0)
      throw FlagError(
          fmt::format("[ds_io] --size {} is not a multiple of {} bytes", b.size, io::kAlignment));
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      throw FlagError(fmt::format("[ds_io] --path {}: no such folder", dir));
    const int64_t avail = io::available_bytes(dir);
    if (b.size > avail)
      throw FlagError(fmt::format("[ds_io] --size {} is larger than the {:.2f} GiB free in {}",
                                  size_s, static_cast<double>(avail) / (1 << 30), dir));
    o.overlap_events = !no_overlap;
    o.kind = engine_s == "uring"     ? io::AioOptions::Kind::Uring
             : engine_s == "threads" ? io::AioOptions::Kind::Threads
                                     : io::AioOptions::Kind::Auto;
    b.do_read = !wr;
    b.do_write = !rd;
    b.loops = do_sweep && l_opt->count() == 0 ? 1 : loops;

    // The file (exit 1 from here on).
    TempFile tmp(fmt::format("{}/ds_io.{}.tmp", dir, ::getpid()));
    b.file = tmp.path;
    io::File::open(b.file, io::File::kReadWrite | io::File::kCreate, false).reserve(b.size);
    std::string why;
    b.direct = !buffered && io::direct_io_supported(dir, &why);
    if (!buffered && !b.direct)
      fmt::print(
          "note: O_DIRECT is not supported in {} ({}): buffered I/O; read numbers are "
          "likely cached-memory speed, not the disk\n",
          dir, why);
    if (buffered)
      fmt::print(
          "note: --buffered: pages are dropped after each fsync (best effort); read "
          "numbers may still include page-cache hits\n");
    fmt::print("ds_io: {} file {}; write GB/s {} the fsync after each write pass\n", human(b.size),
               b.file, b.direct ? "excludes" : "includes");
    b.buf = io::AlignedBuffer(std::min<int64_t>(b.size, int64_t{256} << 20));
    std::memset(b.buf.data(), 0x5a, static_cast<size_t>(b.buf.bytes()));  // not all zeros
    if (do_sweep)
      sweep(b, o);
    else
      b.run(o, true);
    return 0;
  } catch (const FlagError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
