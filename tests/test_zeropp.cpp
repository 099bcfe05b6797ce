// ZeRO++ (docs/zero.md, "ZeRO++"): the blockwise quantizer against its error bound; qwZ (stage 3
// gathers as int8 blocks) within a stated band of stage 3's losses, moving about a quarter of the
// bytes of an fp32 gather, with checkpoints and exports still exact; hpZ (the backward gathers from
// secondary pieces within groups of h ranks) giving stage 3's losses bitwise; MiCS (shard groups of
// S ranks, replicated) against stage 3, its memory, and checkpoints that resume bitwise and load
// into plain stage 3. Run plainly (the quantizer) and under mpirun with 2 and 4 ranks
// (tests/cmake/zero.cmake): hpZ needs 4.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "ds/comm/group.h"
#include "ds/comm/logger.h"
#include "ds/core/rng.h"
#include "ds/models/gpt.h"
#include "ds/runtime/engine.h"
#include "ds/zero/quantize.h"

using namespace ds;

namespace {

constexpr int64_t kT = 16, kGas = 2, kVocab = 64;

std::string zero_config(const std::string& zero_extra, const std::string& precision = "") {
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": {},
    {} "zero_optimization": {{"stage": 3, "reduce_bucket_size": 4000,
      "stage3_param_persistence_threshold": 100, "stage3_prefetch_bucket_size": 3000,
      "stage3_max_reuse_distance": 1000 {}}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 5e-3, "weight_decay": 0.1}}}}}})",
                     kGas, precision, zero_extra);
}

std::unique_ptr<runtime::Engine> make_engine(const std::string& cfg) {
  auto model = std::make_shared<models::GPT>(models::GPTConfig::preset("test-gpt2"));
  runtime::InitOptions opt;
  opt.group = comm::world();
  opt.log = [](const std::string&) {};
  return runtime::initialize(model, cfg, opt);
}

// `steps` optimizer steps on a deterministic corpus from step `first`; the global mean loss of
// each micro-step.
std::vector<double> train(runtime::Engine& e, int steps, int64_t first = 0) {
  const int n = e.world_size(), r = e.rank();
  std::vector<double> losses;
  for (int64_t s = first; s < first + steps; ++s)
    for (int64_t m = 0; m < kGas; ++m) {
      Tensor x = Tensor::empty({2, kT}, DType::i32), y = Tensor::empty({2, kT}, DType::i32);
      for (int64_t b = 0; b < 2; ++b) {
        const int64_t sample = ((s * kGas + m) * n + r) * 2 + b;
        for (int64_t t = 0; t <= kT; ++t) {
          const auto v = static_cast<int32_t>((sample * 5 + t * 3 + (t / 4) * 7) % kVocab);
          if (t < kT) x.data<int32_t>()[b * kT + t] = v;
          if (t > 0) y.data<int32_t>()[b * kT + t - 1] = v;
        }
      }
      Tensor loss = e.forward(x, y);
      e.backward(loss);
      e.step();
      float l = loss.item();
      e.group().all_reduce(&l, 1, DType::f32);
      losses.push_back(static_cast<double>(l) / n);
    }
  return losses;
}

// all_gather bytes issued while fn runs.
template <class F>
uint64_t gathered_bytes(F&& fn) {
  auto& log = comm::comms_logger();
  log.enable(true);
  log.reset();
  fn();
  uint64_t bytes = 0;
  for (const auto& [op, e] : log.totals())
    if (op == comm::OpKind::all_gather) bytes += e.bytes;
  log.reset();
  log.enable(false);
  return bytes;
}

}  // namespace

TEST(Quantize, RoundTripWithinHalfAScalePerBlock) {
  const int64_t n = 3 * zero::kQuantBlock + 123;  // a short last block
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] = rng::normal(5, 0, static_cast<uint64_t>(i)) * (1 + i / zero::kQuantBlock);
  for (int64_t i = zero::kQuantBlock; i < 2 * zero::kQuantBlock; ++i) x[static_cast<size_t>(i)] = 0;  // a zero block
  for (int bits : {8, 4}) {
    SCOPED_TRACE(bits);
    const int64_t per_word = 32 / bits;
    ASSERT_EQ(zero::quantized_words(n, bits), 4 + (n + per_word - 1) / per_word);
    std::vector<int32_t> q(static_cast<size_t>(zero::quantized_words(n, bits)));
    zero::quantize_blocks(x.data(), n, bits, q.data());
    std::vector<float> back(static_cast<size_t>(n), 1.0f);
    zero::dequantize_blocks(q.data(), n, bits, back.data());
    const float qmax = bits == 8 ? 127.0f : 7.0f;
    for (int64_t b = 0; b * zero::kQuantBlock < n; ++b) {
      float amax = 0;
      const int64_t lo = b * zero::kQuantBlock, hi = std::min(n, lo + zero::kQuantBlock);
      for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[static_cast<size_t>(i)]));
      const float half_scale = amax / qmax / 2;
      for (int64_t i = lo; i < hi; ++i)
        ASSERT_LE(std::fabs(back[static_cast<size_t>(i)] - x[static_cast<size_t>(i)]),
                  half_scale * (1 + 1e-5f))
            << "element " << i;
    }
    EXPECT_EQ(back[static_cast<size_t>(zero::kQuantBlock + 7)], 0.0f);  // the zero block stays zero
    // accumulate adds the values.
    std::vector<float> twice = back;
    zero::dequantize_blocks(q.data(), n, bits, twice.data(), /*accumulate=*/true);
    EXPECT_EQ(twice[5], 2 * back[5]);
  }
}

TEST(ZeroPlusPlus, QuantizedWeightsStayWithinBandAndMoveAQuarterOfTheBytes) {
  if (comm::world()->size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  std::vector<double> want, got;
  rng::dropout_state() = {};
  const uint64_t exact_bytes = gathered_bytes([&] { want = train(*make_engine(zero_config("")), 6); });
  rng::dropout_state() = {};
  const uint64_t q_bytes = gathered_bytes(
      [&] { got = train(*make_engine(zero_config(R"(, "zero_quantized_weights": true)")), 6); });
  ASSERT_EQ(want.size(), got.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / want[i]);
  // int8 weights with a scale per 2048 values: the losses move by well under a percent.
  EXPECT_LT(worst, 5e-3) << "qwZ moved the losses by " << worst;
  EXPECT_GT(worst, 0.0) << "qwZ changed nothing: were the gathers quantized?";
  // fp32 training: 1 byte per value plus a 4-byte scale per 2048 instead of 4 bytes (the small
  // persistent parameters, gathered exactly once per step, add a little).
  const double ratio = static_cast<double>(q_bytes) / static_cast<double>(exact_bytes);
  EXPECT_GT(ratio, 0.25);
  EXPECT_LT(ratio, 0.27) << q_bytes << " vs " << exact_bytes;
  if (comm::world()->rank() == 0)
    std::printf("qwZ: worst relative loss change %.2e, all-gather bytes %.4f of stage 3's\n",
                worst, ratio);
}

TEST(ZeroPlusPlus, QuantizedWeightsLeaveCheckpointsAndExportsExact) {
  if (comm::world()->size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  auto e = make_engine(zero_config(R"(, "zero_quantized_weights": true)"));
  const auto got = e->full_weights();  // collective
  if (e->rank() != 0) return;
  const models::GPT fresh(models::GPTConfig::preset("test-gpt2"));
  const auto want = fresh.named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(got[i].second.to_vector(), want[i].second.to_vector()) << got[i].first;
  }
}

TEST(ZeroPlusPlus, HierarchicalPartitionGivesStage3LossesBitwise) {
  const int n = comm::world()->size();
  if (n < 4) GTEST_SKIP() << "hpZ needs a group of h < N ranks: run with mpirun -np 4";
  rng::dropout_state() = {};
  const auto want = train(*make_engine(zero_config("")), 5);
  rng::dropout_state() = {};
  auto hpz = make_engine(zero_config(R"(, "zero_hpz_partition_size": 2)"));
  const auto got = train(*hpz, 5);
  // The secondary pieces are copies of the gathered values: the same arithmetic, bit for bit.
  EXPECT_EQ(got, want);
  EXPECT_GT(hpz->strategy().secondary_gathers(), 0) << "no gather used the secondary pieces";
  // hpZ and qwZ together: the forward's gathers are int8, the secondary pieces keep what they
  // gathered.
  rng::dropout_state() = {};
  const auto both = train(
      *make_engine(zero_config(R"(, "zero_hpz_partition_size": 2, "zero_quantized_weights": true)")), 5);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(both[i] / want[i], 1.0, 5e-3) << i;
}

TEST(ZeroPlusPlus, HpzPartitionMustDivideTheGroup) {
  const int n = comm::world()->size();
  if (n < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  try {
    make_engine(zero_config(fmt::format(R"(, "zero_hpz_partition_size": {})", n + 1)));
    FAIL() << "accepted an hpZ size that does not divide the group";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must divide the data-parallel size"), std::string::npos)
        << e.what();
  }
}

TEST(ZeroPlusPlus, MicsShardsWithinGroupsAndMatchesStage3) {
  const int n = comm::world()->size();
  if (n < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  const int shard = n / 2;
  rng::dropout_state() = {};
  auto plain = make_engine(zero_config(""));
  const auto want = train(*plain, 5);
  rng::dropout_state() = {};
  auto mics = make_engine(zero_config(fmt::format(R"(, "mics_shard_size": {})", shard)));
  const auto got = train(*mics, 5);
  // The same sums in another order (reduce-scatter within a shard group, then the replicas').
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i] / want[i], 1.0, 1e-5) << "micro-step " << i;
  EXPECT_EQ(mics->strategy().group().size(), shard);
  ASSERT_NE(mics->strategy().replicas(), nullptr);
  EXPECT_EQ(mics->strategy().replicas()->size(), 2);
  // Each rank holds 1/shard of the gradients (and optimizer state) instead of 1/n.
  EXPECT_NEAR(static_cast<double>(mics->memory_budget().grads) /
                  static_cast<double>(plain->memory_budget().grads),
              static_cast<double>(n) / shard, 0.05);
}

TEST(ZeroPlusPlus, MicsCheckpointResumesBitwiseAndLoadsIntoStage3) {
  auto world = comm::world();
  const int n = world->size();
  if (n < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  // One folder for every rank: rank 0's process id.
  int pid = static_cast<int>(::getpid());
  world->broadcast(&pid, 1, DType::i32, 0);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("ds_mics_{}", pid);
  const std::string cfg = zero_config(fmt::format(R"(, "mics_shard_size": {})", n / 2));
  rng::dropout_state() = {};
  auto a = make_engine(cfg);
  train(*a, 3);
  a->save_checkpoint(dir.string());
  const auto want = train(*a, 2, 3);
  // The first replica group wrote n / 2 optimizer shards.
  if (world->rank() == 0) {
    int shards = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir / "global_step3"))
      shards += f.path().filename().string().find("optim_states") != std::string::npos;
    EXPECT_EQ(shards, n / 2);
  }
  auto b = make_engine(cfg);
  b->load_checkpoint(dir.string());
  EXPECT_EQ(train(*b, 2, 3), want);
  auto c = make_engine(zero_config(""));  // plain stage 3 over all n ranks
  c->load_checkpoint(dir.string());
  const auto got = train(*c, 2, 3);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i] / want[i], 1.0, 1e-5) << i;
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}
