// Per-rank optimizer state in checkpoints (checkpoint_rank_state.h).
#include "checkpoint_rank_state.h"

#include <cstring>

#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/optim/onebit.h"

namespace ds::runtime::detail {

std::string rank_state_file_name(int dp_rank, int mp_rank) {
  return fmt::format("onebit_dp_rank_{}_mp_rank_{:02}_error_feedback.safetensors", dp_rank,
                     mp_rank);
}

void save_rank_state(optim::Optimizer& opt, const std::filesystem::path& folder, int dp_rank,
                     int mp_rank, int world_size) {
  auto* c = dynamic_cast<optim::CompressedOptimizer*>(&opt);
  if (!c) return;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const optim::StateBuffer& b : c->rank_state_buffers()) {
    Tensor t = Tensor::empty({b.numel}, DType::f32);
    if (b.numel) std::memcpy(t.raw_data(), b.data, static_cast<size_t>(b.numel) * sizeof(float));
    tensors.emplace_back(b.name, t);
  }
  if (tensors.empty()) return;
  safetensors::save((folder / rank_state_file_name(dp_rank, mp_rank)).string(), tensors,
                    {{"optimizer", opt.name()}, {"world_size", std::to_string(world_size)}});
}

std::string load_rank_state(optim::Optimizer& opt, const std::filesystem::path& folder, int dp_rank,
                            int mp_rank, int world_size) {
  auto* c = dynamic_cast<optim::CompressedOptimizer*>(&opt);
  if (!c) return "";
  const std::filesystem::path file = folder / rank_state_file_name(dp_rank, mp_rank);
  const auto bufs = c->rank_state_buffers();
  std::string why;
  if (!std::filesystem::exists(file)) {
    why = "the checkpoint has no error-feedback file for this rank";
  } else {
    safetensors::Reader r(file.string());
    const auto& meta = r.metadata();
    auto ws = meta.find("world_size");
    if (ws == meta.end() || ws->second != std::to_string(world_size)) {
      why = fmt::format("it was written by {} ranks, this run has {}",
                        ws == meta.end() ? "?" : ws->second, world_size);
    } else {
      for (const optim::StateBuffer& b : bufs) {
        DS_CHECK(r.contains(b.name), "[checkpoint] {}: no tensor '{}'", file.string(), b.name);
        Tensor t = r.get(b.name);
        DS_CHECK(t.dtype() == DType::f32 && t.numel() == b.numel,
                 "[checkpoint] {}: '{}' has {} elements, the optimizer {}", file.string(), b.name,
                 t.numel(), b.numel);
        if (b.numel) std::memcpy(b.data, t.raw_data(), static_cast<size_t>(b.numel) * 4);
      }
      return "";
    }
  }
  c->reset_rank_state();
  return fmt::format(
      "[checkpoint] {}: the compression error feedback starts from zero ({}), as DeepSpeed resets "
      "it at every load",
      opt.name(), why);
}

}  // namespace ds::runtime::detail
