#pragma once
// How a pipeline assigns a model's layers to its stages: DeepSpeed's PipelineModule
// partition_method (deepspeed/runtime/pipe/module.py), with the same results as its
// runtime/utils.py partition_uniform / partition_balanced (tests compare with a fixture DeepSpeed
// wrote: tests/fixtures/generators/gen_pipeline_partition_fixture.py).
//
//   auto parts = ds::runtime::partition_layers(layers, /*num_stages=*/2, "parameters");
//   // stage s runs layers [parts[s], parts[s + 1])
//
// The pipeline engine (pipeline_engine.h) trains the stages this assigns (docs/parallelism.md).
#include <cstdint>
#include <string>
#include <vector>

namespace ds::runtime {

// One entry of the layer sequence: its class name (for "type:<regex>") and trainable parameters.
struct PipeLayer {
  std::string type_name;
  int64_t num_parameters = 0;
};

// num_parts + 1 boundaries. floor(n / p) items each, the first n mod p parts one more; n <= p:
// part i holds item i (the rest are empty).
std::vector<int64_t> partition_uniform(int64_t num_items, int num_parts);

// num_parts + 1 boundaries of contiguous parts minimising (largest - smallest) part weight
// (DeepSpeed's O(n^2 p) dynamic program, ties resolved as it does); n <= p: uniform.
std::vector<int64_t> partition_balanced(const std::vector<double>& weights, int num_parts);

// method: "uniform"; "parameters" (weights = trainable parameters per layer); "type:<regex>"
// (weight 1 for layers whose type name matches, case-insensitively, anywhere: Megatron-DeepSpeed's
// "type:transformer"). Errors name the method (unknown method; a regex matching no layer).
std::vector<int64_t> partition_layers(const std::vector<PipeLayer>& layers, int num_stages,
                                      const std::string& method);

}  // namespace ds::runtime
