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
#include "checkpoint_rank_state.h"
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

namespace {

// The checkpoint folder and the tag's temporary folder, by rank 0; the error ("" on success).
std::string create_folders(const fs::path& dir, const fs::path& tmp) {
  std::error_code ec;
  fs::path failed = dir;
  fs::create_directories(dir, ec);
  if (!ec) {
    failed = tmp;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
  }
  return ec ? fmt::format("[checkpoint] cannot create {}: {} (is the path writable?)",
                          failed.string(), ec.message())
            : "";
}

// Checksums of every file in `tmp`, then `tmp` renamed to dir/tag (an older folder of that tag
// goes only after) and `latest` replaced: by rank 0, once every rank's files are complete.
void publish(const fs::path& dir, const fs::path& tmp, const std::string& tag) {
  nlohmann::json sums = nlohmann::json::object();
  for (const auto& entry : fs::directory_iterator(tmp)) {
    const std::string f = entry.path().filename().string();
    uint64_t size = 0;
    const uint64_t h = file_xxh64(entry.path(), &size);
    sums[f] = {{"bytes", size}, {"xxh64", hex64(h)}};
  }
  write_file_atomic(tmp / "checksums.json", sums.dump(2) + "\n");
  fsync_dir(tmp);
  std::error_code ec;
  const fs::path final_dir = dir / tag;
  const fs::path old = dir / fmt::format(".{}.old", tag);
  fs::remove_all(old, ec);
  if (fs::exists(final_dir)) fs::rename(final_dir, old);
  fs::rename(tmp, final_dir);
  fsync_dir(dir);
  fs::remove_all(old, ec);
  write_file_atomic(dir / "latest", tag + "\n");
}

// Which slice of each whole parameter this rank's tensors are (whole without model parallelism).
std::function<detail::Slice(const std::string&, const Shape&)> slices_of(nn::Module& model,
                                                                        bool model_parallel) {
  std::map<std::string, nn::TPSplit> splits = detail::part_splits(model, model_parallel);
  return [splits = std::move(splits)](const std::string& name, const Shape& local) {
    auto it = splits.find(name);
    return detail::Slice::of(local, it == splits.end() ? nn::TPSplit{} : it->second);
  };
}

}  // namespace

nlohmann::json Engine::checkpoint_record(const nlohmann::json& client_state) const {
  nlohmann::json record = {
      {"format_version", kFormatVersion},
      {"global_steps", global_steps_},
      {"global_samples", global_samples_},
      {"skipped_steps", skipped_steps_},
      {"micro_steps", micro_steps_},
      {"consecutive_skips", consecutive_skips_},
      {"lr_scheduler", scheduler_.state_dict()},
      {"loss_scaler", scaler_.state_dict()},
      {"dropout_rng", {{"seed", rng::dropout_state().seed}, {"offset", rng::dropout_state().offset}}},
      {"world_size", group_->size()},
      {"zero_stage", zero_stage()},
      {"dtype", dtype_name(training_dtype())},
      {"grad_dtype", dtype_name(grad_dtype())},
      {"ds_config_source", config_.source},
      {"client_state", client_state},
  };
  if (options_.topology && options_.topology->model_parallel()->size() > 1) {
    const comm::Grid& g = options_.topology->grid();
    record["model_parallel"] = {{"tp", g.tp}, {"pp", g.pp}, {"mp_rank", options_.topology->mp_rank()}};
  }
  if (experts_.expert)
    record["expert_parallel"] = {{"size", experts_.expert->size()},
                                 {"rank", experts_.expert->rank()}};
  return record;
}

void Engine::write_model_states(const std::string& tmp,
                                const std::vector<std::pair<std::string, Tensor>>& weights,
                                const nlohmann::json& client_state) const {
  // Every parameter by name in the training dtype, plus the engine record; with model
  // parallelism, which part of each whole parameter the file holds.
  const bool mp = options_.topology && options_.topology->model_parallel()->size() > 1;
  const int mp_rank = options_.topology ? options_.topology->mp_rank() : 0;
  const int ep_rank = experts_.expert ? experts_.expert->rank() : 0;
  std::map<std::string, std::string> meta;
  if (mp || experts_.expert) {
    const auto slice_of = slices_of(*model_, mp);
    nlohmann::json slices = nlohmann::json::object();
    for (const auto& [name, t] : weights) slices[name] = slice_of(name, t.shape()).to_json();
    meta["ds_slices"] = slices.dump();
  }
  meta["ds_engine"] = checkpoint_record(client_state).dump();
  safetensors::save((fs::path(tmp) / detail::model_file_name(mp_rank, ep_rank)).string(), weights,
                    meta);
  // Buffers are not parameters (no master weights, no optimizer state): their own file, so that a
  // resume or ds_to_fp32 without the model's source folder still has them. One file for the whole
  // model: written without model parallelism only (no model with buffers runs under tensor or
  // pipeline parallelism; each part would hold only its own).
  std::vector<std::pair<std::string, Tensor>> buffers;
  for (const auto& [name, b] : model_->named_buffers()) {
    Tensor host = Tensor::empty(b.shape(), b.dtype(), kCPU);
    host.copy_from(b);
    buffers.emplace_back(name, host);
  }
  if (!buffers.empty() && !mp && ep_rank == 0)
    safetensors::save((fs::path(tmp) / detail::kBuffersFile).string(), buffers);
}

void Engine::write_optimizer_shard(const std::string& tmp) const {
  // This rank's fp32 master weights and moments. `segments` maps them to the flat coordinates (the
  // unpadded concatenation of all parameters of this model-parallel part): one range for stages
  // 0-2, one piece per parameter for stage 3.
  const bool sharded = zero_->partitioned();
  const bool mp = options_.topology && options_.topology->model_parallel()->size() > 1;
  // The ranks the state is partitioned over: the data-parallel group (MiCS: the shard group).
  const comm::Group& shards = zero_->group();
  const int rank = shards.rank(), mp_rank = options_.topology ? options_.topology->mp_rank() : 0;
  nlohmann::json segments = nlohmann::json::array();
  int64_t count = 0;  // elements of the buffers written: up to the end of the last range held
  for (const zero::HeldRange& h : zero_->held_ranges()) {
    segments.push_back({h.flat_begin, h.flat_end, h.offset});
    count = std::max(count, h.offset + (h.flat_end - h.flat_begin));
  }
  const auto slice_of = slices_of(*model_, mp);
  const bool parts = mp || experts_.expert;
  const int ep_rank = experts_.expert ? experts_.expert->rank() : 0;
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
      {"partition_count", sharded ? shards.size() : 1},
      {"zero_stage", zero_stage()},
      {"rank", rank},
  };
  if (parts) {
    // param_shapes are this part's local shapes; param_slices say where they sit in the whole
    // parameters, so that any layout can take its elements from here.
    opt_state["param_slices"] = slices;
    opt_state["mp_rank"] = mp_rank;
    if (experts_.expert) opt_state["ep_rank"] = ep_rank;
  }
  // Streamed sub-group by sub-group from wherever the state lives (RAM, or NVMe swap files: each
  // sub-group is read once and never held whole).
  zero::StateStore& store = zero_->state();
  std::vector<safetensors::Declared> declared = {{"fp32_master", DType::f32, {count}}};
  for (const auto& name : store.state_names()) declared.push_back({name, DType::f32, {count}});
  const std::string file =
      detail::optim_file_name(training_dtype() == DType::bf16, sharded ? rank : 0, mp_rank, ep_rank);
  safetensors::save_streamed(
      (fs::path(tmp) / file).string(), declared, {{"ds_optimizer", opt_state.dump()}},
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

void Engine::save_checkpoint(const std::string& dir_in, const std::string& tag_in,
                             const nlohmann::json& client_state) {
  check_single_model_part("save_checkpoint");
  const fs::path dir(dir_in);
  const std::string tag = tag_in.empty() ? fmt::format("global_step{}", global_steps_) : tag_in;
  DS_CHECK(tag.find('/') == std::string::npos && tag != "." && tag != "..",
           "[checkpoint] tag '{}' must be a plain folder name", tag);
  synchronize();  // a background optimizer step writes the state being saved
  // ZeRO's ranks (the data-parallel group) write the optimizer shards of their model-parallel
  // part; every rank of the job takes part in the folder's phases. Every phase ends with a
  // collective status check: a failure on one rank (a full disk, a read-only or node-local
  // folder) becomes an error on every rank, so no rank waits for a peer that stopped, and the
  // library never ends the process itself.
  comm::Group& world = options_.topology ? *options_.topology->world() : *group_;
  const int world_rank = world.rank();
  const fs::path tmp = dir / fmt::format(".{}.tmp", tag);
  const std::string what = "checkpoint " + tag;
  std::error_code ec;
  std::string error = world_rank == 0 ? create_folders(dir, tmp) : "";
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
  const std::vector<std::pair<std::string, Tensor>> weights = zero_->full_weights();
  try {
    // The strategy's rank 0 (with expert parallelism, of each expert slice) writes the model file.
    const bool first = (experts_.expert ? zero_->group() : *group_).rank() == 0;
    if (first) write_model_states(tmp.string(), weights, client_state);
    // Stage 0 ranks all hold the same full state: rank 0 writes it once.
    // MiCS: the first replica group writes the shards (the others hold the same).
    if ((zero_->partitioned() && zero_->writes_optimizer_shard()) || first)
      write_optimizer_shard(tmp.string());
    // The 1-bit optimizers' error feedback differs on every rank: each writes its own.
    detail::save_rank_state(*optimizer_, tmp, group_->rank(),
                            options_.topology ? options_.topology->mp_rank() : 0, group_->size());
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
      publish(dir, tmp, tag);
    } catch (const std::exception& e) {
      error = fmt::format("[checkpoint] finishing {} failed: {} (is the disk full?)",
                          (dir / tag).string(), e.what());
      fs::remove_all(tmp, ec);
    }
  }
  comm::raise_if_any_failed(world, error, what + ": the checksums and `latest`");
}

}  // namespace ds::runtime
