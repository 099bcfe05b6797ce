// Engine checkpoints in DeepSpeed's layout (reference/deepspeed-behaviour.md §8), with tensors in
// safetensors files and metadata in JSON:
//
//   dir/latest                                               the newest complete tag, written last
//   dir/<tag>/mp_rank_00_model_states.safetensors            module weights (training dtype) +
//                                                            engine state in the "ds_engine" metadata
//   dir/<tag>/[bf16_]zero_pp_rank_0_mp_rank_00_optim_states.safetensors
//                                                            fp32 master weights and moments (padding
//                                                            stripped) + "ds_optimizer" metadata
//   dir/<tag>/checksums.json                                 size and XXH64 of every file above
//
// A tag is written into a hidden temporary folder and renamed into place only when every file is
// complete and fsynced, and `latest` is replaced after that: a crash at any point leaves the
// previous checkpoint intact and `latest` naming a complete one.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ds/core/error.h"
#include "ds/core/rng.h"
#include "ds/core/safetensors.h"
#include "ds/data/checksum.h"
#include "ds/data/shard.h"
#include "ds/runtime/engine.h"

namespace fs = std::filesystem;

namespace ds::runtime {
namespace {

constexpr int kFormatVersion = 1;
constexpr const char* kModelFile = "mp_rank_00_model_states.safetensors";

std::string optim_file_name(DType training) {
  return std::string(training == DType::bf16 ? "bf16_" : "") +
         "zero_pp_rank_0_mp_rank_00_optim_states.safetensors";
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

// XXH64 of a whole file, streamed.
uint64_t file_xxh64(const fs::path& path, uint64_t* size) {
  std::ifstream in(path, std::ios::binary);
  DS_CHECK(in, "[checkpoint] cannot read {}", path.string());
  data::Xxh64 h;
  std::vector<char> buf(1 << 20);
  *size = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = in.gcount();
    if (got <= 0) break;
    h.update(buf.data(), static_cast<size_t>(got));
    *size += static_cast<uint64_t>(got);
  }
  return h.digest();
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

nlohmann::json parse_metadata(const safetensors::Reader& r, const std::string& key) {
  DS_CHECK(r.metadata().count(key), "[checkpoint] {} has no '{}' metadata: not a deepspeed.cpp checkpoint file",
           r.path(), key);
  try {
    return nlohmann::json::parse(r.metadata(key));
  } catch (const std::exception& e) {
    DS_THROW("[checkpoint] {}: the '{}' metadata is not valid JSON ({})", r.path(), key, e.what());
  }
}

}  // namespace

void Engine::save_checkpoint(const std::string& dir_in, const std::string& tag_in,
                             const nlohmann::json& client_state) {
  const fs::path dir(dir_in);
  const std::string tag = tag_in.empty() ? fmt::format("global_step{}", global_steps_) : tag_in;
  DS_CHECK(tag.find('/') == std::string::npos && tag != "." && tag != "..",
           "[checkpoint] tag '{}' must be a plain folder name", tag);
  std::error_code ec;
  fs::create_directories(dir, ec);
  DS_CHECK(!ec, "[checkpoint] cannot create {}: {}", dir.string(), ec.message());
  const fs::path tmp = dir / fmt::format(".{}.tmp.{}", tag, ::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  DS_CHECK(!ec, "[checkpoint] cannot create {}: {}", tmp.string(), ec.message());

  try {
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
        {"dropout_rng", {{"seed", rng::dropout_state().seed}, {"offset", rng::dropout_state().offset}}},
        {"world_size", config_.batch.world_size},
        {"zero_stage", config_.zero_optimization.stage},
        {"dtype", dtype_name(training_dtype())},
        {"grad_dtype", dtype_name(grad_dtype())},
        {"ds_config_source", config_.source},
        {"client_state", client_state},
    };
    std::vector<std::pair<std::string, Tensor>> weights;
    for (auto& [name, p] : model_->named_parameters()) weights.emplace_back(name, p);
    safetensors::save((tmp / kModelFile).string(), weights, {{"ds_engine", engine_state.dump()}});

    // Optimizer states: fp32 master and moments over the unpadded range, in flat-buffer order.
    const int64_t n = flat_.numel;
    auto unpadded = [n](const Tensor& t) { return Tensor::from_storage(t.storage(), {n}, DType::f32, t.storage_offset()); };
    std::vector<std::pair<std::string, Tensor>> states = {{"fp32_master", unpadded(master_)}};
    for (const auto& sb : optimizer_->state_buffers()) {
      auto st = Storage::external(sb.data, static_cast<size_t>(sb.numel) * sizeof(float), kCPU);
      states.emplace_back(sb.name, Tensor::from_storage(st, {n}, DType::f32));
    }
    nlohmann::json names = nlohmann::json::array(), shapes = nlohmann::json::array(),
                   offsets = nlohmann::json::array();
    for (const auto& e : flat_.entries) {
      names.push_back(e.name);
      shapes.push_back(e.shape);
      offsets.push_back(e.offset);
    }
    nlohmann::json opt_state = {
        {"format_version", kFormatVersion},
        {"optimizer", optimizer_->name()},
        {"scalar_state", optimizer_->scalar_state()},
        {"param_names", names},
        {"param_shapes", shapes},
        {"param_offsets", offsets},
        {"numel", n},
        {"padding", flat_.padded_numel - n},
        {"partition_count", 1},
        {"rank", options_.rank},
    };
    const std::string optim_file = optim_file_name(training_dtype());
    safetensors::save((tmp / optim_file).string(), states, {{"ds_optimizer", opt_state.dump()}});

    nlohmann::json sums = nlohmann::json::object();
    for (const std::string f : {std::string(kModelFile), optim_file}) {
      uint64_t size = 0;
      const uint64_t h = file_xxh64(tmp / f, &size);
      sums[f] = {{"bytes", size}, {"xxh64", hex64(h)}};
    }
    data::write_file_atomic(tmp / "checksums.json", sums.dump(2) + "\n");
    fsync_dir(tmp);

    // Swap the complete folder into place; an older folder of the same tag goes only after.
    const fs::path final_dir = dir / tag;
    const fs::path old = dir / fmt::format(".{}.old.{}", tag, ::getpid());
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fsync_dir(dir);
    fs::remove_all(old, ec);
    data::write_file_atomic(dir / "latest", tag + "\n");
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    DS_THROW("[checkpoint] writing {} failed: {} (is the disk full or the folder read-only?)",
             (dir / tag).string(), e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

nlohmann::json Engine::load_checkpoint(const std::string& dir_in, const std::string& tag_in) {
  const fs::path dir(dir_in);
  DS_CHECK(fs::is_directory(dir), "[checkpoint] {} is not a folder", dir.string());
  std::string tag = tag_in;
  if (tag.empty()) {
    const fs::path latest = dir / "latest";
    DS_CHECK(fs::exists(latest), "[checkpoint] {} has no 'latest' file: no complete checkpoint was "
             "written there; pass a tag (a global_step<N> folder) explicitly", dir.string());
    tag = trim(read_text(latest));
    DS_CHECK(!tag.empty(), "[checkpoint] {} is empty", latest.string());
  }
  const fs::path ck = dir / tag;
  DS_CHECK(fs::is_directory(ck), "[checkpoint] checkpoint folder {} does not exist", ck.string());

  // Integrity first: every file present, of the recorded size and checksum.
  const fs::path sums_path = ck / "checksums.json";
  DS_CHECK(fs::exists(sums_path), "[checkpoint] {} is missing: the checkpoint is incomplete", sums_path.string());
  nlohmann::json sums;
  try {
    sums = nlohmann::json::parse(read_text(sums_path));
  } catch (const std::exception& e) {
    DS_THROW("[checkpoint] {} is corrupted ({})", sums_path.string(), e.what());
  }
  const std::string optim_file = optim_file_name(training_dtype());
  for (const std::string f : {std::string(kModelFile), optim_file}) {
    const fs::path p = ck / f;
    if (!sums.contains(f)) {
      // The other precision's optimizer file name: say so instead of "missing".
      DS_CHECK(f != optim_file || !fs::exists(ck / optim_file_name(training_dtype() == DType::bf16 ? DType::f32 : DType::bf16)),
               "[checkpoint] {} was written by a {} run; this run trains in {} (DeepSpeed names the "
               "bf16 optimizer file differently). Resume with the same precision",
               ck.string(), training_dtype() == DType::bf16 ? "non-bf16" : "bf16", dtype_name(training_dtype()));
      DS_THROW("[checkpoint] {} does not list {}", sums_path.string(), f);
    }
    DS_CHECK(fs::exists(p), "[checkpoint] {} is missing", p.string());
    uint64_t size = 0;
    const uint64_t h = file_xxh64(p, &size);
    const uint64_t want_size = sums[f].at("bytes").get<uint64_t>();
    DS_CHECK(size == want_size, "[checkpoint] {} is truncated or padded: {} bytes, expected {}",
             p.string(), size, want_size);
    DS_CHECK(hex64(h) == sums[f].at("xxh64").get<std::string>(),
             "[checkpoint] {} is corrupted: checksum {} differs from the recorded {}", p.string(),
             hex64(h), sums[f].at("xxh64").get<std::string>());
  }

  // Model weights: exactly our names, shapes and dtypes.
  safetensors::Reader model_file((ck / kModelFile).string());
  const nlohmann::json engine_state = parse_metadata(model_file, "ds_engine");
  auto params = model_->named_parameters();
  std::vector<std::string> problems;
  for (auto& [name, p] : params) {
    if (!model_file.contains(name)) {
      problems.push_back("missing " + name);
      continue;
    }
    const auto& e = model_file.entry(name);
    if (e.shape != p.shape()) problems.push_back(fmt::format("{}: shape {} in the file, {} in the model", name, shape_str(e.shape), shape_str(p.shape())));
  }
  for (const auto& name : model_file.names()) {
    bool known = false;
    for (auto& [n, p] : params) known = known || n == name;
    if (!known) problems.push_back("unexpected " + name);
  }
  DS_CHECK(problems.empty(), "[checkpoint] {} does not match this model: {}", (ck / kModelFile).string(),
           fmt::join(problems, "; "));

  // Optimizer file: the same flat layout.
  safetensors::Reader opt_file((ck / optim_file).string());
  const nlohmann::json opt_state = parse_metadata(opt_file, "ds_optimizer");
  DS_CHECK(opt_state.at("numel").get<int64_t>() == flat_.numel &&
               opt_state.at("param_names").size() == flat_.entries.size(),
           "[checkpoint] {} holds {} parameters ({} elements); this model has {} ({} elements)",
           (ck / optim_file).string(), opt_state.at("param_names").size(), opt_state.at("numel").get<int64_t>(),
           flat_.entries.size(), flat_.numel);
  for (size_t i = 0; i < flat_.entries.size(); ++i) {
    DS_CHECK(opt_state["param_names"][i].get<std::string>() == flat_.entries[i].name &&
                 opt_state["param_shapes"][i].get<Shape>() == flat_.entries[i].shape,
             "[checkpoint] {}: parameter {} is {} {} in the file but {} {} in the model",
             (ck / optim_file).string(), i, opt_state["param_names"][i].get<std::string>(),
             shape_str(opt_state["param_shapes"][i].get<Shape>()), flat_.entries[i].name,
             shape_str(flat_.entries[i].shape));
  }
  DS_CHECK(opt_state.at("optimizer").get<std::string>() == optimizer_->name(),
           "[checkpoint] {} was written with the {} optimizer; this run uses {}",
           (ck / optim_file).string(), opt_state.at("optimizer").get<std::string>(), optimizer_->name());

  // Everything verified: now restore. Weights, then master (which in fp32 training is the weights).
  for (auto& [name, p] : params) model_file.read_into(name, p);
  const int64_t n = flat_.numel;
  opt_file.read_into("fp32_master", Tensor::from_storage(master_.storage(), {n}, DType::f32, master_.storage_offset()));
  for (const auto& sb : optimizer_->state_buffers()) {
    DS_CHECK(opt_file.contains(sb.name), "[checkpoint] {} has no optimizer state '{}'", (ck / optim_file).string(), sb.name);
    auto st = Storage::external(sb.data, static_cast<size_t>(sb.numel) * sizeof(float), kCPU);
    opt_file.read_into(sb.name, Tensor::from_storage(st, {n}, DType::f32));
  }
  optimizer_->load_scalar_state(opt_state.at("scalar_state").get<std::map<std::string, double>>());

  global_steps_ = engine_state.at("global_steps").get<int64_t>();
  global_samples_ = engine_state.at("global_samples").get<int64_t>();
  skipped_steps_ = engine_state.at("skipped_steps").get<int64_t>();
  micro_steps_ = engine_state.at("micro_steps").get<int64_t>();
  consecutive_skips_ = engine_state.value("consecutive_skips", 0);
  scheduler_.load_state_dict(engine_state.at("lr_scheduler"));
  scaler_.load_state_dict(engine_state.at("loss_scaler"));
  rng::dropout_state().seed = engine_state.at("dropout_rng").at("seed").get<uint64_t>();
  rng::dropout_state().offset = engine_state.at("dropout_rng").at("offset").get<uint64_t>();
  zero_grads();
  return engine_state.value("client_state", nlohmann::json::object());
}

}  // namespace ds::runtime
