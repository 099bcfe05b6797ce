// DeepSpeed's memory estimator (zero/estimate.h) against DeepSpeed 0.19.8's own functions
// (tests/fixtures/zero/estimates.json, made by tests/fixtures/generators/gen_estimate_fixture.py): every option's
// bytes and the printed tables byte for byte; parameter counting as DeepSpeed's _all_live does it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/nn/module.h"
#include "ds/zero/estimate.h"

using namespace ds;
using nlohmann::json;

TEST(Estimate, MatchesDeepSpeedNumbersAndTables) {
  std::ifstream in(std::string(DS_FIXTURE_DIR) + "/zero/estimates.json");
  ASSERT_TRUE(in.good());
  const json fx = json::parse(in);
  ASSERT_GE(fx["cases"].size(), 5u);
  for (const auto& c : fx["cases"]) {
    const std::string name = c["name"];
    const int64_t P = c["params"], L = c["largest_layer"];
    const int G = c["gpus_per_node"], N = c["nodes"];
    const double abf = c["abf"];
    for (const auto& r : c["zero2"]) {
      const auto e = zero::estimate_zero2(P, G, N, r["cpu_offload"], abf);
      EXPECT_EQ(e.cpu, r["cpu"].get<int64_t>()) << name;
      EXPECT_EQ(e.gpu, r["gpu"].get<int64_t>()) << name;
    }
    for (const auto& r : c["zero3"]) {
      const auto e = zero::estimate_zero3(P, L, G, N, r["cpu_offload"], r["cpu_offload_params"],
                                          r["zero_init"], abf);
      EXPECT_EQ(e.cpu, r["cpu"].get<int64_t>()) << name << " " << r.dump();
      EXPECT_EQ(e.gpu, r["gpu"].get<int64_t>()) << name << " " << r.dump();
    }
    EXPECT_EQ(zero::zero2_table(P, G, N, abf), c["zero2_table"].get<std::string>()) << name;
    EXPECT_EQ(zero::zero3_table(P, L, G, N, abf), c["zero3_table"].get<std::string>()) << name;
  }
}

TEST(Estimate, T0_3BAsTheDocsPrintIt) {
  // DeepSpeed's documented example (bigscience/T0_3B on 1 node x 1 GPU).
  const std::string t = zero::zero3_table(2783959040, 65798144, 1, 1);
  for (const char* row :
       {"   70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1",
        "   62.23GB |   5.43GB | offload_param=none, offload_optimizer=cpu , zero_init=0",
        "    0.37GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=1",
        "   15.56GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=0"})
    EXPECT_NE(t.find(row), std::string::npos) << row << "\n" << t;
}

TEST(Estimate, CountsParametersWithoutMemory) {
  // Built under PartitionedInit: shapes only. Tied embedding and head count once; the largest layer
  // is the embedding (one module's own parameters), as DeepSpeed's model_to_params counts it.
  nn::PartitionedInit no_memory;
  models::GPT gpt2(models::GPTConfig::preset("gpt2"), /*init=*/false);
  const auto c = zero::count_parameters(gpt2);
  EXPECT_EQ(c.params, 124439808);  // what every GPT-2 reimplementation prints
  EXPECT_EQ(c.largest_layer, 50257 * 768);
  models::GPT tiny(models::GPTConfig::preset("tiny"), false);
  const auto t = zero::count_parameters(tiny);
  EXPECT_EQ(t.params, tiny.num_parameters());
  EXPECT_EQ(t.largest_layer, 50257 * 256);
}

TEST(Estimate, NvmeRowsFollowTheStoresLayout) {
  // 1e9 parameters on 2 processes: p = 5e8. Optimizer on NVMe: master + two moments = 12 bytes per
  // element on disk, read and written once per step; a ring of 4 sub-groups of 1e8 elements.
  const int64_t P = 1000000000, L = 50000000, p = P / 2, ring = 4 * 100000000LL * 12;
  const auto opt = zero::estimate_nvme(3, false, P, L, 2, 1, 100000000);
  EXPECT_EQ(opt.disk, 12 * p);
  EXPECT_EQ(opt.read, 12 * p);
  EXPECT_EQ(opt.written, 12 * p);
  // bf16 pieces + fp32 gradient pieces + ring + the largest layer gathered with its gradient (2 x
  // 2L: stage 3 gathers it whatever lives on disk; before the one memory model this row left it
  // out while the parameters-on-NVMe row counted it).
  EXPECT_EQ(opt.ram, 2 * p + 4 * p + ring + 4 * L);
  EXPECT_EQ(opt.disk_with_checkpoint, opt.disk + 12 * p + 2 * P / 2);
  // Parameters too: 2 bytes more on disk, read in forward and backward, written after the step.
  const auto both = zero::estimate_nvme(3, true, P, L, 2, 1, 100000000);
  EXPECT_EQ(both.disk, 14 * p);
  EXPECT_EQ(both.read, 16 * p);
  EXPECT_EQ(both.written, 14 * p);
  EXPECT_EQ(both.ram, 4 * p + ring + 2 * 500000000LL / 2 * 2 + 4 * L);
  // Stage 2 keeps the whole bf16 model per process.
  EXPECT_EQ(zero::estimate_nvme(2, false, P, L, 2, 1, 100000000).ram, 2 * P + 4 * p + ring);
  // The table: one row at stage 2, two at stage 3; seconds from the bandwidths given.
  const std::string t = zero::nvme_table(3, P, L, 2, 1, 1e9, 5e8, 100000000);
  EXPECT_NE(t.find("offload_optimizer=nvme\n"), std::string::npos) << t;
  EXPECT_NE(t.find("offload_optimizer=nvme, offload_param=nvme"), std::string::npos) << t;
  const double secs = 12.0 * p / 1e9 + 12.0 * p / 5e8;  // 6 + 12 = 18 s
  EXPECT_NE(t.find(fmt::format("{:10.1f}", secs)), std::string::npos) << t;
  EXPECT_EQ(zero::nvme_table(2, P, L, 2, 1, 0, 0).find("offload_param"), std::string::npos);
}

// Mixture of experts (tests/fixtures/zero/moe, gen_moe_count_fixture.py): the published configs
// of Mixtral-8x7B and Qwen3-30B-A3B counted by transformers on the meta device. The memory
// formulas take the total (every expert is held and trained); "active" is what one token runs
// through (dense + experts_per_tok / num_experts of the experts).
TEST(Estimate, CountsTotalAndActiveExperts) {
  for (const char* name : {"mixtral_8x7b", "qwen3_30b_a3b"}) {
    const std::string dir = std::string(DS_FIXTURE_DIR) + "/zero/moe/" + name;
    std::ifstream in(dir + "/expected.json");
    ASSERT_TRUE(in.good()) << dir;
    const json want = json::parse(in);
    const std::optional<models::GPTConfig> cfg = models::read_hf_config(dir);
    ASSERT_TRUE(cfg.has_value()) << name;
    EXPECT_EQ(cfg->num_experts, want["num_experts"].get<int64_t>()) << name;
    EXPECT_EQ(cfg->experts_per_tok, want["experts_per_tok"].get<int64_t>()) << name;
    EXPECT_EQ(cfg->num_parameters(), want["total"].get<int64_t>()) << name;
    EXPECT_EQ(cfg->num_active_parameters(), want["active"].get<int64_t>()) << name;
  }
  // The published numbers: Mixtral-8x7B is 46.7B in total, 12.9B active.
  const auto mixtral =
      models::read_hf_config(std::string(DS_FIXTURE_DIR) + "/zero/moe/mixtral_8x7b");
  EXPECT_EQ(mixtral->num_parameters(), 46702792704);
  EXPECT_EQ(mixtral->num_active_parameters(), 12879925248);
  // Without experts, active is total.
  const auto gpt2 = models::GPTConfig::preset("gpt2");
  EXPECT_EQ(gpt2.num_active_parameters(), gpt2.num_parameters());
}
