// Engine::load_checkpoint: resuming from a checkpoint written at any (dp, tp, pp) layout and ZeRO
// stage (the layout is in checkpoint.cpp's header and docs/checkpoints.md). The steps, in order:
//
//   1. read the engine record (counters, scheduler, scaler, dropout RNG, client state) and check
//      every field before any state changes: a damaged file leaves the engine as it was;
//   2. open every model-parallel part's model file and index which slice of each whole parameter
//      it holds; check the model's names and shapes against them, and the buffers file;
//   3. open the optimizer shards of every part and data-parallel rank, check they belong to one
//      save, and plan the pieces of this rank's held ranges they supply;
//   4. stream the pieces into the state store (master weights and moments); every rank agrees
//      that its local part succeeded (local_part_done) before the collective part:
//   5. the weights (stage 3: gathered from the master pieces), buffers and the engine record.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "checkpoint_format.h"
#include "checkpoint_parts.h"
#include "checkpoint_rank_state.h"
#include "ds/comm/group.h"
#include "ds/core/error.h"
#include "ds/core/rng.h"
#include "ds/core/safetensors.h"
#include "ds/nn/tensor_parallel.h"
#include "ds/runtime/checkpoint_reader.h"
#include "ds/runtime/engine.h"
#include "optimizer_shard.h"

namespace fs = std::filesystem;

namespace ds::runtime {
namespace {

using detail::kModelFile;
using detail::Meta;
using Sources = std::map<std::string, std::vector<detail::Source>>;

// Step 1: the engine's counters and state objects as ds_engine records them.
struct EngineRecord {
  int64_t global_steps = 0, global_samples = 0, skipped_steps = 0, micro_steps = 0,
          consecutive_skips = 0;
  nlohmann::json lr_state, scaler_state, client_state;
  uint64_t dropout_seed = 0, dropout_offset = 0;
};

EngineRecord read_engine_record(CheckpointReader& ckpt) {
  const Meta state(ckpt.engine_state(), (ckpt.folder() / kModelFile).string(), "ds_engine");
  EngineRecord r;
  r.global_steps = ckpt.global_steps();
  r.global_samples = state.integer("global_samples");
  r.skipped_steps = state.integer("skipped_steps");
  r.micro_steps = state.integer("micro_steps");
  r.consecutive_skips = state.has("consecutive_skips") ? state.integer("consecutive_skips") : 0;
  r.lr_state = state.object("lr_scheduler").json();
  r.scaler_state = state.object("loss_scaler").json();
  const Meta dropout = state.object("dropout_rng");
  r.dropout_seed = dropout.unsigned64("seed");
  r.dropout_offset = dropout.unsigned64("offset");
  r.client_state = ckpt.client_state();
  return r;
}

// Step 2: the model files of every model-parallel part (mp_rank_00 first) and where each whole
// parameter's slices are.
struct ModelFiles {
  int parts = 1;       // tp x pp x ep of the run that wrote it (part = mp rank x ep + ep rank)
  int ep = 1;          // its expert-parallel size
  std::string layout;  // "tp=2 pp=1", for messages
  std::vector<const safetensors::Reader*> readers;
  std::vector<std::unique_ptr<safetensors::Reader>> owned;  // mp_rank_01 and on
  std::vector<detail::PartIndex> index;
  Sources sources;
};

// Which slice of every whole parameter the model file `r` holds (its ds_slices metadata; a
// single-part file without it holds whole tensors).
detail::PartIndex index_model_file(const safetensors::Reader& r, bool single_part) {
  detail::PartIndex part{r.path(), {}};
  if (single_part && !r.metadata().count("ds_slices")) {
    for (const auto& e : r.entries()) part.slices[e.name] = detail::Slice::whole(e.shape);
    return part;
  }
  const nlohmann::json sl = detail::parse_metadata(r, "ds_slices", "[checkpoint]");
  for (const auto& e : r.entries()) {
    DS_CHECK(sl.contains(e.name),
             "[checkpoint] {}: the ds_slices metadata does not say which part of {} the file "
             "holds; the file is damaged",
             r.path(), e.name);
    const detail::Slice s =
        detail::Slice::from_json(sl[e.name], r.path(), "ds_slices." + e.name, "[checkpoint]");
    DS_CHECK(s.local_shape() == e.shape,
             "[checkpoint] {}: {} is {} in the file, but its slice ({}) is {}; the file is "
             "damaged",
             r.path(), e.name, shape_str(e.shape), s.str(), shape_str(s.local_shape()));
    part.slices[e.name] = s;
  }
  return part;
}

ModelFiles open_model_files(CheckpointReader& ckpt) {
  const fs::path ck = ckpt.folder();
  ModelFiles m;
  const auto [tp, pp] = ckpt.model_parallel();
  const int ep = ckpt.expert_parallel();
  m.ep = ep;
  m.parts = tp * pp * ep;
  m.layout = ep > 1 ? fmt::format("tp={} pp={} ep={}", tp, pp, ep) : fmt::format("tp={} pp={}", tp, pp);
  const nlohmann::json& sums = ckpt.checksums();
  for (auto it = sums.begin(); it != sums.end(); ++it)
    if (auto f = detail::parse_model_file_name(it.key()))
      DS_CHECK(f->mp < tp * pp && f->ep < ep,
               "[checkpoint] {} lists {}, but {} says the checkpoint was written with {} ({} "
               "model-parallel part(s)): the folder mixes saves of different layouts",
               ckpt.checksums_path().string(), it.key(), (ck / kModelFile).string(), m.layout,
               m.parts);
  m.readers.push_back(&ckpt.model_file());
  for (int k = 1; k < m.parts; ++k) {
    const std::string f = detail::model_file_name(k / ep, k % ep);
    DS_CHECK(ckpt.lists(f) && fs::exists(ck / f),
             "[checkpoint] {} is missing: the checkpoint was written with {} ({} parts: "
             "mp_rank_00 to mp_rank_{:02d}{}); copy it from the run's checkpoint folder",
             (ck / f).string(), m.layout, m.parts, tp * pp - 1,
             ep > 1 ? fmt::format(", each also as expp_rank_1_ to expp_rank_{}_", ep - 1) : "");
    m.owned.push_back(std::make_unique<safetensors::Reader>((ck / f).string()));
    m.readers.push_back(m.owned.back().get());
  }
  for (const safetensors::Reader* r : m.readers)
    m.index.push_back(index_model_file(*r, m.parts == 1));
  m.sources = detail::plan_sources(m.index, ck.string(), "[checkpoint]");
  return m;
}

// The model's buffers from model_buffers.safetensors, when the checkpoint has one (older ones do
// not: the buffers then keep the values the model was built or loaded with). Exactly the model's
// names and shapes, unless this rank holds a model-parallel part (part_only: it takes those it
// has).
std::map<std::string, Tensor> read_buffers(CheckpointReader& ckpt, const nn::Module& model,
                                           bool part_only) {
  std::map<std::string, Tensor> file_buffers;
  if (!ckpt.lists(detail::kBuffersFile)) return file_buffers;
  const fs::path bf = ckpt.folder() / detail::kBuffersFile;
  ckpt.verify(detail::kBuffersFile);
  file_buffers = safetensors::load(bf.string());
  std::vector<std::string> bad;
  std::set<std::string> model_buffers;
  for (const auto& [name, b] : model.named_buffers()) {
    model_buffers.insert(name);
    const auto it = file_buffers.find(name);
    if (it == file_buffers.end()) {
      if (!part_only) bad.push_back("missing " + name);
    } else if (it->second.shape() != b.shape()) {
      bad.push_back(fmt::format("{}: shape {} in the file, {} in the model", name,
                                shape_str(it->second.shape()), shape_str(b.shape())));
    }
  }
  for (const auto& [name, t] : file_buffers)
    if (!model_buffers.count(name) && !part_only) bad.push_back("unexpected " + name);
  DS_CHECK(bad.empty(), "[checkpoint] {} does not match this model's buffers: {}", bf.string(),
           fmt::join(bad, "; "));
  return file_buffers;
}

// This rank's part of parameter `name` (whole without tensor parallelism).
struct SliceOf {
  std::map<std::string, nn::TPSplit> splits;
  detail::Slice operator()(const std::string& name, const Shape& local) const {
    auto it = splits.find(name);
    return detail::Slice::of(local, it == splits.end() ? nn::TPSplit{} : it->second);
  }
};

// The model's parameters against the model files: exactly our names and whole shapes (a pipeline
// stage holds some of them: stage_only). Verifies and type-checks the files this rank reads.
void check_model_parameters(nn::Module& model, CheckpointReader& ckpt, const ModelFiles& files,
                            const SliceOf& slice_of, bool stage_only) {
  const fs::path ck = ckpt.folder();
  const std::string where =
      files.parts == 1 ? (ck / kModelFile).string()
                       : fmt::format("{} (mp_rank_*_model_states.safetensors)", ck.string());
  std::vector<std::string> problems;
  std::set<std::string> ours;
  std::set<size_t> parts_read;
  for (auto& [name, p] : model.named_parameters()) {
    ours.insert(name);
    auto it = files.sources.find(name);
    if (it == files.sources.end()) {
      problems.push_back("missing " + name);
      continue;
    }
    const detail::Slice want = slice_of(name, p.shape());
    const Shape& whole = it->second.front().slice.full;
    if (whole != want.full) {
      problems.push_back(fmt::format("{}: shape {} in the file, {} in the model", name,
                                     shape_str(whole), shape_str(want.full)));
      continue;
    }
    for (const detail::Source& s : it->second)
      if (detail::overlap_numel(s.slice, want) > 0) parts_read.insert(s.part);
  }
  for (const auto& [name, v] : files.sources)
    if (!ours.count(name) && !stage_only) problems.push_back("unexpected " + name);
  const bool lora_names = std::any_of(problems.begin(), problems.end(), [](const auto& pr) {
    return pr.find(".lora_A.") != std::string::npos || pr.find(".lora_B.") != std::string::npos;
  });
  DS_CHECK(problems.empty(), "[checkpoint] {} does not match this model: {}{}", where,
           fmt::join(problems, "; "),
           lora_names ? " (LoRA matrices differ: resume with the LoRA settings the checkpoint was "
                        "written with, --lora_dim and --lora_module_name)"
                      : "");
  for (size_t k : parts_read) {
    ckpt.verify(fs::path(files.index[k].file).filename().string());
    for (const auto& e : files.readers[k]->entries())
      DS_CHECK(
          e.supported && (e.dtype == DType::f32 || e.dtype == DType::bf16 || e.dtype == DType::f16),
          "[checkpoint] {}: {} is stored as {}, not a floating type", files.index[k].file, e.name,
          e.dtype_name);
  }
}

// Step 3: the optimizer shards of every model-parallel part, whatever (dp, tp, pp) and stage wrote
// them. Each lists its part's flat layout (names, local shapes, offsets, slices) and the flat
// ranges it stores (segments); a parameter's elements are found through its slices.
struct OptimizerShards {
  struct Segment {
    int64_t begin, end, offset;  // flat [begin, end) of the part, at `offset` in the file
    size_t reader;
  };
  std::vector<safetensors::Reader> readers;
  std::vector<std::string> files;                          // per reader, the file name
  std::vector<std::vector<const float*>> states;           // per reader, per state name (lazily)
  std::vector<std::vector<Segment>> segments;              // per part, sorted by begin
  std::vector<detail::PartIndex> index;                    // per part
  std::vector<std::map<std::string, int64_t>> offsets;     // per part: parameter -> flat offset
  std::vector<std::string> first_file;                     // per part
  nlohmann::json scalar_state;
  Sources sources;
};

// The shards of one part `mp` (mp rank x ep + ep rank; by data-parallel rank), added to `s`.
void open_part_shards(OptimizerShards& s, const fs::path& ck, int mp, int ep,
                      const std::map<int, std::string>& by_dp, const std::string& optimizer,
                      bool bf16) {
  const size_t m = static_cast<size_t>(mp);
  int64_t partition_count = 0;
  detail::ShardMeta first;  // the part's first shard: the others must repeat its layout
  for (const auto& [dp, f] : by_dp) {
    const std::string path = (ck / f).string();
    DS_CHECK(fs::exists(ck / f),
             "[checkpoint] {} is missing (checksums.json lists it): the checkpoint is "
             "incomplete; copy the file from the run's checkpoint folder",
             path);
    s.readers.emplace_back(path);
    s.files.push_back(f);
    s.states.emplace_back();
    detail::ShardMeta shard = detail::read_shard_meta(s.readers.back(), CheckpointReader::Use::Resume);
    const Meta meta(shard.json, path, "ds_optimizer");
    const std::string opt_name = meta.string("optimizer");
    DS_CHECK(opt_name == optimizer,
             "[checkpoint] {} was written with the {} optimizer; this run uses {}", path, opt_name,
             optimizer);
    const Meta scalars = meta.object("scalar_state");
    for (const auto& [k, v] : scalars.json().items())
      if (!v.is_number()) meta.bad("scalar_state." + k, v, "a number");
    if (s.scalar_state.is_null()) s.scalar_state = scalars.json();
    if (s.first_file[m].empty()) {
      s.first_file[m] = path;
      partition_count = shard.partition_count;
      detail::PartIndex part{path, {}};
      for (const detail::ShardParameter& p :
           detail::shard_parameters(shard, CheckpointReader::Use::Resume)) {
        part.slices[p.name] = p.slice;
        s.offsets[m][p.name] = p.offset;
      }
      s.index[m] = std::move(part);
    } else {
      DS_CHECK(shard.partition_count == partition_count,
               "[checkpoint] {} was written by {} data-parallel partitions, {} by {}: the folder "
               "mixes shards of different saves; use the files of one save only",
               path, shard.partition_count, s.first_file[m], partition_count);
      DS_CHECK(shard.same_layout(first),
               "[checkpoint] {} lists other parameters (names, shapes, offsets or slices) than "
               "{}: the folder mixes shards of different saves; use the files of one save only",
               path, s.first_file[m]);
    }
    for (const detail::ShardSegment& seg : shard.segments)
      s.segments[m].push_back({seg.begin, seg.end, seg.offset, s.readers.size() - 1});
    if (first.file.empty()) first = std::move(shard);
  }
  for (int64_t d = 0; d < partition_count; ++d)
    DS_CHECK(by_dp.count(static_cast<int>(d)),
             "[checkpoint] {} is missing: the optimizer state of model-parallel part {} was "
             "written by {} data-parallel ranks; copy the file from the run's checkpoint folder",
             (ck / detail::optim_file_name(bf16, static_cast<int>(d), mp / ep, mp % ep)).string(), mp,
             partition_count);
  DS_CHECK(by_dp.rbegin()->first < partition_count,
           "[checkpoint] {} says the run had {} data-parallel partitions, but {} is there: the "
           "folder mixes shards of different saves",
           s.first_file[m], partition_count, by_dp.rbegin()->second);
}

// The optimizer shard files by model-parallel part and data-parallel rank; throws when there are
// none for this run's precision.
using ShardNames = std::map<int, std::map<int, std::string>>;
ShardNames optimizer_shard_names(CheckpointReader& ckpt, DType training_dtype) {
  const bool bf16 = training_dtype == DType::bf16;
  ShardNames names = ckpt.optimizer_files(bf16, ckpt.expert_parallel());
  if (!names.empty()) return names;
  DS_CHECK(ckpt.optimizer_files(!bf16).empty(),
           "[checkpoint] {} was written by a {} run; this run trains in {} (DeepSpeed names the "
           "bf16 optimizer files differently). Resume with the same precision",
           ckpt.folder().string(), bf16 ? "non-bf16" : "bf16", dtype_name(training_dtype));
  DS_THROW("[checkpoint] {} holds no optimizer shard (zero_pp_rank_*_optim_states.safetensors)",
           ckpt.folder().string());
}

OptimizerShards open_optimizer_shards(CheckpointReader& ckpt, const ModelFiles& files,
                                      const ShardNames& names, const std::string& optimizer,
                                      bool bf16) {
  const fs::path ck = ckpt.folder();
  const size_t parts = static_cast<size_t>(files.parts);
  OptimizerShards s;
  s.segments.resize(parts);
  s.index.resize(parts);
  s.offsets.resize(parts);
  s.first_file.resize(parts);
  for (const auto& [mp, by_dp] : names) {
    DS_CHECK(mp < files.parts,
             "[checkpoint] {} lists {}, but {} says the checkpoint was written with {} ({} "
             "model-parallel part(s)): the folder mixes saves of different layouts",
             ckpt.checksums_path().string(), by_dp.begin()->second, (ck / kModelFile).string(),
             files.layout, files.parts);
    open_part_shards(s, ck, mp, files.ep, by_dp, optimizer, bf16);
  }
  for (int k = 0; k < files.parts; ++k)
    DS_CHECK(!s.first_file[static_cast<size_t>(k)].empty(),
             "[checkpoint] {} holds no optimizer shard of model-parallel part {} ({} is missing); "
             "the checkpoint is incomplete",
             ck.string(), k, detail::optim_file_name(bf16, 0, k / files.ep, k % files.ep));
  for (auto& segs : s.segments)
    std::sort(segs.begin(), segs.end(), [](const auto& a, const auto& b) {
      return a.begin < b.begin;
    });
  s.sources = detail::plan_sources(s.index, ck.string(), "[checkpoint]");
  return s;
}

// The state tensors of shard `r` (fp32_master, then the optimizer's moments), verified once, on
// first use.
const std::vector<const float*>& shard_states(OptimizerShards& s, CheckpointReader& ckpt,
                                              size_t r,
                                              const std::vector<std::string>& state_names) {
  auto& src = s.states[r];
  if (!src.empty()) return src;
  ckpt.verify(s.files[r]);
  const safetensors::Reader& reader = s.readers[r];
  for (const auto& name : state_names) {
    int64_t have = 0;
    const float* data = detail::shard_tensor(reader, name, CheckpointReader::Use::Resume, &have);
    for (const auto& segs : s.segments)
      for (const auto& seg : segs)
        DS_CHECK(seg.reader != r || seg.offset + (seg.end - seg.begin) <= have,
                 "[checkpoint] {}: segment [{}, {}) at offset {} reads past the {} elements of "
                 "'{}'; the file is damaged",
                 reader.path(), seg.begin, seg.end, seg.offset, have, name);
    src.push_back(data);
  }
  return src;
}

// A run of elements one shard supplies to this rank's optimizer buffers.
struct Piece {
  size_t reader;
  int64_t src, dst, len;  // elements: offset in the file's tensors, offset in our buffers
};

// The pieces of the held range `h` that `run` of parameter `e` (from part `src`) covers.
void add_pieces(std::vector<Piece>& pieces, int64_t& covered, const OptimizerShards& s,
                const nn::FlatEntry& e, const detail::Source& src, const detail::Run& r,
                const zero::HeldRange& h, const std::function<void(size_t)>& touch) {
  const int64_t a = std::max(h.flat_begin, e.offset + r.dst),
                z = std::min(h.flat_end, e.offset + r.dst + r.len);
  if (a >= z) return;
  const int64_t base = s.offsets[src.part].at(e.name);
  const int64_t s0 = base + r.src + (a - e.offset - r.dst), d0 = h.offset + (a - h.flat_begin);
  const int64_t s1 = s0 + (z - a);
  const auto& segs = s.segments[src.part];
  auto sit = std::upper_bound(segs.begin(), segs.end(), s0,
                              [](int64_t v, const auto& seg) { return v < seg.begin; });
  if (sit != segs.begin()) --sit;
  for (; sit != segs.end() && sit->begin < s1; ++sit) {
    const int64_t x = std::max(s0, sit->begin), y = std::min(s1, sit->end);
    if (x >= y) continue;
    touch(sit->reader);
    pieces.push_back({sit->reader, sit->offset + (x - sit->begin), d0 + (x - s0), y - x});
    covered += y - x;
  }
}

// Every piece of this rank's held ranges, from whichever shards hold them; throws when they do
// not cover the ranges exactly once.
std::vector<Piece> plan_pieces(OptimizerShards& s, CheckpointReader& ckpt,
                               const zero::Strategy& zero, const SliceOf& slice_of,
                               const std::vector<std::string>& state_names) {
  const std::vector<zero::HeldRange> held = zero.held_ranges();
  int64_t needed = 0, covered = 0;
  for (const auto& h : held) needed += h.flat_end - h.flat_begin;
  const auto touch = [&](size_t r) { shard_states(s, ckpt, r, state_names); };
  std::vector<Piece> pieces;
  for (const auto& e : zero.flat().entries) {
    const bool wanted = std::any_of(held.begin(), held.end(), [&](const zero::HeldRange& h) {
      return std::max(h.flat_begin, e.offset) < std::min(h.flat_end, e.offset + e.numel);
    });
    if (!wanted) continue;
    auto it = s.sources.find(e.name);
    DS_CHECK(it != s.sources.end(),
             "[checkpoint] the optimizer shards in {} hold no state for parameter {}; the "
             "checkpoint was written by another model (or other LoRA settings)",
             ckpt.folder().string(), e.name);
    const detail::Slice want = slice_of(e.name, e.shape);
    DS_CHECK(it->second.front().slice.full == want.full,
             "[checkpoint] {}: parameter {} is whole {} in the optimizer shards, {} in this model",
             ckpt.folder().string(), e.name, shape_str(it->second.front().slice.full),
             shape_str(want.full));
    for (const detail::Source& src : it->second)
      for (const detail::Run& r : detail::overlap_runs(src.slice, want))
        for (const auto& h : held) add_pieces(pieces, covered, s, e, src, r, h, touch);
  }
  DS_CHECK(covered == needed,
           "[checkpoint] the optimizer shards in {} cover {} of the {} elements this rank needs; a "
           "shard file is missing or the shards overlap",
           ckpt.folder().string(), covered, needed);
  return pieces;
}

// Step 4: the pieces into the state store (master weights, then each moment), chunk by chunk.
void fill_state(zero::StateStore& store, const std::vector<Piece>& pieces,
                const OptimizerShards& s) {
  store.for_each(zero::Access::Overwrite, [&](const zero::StateChunk& c) {
    std::vector<float*> dst = {c.master};
    dst.insert(dst.end(), c.states.begin(), c.states.end());
    for (float* d : dst) std::fill(d, d + c.numel, 0.0f);
    for (const Piece& p : pieces) {
      const int64_t a = std::max(p.dst, c.begin), z = std::min(p.dst + p.len, c.begin + c.numel);
      if (a >= z) continue;
      for (size_t i = 0; i < dst.size(); ++i)
        std::memcpy(dst[i] + (a - c.begin), s.states[p.reader][i] + p.src + (a - p.dst),
                    static_cast<size_t>(z - a) * sizeof(float));
    }
  });
}

// Step 5: parameter `name`'s slice `p` from the model files (converted from the file's dtype).
void read_parameter(const ModelFiles& files, const SliceOf& slice_of, const std::string& name,
                    const Tensor& p) {
  DS_CHECK(p.is_contiguous(), "[checkpoint] internal: parameter {} is not contiguous", name);
  const detail::Slice want = slice_of(name, p.shape());
  const size_t es = dtype_size(p.dtype());
  auto* out = static_cast<unsigned char*>(p.raw_data());
  for (const detail::Source& src : files.sources.at(name)) {
    const safetensors::Reader& file = *files.readers[src.part];
    const safetensors::Entry& e = file.entry(name);
    const uint8_t* from = file.data_of(e);
    const std::vector<detail::Run> runs = detail::overlap_runs(src.slice, want);
    if (e.dtype == p.dtype()) {
      detail::copy_runs(runs, from, out, es);
      continue;
    }
    const size_t fs = dtype_size(e.dtype);
    for (const detail::Run& r : runs)
      convert(from + static_cast<size_t>(r.src) * fs, e.dtype,
              out + static_cast<size_t>(r.dst) * es, p.dtype(), static_cast<size_t>(r.len));
  }
}

// Runs `load`, putting `file` in front of the message of an error it throws (the state objects
// check their own fields).
template <typename F>
void in_file(const std::string& file, F&& load) {
  try {
    load();
  } catch (const Error& e) {
    DS_THROW("[checkpoint] {}: {}", file, e.what());
  }
}

}  // namespace

nlohmann::json Engine::load_checkpoint(const std::string& dir_in, const std::string& tag_in) {
  check_single_model_part("load_checkpoint");
  synchronize();  // a background optimizer step must not write the state being replaced
  // Each rank reads and checks its own files and streams its optimizer state first; a failure
  // there (a damaged shard, an I/O error in the swap file) is agreed on by every rank before the
  // collective part (stage 3's parameter pieces), so no rank waits for one that stopped.
  const std::string what = fmt::format("loading checkpoint {} on every rank", dir_in);
  comm::Group& world = options_.topology ? *options_.topology->world() : *group_;
  bool agreed = false;
  try {
    return load_checkpoint_files(dir_in, tag_in, [&] {
      agreed = true;
      comm::raise_if_any_failed(world, "", what);
    });
  } catch (const Error& e) {
    if (!agreed) comm::raise_if_any_failed(world, e.what(), what);
    throw;
  }
}

nlohmann::json Engine::load_checkpoint_files(const std::string& dir_in, const std::string& tag_in,
                                             const std::function<void()>& local_part_done) {
  CheckpointReader ckpt(dir_in, tag_in, CheckpointReader::Use::Resume,
                        group_->size() > 1 ? group_->rank() : -1);
  const comm::Grid grid = options_.topology ? options_.topology->grid() : comm::Grid{};
  // Every field is read and checked before any state changes.
  const ShardNames names = optimizer_shard_names(ckpt, training_dtype());
  const EngineRecord record = read_engine_record(ckpt);
  const ModelFiles files = open_model_files(ckpt);
  const std::map<std::string, Tensor> buffers =
      read_buffers(ckpt, *model_, options_.topology && grid.tp * grid.pp > 1);
  const SliceOf slice_of{detail::part_splits(*model_, true)};
  check_model_parameters(*model_, ckpt, files, slice_of, options_.topology && grid.pp > 1);
  OptimizerShards shards = open_optimizer_shards(ckpt, files, names, optimizer_->name(),
                                                 training_dtype() == DType::bf16);

  zero::StateStore& store = zero_->state();
  std::vector<std::string> state_names = {"fp32_master"};
  for (const auto& name : store.state_names()) state_names.push_back(name);
  const std::vector<Piece> pieces = plan_pieces(shards, ckpt, *zero_, slice_of, state_names);
  fill_state(store, pieces, shards);
  local_part_done();
  // Weights: stages 0-2 assemble every parameter (this rank's slice of it) from the model files
  // (in fp32 training the master weights are a view of them and the files hold the same values);
  // under stage 3 each rank's piece is the rounded master weights, exactly as after an optimizer
  // step.
  zero_->load_parameters([&](const std::string& name, const Tensor& p) {
    read_parameter(files, slice_of, name, p);
  });
  for (const auto& [name, b] : model_->named_buffers())
    if (auto it = buffers.find(name); it != buffers.end()) b.copy_from(it->second);
  in_file(shards.readers.front().path(), [&] {
    optimizer_->load_scalar_state(shards.scalar_state.get<std::map<std::string, double>>());
  });
  const std::string reset =
      detail::load_rank_state(*optimizer_, ckpt.folder(), group_->rank(),
                              options_.topology ? options_.topology->mp_rank() : 0, group_->size());
  if (!reset.empty()) log(reset);
  in_file((ckpt.folder() / kModelFile).string(), [&] {
    scheduler_.load_state_dict(record.lr_state);
    scaler_.load_state_dict(record.scaler_state);
  });
  global_steps_ = record.global_steps;
  global_samples_ = record.global_samples;
  skipped_steps_ = record.skipped_steps;
  micro_steps_ = record.micro_steps;
  consecutive_skips_ = record.consecutive_skips;
  rng::dropout_state().seed = record.dropout_seed;
  rng::dropout_state().offset = record.dropout_offset;
  zero_->zero_grads();
  return record.client_state;
}

}  // namespace ds::runtime
