// DeepSpeed's memory estimator (zero/estimate.h) against DeepSpeed 0.19.8's own functions
// (tests/fixtures/zero/estimates.json, made by tools/gen_estimate_fixture.py): every option's
// bytes and the printed tables byte for byte; parameter counting as DeepSpeed's _all_live does it.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "ds/models/gpt.h"
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
