// Token shards, the memory-mapped dataset, the distributed sampler and the data loader.
// Self-contained: needs no downloaded data (the tokenizer tests are in test_tokenizer.cpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/checksum.h"
#include "ds/data/dataset.h"
#include "ds/data/loader.h"
#include "ds/data/prepare.h"
#include "ds/data/sampler.h"
#include "ds/data/shard.h"

namespace fs = std::filesystem;
using namespace ds;
using namespace ds::data;

namespace {

// A fresh folder per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            fmt::format("ds_test_data_{}_{}_{}", ::getpid(), info->test_suite_name(), info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

std::vector<int32_t> iota_tokens(size_t n, int32_t start, int32_t modulo) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((start + i) % modulo);
  return v;
}

// Run f, expect a ds::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected ds::Error";
  } catch (const ds::Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

void patch_file(const fs::path& p, size_t offset, const void* bytes, size_t n) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
}

}  // namespace

// ---- checksum -----------------------------------------------------------------------------------

TEST(Checksum, Xxh64KnownVectors) {
  // Published XXH64 values (seed 0), also what Python's xxhash.xxh64(...).hexdigest() gives.
  EXPECT_EQ(xxh64("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(xxh64("a", 1), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(xxh64("abc", 3), 0x44BC2CF5AD770999ULL);
  std::string s;
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>(i));
  EXPECT_EQ(xxh64(s.data(), s.size()), 0x8E03C838C596036FULL);
  // Streaming in odd pieces gives the same digest.
  Xxh64 st;
  for (size_t i = 0; i < s.size(); i += 7)
    st.update(s.data() + i, std::min<size_t>(7, s.size() - i));
  EXPECT_EQ(st.digest(), 0x8E03C838C596036FULL);
}

// ---- shards -------------------------------------------------------------------------------------

TEST(Shard, WriteReadUint16) {
  TempDir dir;
  const auto tokens = iota_tokens(10007, 5, 50257);
  const ShardHeader h = write_shard(dir / "a.bin", tokens, 50257, 3);
  EXPECT_EQ(h.token_bytes, 2u);
  EXPECT_EQ(fs::file_size(dir / "a.bin"), kShardHeaderBytes + 2 * tokens.size());

  const Shard s = Shard::open(dir / "a.bin", /*verify_checksum=*/true);
  EXPECT_EQ(s.num_tokens(), tokens.size());
  EXPECT_EQ(s.vocab_size(), 50257u);
  EXPECT_EQ(s.header().num_documents, 3u);
  EXPECT_EQ(s.header().payload_checksum, xxh64(s.payload(), tokens.size() * 2));
  std::vector<int32_t> back(tokens.size());
  s.read(0, back);
  EXPECT_EQ(back, tokens);
  EXPECT_EQ(s.at(100), tokens[100]);
  expect_error([&] { s.at(tokens.size()); }, {"[shard]", "a.bin", "past its end"});
}

TEST(Shard, WriteReadUint32ForLargeVocab) {
  TempDir dir;
  const auto tokens = iota_tokens(5000, 65000, 70000);  // ids above 65535 need 4 bytes
  ShardWriter w(dir / "b.bin", 70000);
  w.write(std::span(tokens).first(1234));  // several writes stream into one file
  w.write(std::span(tokens).subspan(1234));
  EXPECT_FALSE(fs::exists(dir / "b.bin")) << "the final name must appear only at finish()";
  w.finish();
  const Shard s = Shard::open(dir / "b.bin", true);
  EXPECT_EQ(s.header().token_bytes, 4u);
  std::vector<int32_t> back(tokens.size());
  s.read(0, back);
  EXPECT_EQ(back, tokens);
}

TEST(Shard, EmptyShardIsValid) {
  TempDir dir;
  write_shard(dir / "e.bin", {}, 100);
  const Shard s = Shard::open(dir / "e.bin", true);
  EXPECT_EQ(s.num_tokens(), 0u);
}

TEST(Shard, AtomicWriteLeavesNoTemporaryFiles) {
  TempDir dir;
  write_shard(dir / "a.bin", iota_tokens(10, 0, 100), 100);
  {
    ShardWriter abandoned(dir / "b.bin", 100);
    abandoned.write(iota_tokens(10, 0, 100));
    // Destroyed without finish(), as when an exception unwinds through the writer.
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"a.bin"});
}

TEST(Shard, WriterRejectsTokensOutsideVocab) {
  TempDir dir;
  ShardWriter w(dir / "a.bin", 100);
  const std::vector<int32_t> bad = {1, 2, 100};
  expect_error([&] { w.write(bad); }, {"[shard]", "token 100", "a.bin"});
  const std::vector<int32_t> negative = {-1};
  expect_error([&] { w.write(negative); }, {"[shard]", "token -1"});
}

TEST(Shard, CorruptHeaderIsRefusedNamingTheFile) {
  TempDir dir;
  const auto tokens = iota_tokens(1000, 0, 50257);
  const fs::path good = dir / "good.bin";
  write_shard(good, tokens, 50257);
  auto corrupt_copy = [&](const std::string& name, size_t offset, std::string bytes) {
    const fs::path p = dir / name;
    fs::copy_file(good, p);
    patch_file(p, offset, bytes.data(), bytes.size());
    return p;
  };
  const fs::path magic = corrupt_copy("magic.bin", 0, "XSTOKENS");
  expect_error([&] { Shard::open(magic); }, {"[shard]", magic.string(), "bad magic", "ds_prepare"});

  // One flipped bit in num_tokens: caught by the header checksum, not by a wild read.
  std::string count(8, '\0');
  const uint64_t wrong = 999;
  std::memcpy(count.data(), &wrong, 8);
  const fs::path hdr = corrupt_copy("count.bin", 16, count);
  expect_error([&] { Shard::open(hdr); }, {"[shard]", hdr.string(), "header checksum"});

  const fs::path version = corrupt_copy("version.bin", 8, std::string("\x07\0\0\0", 4));
  expect_error([&] { Shard::open(version); }, {"[shard]", version.string(), "version 7"});

  const fs::path truncated = dir / "truncated.bin";
  fs::copy_file(good, truncated);
  fs::resize_file(truncated, fs::file_size(good) - 2);
  expect_error([&] { Shard::open(truncated); }, {"[shard]", truncated.string(), "truncated"});

  const fs::path tiny = dir / "tiny.bin";
  std::ofstream(tiny) << "DSTOK";
  expect_error([&] { Shard::open(tiny); }, {"[shard]", tiny.string(), "shorter than"});

  expect_error([&] { Shard::open(dir / "missing.bin"); },
               {"[shard]", "missing.bin", "cannot open"});
}

TEST(Shard, CorruptPayloadCaughtByVerify) {
  TempDir dir;
  const fs::path p = dir / "p.bin";
  write_shard(p, iota_tokens(1000, 0, 50257), 50257);
  const char flip = 0x5A;
  patch_file(p, kShardHeaderBytes + 777, &flip, 1);
  // Opening without verification only checks the header (cheap, lazy) ...
  const Shard s = Shard::open(p);
  // ... the payload checksum is checked on request.
  expect_error([&] { s.verify(); }, {"[shard]", p.string(), "payload checksum mismatch"});
  expect_error([&] { Shard::open(p, /*verify_checksum=*/true); }, {"payload checksum mismatch"});
  expect_error([&] { TokenDataset({p}, /*verify_checksums=*/true); }, {p.string()});
}

TEST(Shard, IdsOutsideTheVocabularyAreRefusedOnRead) {
  // One flipped bit in the payload (not verified on open) must never reach an embedding lookup or
  // a histogram as an out-of-bounds index: every read checks the ids (issue 12).
  TempDir dir;
  const fs::path p = dir / "p.bin";
  write_shard(p, iota_tokens(1000, 0, 64), 64);
  const uint16_t bad = 0x8005;  // token 321 becomes id 32773 >= 64
  patch_file(p, kShardHeaderBytes + 321 * 2, &bad, 2);
  const Shard s = Shard::open(p);
  std::vector<int32_t> out(1000);
  expect_error([&] { s.read(0, out); },
               {p.string(), "token 321", fmt::format("byte offset {}", kShardHeaderBytes + 642),
                "id 32773", "vocabulary of 64 ids"});
  // Reads that do not touch it succeed; reads through a dataset fail the same way.
  s.read(0, std::span<int32_t>(out.data(), 321));
  EXPECT_EQ(out[320], 320 % 64);
  TokenDataset ds({p});
  expect_error([&] { ds.get(20, 16); }, {"token 321", "id 32773"});
  // uint32 shards too.
  const fs::path q = dir / "q.bin";
  write_shard(q, iota_tokens(100, 0, 70000), 70000);
  const uint32_t big = 70000;
  patch_file(q, kShardHeaderBytes + 4 * 7, &big, 4);
  expect_error([&] { Shard::open(q).at(7); }, {"token 7", "id 70000"});
}

// ---- dataset ------------------------------------------------------------------------------------

TEST(Dataset, SamplesAreWindowsAcrossShards) {
  TempDir dir;
  // 3 shards of unequal length (one empty) forming the stream 0, 1, 2, ..., 999.
  const auto all = iota_tokens(1000, 0, 50257);
  write_shard(dir / "s0.bin", std::span(all).first(333), 50257);
  write_shard(dir / "s1.bin", {}, 50257);
  write_shard(dir / "s2.bin", std::span(all).subspan(333, 400), 50257);
  write_shard(dir / "s3.bin", std::span(all).subspan(733), 50257);
  const TokenDataset ds({dir / "s0.bin", dir / "s1.bin", dir / "s2.bin", dir / "s3.bin"});
  EXPECT_EQ(ds.num_tokens(), 1000u);
  EXPECT_EQ(ds.num_samples(64), (1000u - 1) / 64);
  EXPECT_EQ(ds.num_samples(999), 1u);
  EXPECT_EQ(ds.num_samples(1000), 0u);

  const size_t T = 64;
  for (uint64_t i = 0; i < ds.num_samples(T); ++i) {
    const Sample s = ds.get(i, T);
    for (size_t t = 0; t < T; ++t) {
      ASSERT_EQ(s.inputs[t], static_cast<int32_t>(i * T + t));
      ASSERT_EQ(s.targets[t], static_cast<int32_t>(i * T + t + 1));
    }
  }
  expect_error([&] { ds.get(ds.num_samples(T), T); }, {"[dataset]", "out of range"});
  std::vector<int32_t> small(3);
  expect_error([&] { ds.get(0, T, small, small); }, {"[dataset]", "expected 64"});
}

TEST(Dataset, RefusesMixedVocabularies) {
  TempDir dir;
  write_shard(dir / "a.bin", iota_tokens(10, 0, 100), 50257);
  write_shard(dir / "b.bin", iota_tokens(10, 0, 100), 100);
  expect_error(
      [&] {
        TokenDataset({dir / "a.bin", dir / "b.bin"});
      },
      {"[dataset]", "b.bin", "vocab_size"});
}

TEST(Dataset, OpenSplitFromMeta) {
  TempDir dir;
  write_shard(dir / "train_0000.bin", iota_tokens(100, 0, 500), 500);
  write_shard(dir / "train_0001.bin", iota_tokens(50, 100, 500), 500);
  nlohmann::json meta = {
      {"splits", {{"train", {{"files", {"train_0000.bin", "train_0001.bin"}}}}}}};
  std::ofstream(dir / "meta.json") << meta.dump();
  const TokenDataset ds = TokenDataset::open_split(dir.path(), "train");
  EXPECT_EQ(ds.num_tokens(), 150u);
  EXPECT_EQ(ds.get(1, 74).inputs.front(), 74);  // crosses into the second shard
  EXPECT_EQ(ds.get(1, 74).targets.back(), 148);
  expect_error([&] { TokenDataset::open_split(dir.path(), "val"); },
               {"[dataset]", "no split 'val'", "train"});
  expect_error([&] { TokenDataset::open_split(dir / "nope", "train"); },
               {"[dataset]", "meta.json", "ds_prepare"});
}

namespace {
// Resident set size of this process, in bytes, from /proc/self/statm.
uint64_t rss_bytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}
}  // namespace

TEST(Dataset, IsMemoryMappedAndNeverLoadsTheWholeFile) {
  TempDir dir;
  const fs::path p = dir / "big.bin";
  constexpr size_t kTokens = 32u << 20;  // 64 MiB of uint16 ids
  {
    ShardWriter w(p, 50257);
    std::vector<int32_t> chunk(1 << 20);
    for (size_t done = 0; done < kTokens; done += chunk.size()) {
      for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<int32_t>((done + i) % 50000);
      w.write(chunk);
    }
    w.finish();
  }
  const uint64_t before = rss_bytes();
  const TokenDataset ds({p});
  const size_t T = 1024;
  const uint64_t n = ds.num_samples(T);
  ASSERT_EQ(n, (kTokens - 1) / T);
  // Read 16 samples spread over the file.
  for (uint64_t k = 0; k < 16; ++k) {
    const uint64_t i = k * (n / 16);
    const Sample s = ds.get(i, T);
    ASSERT_EQ(s.inputs[0], static_cast<int32_t>((i * T) % 50000));
  }
  const uint64_t after = rss_bytes();
  const uint64_t growth = after > before ? after - before : 0;
  // The file is 64 MiB; touching 16 windows maps a few pages each (plus kernel read-ahead).
  EXPECT_LT(growth, 16u << 20) << "the dataset seems to have read the whole file";

  // The file is an mmap of this process, not a private copy.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool mapped = false;
  const std::string canon = fs::canonical(p).string();
  while (std::getline(maps, line)) mapped |= line.find(canon) != std::string::npos;
  EXPECT_TRUE(mapped) << canon << " not found in /proc/self/maps";
}

// ---- sampler ------------------------------------------------------------------------------------

namespace {
SamplerOptions sopts(uint64_t n, int b, int a, int world, int rank, uint64_t seed = 7,
                     bool drop_last = true) {
  SamplerOptions o;
  o.num_samples = n;
  o.micro_batch = b;
  o.grad_accum = a;
  o.world_size = world;
  o.rank = rank;
  o.seed = seed;
  o.drop_last = drop_last;
  return o;
}

// All indices each rank reads in one epoch (a full pass of micro-steps), by rank.
std::vector<std::vector<uint64_t>> epoch_by_rank(uint64_t n, int b, int a, int world,
                                                 bool drop_last, uint64_t seed = 7) {
  std::vector<std::vector<uint64_t>> out(world);
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(sopts(n, b, a, world, r, seed, drop_last));
    for (uint64_t k = 0; k < s.micro_steps_per_epoch(); ++k) {
      const auto idx = s.next();
      out[r].insert(out[r].end(), idx.begin(), idx.end());
    }
    EXPECT_EQ(s.epoch(), 1u);  // exactly one epoch consumed
  }
  return out;
}
}  // namespace

TEST(Sampler, RanksAreDisjointAndCoverTheEpoch) {
  // S = 1000, G = 3 * 2 * 4 = 24: 41 full steps (984 samples), 16 dropped.
  const auto by_rank = epoch_by_rank(1000, 3, 2, 4, /*drop_last=*/true);
  std::set<uint64_t> all;
  size_t total = 0;
  for (const auto& v : by_rank) {
    EXPECT_EQ(v.size(), 41u * 3 * 2);
    total += v.size();
    all.insert(v.begin(), v.end());
  }
  EXPECT_EQ(all.size(), total) << "ranks overlap or a rank repeats a sample";
  EXPECT_EQ(total, 984u);
  for (uint64_t i : all) EXPECT_LT(i, 1000u);
}

TEST(Sampler, WithoutDropLastEverySampleIsSeen) {
  const auto by_rank = epoch_by_rank(1000, 3, 2, 4, /*drop_last=*/false);
  std::set<uint64_t> all;
  size_t total = 0;
  for (const auto& v : by_rank) {
    EXPECT_EQ(v.size(), 42u * 3 * 2);  // ceil(1000 / 24) = 42 steps for every rank
    total += v.size();
    all.insert(v.begin(), v.end());
  }
  EXPECT_EQ(all.size(), 1000u);
  EXPECT_EQ(total, 42u * 24);  // 8 padding samples wrap to the start of the order
}

TEST(Sampler, ShuffleIsPerEpochAndReproducible) {
  const SamplerOptions o = sopts(500, 2, 1, 1, 0, /*seed=*/42);
  const DistributedSampler a(o), b(o);
  EXPECT_EQ(a.order(0), b.order(0));
  EXPECT_EQ(a.order(3), b.order(3));
  EXPECT_NE(a.order(0), a.order(1));
  auto sorted = a.order(1);
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint64_t> ident(500);
  std::iota(ident.begin(), ident.end(), 0);
  EXPECT_EQ(sorted, ident) << "an order must be a permutation";
  EXPECT_NE(a.order(0), ident);
  const DistributedSampler other(sopts(500, 2, 1, 1, 0, /*seed=*/43));
  EXPECT_NE(a.order(0), other.order(0));

  SamplerOptions no = o;
  no.shuffle = false;
  EXPECT_EQ(DistributedSampler(no).order(5), ident);
}

TEST(Sampler, OrderIsPinned) {
  // The shuffle is part of the checkpoint contract: a resumed run must rebuild the same order, on
  // any machine and after any rebuild. If this changes, old checkpoints resume on other data.
  const DistributedSampler s(sopts(10, 1, 1, 1, 0, /*seed=*/1234));
  const std::vector<uint64_t> got = s.order(0);
  const std::vector<uint64_t> pinned = {4, 7, 0, 6, 5, 1, 9, 8, 2, 3};
  EXPECT_EQ(got, pinned) << "got " << fmt::format("{}", got);
}

TEST(Sampler, OrderDoesNotDependOnRankOrWorldSize) {
  // The same global batch G = 8 split as 1x8, 2x4 and 4x2 (ranks x accumulation steps) with
  // B = 1: each optimizer step trains on the same set of samples.
  auto step_sets = [](int world, int accum) {
    std::vector<std::set<uint64_t>> steps;
    std::vector<DistributedSampler> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(sopts(100, 1, accum, world, r));
    for (uint64_t step = 0; step < ranks[0].steps_per_epoch(); ++step) {
      std::set<uint64_t> s;
      for (auto& rk : ranks)
        for (int m = 0; m < accum; ++m) s.insert(rk.next()[0]);
      steps.push_back(s);
    }
    return steps;
  };
  // The position keyed by per-sample randomness is the same for a sample however G is split.
  DistributedSampler r1(sopts(100, 1, 8, 1, 0)), r3of4(sopts(100, 1, 2, 4, 3));
  for (int k = 0; k < 3; ++k) r1.next();  // rank 3 of 4 reads position 3 of the step first
  EXPECT_EQ(r1.next_sample_position(), r3of4.next_sample_position());
  EXPECT_EQ(r1.next(), r3of4.next());
  for (int k = 0; k < 12 * 8 - 4; ++k) r1.next();  // 12 steps of 8 per epoch: to epoch 1
  EXPECT_EQ(r1.epoch(), 1u);
  EXPECT_EQ(r1.next_sample_position(), 96u);

  const auto one = step_sets(1, 8);
  EXPECT_EQ(one, step_sets(2, 4));
  EXPECT_EQ(one, step_sets(4, 2));
  EXPECT_EQ(one, step_sets(8, 1));
}

TEST(Sampler, ResumeFromStateSeesTheSameSamples) {
  const SamplerOptions o = sopts(103, 2, 3, 2, 1, /*seed=*/99);
  DistributedSampler straight(o);
  DistributedSampler first(o);
  // Stop mid-epoch, mid-accumulation; the state passes through JSON text like a checkpoint.
  const int stop = 7;
  for (int k = 0; k < stop; ++k) EXPECT_EQ(first.next(), straight.next());
  const std::string saved = first.state().dump();

  DistributedSampler resumed(o);
  resumed.load_state(nlohmann::json::parse(saved));
  EXPECT_EQ(resumed.epoch(), first.epoch());
  EXPECT_EQ(resumed.step(), first.step());
  EXPECT_EQ(resumed.micro_step(), first.micro_step());
  // Through the end of this epoch and two more.
  const uint64_t more = 3 * straight.micro_steps_per_epoch();
  for (uint64_t k = 0; k < more; ++k)
    ASSERT_EQ(resumed.next(), straight.next()) << "micro-step " << k;
}

TEST(Sampler, ResumeOnADifferentWorldSizeAtAStepBoundary) {
  // 2 ranks x 2 accumulation steps -> 4 ranks x 1, same G = 8: the global batches continue.
  auto global_batch = [](std::vector<DistributedSampler>& ranks, int accum) {
    std::set<uint64_t> s;
    for (auto& r : ranks)
      for (int m = 0; m < accum; ++m) {
        auto idx = r.next();
        s.insert(idx.begin(), idx.end());
      }
    return s;
  };
  std::vector<DistributedSampler> two, four, reference;
  for (int r = 0; r < 2; ++r) two.emplace_back(sopts(200, 2, 2, 2, r));
  for (int r = 0; r < 2; ++r) reference.emplace_back(sopts(200, 2, 2, 2, r));
  for (int step = 0; step < 5; ++step) global_batch(two, 2), global_batch(reference, 2);
  const nlohmann::json st = two[0].state();
  for (int r = 0; r < 4; ++r) {
    four.emplace_back(sopts(200, 2, 1, 4, r));
    four.back().load_state(st);
  }
  for (int step = 0; step < 30; ++step)
    EXPECT_EQ(global_batch(four, 1), global_batch(reference, 2));
}

TEST(Sampler, ResumeRejectsMismatches) {
  DistributedSampler s(sopts(100, 2, 2, 2, 0, /*seed=*/5));
  s.next();
  const nlohmann::json st = s.state();
  DistributedSampler other_seed(sopts(100, 2, 2, 2, 0, /*seed=*/6));
  expect_error([&] { other_seed.load_state(st); }, {"[sampler]", "seed"});
  DistributedSampler other_size(sopts(101, 2, 2, 2, 0, 5));
  expect_error([&] { other_size.load_state(st); }, {"[sampler]", "num_samples"});
  DistributedSampler other_batch(sopts(100, 2, 1, 2, 0, 5));
  expect_error([&] { other_batch.load_state(st); }, {"[sampler]", "global_batch"});
  // Position 4 (one micro-step of 2 x 2) is not a boundary of 4 ranks x 2 = 8 per micro-step.
  DistributedSampler regrouped(sopts(100, 2, 1, 4, 0, 5));
  expect_error([&] { regrouped.load_state(st); }, {"[sampler]", "micro-step boundary"});
  expect_error([&] { s.load_state(nlohmann::json{{"epoch", 1}}); }, {"[sampler]", "malformed"});
}

TEST(Sampler, RejectsBadOptions) {
  expect_error([] { DistributedSampler(sopts(10, 4, 2, 2, 0)); },
               {"[sampler]", "fewer than one global batch"});
  expect_error([] { DistributedSampler(sopts(100, 4, 2, 2, 2)); }, {"[sampler]", "rank 2"});
  expect_error([] { DistributedSampler(sopts(100, 0, 2, 2, 0)); }, {"[sampler]", "positive"});
  // Without drop_last a dataset smaller than one global batch still gives one (padded) step.
  EXPECT_EQ(DistributedSampler(sopts(10, 4, 2, 2, 0, 7, /*drop_last=*/false)).steps_per_epoch(),
            1u);
}

// ---- loader -------------------------------------------------------------------------------------

TEST(DataLoader, BatchesAreSamplerRowsAndResumeExactly) {
  TempDir dir;
  write_shard(dir / "d.bin", iota_tokens(5000, 0, 50257), 50257);
  auto ds = std::make_shared<const TokenDataset>(std::vector<fs::path>{dir / "d.bin"});
  const size_t B = 3, T = 16;
  SamplerOptions o = sopts(0, B, 2, 2, 1, /*seed=*/11);
  DataLoader loader(ds, T, o);
  o.num_samples = ds->num_samples(T);
  DistributedSampler mirror(o);

  for (int k = 0; k < 5; ++k) {
    const Batch batch = loader.next();
    ASSERT_EQ(batch.inputs.size(), B * T);
    const auto idx = mirror.next();
    for (size_t b = 0; b < B; ++b) {
      const Sample s = ds->get(idx[b], T);
      EXPECT_TRUE(std::equal(s.inputs.begin(), s.inputs.end(), batch.inputs.begin() + b * T));
      EXPECT_TRUE(std::equal(s.targets.begin(), s.targets.end(), batch.targets.begin() + b * T));
    }
  }
  const std::string saved = loader.state().dump();
  DataLoader resumed(ds, T, sopts(0, B, 2, 2, 1, 11));
  resumed.load_state(nlohmann::json::parse(saved));
  std::vector<int32_t> x1(B * T), y1(B * T), x2(B * T), y2(B * T);
  for (int k = 0; k < 200; ++k) {  // several epochs
    loader.next(x1, y1);
    resumed.next(x2, y2);
    ASSERT_EQ(x1, x2);
    ASSERT_EQ(y1, y2);
  }
  DataLoader other_t(ds, T * 2, sopts(0, B, 2, 2, 1, 11));
  expect_error([&] { other_t.load_state(nlohmann::json::parse(saved)); }, {"[loader]", "seq_len"});
  std::vector<int32_t> wrong(5);
  expect_error([&] { loader.next(wrong, wrong); }, {"[loader]", "B*T"});
}

// ---- preparation rules (no tokenizer needed) ----------------------------------------------------

TEST(Prepare, ListInputsRecursesFiltersAndSorts) {
  TempDir dir;
  fs::create_directories(dir / "corpus/sub");
  for (const char* f : {"corpus/b.txt", "corpus/a.txt", "corpus/sub/c.txt", "corpus/skip.md",
                        "corpus/.hidden.txt", "single.txt"})
    std::ofstream(dir / f) << "x";
  const auto files =
      list_inputs({dir / "corpus", dir / "single.txt", dir / "corpus/a.txt"}, ".txt");
  std::vector<std::string> rel;
  for (const auto& f : files) rel.push_back(f.rel);
  EXPECT_EQ(rel, (std::vector<std::string>{"a.txt", "b.txt", "sub/c.txt", "single.txt"}));
  expect_error([&] { list_inputs({dir / "nope"}, ".txt"); },
               {"[prepare]", "nope", "does not exist"});
  expect_error([&] { list_inputs({dir / "corpus"}, ".csv"); }, {"[prepare]", "no input files"});
}

TEST(Prepare, SplitRules) {
  std::vector<InputFile> files;
  for (const char* n : {"1999_a_d.txt", "2000_b_r.txt", "2001_c_r.txt", "2021_d_d.txt"})
    files.push_back({fs::path("/x") / n, n, 1});
  PrepareOptions o;
  o.val_from_year = 2001;
  std::string rule;
  EXPECT_EQ(assign_val(files, o, &rule), (std::vector<bool>{false, false, true, true}));
  EXPECT_NE(rule.find("2001"), std::string::npos);

  o = {};
  o.val_files = "20?1_*";
  EXPECT_EQ(assign_val(files, o), (std::vector<bool>{false, false, true, true}));

  o = {};
  o.val_fraction = 0.25;
  EXPECT_EQ(assign_val(files, o), (std::vector<bool>{false, false, false, true}));
  o = {};  // default: 10% of 4 files, rounded up to 1
  EXPECT_EQ(assign_val(files, o), (std::vector<bool>{false, false, false, true}));

  o.val_fraction = 0.5;
  o.val_from_year = 2000;
  expect_error([&] { assign_val(files, o); }, {"[prepare]", "at most one split rule"});

  o = {};
  o.val_from_year = 2000;
  files.push_back({"/x/readme.txt", "readme.txt", 1});
  expect_error([&] { assign_val(files, o); }, {"[prepare]", "readme.txt", "year"});
}
