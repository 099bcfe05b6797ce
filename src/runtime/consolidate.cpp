// zero_to_fp32 for our checkpoints: see include/ds/runtime/consolidate.h.
#include "ds/runtime/consolidate.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

#include "checkpoint_format.h"
#include "checkpoint_parts.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/runtime/checkpoint_reader.h"
#include "optimizer_shard.h"

namespace fs = std::filesystem;

namespace ds::runtime {
namespace {

constexpr int64_t kChunk = int64_t{1} << 20;  // elements converted at a time

}  // namespace

struct CheckpointShards::Shard {
  safetensors::Reader reader;
  const float* master = nullptr;  // into the mapping
  int64_t count = 0;              // elements of fp32_master
};

CheckpointShards::~CheckpointShards() = default;

// One model-parallel part as its shards list it: each parameter's slice of the whole and its
// offset in the part's flat space, in the part's order.
struct CheckpointShards::PartLayout {
  detail::PartIndex index;
  std::map<std::string, int64_t> offsets;
  std::vector<std::string> order;
};

namespace {

// The pieces of one part's flat space [0, numel) must tile it once: a gap leaves a parameter
// without master weights, an overlap means shards of different saves. Sorts `pieces`.
template <typename Piece>
void check_tiling(std::vector<Piece>& pieces, const std::vector<ShardedParameter>& params,
                  int64_t numel, const std::string& where) {
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.flat_begin < b.flat_begin; });
  auto param_at = [&](int64_t flat) {
    for (const auto& p : params)
      if (flat >= p.offset && flat < p.offset + p.numel)
        return fmt::format("parameter {} (elements {}..)", p.name, flat - p.offset);
    return fmt::format("flat element {}", flat);
  };
  int64_t at = 0;
  for (const Piece& p : pieces) {
    DS_CHECK(p.flat_begin <= at,
             "[ds_to_fp32] the shards in {} do not cover flat elements [{}, {}): {} has no "
             "master weights; a shard is missing or damaged",
             where, at, p.flat_begin, param_at(at));
    DS_CHECK(p.flat_begin == at,
             "[ds_to_fp32] the shards in {} both hold flat element {} ({}): they overlap; the "
             "folder mixes shards of different saves",
             where, p.flat_begin, param_at(p.flat_begin));
    at = p.flat_end;
  }
  DS_CHECK(at == numel,
           "[ds_to_fp32] the shards in {} cover {} of the {} flat elements: {} has no master "
           "weights; a shard is missing or damaged",
           where, at, numel, param_at(at));
}

// The shards' ranks must be 0 .. partition_count - 1, each once.
void check_ranks(const std::map<int64_t, std::string>& by_rank, int64_t partition_count,
                 const fs::path& folder, bool bf16, int part, int ep, const std::string& where) {
  std::vector<std::string> missing;
  for (int64_t r = 0; r < partition_count; ++r)
    if (!by_rank.count(r))
      missing.push_back(
          (folder / detail::optim_file_name(bf16, static_cast<int>(r), part / ep, part % ep))
              .string());
  DS_CHECK(missing.empty(),
           "[ds_to_fp32] {} was written by {} partitions but {} missing: the checkpoint is "
           "incomplete; copy the missing shard(s) from the run's checkpoint folder",
           where, partition_count,
           fmt::format("{} {}", fmt::join(missing, ", "), missing.size() == 1 ? "is" : "are"));
  DS_CHECK(static_cast<int64_t>(by_rank.size()) == partition_count,
           "[ds_to_fp32] {} holds {} shards but they say the run had {} partitions: the folder "
           "mixes shards of different world sizes; use the files of one save only",
           where, by_rank.size(), partition_count);
}

}  // namespace

CheckpointShards::CheckpointShards(const fs::path& path, const std::string& tag) {
  CheckpointReader ckpt(path, tag, CheckpointReader::Use::Consolidate);
  folder_ = ckpt.folder();
  read_record(ckpt);
  // Optimizer shards: those checksums.json lists and those in the folder, by model-parallel part
  // (mp_rank_XX) and data-parallel rank.
  const bool bf16 = training_dtype_ == DType::bf16;
  const std::map<int, std::map<int, std::string>> names =
      ckpt.optimizer_files(bf16, expert_parallel_);
  DS_CHECK(!names.empty(),
           "[ds_to_fp32] {} holds no optimizer shard ({}zero_pp_rank_<r>_mp_rank_XX_optim_states"
           ".safetensors): the master weights are there; the checkpoint is incomplete",
           folder_.string(), bf16 ? "bf16_" : "");
  const int mp_parts = tensor_parallel_ * pipeline_parallel_ * expert_parallel_;
  DS_CHECK(names.rbegin()->first < mp_parts,
           "[ds_to_fp32] {} holds {}, but its model-states file says the run had {} model-parallel "
           "part(s): the folder mixes saves of different layouts; use the files of one save only",
           folder_.string(), names.rbegin()->second.begin()->second, mp_parts);
  std::vector<PartLayout> layouts(static_cast<size_t>(mp_parts));
  part_pieces_.assign(static_cast<size_t>(mp_parts), {});
  for (int mp = 0; mp < mp_parts; ++mp) {
    DS_CHECK(names.count(mp),
             "[ds_to_fp32] {} holds no optimizer shard of model-parallel part {} ({} is missing): "
             "the checkpoint is incomplete; copy the missing shard(s) from the run's checkpoint "
             "folder",
             folder_.string(), mp,
             (folder_ / detail::optim_file_name(bf16, 0, mp / expert_parallel_,
                                                mp % expert_parallel_))
                 .string());
    read_part(ckpt, mp, names.at(mp), layouts[static_cast<size_t>(mp)]);
  }
  if (mp_parts > 1) place_whole_parameters(layouts);
}

void CheckpointShards::read_record(CheckpointReader& ckpt) {
  // Model states: metadata only (its weights are in the training dtype).
  global_steps_ = ckpt.global_steps();
  world_size_ = ckpt.world_size();
  zero_stage_ = ckpt.zero_stage();
  training_dtype_ = ckpt.training_dtype();
  std::tie(tensor_parallel_, pipeline_parallel_) = ckpt.model_parallel();
  expert_parallel_ = ckpt.expert_parallel();
  model_config_ = ckpt.model_config();
  if (const nlohmann::json cs = ckpt.client_state();
      cs.contains("ds_train") && cs["ds_train"].is_object() && cs["ds_train"].contains("labels") &&
      cs["ds_train"]["labels"].is_array())
    for (const auto& n : cs["ds_train"]["labels"])
      if (n.is_string()) label_names_.push_back(n.get<std::string>());
  if (ckpt.lists(detail::kBuffersFile)) {
    ckpt.verify(detail::kBuffersFile);
    for (auto& [name, t] : safetensors::load((folder_ / detail::kBuffersFile).string()))
      buffers_.emplace_back(name, std::move(t));
  }
}

void CheckpointShards::read_part(CheckpointReader& ckpt, int mp,
                                 const std::map<int, std::string>& by_dp, PartLayout& layout) {
  const bool bf16 = training_dtype_ == DType::bf16;
  detail::ShardMeta first;  // the part's first shard: the others must repeat its layout
  std::map<int64_t, std::string> by_rank;
  std::vector<Piece> pieces;
  for (const auto& [dp, f] : by_dp) {
    ckpt.verify(f);
    auto shard = std::make_unique<Shard>(Shard{safetensors::Reader((folder_ / f).string())});
    const std::string file = shard->reader.path();
    shard->master = detail::shard_tensor(shard->reader, "fp32_master",
                                         CheckpointReader::Use::Consolidate, &shard->count);
    detail::ShardMeta meta =
        detail::read_shard_meta(shard->reader, CheckpointReader::Use::Consolidate, shard->count);
    if (!first.file.empty()) {
      DS_CHECK(meta.partition_count == first.partition_count,
               "[ds_to_fp32] {} was written by a run of {} partitions, {} by one of {}: the "
               "folder mixes shards of different world sizes; use the files of one save only",
               file, meta.partition_count, first.file, first.partition_count);
      DS_CHECK(meta.numel == first.numel && meta.same_layout(first),
               "[ds_to_fp32] {} lists other parameters (names, shapes, offsets or slices) than "
               "{}: the folder mixes shards of different models; use the files of one save only",
               file, first.file);
    }
    const int64_t rank = *meta.rank;
    DS_CHECK(!by_rank.count(rank), "[ds_to_fp32] {} and {} both say they are rank {}",
             by_rank.count(rank) ? by_rank[rank] : "", file, rank);
    by_rank[rank] = file;
    for (const detail::ShardSegment& seg : meta.segments)
      pieces.push_back({seg.begin, seg.end, shards_.size(), seg.offset});
    shard_files_.push_back(f);
    shards_.push_back(std::move(shard));
    if (first.file.empty()) first = std::move(meta);
  }
  const int parts = tensor_parallel_ * pipeline_parallel_ * expert_parallel_;
  const std::string where = parts == 1
                                ? folder_.string()
                                : fmt::format("{} (model-parallel part {})", folder_.string(), mp);
  check_ranks(by_rank, first.partition_count, folder_, bf16, mp, expert_parallel_, where);
  // This part's parameters in its flat order, with the slice of the whole each one is.
  std::vector<ShardedParameter> local;
  for (detail::ShardParameter& sp :
       detail::shard_parameters(first, CheckpointReader::Use::Consolidate)) {
    layout.index.slices[sp.name] = sp.slice;
    layout.offsets[sp.name] = sp.offset;
    layout.order.push_back(sp.name);
    local.push_back({std::move(sp.name), std::move(sp.shape), sp.offset, sp.numel});
  }
  layout.index.file = first.file;
  check_tiling(pieces, local, first.numel, where);
  part_pieces_[static_cast<size_t>(mp)] = std::move(pieces);
  if (parts == 1) {
    params_ = std::move(local);
    numel_ = first.numel;
  }
}

void CheckpointShards::place_whole_parameters(const std::vector<PartLayout>& layouts) {
  // Whole parameters in the order the parts list them (part 0's first: a tensor-parallel rank
  // holds every name; pipeline stages hold the model's layers in order), at offsets of a virtual
  // whole flat layout, each read through the runs of its distinct slices.
  std::vector<detail::PartIndex> index;
  for (const PartLayout& l : layouts) index.push_back(l.index);
  const auto sources = detail::plan_sources(index, folder_.string(), "[ds_to_fp32]");
  std::set<std::string> placed;
  for (const PartLayout& layout : layouts)
    for (const std::string& name : layout.order) {
      if (!placed.insert(name).second) continue;
      const std::vector<detail::Source>& v = sources.at(name);
      const detail::Slice whole = detail::Slice::whole(v.front().slice.full);
      ShardedParameter p;
      p.name = name;
      p.shape = whole.full;
      p.numel = whole.local_numel();
      p.offset = numel_;
      numel_ += p.numel;
      std::vector<ParamRun> runs;
      for (const detail::Source& s : v) {
        const int64_t base = layouts[s.part].offsets.at(name);
        for (const detail::Run& r : detail::overlap_runs(s.slice, whole))
          runs.push_back({s.part, base + r.src, r.dst, r.len});
      }
      std::sort(runs.begin(), runs.end(),
                [](const ParamRun& a, const ParamRun& b) { return a.dst < b.dst; });
      runs_.push_back(std::move(runs));
      params_.push_back(std::move(p));
    }
}

void CheckpointShards::read_flat(size_t part, int64_t begin, int64_t n, float* dst) const {
  const std::vector<Piece>& pieces = part_pieces_.at(part);
  auto it = std::upper_bound(pieces.begin(), pieces.end(), begin,
                             [](int64_t v, const Piece& p) { return v < p.flat_begin; });
  DS_CHECK(it != pieces.begin(), "[ds_to_fp32] internal: flat element {} not covered", begin);
  --it;
  const int64_t end = begin + n;
  for (; it != pieces.end() && it->flat_begin < end; ++it) {
    const int64_t a = std::max(begin, it->flat_begin), z = std::min(end, it->flat_end);
    if (a >= z) continue;
    std::memcpy(dst + (a - begin), shards_[it->shard]->master + it->offset + (a - it->flat_begin),
                static_cast<size_t>(z - a) * sizeof(float));
  }
}

void CheckpointShards::read_parameter(size_t index, int64_t at, int64_t n, float* dst) const {
  const ShardedParameter& p = params_.at(index);
  if (runs_.empty()) return read_flat(0, p.offset + at, n, dst);
  // The runs tile the whole parameter, ascending: copy those that meet [at, at + n).
  const std::vector<ParamRun>& runs = runs_.at(index);
  auto it = std::upper_bound(runs.begin(), runs.end(), at,
                             [](int64_t v, const ParamRun& r) { return v < r.dst; });
  if (it != runs.begin()) --it;
  for (; it != runs.end() && it->dst < at + n; ++it) {
    const int64_t a = std::max(at, it->dst), z = std::min(at + n, it->dst + it->len);
    if (a < z) read_flat(it->part, it->src + (a - it->dst), z - a, dst + (a - at));
  }
}

Tensor CheckpointShards::parameter(size_t index) const {
  const ShardedParameter& p = params_.at(index);
  Tensor t = Tensor::zeros(p.shape, DType::f32);
  read_parameter(index, 0, p.numel, t.data<float>());
  return t;
}

std::vector<std::pair<std::string, Tensor>> CheckpointShards::weights(DType dtype) const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i)
    out.emplace_back(params_[i].name, parameter(i).to(dtype));
  return out;
}

uint64_t CheckpointShards::write_safetensors(const fs::path& file, DType dtype) const {
  DS_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
           "[ds_to_fp32] the output dtype must be fp32, bf16 or fp16, not {}", dtype_name(dtype));
  std::vector<safetensors::Declared> declared;
  for (const auto& p : params_) declared.push_back({p.name, dtype, p.shape});
  const nlohmann::json info = {{"source", folder_.string()},
                               {"global_steps", global_steps_},
                               {"world_size", world_size_},
                               {"zero_stage", zero_stage_},
                               {"tensor_parallel", tensor_parallel_},
                               {"pipeline_parallel", pipeline_parallel_},
                               {"expert_parallel", expert_parallel_},
                               {"training_dtype", dtype_name(training_dtype_)},
                               {"dtype", dtype_name(dtype)}};
  std::vector<float> buf;             // (min(numel, kChunk),) fp32
  std::vector<unsigned char> packed;  // the same in the output dtype
  safetensors::save_streamed(
      file.string(), declared, {{"format", "pt"}, {"ds_to_fp32", info.dump()}},
      [&](const safetensors::WriteAt& write_at) {
        const size_t es = dtype_size(dtype);
        for (size_t i = 0; i < params_.size(); ++i) {
          const ShardedParameter& p = params_[i];
          for (int64_t at = 0; at < p.numel; at += kChunk) {
            const int64_t n = std::min(kChunk, p.numel - at);
            buf.resize(static_cast<size_t>(n));
            read_parameter(i, at, n, buf.data());
            const uint64_t byte_at = static_cast<uint64_t>(at) * es;
            if (dtype == DType::f32) {
              write_at(i, byte_at, buf.data(), static_cast<uint64_t>(n) * es);
              continue;
            }
            packed.resize(static_cast<size_t>(n) * es);
            convert(buf.data(), DType::f32, packed.data(), dtype, static_cast<size_t>(n));
            write_at(i, byte_at, packed.data(), packed.size());
          }
        }
      });
  std::error_code ec;
  const auto bytes = fs::file_size(file, ec);
  return ec ? 0 : static_cast<uint64_t>(bytes);
}

}  // namespace ds::runtime
