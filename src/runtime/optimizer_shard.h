#pragma once
// One optimizer shard's "ds_optimizer" metadata (docs/checkpoints.md), read and checked once for
// both users of CheckpointReader: Engine::load_checkpoint (this rank's elements) and
// CheckpointShards (ds_to_fp32, whole parameters). Internal to src/runtime.
//
// A shard file ([bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.safetensors) holds fp32 tensors
// ("fp32_master" and the optimizer's moments), each the concatenation of the flat ranges listed in
// "segments", of one model-parallel part's flat parameter space, whose layout (names, local shapes,
// offsets, slices of the whole parameters) every shard of the part repeats.
//
// Errors use the wording of the reader's Use ("[checkpoint]" / "[ds_to_fp32]") and name the file.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint_parts.h"
#include "ds/core/safetensors.h"
#include "ds/runtime/checkpoint_reader.h"

namespace ds::runtime::detail {

struct ShardSegment {
  int64_t begin = 0, end = 0;  // flat [begin, end) of the part, begin < end
  int64_t offset = 0;          // element offset of `begin` in the file's fp32 tensors
};

struct ShardParameter {
  std::string name;
  Shape shape;         // this part's (local) shape
  int64_t offset = 0;  // in the part's unpadded flat space
  int64_t numel = 0;
  Slice slice;  // which part of the whole parameter this is
};

struct ShardMeta {
  std::string file;             // the path, for messages
  nlohmann::json json;          // the whole ds_optimizer object
  int64_t numel = 0;            // the part's flat elements (unpadded)
  int64_t partition_count = 1;  // data-parallel ranks that wrote the part's shards
  std::optional<int64_t> rank;  // read for Consolidate only
  // The part's layout as stored; the shards of one part must repeat it exactly.
  nlohmann::json names, shapes, offsets, slices;  // slices: [] without tensor/pipeline parallelism
  std::vector<ShardSegment> segments;             // non-empty ones, in file order

  bool same_layout(const ShardMeta& o) const {
    return names == o.names && shapes == o.shapes && offsets == o.offsets && slices == o.slices;
  }
};

// The ds_optimizer metadata of r, checked: counts are integers >= 0, the lists have one entry per
// parameter, segments are [flat begin, flat end, offset] triples inside [0, numel) and, when
// `stored` >= 0 (the elements of the file's fp32 tensors), inside those too.
ShardMeta read_shard_meta(const safetensors::Reader& r, CheckpointReader::Use use,
                          int64_t stored = -1);

// The fp32 tensor `name` of a shard ("fp32_master" or a moment such as "exp_avg"), in r's
// read-only mapping; *count gets its elements. Throws naming the file when it is absent or not F32.
const float* shard_tensor(const safetensors::Reader& r, const std::string& name,
                          CheckpointReader::Use use, int64_t* count);

// The part's parameters in flat order, each checked: a name, a shape of integers >= 0, an offset
// with the parameter inside [0, m.numel), a slice whose local shape is the shape.
std::vector<ShardParameter> shard_parameters(const ShardMeta& m, CheckpointReader::Use use);

}  // namespace ds::runtime::detail
