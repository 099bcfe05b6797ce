// Engine checkpoints in DeepSpeed's layout (deepspeed/runtime/engine.py, save_checkpoint; ours in
// docs/checkpoints.md), with tensors in safetensors files and metadata in JSON:
//
//   dir/latest                                               the newest complete tag, written last
//   dir/<tag>/mp_rank_00_model_states.safetensors            module weights (training dtype) +
//                                                            engine state in the "ds_engine"
//                                                            metadata
//   dir/<tag>/[bf16_]zero_pp_rank_0_mp_rank_00_optim_states.safetensors
//                                                            fp32 master weights and moments
//                                                            (padding stripped) + "ds_optimizer"
//                                                            metadata
//   dir/<tag>/model_buffers.safetensors                      the module's buffers (not trained:
//                                                            BART's final_logits_bias), if any
//   dir/<tag>/checksums.json                                 size and XXH64 of every file above
//
// A tag is written into a hidden temporary folder and renamed into place only when every file is
// complete and fsynced, and `latest` is replaced after that: a crash at any point leaves the
// previous checkpoint intact and `latest` naming a complete one.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "checkpoint_format.h"
#include "checkpoint_parts.h"
#include "ds/comm/group.h"
#include "ds/core/checksum.h"
#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/core/rng.h"
#include "ds/core/safetensors.h"
#include "ds/core/text.h"
#include "ds/nn/tensor_parallel.h"
#include "ds/runtime/checkpoint_files.h"
#include "ds/runtime/checkpoint_reader.h"
#include "ds/runtime/engine.h"
#include "optimizer_shard.h"

namespace fs = std::filesystem;

namespace ds::runtime {
namespace {

using detail::hex64;
using detail::kModelFile;
using detail::Meta;
using detail::parse_metadata;
using detail::read_text;
using detail::trim;

constexpr int kFormatVersion = 1;

}  // namespace

std::vector<fs::path> remove_stale_checkpoint_temporaries(const fs::path& dir) {
  std::vector<fs::path> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  auto ends_with = [](const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool hidden_tag =
        name.size() > 1 && name[0] == '.' &&
        (ends_with(name, ".tmp") || ends_with(name, ".old") || ends_with(name, ".deleting"));
    const bool latest_tmp = name.rfind("latest.tmp-", 0) == 0;
    if ((hidden_tag && e.is_directory(ec)) || (latest_tmp && !e.is_directory(ec)))
      stale.push_back(e.path());
  }
  for (const auto& p : stale) {
    fs::remove_all(p, ec);
    DS_CHECK(!ec, "[checkpoint] cannot delete the stale temporary {}: {}", p.string(),
             ec.message());
    removed.push_back(p);
  }
  return removed;
}

std::string read_latest_tag(const fs::path& dir, const std::string& who) {
  const fs::path latest = dir / "latest";
  std::error_code ec;
  DS_CHECK(fs::exists(latest, ec),
           "{} {} has no 'latest' file: no complete checkpoint was written there; pass a tag (a "
           "global_step<N> folder) explicitly",
           who, dir.string());
  DS_CHECK(!fs::is_directory(latest, ec),
           "{} {} is a directory, not the file naming the newest checkpoint; remove or rename it, "
           "or pass a tag (a global_step<N> folder) explicitly",
           who, latest.string());
  DS_CHECK(fs::is_regular_file(latest, ec),
           "{} {} is not a regular file naming the newest checkpoint; remove or rename it, or "
           "pass a tag (a global_step<N> folder) explicitly",
           who, latest.string());
  const auto size = fs::file_size(latest, ec);
  DS_CHECK(!ec && size <= 4096,
           "{} {} is {} bytes, but it should hold one tag name (global_step<N>): it is damaged; "
           "pass a tag (a global_step<N> folder) explicitly",
           who, latest.string(), size);
  const std::string text = read_text(latest);
  std::string tag = trim(text.substr(0, text.find('\n')));
  DS_CHECK(!tag.empty(), "{} {} is empty; pass a tag (a global_step<N> folder) explicitly", who,
           latest.string());
  const bool printable = std::all_of(tag.begin(), tag.end(), [](char c) {
    return static_cast<unsigned char>(c) >= 0x20 && c != 0x7F;
  });
  DS_CHECK(printable,
           "{} {} names {}, which is not a checkpoint tag (a folder name such as global_step<N>): "
           "the file is damaged; pass a tag explicitly",
           who, latest.string(), quoted_excerpt(tag, 200));
  DS_CHECK(tag.find('/') == std::string::npos && tag != "." && tag != "..",
           "{} {} names {}, but a checkpoint tag must be a folder name inside the checkpoint "
           "folder (global_step<N>), not a path; to load another folder, pass that folder itself",
           who, latest.string(), quoted_excerpt(tag, 200));
  // Longer than any file name (NAME_MAX): looking the folder up would fail with ENAMETOOLONG and
  // a filesystem error that echoes all of it.
  DS_CHECK(tag.size() <= 255,
           "{} {} names {}, {} characters, longer than any folder name: the file is damaged; pass "
           "a tag (a global_step<N> folder) explicitly",
           who, latest.string(), quoted_excerpt(tag, 200), tag.size());
  return tag;
}

void delete_checkpoint(const fs::path& dir, const std::string& tag) {
  const fs::path from = dir / tag, away = dir / fmt::format(".{}.deleting", tag);
  std::error_code ec;
  fs::remove_all(away, ec);  // left by an earlier crash
  fs::rename(from, away, ec);
  DS_CHECK(!ec, "[checkpoint] cannot delete old checkpoint {} (renaming it to {} failed: {})",
           from.string(), away.filename().string(), ec.message());
  fsync_dir(dir);
  fs::remove_all(away, ec);
  DS_CHECK(!ec, "[checkpoint] cannot delete old checkpoint {} (now {}): {}", from.string(),
           away.string(), ec.message());
}

void Engine::check_single_model_part(const char* what) const {
  // Tensor-parallel parts and pipeline stages are written and read by full parameter name
  // (checkpoint_parts.h): every layout is supported. A pipeline stage's engine is driven by
  // runtime::PipelineEngine, whose save/load also restore the tied weight's copy.
  (void)what;
}

void Engine::save_checkpoint(const std::string& dir_in, const std::string& tag_in,
                             const nlohmann::json& client_state) {
  check_single_model_part("save_checkpoint");
  const fs::path dir(dir_in);
  const std::string tag = tag_in.empty() ? fmt::format("global_step{}", global_steps_) : tag_in;
  DS_CHECK(tag.find('/') == std::string::npos && tag != "." && tag != "..",
           "[checkpoint] tag '{}' must be a plain folder name", tag);
  synchronize();  // a background optimizer step writes the state being saved
  // ZeRO's ranks (the data-parallel group) write the optimizer shards of their model-parallel
  // part; every rank of the job takes part in the folder's phases.
  const int rank = group_->rank(), n = group_->size();
  comm::Group& world = options_.topology ? *options_.topology->world() : *group_;
  const int world_rank = world.rank();
  const int mp_size = options_.topology ? options_.topology->model_parallel()->size() : 1;
  const int mp_rank = options_.topology ? options_.topology->mp_rank() : 0;
  const fs::path tmp = dir / fmt::format(".{}.tmp", tag);
  // Every phase ends with a collective status check: a failure on one rank (a full disk, a
  // read-only or node-local folder) becomes an error on every rank, so no rank waits for a peer
  // that stopped, and the library never ends the process itself.
  const std::string what = "checkpoint " + tag;
  std::error_code ec;
  std::string error;
  if (world_rank == 0) {
    fs::path failed = dir;
    fs::create_directories(dir, ec);
    if (!ec) {
      failed = tmp;
      fs::remove_all(tmp, ec);
      fs::create_directories(tmp, ec);
    }
    if (ec)
      error = fmt::format("[checkpoint] cannot create {}: {} (is the path writable?)",
                          failed.string(), ec.message());
  }
  comm::raise_if_any_failed(world, error, what + ": creating the folder");
  if (world_rank != 0 && !fs::is_directory(tmp)) {
    // The classic multi-node mistake: a node-local folder (/tmp, a local disk) as the output.
    error = fmt::format(
        "[checkpoint] rank {} does not see the folder {} that rank 0 just created: every rank "
        "writes its shard into one folder, so with several nodes the checkpoint folder must be on "
        "a filesystem that every node mounts (NFS, Lustre, ...); choose such an output folder",
        world_rank, tmp.string());
  }
  comm::raise_if_any_failed(world, error, what + ": opening the folder on every rank");

  // Stage 3: gather each parameter in turn (a collective) so that rank 0 writes a complete model
  // file that any world size and stage can load (DeepSpeed's
  // stage3_gather_16bit_weights_on_model_save). With tensor parallelism these are this rank's
  // slices, and every file says which part of each whole parameter it holds.
  std::vector<std::pair<std::string, Tensor>> weights = zero_->full_weights();
  std::map<std::string, nn::TPSplit> splits;
  if (mp_size > 1) splits = nn::tp_splits(*model_);
  auto slice_of = [&](const std::string& name, const Shape& local) {
    auto it = splits.find(name);
    return detail::Slice::of(local, it == splits.end() ? nn::TPSplit{} : it->second);
  };

  try {
    if (rank == 0) {
      // Model states: every parameter by name in the training dtype, plus the engine state.
      nlohmann::json engine_state = {
          {"format_version", kFormatVersion},
          {"global_steps", global_steps_},
          {"global_samples", global_samples_},
          {"skipped_steps", skipped_steps_},
          {"micro_steps", micro_steps_},
          {"consecutive_skips", consecutive_skips_},
          {"lr_scheduler", scheduler_.state_dict()},
          {"loss_scaler", scaler_.state_dict()},
          {"dropout_rng",
           {{"seed", rng::dropout_state().seed}, {"offset", rng::dropout_state().offset}}},
          {"world_size", n},
          {"zero_stage", zero_stage()},
          {"dtype", dtype_name(training_dtype())},
          {"grad_dtype", dtype_name(grad_dtype())},
          {"ds_config_source", config_.source},
          {"client_state", client_state},
      };
      std::map<std::string, std::string> meta;
      if (mp_size > 1) {
        const comm::Grid& g = options_.topology->grid();
        engine_state["model_parallel"] = {{"tp", g.tp}, {"pp", g.pp}, {"mp_rank", mp_rank}};
        nlohmann::json slices = nlohmann::json::object();
        for (const auto& [name, t] : weights) slices[name] = slice_of(name, t.shape()).to_json();
        meta["ds_slices"] = slices.dump();
      }
      meta["ds_engine"] = engine_state.dump();
      safetensors::save((tmp / detail::model_file_name(mp_rank)).string(), weights, meta);
      // Buffers are not parameters (no master weights, no optimizer state): their own file, so
      // that a resume or ds_to_fp32 without the model's source folder still has them. One file for
      // the whole model: written without model parallelism only (no model with buffers runs
      // under tensor or pipeline parallelism; each part would hold only its own).
      std::vector<std::pair<std::string, Tensor>> buffers;
      for (const auto& [name, b] : model_->named_buffers()) {
        Tensor host = Tensor::empty(b.shape(), b.dtype(), kCPU);
        host.copy_from(b);
        buffers.emplace_back(name, host);
      }
      if (!buffers.empty() && mp_size == 1)
        safetensors::save((tmp / detail::kBuffersFile).string(), buffers);
    }

    // Optimizer shard: this rank's fp32 master weights and moments. `segments` maps them to the
    // flat coordinates (the unpadded concatenation of all parameters of this model-parallel
    // part): one range for stages 0-2, one piece per parameter for stage 3. Stage 0 ranks all hold
    // the same full state: rank 0 writes it once.
    const bool sharded = zero_->partitioned();
    if (sharded || rank == 0) {
      nlohmann::json segments = nlohmann::json::array();
      int64_t count = 0;  // elements of the buffers written: up to the end of the last range held
      for (const zero::HeldRange& h : zero_->held_ranges()) {
        segments.push_back({h.flat_begin, h.flat_end, h.offset});
        count = std::max(count, h.offset + (h.flat_end - h.flat_begin));
      }
      nlohmann::json names = nlohmann::json::array(), shapes = nlohmann::json::array(),
                     offsets = nlohmann::json::array(), slices = nlohmann::json::array();
      const nn::FlatParameters& flat = zero_->flat();
      for (const auto& e : flat.entries) {
        names.push_back(e.name);
        shapes.push_back(e.shape);
        offsets.push_back(e.offset);
        slices.push_back(slice_of(e.name, e.shape).to_json());
      }
      nlohmann::json opt_state = {
          {"format_version", kFormatVersion},
          {"optimizer", optimizer_->name()},
          {"scalar_state", optimizer_->scalar_state()},
          {"param_names", names},
          {"param_shapes", shapes},
          {"param_offsets", offsets},
          {"numel", flat.numel},
          {"padding", zero_->plan().padded_numel - flat.numel},
          {"segments", segments},
          {"partition_count", sharded ? n : 1},
          {"zero_stage", zero_stage()},
          {"rank", rank},
      };
      if (mp_size > 1) {
        // param_shapes are this part's local shapes; param_slices say where they sit in the
        // whole parameters, so that any layout can take its elements from here.
        opt_state["param_slices"] = slices;
        opt_state["mp_rank"] = mp_rank;
      }
      // Streamed sub-group by sub-group from wherever the state lives (RAM, or NVMe swap files:
      // each sub-group is read once and never held whole).
      zero::StateStore& store = zero_->state();
      std::vector<safetensors::Declared> declared = {{"fp32_master", DType::f32, {count}}};
      for (const auto& name : store.state_names()) declared.push_back({name, DType::f32, {count}});
      safetensors::save_streamed(
          (tmp /
           detail::optim_file_name(training_dtype() == DType::bf16, sharded ? rank : 0, mp_rank))
              .string(),
          declared, {{"ds_optimizer", opt_state.dump()}},
          [&](const safetensors::WriteAt& write_at) {
            store.for_each(zero::Access::Read, [&](const zero::StateChunk& c) {
              const int64_t n = std::min(c.numel, count - c.begin);
              if (n <= 0) return;
              const uint64_t at = static_cast<uint64_t>(c.begin) * sizeof(float),
                             bytes = static_cast<uint64_t>(n) * sizeof(float);
              write_at(0, at, c.master, bytes);
              for (size_t i = 0; i < c.states.size(); ++i) write_at(i + 1, at, c.states[i], bytes);
            });
          });
    }
  } catch (const std::exception& e) {
    error = fmt::format(
        "[checkpoint] rank {} failed writing {}: {} (is the disk full or the folder read-only?)",
        world_rank, (dir / tag).string(), e.what());
  }
  try {
    comm::raise_if_any_failed(world, error, what + ": writing the files");
  } catch (const Error&) {
    if (world_rank == 0) fs::remove_all(tmp, ec);  // half-written: never leave it for a later load
    throw;
  }

  if (world_rank == 0) {
    try {
      nlohmann::json sums = nlohmann::json::object();
      for (const auto& entry : fs::directory_iterator(tmp)) {
        const std::string f = entry.path().filename().string();
        uint64_t size = 0;
        const uint64_t h = file_xxh64(entry.path(), &size);
        sums[f] = {{"bytes", size}, {"xxh64", hex64(h)}};
      }
      write_file_atomic(tmp / "checksums.json", sums.dump(2) + "\n");
      fsync_dir(tmp);
      // Swap the complete folder into place; an older folder of the same tag goes only after.
      const fs::path final_dir = dir / tag;
      const fs::path old = dir / fmt::format(".{}.old", tag);
      fs::remove_all(old, ec);
      if (fs::exists(final_dir)) fs::rename(final_dir, old);
      fs::rename(tmp, final_dir);
      fsync_dir(dir);
      fs::remove_all(old, ec);
      write_file_atomic(dir / "latest", tag + "\n");
    } catch (const std::exception& e) {
      error = fmt::format("[checkpoint] finishing {} failed: {} (is the disk full?)",
                          (dir / tag).string(), e.what());
      fs::remove_all(tmp, ec);
    }
  }
  comm::raise_if_any_failed(world, error, what + ": the checksums and `latest`");
}

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
  const fs::path ck = ckpt.folder();
  const fs::path& sums_path = ckpt.checksums_path();
  auto verify = [&](const std::string& f) { ckpt.verify(f); };
  // Optimizer shards by model-parallel part and data-parallel rank.
  const bool bf16 = training_dtype() == DType::bf16;
  const std::map<int, std::map<int, std::string>> shard_names = ckpt.optimizer_files(bf16);
  if (shard_names.empty()) {
    DS_CHECK(ckpt.optimizer_files(!bf16).empty(),
             "[checkpoint] {} was written by a {} run; this run trains in {} (DeepSpeed names the "
             "bf16 optimizer files differently). Resume with the same precision",
             ck.string(), bf16 ? "non-bf16" : "bf16", dtype_name(training_dtype()));
    DS_THROW("[checkpoint] {} holds no optimizer shard (zero_pp_rank_*_optim_states.safetensors)",
             ck.string());
  }

  // Model states: the engine state is in part 0's file (every part's holds the same).
  std::vector<const safetensors::Reader*> model_readers = {&ckpt.model_file()};
  std::vector<std::unique_ptr<safetensors::Reader>> other_parts;  // mp_rank_01 and on
  const Meta engine_state(ckpt.engine_state(), (ck / kModelFile).string(), "ds_engine");
  // Every field is read (and type-checked) before any state changes, so a damaged file leaves the
  // engine as it was.
  const int64_t global_steps = ckpt.global_steps();
  const int64_t global_samples = engine_state.integer("global_samples");
  const int64_t skipped_steps = engine_state.integer("skipped_steps");
  const int64_t micro_steps = engine_state.integer("micro_steps");
  const int64_t consecutive_skips =
      engine_state.has("consecutive_skips") ? engine_state.integer("consecutive_skips") : 0;
  const nlohmann::json lr_state = engine_state.object("lr_scheduler").json();
  const nlohmann::json scaler_state = engine_state.object("loss_scaler").json();
  const Meta dropout = engine_state.object("dropout_rng");
  const uint64_t dropout_seed = dropout.unsigned64("seed"),
                 dropout_offset = dropout.unsigned64("offset");
  nlohmann::json client_state = ckpt.client_state();
  // The layout that wrote it: one part (mp_rank_00) unless ds_engine.model_parallel says more.
  const auto [ck_tp, ck_pp] = ckpt.model_parallel();
  const int ck_mp = ck_tp * ck_pp;
  const std::string layout = fmt::format("tp={} pp={}", ck_tp, ck_pp);
  const nlohmann::json& sums = ckpt.checksums();
  for (auto it = sums.begin(); it != sums.end(); ++it)
    if (auto mp = detail::parse_model_file_name(it.key()))
      DS_CHECK(*mp < ck_mp,
               "[checkpoint] {} lists {}, but {} says the checkpoint was written with {} ({} "
               "model-parallel part(s)): the folder mixes saves of different layouts",
               sums_path.string(), it.key(), (ck / kModelFile).string(), layout, ck_mp);
  for (int k = 1; k < ck_mp; ++k) {
    const std::string f = detail::model_file_name(k);
    DS_CHECK(ckpt.lists(f) && fs::exists(ck / f),
             "[checkpoint] {} is missing: the checkpoint was written with {} ({} model-parallel "
             "parts, mp_rank_00 to mp_rank_{:02d}); copy it from the run's checkpoint folder",
             (ck / f).string(), layout, ck_mp, ck_mp - 1);
    other_parts.push_back(std::make_unique<safetensors::Reader>((ck / f).string()));
    model_readers.push_back(other_parts.back().get());
  }
  // Which part of every whole parameter each model file holds.
  std::vector<detail::PartIndex> model_parts;
  for (int k = 0; k < ck_mp; ++k) {
    const safetensors::Reader& r = *model_readers[static_cast<size_t>(k)];
    detail::PartIndex part{r.path(), {}};
    if (ck_mp == 1 && !r.metadata().count("ds_slices")) {
      for (const auto& e : r.entries()) part.slices[e.name] = detail::Slice::whole(e.shape);
    } else {
      const nlohmann::json sl = parse_metadata(r, "ds_slices", "[checkpoint]");
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
    }
    model_parts.push_back(std::move(part));
  }
  const auto model_sources = detail::plan_sources(model_parts, ck.string(), "[checkpoint]");
  // The model's buffers, when the checkpoint has them (older ones do not: the buffers then keep
  // the values the model was built or loaded with). Exactly the model's names and shapes (a
  // model-parallel part takes those it has).
  std::map<std::string, Tensor> file_buffers;
  const bool part_only = options_.topology && options_.topology->grid().tp *
                                                      options_.topology->grid().pp >
                                                  1;
  if (ckpt.lists(detail::kBuffersFile)) {
    const fs::path bf = ck / detail::kBuffersFile;
    ckpt.verify(detail::kBuffersFile);
    file_buffers = safetensors::load(bf.string());
    std::vector<std::string> bad;
    std::set<std::string> model_buffers;
    for (const auto& [name, b] : model_->named_buffers()) {
      model_buffers.insert(name);
      const auto it = file_buffers.find(name);
      if (it == file_buffers.end()) {
        if (!part_only) bad.push_back("missing " + name);
      }
      else if (it->second.shape() != b.shape())
        bad.push_back(fmt::format("{}: shape {} in the file, {} in the model", name,
                                  shape_str(it->second.shape()), shape_str(b.shape())));
    }
    for (const auto& [name, t] : file_buffers)
      if (!model_buffers.count(name) && !part_only) bad.push_back("unexpected " + name);
    DS_CHECK(bad.empty(), "[checkpoint] {} does not match this model's buffers: {}", bf.string(),
             fmt::join(bad, "; "));
  }

  // This rank's part of every parameter (whole without tensor parallelism).
  const std::map<std::string, nn::TPSplit> splits = nn::tp_splits(*model_);
  auto slice_of = [&](const std::string& name, const Shape& local) {
    auto it = splits.find(name);
    return detail::Slice::of(local, it == splits.end() ? nn::TPSplit{} : it->second);
  };

  // Model weights: exactly our names and whole shapes.
  const std::string model_where =
      ck_mp == 1 ? (ck / kModelFile).string()
                 : fmt::format("{} (mp_rank_*_model_states.safetensors)", ck.string());
  auto params = model_->named_parameters();
  std::vector<std::string> problems;
  std::set<std::string> ours;
  std::set<size_t> model_parts_read;
  for (auto& [name, p] : params) {
    ours.insert(name);
    auto it = model_sources.find(name);
    if (it == model_sources.end()) {
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
      if (detail::overlap_numel(s.slice, want) > 0) model_parts_read.insert(s.part);
  }
  // A pipeline stage holds some of the checkpoint's parameters; the others are other stages'.
  const bool stage_only = options_.topology && options_.topology->grid().pp > 1;
  for (const auto& [name, v] : model_sources)
    if (!ours.count(name) && !stage_only) problems.push_back("unexpected " + name);
  bool lora_names = false;
  for (const auto& pr : problems)
    lora_names = lora_names || pr.find(".lora_A.") != std::string::npos ||
                 pr.find(".lora_B.") != std::string::npos;
  DS_CHECK(problems.empty(), "[checkpoint] {} does not match this model: {}{}", model_where,
           fmt::join(problems, "; "),
           lora_names ? " (LoRA matrices differ: resume with the LoRA settings the checkpoint was "
                        "written with, --lora_dim and --lora_module_name)"
                      : "");
  for (size_t k : model_parts_read) {
    verify(fs::path(model_parts[k].file).filename().string());
    for (const auto& e : model_readers[k]->entries())
      DS_CHECK(
          e.supported && (e.dtype == DType::f32 || e.dtype == DType::bf16 || e.dtype == DType::f16),
          "[checkpoint] {}: {} is stored as {}, not a floating type", model_parts[k].file, e.name,
          e.dtype_name);
  }

  // Optimizer shards: whatever (dp, tp, pp) and stage wrote them, take the elements this rank
  // holds. Each shard lists its part's flat layout (names, local shapes, offsets, slices) and the
  // flat ranges it stores ("segments"); a parameter's elements are found through its slices.
  const std::vector<zero::HeldRange> held = zero_->held_ranges();
  const nn::FlatParameters& flat = zero_->flat();
  zero::StateStore& store = zero_->state();
  std::vector<std::string> state_names = {"fp32_master"};
  for (const auto& name : store.state_names()) state_names.push_back(name);
  int64_t needed = 0;
  for (const auto& h : held) needed += h.flat_end - h.flat_begin;

  struct Piece {
    size_t reader;
    int64_t src, dst, len;  // elements: offset in the file's tensors, offset in our buffers
  };
  struct Segment {
    int64_t begin, end, offset;  // flat [begin, end) of the part, at `offset` in the file
    size_t reader;
  };
  std::vector<safetensors::Reader> readers;
  std::vector<std::string> reader_files;
  std::vector<std::vector<const float*>> sources;  // per reader, per state name (lazily)
  std::vector<std::vector<Segment>> part_segments(static_cast<size_t>(ck_mp));
  std::vector<detail::PartIndex> opt_parts(static_cast<size_t>(ck_mp));
  std::vector<std::map<std::string, int64_t>> part_offsets(static_cast<size_t>(ck_mp));
  std::vector<std::string> opt_first(static_cast<size_t>(ck_mp));
  nlohmann::json scalar_state;
  for (const auto& [mp, by_dp] : shard_names) {
    DS_CHECK(mp < ck_mp,
             "[checkpoint] {} lists {}, but {} says the checkpoint was written with {} ({} "
             "model-parallel part(s)): the folder mixes saves of different layouts",
             sums_path.string(), by_dp.begin()->second, (ck / kModelFile).string(), layout, ck_mp);
    int64_t partition_count = 0;
    detail::ShardMeta first;  // the part's first shard: the others must repeat its layout
    for (const auto& [dp, f] : by_dp) {
      const std::string path = (ck / f).string();
      DS_CHECK(fs::exists(ck / f),
               "[checkpoint] {} is missing (checksums.json lists it): the checkpoint is "
               "incomplete; copy the file from the run's checkpoint folder",
               path);
      readers.emplace_back(path);
      reader_files.push_back(f);
      sources.emplace_back();
      detail::ShardMeta shard =
          detail::read_shard_meta(readers.back(), CheckpointReader::Use::Resume);
      const Meta meta(shard.json, path, "ds_optimizer");
      const std::string opt_name = meta.string("optimizer");
      DS_CHECK(opt_name == optimizer_->name(),
               "[checkpoint] {} was written with the {} optimizer; this run uses {}", path,
               opt_name, optimizer_->name());
      const Meta scalars = meta.object("scalar_state");
      for (const auto& [k, v] : scalars.json().items())
        if (!v.is_number()) meta.bad("scalar_state." + k, v, "a number");
      if (scalar_state.is_null()) scalar_state = scalars.json();
      const size_t m = static_cast<size_t>(mp);
      if (opt_first[m].empty()) {
        opt_first[m] = path;
        partition_count = shard.partition_count;
        detail::PartIndex part{path, {}};
        for (const detail::ShardParameter& p :
             detail::shard_parameters(shard, CheckpointReader::Use::Resume)) {
          part.slices[p.name] = p.slice;
          part_offsets[m][p.name] = p.offset;
        }
        opt_parts[m] = std::move(part);
      } else {
        DS_CHECK(shard.partition_count == partition_count,
                 "[checkpoint] {} was written by {} data-parallel partitions, {} by {}: the folder "
                 "mixes shards of different saves; use the files of one save only",
                 path, shard.partition_count, opt_first[m], partition_count);
        DS_CHECK(shard.same_layout(first),
                 "[checkpoint] {} lists other parameters (names, shapes, offsets or slices) than "
                 "{}: the folder mixes shards of different saves; use the files of one save only",
                 path, opt_first[m]);
      }
      for (const detail::ShardSegment& seg : shard.segments)
        part_segments[m].push_back({seg.begin, seg.end, seg.offset, readers.size() - 1});
      if (first.file.empty()) first = std::move(shard);
    }
    for (int64_t d = 0; d < partition_count; ++d)
      DS_CHECK(by_dp.count(static_cast<int>(d)),
               "[checkpoint] {} is missing: the optimizer state of model-parallel part {} was "
               "written by {} data-parallel ranks; copy the file from the run's checkpoint folder",
               (ck / detail::optim_file_name(bf16, static_cast<int>(d), mp)).string(), mp,
               partition_count);
    DS_CHECK(by_dp.rbegin()->first < partition_count,
             "[checkpoint] {} says the run had {} data-parallel partitions, but {} is there: the "
             "folder mixes shards of different saves",
             opt_first[static_cast<size_t>(mp)], partition_count, by_dp.rbegin()->second);
  }
  for (int k = 0; k < ck_mp; ++k)
    DS_CHECK(!opt_first[static_cast<size_t>(k)].empty(),
             "[checkpoint] {} holds no optimizer shard of model-parallel part {} ({} is missing); "
             "the checkpoint is incomplete",
             ck.string(), k, detail::optim_file_name(bf16, 0, k));
  for (auto& segs : part_segments)
    std::sort(segs.begin(), segs.end(),
              [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
  const auto opt_sources = detail::plan_sources(opt_parts, ck.string(), "[checkpoint]");

  // The state tensors of shard `r`, verified once, on first use.
  auto state_of = [&](size_t r) -> const std::vector<const float*>& {
    auto& src = sources[r];
    if (!src.empty()) return src;
    verify(reader_files[r]);
    const safetensors::Reader& reader = readers[r];
    for (const auto& name : state_names) {
      int64_t have = 0;
      const float* data = detail::shard_tensor(reader, name, CheckpointReader::Use::Resume, &have);
      for (const auto& segs : part_segments)
        for (const Segment& s : segs)
          DS_CHECK(s.reader != r || s.offset + (s.end - s.begin) <= have,
                   "[checkpoint] {}: segment [{}, {}) at offset {} reads past the {} elements of "
                   "'{}'; the file is damaged",
                   reader.path(), s.begin, s.end, s.offset, have, name);
      src.push_back(data);
    }
    return src;
  };
  std::vector<Piece> pieces;
  int64_t covered = 0;
  for (const auto& e : flat.entries) {
    const int64_t e_numel = e.numel;
    bool wanted = false;
    for (const auto& h : held)
      wanted =
          wanted || std::max(h.flat_begin, e.offset) < std::min(h.flat_end, e.offset + e_numel);
    if (!wanted) continue;
    auto it = opt_sources.find(e.name);
    DS_CHECK(it != opt_sources.end(),
             "[checkpoint] the optimizer shards in {} hold no state for parameter {}; the "
             "checkpoint was written by another model (or other LoRA settings)",
             ck.string(), e.name);
    const detail::Slice want = slice_of(e.name, e.shape);
    DS_CHECK(it->second.front().slice.full == want.full,
             "[checkpoint] {}: parameter {} is whole {} in the optimizer shards, {} in this model",
             ck.string(), e.name, shape_str(it->second.front().slice.full), shape_str(want.full));
    for (const detail::Source& src : it->second) {
      const int64_t base = part_offsets[src.part].at(e.name);
      const std::vector<Segment>& segs = part_segments[src.part];
      for (const detail::Run& r : detail::overlap_runs(src.slice, want)) {
        for (const auto& h : held) {
          const int64_t a = std::max(h.flat_begin, e.offset + r.dst),
                        z = std::min(h.flat_end, e.offset + r.dst + r.len);
          if (a >= z) continue;
          const int64_t s0 = base + r.src + (a - e.offset - r.dst),
                        d0 = h.offset + (a - h.flat_begin);
          const int64_t s1 = s0 + (z - a);
          auto sit = std::upper_bound(segs.begin(), segs.end(), s0,
                                      [](int64_t v, const Segment& s) { return v < s.begin; });
          if (sit != segs.begin()) --sit;
          for (; sit != segs.end() && sit->begin < s1; ++sit) {
            const int64_t x = std::max(s0, sit->begin), y = std::min(s1, sit->end);
            if (x >= y) continue;
            state_of(sit->reader);
            pieces.push_back({sit->reader, sit->offset + (x - sit->begin), d0 + (x - s0), y - x});
            covered += y - x;
          }
        }
      }
    }
  }
  DS_CHECK(covered == needed,
           "[checkpoint] the optimizer shards in {} cover {} of the {} elements this rank needs; a "
           "shard file is missing or the shards overlap",
           ck.string(), covered, needed);
  store.for_each(zero::Access::Overwrite, [&](const zero::StateChunk& c) {
    std::vector<float*> dst = {c.master};
    dst.insert(dst.end(), c.states.begin(), c.states.end());
    for (float* d : dst) std::fill(d, d + c.numel, 0.0f);
    for (const Piece& p : pieces) {
      const int64_t a = std::max(p.dst, c.begin), z = std::min(p.dst + p.len, c.begin + c.numel);
      if (a >= z) continue;
      for (size_t i = 0; i < dst.size(); ++i)
        std::memcpy(dst[i] + (a - c.begin), sources[p.reader][i] + p.src + (a - p.dst),
                    static_cast<size_t>(z - a) * sizeof(float));
    }
  });
  local_part_done();
  // Weights: stages 0-2 assemble every parameter (this rank's slice of it) from the model files
  // (in fp32 training the master weights are a view of them and the files hold the same values);
  // under stage 3 each rank's piece is the rounded master weights, exactly as after an optimizer
  // step.
  zero_->load_parameters([&](const std::string& name, const Tensor& p) {
    DS_CHECK(p.is_contiguous(), "[checkpoint] internal: parameter {} is not contiguous", name);
    const detail::Slice want = slice_of(name, p.shape());
    const size_t es = dtype_size(p.dtype());
    auto* out = static_cast<unsigned char*>(p.raw_data());
    for (const detail::Source& src : model_sources.at(name)) {
      const safetensors::Reader& file = *model_readers[src.part];
      const safetensors::Entry& e = file.entry(name);
      const uint8_t* from = file.data_of(e);
      const std::vector<detail::Run> runs = detail::overlap_runs(src.slice, want);
      if (e.dtype == p.dtype()) {
        detail::copy_runs(runs, from, out, es);
      } else {
        const size_t fs = dtype_size(e.dtype);
        for (const detail::Run& r : runs)
          convert(from + static_cast<size_t>(r.src) * fs, e.dtype,
                  out + static_cast<size_t>(r.dst) * es, p.dtype(), static_cast<size_t>(r.len));
      }
    }
  });
  for (const auto& [name, b] : model_->named_buffers())
    if (auto it = file_buffers.find(name); it != file_buffers.end()) b.copy_from(it->second);
  // The state objects check their own fields; their messages get the file's name in front.
  const std::string model_path = (ck / kModelFile).string();
  auto in_file = [](const std::string& file, auto&& load) {
    try {
      load();
    } catch (const Error& e) {
      DS_THROW("[checkpoint] {}: {}", file, e.what());
    }
  };
  in_file(readers.front().path(), [&] {
    optimizer_->load_scalar_state(scalar_state.get<std::map<std::string, double>>());
  });
  in_file(model_path, [&] {
    scheduler_.load_state_dict(lr_state);
    scaler_.load_state_dict(scaler_state);
  });
  global_steps_ = global_steps;
  global_samples_ = global_samples;
  skipped_steps_ = skipped_steps;
  micro_steps_ = micro_steps;
  consecutive_skips_ = consecutive_skips;
  rng::dropout_state().seed = dropout_seed;
  rng::dropout_state().offset = dropout_offset;
  zero_->zero_grads();
  return client_state;
}

}  // namespace ds::runtime
