// Mixture of experts under ZeRO data parallelism (every expert on every rank, no expert
// parallelism): run under mpirun with 2 ranks (tests/cmake/models.cmake), and plainly (a size-1
// world). Each rank routes its own rows, so an expert may get tokens on one rank and none on
// another; its stacked weights still get a (zero) gradient on every rank, so the gradient
// collectives and ZeRO-3's gathers stay in step. The data-parallel run of the mixtral fixture
// (tests/fixtures/hf_families/mixtral, no aux loss: the load-balancing loss is per rank in
// transformers and here, not additive over ranks) must give the losses of one process taking the
// whole batch: rank r takes row r of the (2, 8) batch, and both rows have 7 counted targets, so the
// mean of the ranks' mean losses is the whole batch's mean.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdio>

#include "ds/comm/group.h"
#include "ds/core/safetensors.h"
#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/nn/batch.h"
#include "ds/ops/ops.h"
#include "ds/runtime/engine.h"
#include "hf_fixture.h"

using namespace ds;

namespace {

std::shared_ptr<models::GPT> import_mixtral() {
  const auto dir = ds::testing::case_dir("mixtral");
  auto m = std::make_shared<models::GPT>(*models::read_hf_config(dir), /*init=*/false);
  models::load_hf_weights(*m, dir);
  return m;
}

// The mean loss over the world of `steps` steps (AdamW lr 1e-2, ZeRO `stage`); each rank takes
// rows [r * B / N, (r + 1) * B / N) of the fixture batch.
std::vector<double> losses(std::shared_ptr<comm::Group> g, int stage, int steps) {
  const safetensors::Reader ref(
      (ds::testing::case_dir("mixtral") / "reference.safetensors").string());
  const Tensor ids = ref.get("input_ids"), targets = ref.get("targets");
  const int64_t n = g->size(), r = g->rank(), B = ids.size(0), b = B / n;
  runtime::InitOptions opt;
  opt.group = g;
  opt.log = [](const std::string&) {};
  auto e = runtime::initialize(
      import_mixtral(),
      fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
        "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2, "weight_decay": 0.1}}}},
        "zero_optimization": {{"stage": {}, "stage3_param_persistence_threshold": 0}}}})",
                  b, stage),
      opt);
  const nn::Batch batch{.input_ids = ops::slice(ids, 0, r * b, (r + 1) * b).contiguous(),
                        .labels = ops::slice(targets, 0, r * b, (r + 1) * b).contiguous()};
  std::vector<double> out;
  for (int s = 0; s < steps; ++s) {
    Tensor loss = e->forward(batch);
    e->backward(loss);
    e->step();
    float l = loss.item();
    g->all_reduce(&l, 1, DType::f32);
    out.push_back(static_cast<double>(l) / static_cast<double>(n));
  }
  return out;
}

TEST(MoEDataParallel, ZeroStagesMatchOneProcess) {
  auto world = comm::world();
  ASSERT_EQ(2 % world->size(), 0) << "run with 1 or 2 ranks (the fixture batch has 2 rows)";
  const std::vector<double> want = losses(comm::single_process_group(), 0, 5);
  for (int stage : {0, 1, 2, 3}) {
    const std::vector<double> got = losses(world, stage, 5);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); ++s)
      EXPECT_NEAR(got[s], want[s], 1e-5 * std::abs(want[s])) << "stage " << stage << " step " << s;
    if (world->rank() == 0)
      std::printf("ZeRO %d on %d ranks: loss %.5f -> %.5f (one process %.5f -> %.5f)\n", stage,
                  world->size(), got.front(), got.back(), want.front(), want.back());
  }
}

}  // namespace
