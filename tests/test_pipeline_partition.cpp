// Pipeline layer partitioning against DeepSpeed's own partition_uniform / partition_balanced
// (tests/fixtures/pipeline/partitions.json, written by tests/fixtures/generators/gen_pipeline_partition_fixture.py
// with deepspeed 0.19), and partition_layers' methods and errors.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/runtime/pipeline_partition.h"

using namespace ds;
using runtime::PipeLayer;

TEST(PipelinePartition, SameAsDeepSpeed) {
  std::ifstream in(std::string(DS_FIXTURE_DIR) + "/pipeline/partitions.json");
  ASSERT_TRUE(in) << "fixture missing";
  const nlohmann::json fx = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& c : fx["cases"]) {
    const auto want = c["want"].get<std::vector<int64_t>>();
    if (c["method"] == "uniform") {
      EXPECT_EQ(runtime::partition_uniform(c["n"].get<int64_t>(), c["parts"].get<int>()), want)
          << c.dump();
    } else {
      EXPECT_EQ(runtime::partition_balanced(c["weights"].get<std::vector<double>>(),
                                            c["parts"].get<int>()),
                want)
          << c.dump();
    }
    ++checked;
  }
  EXPECT_GT(checked, 50);
}

TEST(PipelinePartition, MethodsAndErrors) {
  // GPT-2 as a pipeline: embedding, 4 blocks, final norm + head.
  std::vector<PipeLayer> layers = {{"EmbeddingPipe", 1000}, {"Block", 300}, {"Block", 300},
                                   {"Block", 300},          {"Block", 300}, {"NormHeadPipe", 10}};
  EXPECT_EQ(runtime::partition_layers(layers, 2, "uniform"), (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(runtime::partition_layers(layers, 2, "type:block"),
            runtime::partition_balanced({0, 1, 1, 1, 1, 0}, 2));
  EXPECT_EQ(runtime::partition_layers(layers, 2, "parameters"),
            runtime::partition_balanced({1000, 300, 300, 300, 300, 10}, 2));
  try {
    runtime::partition_layers(layers, 2, "type:transformer");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("found no valid layers"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Block"), std::string::npos) << e.what();
  }
  EXPECT_THROW(runtime::partition_layers(layers, 2, "profile"), Error);
  EXPECT_THROW(runtime::partition_layers(layers, 2, "type:("), Error);
}
