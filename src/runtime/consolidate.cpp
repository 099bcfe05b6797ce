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

namespace fs = std::filesystem;

namespace ds::runtime {
namespace {

using detail::field_int;
using detail::parse_metadata;

constexpr int64_t kChunk = int64_t{1} << 20;  // elements converted at a time

const nlohmann::json& field_array(const nlohmann::json& j, const std::string& key,
                                  const std::string& file, const std::string& where) {
  auto it = j.find(key);
  DS_CHECK(it != j.end() && it->is_array(),
           "[ds_to_fp32] {}: {}.{} must be an array; the checkpoint is damaged or not written by "
           "deepspeed.cpp",
           file, where, key);
  return *it;
}

}  // namespace

struct CheckpointShards::Shard {
  safetensors::Reader reader;
  const float* master = nullptr;  // into the mapping
  int64_t count = 0;              // elements of fp32_master
};

CheckpointShards::~CheckpointShards() = default;

CheckpointShards::CheckpointShards(const fs::path& path, const std::string& tag) {
  CheckpointReader ckpt(path, tag, CheckpointReader::Use::Consolidate);
  folder_ = ckpt.folder();
  // Model states: metadata only (its weights are in the training dtype).
  global_steps_ = ckpt.global_steps();
  world_size_ = ckpt.world_size();
  zero_stage_ = ckpt.zero_stage();
  training_dtype_ = ckpt.training_dtype();
  std::tie(tensor_parallel_, pipeline_parallel_) = ckpt.model_parallel();
  model_config_ = ckpt.model_config();

  // Optimizer shards: those checksums.json lists and those in the folder, by model-parallel part
  // (mp_rank_XX) and data-parallel rank.
  const bool bf16 = training_dtype_ == DType::bf16;
  const std::string prefix = std::string(bf16 ? "bf16_" : "") + "zero_pp_rank_";
  const std::string suffix = "_mp_rank_XX_optim_states.safetensors";
  const std::map<int, std::map<int, std::string>> names = ckpt.optimizer_files(bf16);
  DS_CHECK(!names.empty(),
           "[ds_to_fp32] {} holds no optimizer shard ({}<r>{}): the master weights are there; "
           "the checkpoint is incomplete",
           folder_.string(), prefix, suffix);
  const int mp_parts = tensor_parallel_ * pipeline_parallel_;
  DS_CHECK(names.rbegin()->first < mp_parts,
           "[ds_to_fp32] {} holds {}, but its model-states file says the run had {} model-parallel "
           "part(s): the folder mixes saves of different layouts; use the files of one save only",
           folder_.string(), names.rbegin()->second.begin()->second, mp_parts);

  std::vector<detail::PartIndex> parts(static_cast<size_t>(mp_parts));
  std::vector<std::map<std::string, int64_t>> part_offsets(static_cast<size_t>(mp_parts));
  std::vector<std::vector<std::string>> part_order(static_cast<size_t>(mp_parts));
  part_pieces_.assign(static_cast<size_t>(mp_parts), {});
  std::vector<int64_t> part_numel(static_cast<size_t>(mp_parts), 0);
  for (int mp = 0; mp < mp_parts; ++mp) {
    DS_CHECK(names.count(mp),
             "[ds_to_fp32] {} holds no optimizer shard of model-parallel part {} ({} is missing): "
             "the checkpoint is incomplete; copy the missing shard(s) from the run's checkpoint "
             "folder",
             folder_.string(), mp, (folder_ / detail::optim_file_name(bf16, 0, mp)).string());
    const auto& by_dp = names.at(mp);
    nlohmann::json first_names, first_shapes, first_offsets, first_slices;
    std::string first_file;
    std::map<int64_t, std::string> by_rank;
    int64_t partition_count = -1, numel = 0;
    std::vector<Piece> pieces;
    for (const auto& [dp, f] : by_dp) {
      ckpt.verify(f);
      auto shard = std::make_unique<Shard>(Shard{safetensors::Reader((folder_ / f).string())});
      const std::string file = shard->reader.path();
      const nlohmann::json meta = parse_metadata(shard->reader, "ds_optimizer", "[ds_to_fp32]");
      const int64_t shard_numel = field_int(meta, "numel", file, "ds_optimizer");
      const int64_t pc = field_int(meta, "partition_count", file, "ds_optimizer");
      const int64_t rank = field_int(meta, "rank", file, "ds_optimizer");
      const nlohmann::json& pn = field_array(meta, "param_names", file, "ds_optimizer");
      const nlohmann::json& ps = field_array(meta, "param_shapes", file, "ds_optimizer");
      const nlohmann::json& po = field_array(meta, "param_offsets", file, "ds_optimizer");
      const nlohmann::json slices = meta.contains("param_slices")
                                        ? field_array(meta, "param_slices", file, "ds_optimizer")
                                        : nlohmann::json::array();
      if (first_file.empty()) {
        first_file = file;
        partition_count = pc;
        numel = shard_numel;
        first_names = pn;
        first_shapes = ps;
        first_offsets = po;
        first_slices = slices;
      } else {
        DS_CHECK(pc == partition_count,
                 "[ds_to_fp32] {} was written by a run of {} partitions, {} by one of {}: the "
                 "folder mixes shards of different world sizes; use the files of one save only",
                 file, pc, first_file, partition_count);
        DS_CHECK(shard_numel == numel && pn == first_names && ps == first_shapes &&
                     po == first_offsets && slices == first_slices,
                 "[ds_to_fp32] {} lists other parameters (names, shapes, offsets or slices) than "
                 "{}: the folder mixes shards of different models; use the files of one save only",
                 file, first_file);
      }
      DS_CHECK(!by_rank.count(rank), "[ds_to_fp32] {} and {} both say they are rank {}",
               by_rank.count(rank) ? by_rank[rank] : "", file, rank);
      by_rank[rank] = file;
      DS_CHECK(shard->reader.contains("fp32_master"),
               "[ds_to_fp32] {} has no 'fp32_master' tensor; the file is damaged", file);
      const safetensors::Entry& e = shard->reader.entry("fp32_master");
      DS_CHECK(e.supported && e.dtype == DType::f32,
               "[ds_to_fp32] {}: 'fp32_master' is {}, expected F32; the file is damaged", file,
               e.dtype_name);
      shard->master = reinterpret_cast<const float*>(shard->reader.data_of(e));
      shard->count = static_cast<int64_t>((e.end - e.begin) / sizeof(float));
      for (const auto& seg : field_array(meta, "segments", file, "ds_optimizer")) {
        bool ok = seg.is_array() && seg.size() == 3;
        for (size_t k = 0; ok && k < 3; ++k)
          ok = seg[k].is_number_integer() && seg[k].get<int64_t>() >= 0;
        DS_CHECK(ok,
                 "[ds_to_fp32] {}: ds_optimizer.segments holds {}, expected [flat begin, flat "
                 "end, offset] triples of integers >= 0; the file is damaged",
                 file, seg.dump());
        const int64_t fb = seg[0].get<int64_t>(), fe = seg[1].get<int64_t>(),
                      off = seg[2].get<int64_t>();
        DS_CHECK(fb <= fe && fe <= numel && off + (fe - fb) <= shard->count,
                 "[ds_to_fp32] {}: segment [{}, {}) at offset {} lies outside the {} flat "
                 "elements or the {} stored ones; the file is damaged",
                 file, fb, fe, off, numel, shard->count);
        if (fb < fe) pieces.push_back({fb, fe, shards_.size(), off});
      }
      shard_files_.push_back(f);
      shards_.push_back(std::move(shard));
    }
    const std::string where =
        mp_parts == 1 ? folder_.string()
                      : fmt::format("{} (model-parallel part {})", folder_.string(), mp);
    std::vector<std::string> missing;
    for (int64_t r = 0; r < partition_count; ++r)
      if (!by_rank.count(r))
        missing.push_back(
            (folder_ / detail::optim_file_name(bf16, static_cast<int>(r), mp)).string());
    DS_CHECK(missing.empty(),
             "[ds_to_fp32] {} was written by {} partitions but {} missing: the checkpoint is "
             "incomplete; copy the missing shard(s) from the run's checkpoint folder",
             where, partition_count,
             fmt::format("{} {}", fmt::join(missing, ", "), missing.size() == 1 ? "is" : "are"));
    DS_CHECK(static_cast<int64_t>(by_rank.size()) == partition_count,
             "[ds_to_fp32] {} holds {} shards but they say the run had {} partitions: the folder "
             "mixes shards of different world sizes; use the files of one save only",
             where, by_rank.size(), partition_count);

    // This part's parameters in its flat order, with the slice of the whole each one is.
    DS_CHECK(first_names.size() == first_shapes.size() &&
                 first_names.size() == first_offsets.size() &&
                 (first_slices.empty() || first_slices.size() == first_names.size()),
             "[ds_to_fp32] {}: ds_optimizer lists {} names, {} shapes, {} offsets and {} slices; "
             "the file is damaged",
             first_file, first_names.size(), first_shapes.size(), first_offsets.size(),
             first_slices.size());
    std::vector<ShardedParameter> local;
    for (size_t i = 0; i < first_names.size(); ++i) {
      ShardedParameter p;
      bool ok = first_names[i].is_string() && first_shapes[i].is_array() &&
                first_offsets[i].is_number_integer() && first_offsets[i].get<int64_t>() >= 0;
      int64_t n = 1;
      for (const auto& d : first_shapes[i]) {
        ok = ok && d.is_number_integer() && d.get<int64_t>() >= 0;
        if (ok) {
          p.shape.push_back(d.get<int64_t>());
          n *= d.get<int64_t>();
        }
      }
      DS_CHECK(ok,
               "[ds_to_fp32] {}: parameter {} of ds_optimizer (name, shape, offset) is "
               "malformed; the file is damaged",
               first_file, i);
      p.name = first_names[i].get<std::string>();
      p.offset = first_offsets[i].get<int64_t>();
      p.numel = n;
      DS_CHECK(p.offset + p.numel <= numel,
               "[ds_to_fp32] {}: parameter {} [{}, {}) lies past the {} flat elements; the file "
               "is damaged",
               first_file, p.name, p.offset, p.offset + p.numel, numel);
      detail::Slice s = detail::Slice::whole(p.shape);
      if (!first_slices.empty()) {
        s = detail::Slice::from_json(first_slices[i], first_file,
                                     fmt::format("ds_optimizer.param_slices[{}]", i),
                                     "[ds_to_fp32]");
        DS_CHECK(s.local_shape() == p.shape,
                 "[ds_to_fp32] {}: parameter {} is {} in the file, but its slice ({}) is {}; the "
                 "file is damaged",
                 first_file, p.name, shape_str(p.shape), s.str(), shape_str(s.local_shape()));
      }
      parts[static_cast<size_t>(mp)].slices[p.name] = s;
      part_offsets[static_cast<size_t>(mp)][p.name] = p.offset;
      part_order[static_cast<size_t>(mp)].push_back(p.name);
      local.push_back(std::move(p));
    }
    parts[static_cast<size_t>(mp)].file = first_file;

    // The pieces must tile [0, numel) once: a gap leaves a parameter without master weights.
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.flat_begin < b.flat_begin; });
    int64_t at = 0;
    auto param_at = [&](int64_t flat) {
      for (const auto& p : local)
        if (flat >= p.offset && flat < p.offset + p.numel)
          return fmt::format("parameter {} (elements {}..)", p.name, flat - p.offset);
      return fmt::format("flat element {}", flat);
    };
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
    part_pieces_[static_cast<size_t>(mp)] = std::move(pieces);
    part_numel[static_cast<size_t>(mp)] = numel;
    if (mp_parts == 1) params_ = std::move(local);
  }
  if (mp_parts == 1) {
    numel_ = part_numel[0];
    return;
  }

  // Several parts: whole parameters in the order the parts list them (part 0's first: a
  // tensor-parallel rank holds every name; pipeline stages hold the model's layers in order), at
  // offsets of a virtual whole flat layout, each read through the runs of its distinct slices.
  const auto sources = detail::plan_sources(parts, folder_.string(), "[ds_to_fp32]");
  std::set<std::string> placed;
  for (int mp = 0; mp < mp_parts; ++mp)
    for (const std::string& name : part_order[static_cast<size_t>(mp)]) {
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
        const int64_t base = part_offsets[s.part].at(name);
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
