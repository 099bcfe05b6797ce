// The one reader of a checkpoint folder: see include/ds/runtime/checkpoint_reader.h.
#include "ds/runtime/checkpoint_reader.h"

#include "checkpoint_format.h"
#include "checkpoint_parts.h"
#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/core/safetensors.h"
#include "ds/core/text.h"
#include "ds/runtime/checkpoint_files.h"

namespace fs = std::filesystem;

namespace ds::runtime {
namespace {

using detail::field_int;
using detail::hex64;
using detail::kModelFile;
using detail::Meta;
using detail::read_text;

// Engine::load_checkpoint's folder: dir/<tag>, the tag from dir/latest when not given.
fs::path resolve_resume_folder(const fs::path& dir, const std::string& tag_in, int rank) {
  DS_CHECK(fs::is_directory(dir), "[checkpoint] {} is not a folder{}", dir.string(),
           rank >= 0 ? fmt::format(" on rank {} (with several nodes, checkpoints must be on a "
                                   "filesystem that every node mounts)",
                                   rank)
                     : "");
  std::string tag = tag_in;
  if (tag.empty()) {
    tag = read_latest_tag(dir, "[checkpoint]");
  } else {
    // A plain name, never a path that would load another run's checkpoint.
    DS_CHECK(!tag.empty() && tag.find('/') == std::string::npos && tag != "." && tag != "..",
             "[checkpoint] {} names '{}', but a checkpoint tag must be a folder name inside the "
             "checkpoint folder (global_step<N>), not a path; to load another folder, pass that "
             "folder itself",
             "the requested tag", tag);
  }
  const fs::path ck = dir / tag;
  DS_CHECK(fs::is_directory(ck), "[checkpoint] checkpoint folder {} does not exist",
           quoted_excerpt(ck.string(), 300));
  return ck;
}

}  // namespace

fs::path resolve_checkpoint_folder(const fs::path& path, const std::string& tag_in) {
  DS_CHECK(fs::is_directory(path),
           "[ds_to_fp32] {} is not a folder: give a checkpoint folder "
           "(the one holding 'latest') or one of its global_step<N> folders",
           path.string());
  if (tag_in.empty() && fs::exists(path / kModelFile)) return path;
  std::string tag = tag_in;
  if (tag.empty()) {
    DS_CHECK(fs::exists(path / "latest"),
             "[ds_to_fp32] {} holds neither {} nor a 'latest' file: give a checkpoint folder, one "
             "of its global_step<N> folders, or --tag",
             path.string(), kModelFile);
    tag = read_latest_tag(path, "[ds_to_fp32]");
  }
  DS_CHECK(tag.find('/') == std::string::npos && tag != "." && tag != "..",
           "[ds_to_fp32] tag {} must be a folder name inside {} (global_step<N>), not a path",
           quoted_excerpt(tag, 200), path.string());
  const fs::path folder = path / tag;
  DS_CHECK(fs::is_directory(folder), "[ds_to_fp32] checkpoint folder {} does not exist",
           quoted_excerpt(folder.string(), 300));
  return folder;
}

CheckpointReader::CheckpointReader(const fs::path& path, const std::string& tag_name, Use use,
                                   int rank)
    : folder_(use == Use::Resume ? resolve_resume_folder(path, tag_name, rank)
                                 : resolve_checkpoint_folder(path, tag_name)),
      sums_path_(folder_ / "checksums.json"),
      use_(use) {
  const bool resume = use_ == Use::Resume;
  DS_CHECK(fs::exists(sums_path_), "{} {} is missing: the checkpoint is incomplete{}", tag(),
           sums_path_.string(), resume ? "" : " (a save was interrupted?); use an older tag");
  try {
    sums_ = nlohmann::json::parse(read_text(sums_path_));
  } catch (const std::exception& e) {
    DS_THROW("{} {} is {} ({})", tag(), sums_path_.string(), resume ? "corrupted" : "damaged",
             e.what());
  }
  if (resume)
    DS_CHECK(sums_.is_object(),
             "[checkpoint] {} is corrupted: expected a JSON object of files, got {}",
             sums_path_.string(), sums_.type_name());
  else
    DS_CHECK(sums_.is_object(), "[ds_to_fp32] {} is damaged: expected a JSON object of files",
             sums_path_.string());
}

CheckpointReader::~CheckpointReader() = default;

const char* CheckpointReader::tag() const {
  return use_ == Use::Resume ? "[checkpoint]" : "[ds_to_fp32]";
}

void CheckpointReader::verify(const std::string& f) {
  if (verified_.count(f)) return;
  const fs::path p = folder_ / f;
  uint64_t want_size = 0;
  std::string want_hash;
  if (use_ == Use::Resume) {
    DS_CHECK(sums_.contains(f), "[checkpoint] {} does not list {}", sums_path_.string(), f);
    DS_CHECK(fs::exists(p), "[checkpoint] {} is missing", p.string());
    const Meta entry = Meta(sums_, sums_path_.string(), "checksums").object(f);
    want_size = entry.unsigned64("bytes");
    want_hash = entry.string("xxh64");
  } else {
    DS_CHECK(fs::exists(p),
             "[ds_to_fp32] {} is missing: the checkpoint is incomplete; copy the file from the "
             "run's checkpoint folder or use another tag",
             p.string());
    DS_CHECK(sums_.contains(f) && sums_[f].is_object() && sums_[f].contains("bytes") &&
                 sums_[f].contains("xxh64") && sums_[f]["bytes"].is_number_unsigned() &&
                 sums_[f]["xxh64"].is_string(),
             "[ds_to_fp32] {} does not record the size and checksum of {}; the checkpoint is "
             "damaged or not written by deepspeed.cpp",
             sums_path_.string(), f);
    want_size = sums_[f]["bytes"].get<uint64_t>();
    want_hash = sums_[f]["xxh64"].get<std::string>();
  }
  uint64_t size = 0;
  const uint64_t h = file_xxh64(p, &size);
  // Resume's messages are terse (the run's log names the folder); ds_to_fp32's say what to do.
  const char* again = use_ == Use::Resume ? "" : "; copy it again from the run's checkpoint folder";
  DS_CHECK(size == want_size, "{} {} is truncated or padded: {} bytes, {} {}{}", tag(), p.string(),
           size, use_ == Use::Resume ? "expected" : "checksums.json says", want_size, again);
  DS_CHECK(hex64(h) == want_hash, "{} {} is corrupted: checksum {} differs from the recorded {}{}",
           tag(), p.string(), hex64(h), want_hash, again);
  verified_.insert(f);
}

const safetensors::Reader& CheckpointReader::model_file() {
  if (!model_) {
    verify(kModelFile);
    model_ = std::make_unique<safetensors::Reader>((folder_ / kModelFile).string());
    engine_ = detail::parse_metadata(*model_, "ds_engine", tag());
  }
  return *model_;
}

const nlohmann::json& CheckpointReader::engine_state() {
  model_file();
  return engine_;
}

int64_t CheckpointReader::engine_int(const std::string& key) {
  const nlohmann::json& engine = engine_state();  // maps model_ first
  return use_ == Use::Resume ? Meta(engine, model_->path(), "ds_engine").integer(key)
                             : field_int(engine, key, model_->path(), "ds_engine");
}

int64_t CheckpointReader::global_steps() {
  return engine_int("global_steps");
}

int CheckpointReader::world_size() {
  return static_cast<int>(engine_int("world_size"));
}

int CheckpointReader::zero_stage() {
  return static_cast<int>(engine_int("zero_stage"));
}

DType CheckpointReader::training_dtype() {
  const nlohmann::json& engine = engine_state();
  const std::string& file = model_->path();
  std::string d;
  if (use_ == Use::Resume) {
    d = Meta(engine, file, "ds_engine").string("dtype");
  } else {
    const auto dt = engine.find("dtype");
    DS_CHECK(dt != engine.end() && dt->is_string(),
             "[ds_to_fp32] {}: ds_engine.dtype must be a string; the file is damaged", file);
    d = dt->get<std::string>();
  }
  DS_CHECK(d == "fp32" || d == "bf16" || d == "fp16",
           "{} {}: ds_engine.dtype '{}' is not fp32, bf16 or fp16", tag(), file, d);
  return d == "bf16" ? DType::bf16 : d == "fp16" ? DType::f16 : DType::f32;
}

std::pair<int, int> CheckpointReader::model_parallel() {
  const nlohmann::json& engine = engine_state();
  const std::string& file = model_->path();
  int64_t tp = 1, pp = 1;
  if (use_ == Use::Resume) {
    const Meta meta(engine, file, "ds_engine");
    if (meta.has("model_parallel")) {
      const Meta m = meta.object("model_parallel");
      tp = m.integer("tp", 1);
      pp = m.integer("pp", 1);
    }
  } else if (const auto mp = engine.find("model_parallel"); mp != engine.end()) {
    DS_CHECK(mp->is_object(),
             "[ds_to_fp32] {}: ds_engine.model_parallel must be an object; the "
             "file is damaged",
             file);
    tp = std::max<int64_t>(1, field_int(*mp, "tp", file, "ds_engine.model_parallel"));
    pp = std::max<int64_t>(1, field_int(*mp, "pp", file, "ds_engine.model_parallel"));
  }
  return {static_cast<int>(tp), static_cast<int>(pp)};
}

int CheckpointReader::expert_parallel() {
  const nlohmann::json& engine = engine_state();
  const std::string& file = model_->path();
  const auto ep = engine.find("expert_parallel");
  if (ep == engine.end()) return 1;
  DS_CHECK(ep->is_object() && ep->contains("size") && (*ep)["size"].is_number_integer() &&
               (*ep)["size"].get<int64_t>() >= 1 && (*ep)["size"].get<int64_t>() <= (1 << 16),
           "{} {}: ds_engine.expert_parallel must be an object with an integer size >= 1, got {}; "
           "the file is damaged",
           tag(), file, ep->dump());
  return static_cast<int>((*ep)["size"].get<int64_t>());
}

nlohmann::json CheckpointReader::client_state() {
  const nlohmann::json& engine = engine_state();  // maps model_ first
  const Meta meta(engine, model_->path(), "ds_engine");
  // Resume hands it back to the caller: a malformed one is an error. ds_to_fp32 only looks for the
  // model config in it (model_config()).
  if (!meta.has("client_state")) return nlohmann::json::object();
  if (use_ == Use::Resume) return meta.object("client_state").json();
  const nlohmann::json& cs = meta.json()["client_state"];
  return cs.is_object() ? cs : nlohmann::json::object();
}

std::optional<nlohmann::json> CheckpointReader::model_config() {
  const nlohmann::json cs = client_state();
  if (cs.contains("ds_train") && cs["ds_train"].is_object() && cs["ds_train"].contains("model"))
    return cs["ds_train"]["model"];
  return std::nullopt;
}

std::map<int, std::map<int, std::string>> CheckpointReader::optimizer_files(bool bf16,
                                                                            int ep_size) const {
  std::map<int, std::map<int, std::string>> names;  // part -> dp -> file
  for (auto it = sums_.begin(); it != sums_.end(); ++it)
    if (auto dm = detail::parse_optim_file_name(it.key(), bf16))
      names[dm->part(ep_size)][dm->dp] = it.key();
  // ds_to_fp32 names a shard that checksums.json forgot (then refused by verify) rather than
  // reporting its elements as uncovered.
  if (use_ == Use::Consolidate)
    for (const auto& e : fs::directory_iterator(folder_)) {
      const std::string n = e.path().filename().string();
      if (auto dm = detail::parse_optim_file_name(n, bf16)) names[dm->part(ep_size)][dm->dp] = n;
    }
  return names;
}

}  // namespace ds::runtime
