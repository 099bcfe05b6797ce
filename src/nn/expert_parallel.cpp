#include "ds/nn/expert_parallel.h"

#include <numeric>

#include "ds/autograd/node.h"
#include "ds/core/error.h"
#include "ds/nn/moe.h"

namespace ds::nn {

namespace {

std::vector<size_t> elements(const std::vector<int64_t>& rows, int64_t width) {
  std::vector<size_t> out(rows.size());
  for (size_t j = 0; j < rows.size(); ++j) {
    DS_CHECK(rows[j] >= 0, "[moe] all_to_all_rows: negative row count {}", rows[j]);
    out[j] = static_cast<size_t>(rows[j] * width);
  }
  return out;
}

int64_t total(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

// The exchange itself, without autograd.
Tensor exchange(const Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                comm::Group& group, const std::string& ctx) {
  const int64_t C = x.size(1);
  const Tensor in = x.device().is_cpu() ? x.contiguous() : x.to(kCPU).contiguous();
  Tensor out = Tensor::empty({total(recv), C}, x.dtype(), kCPU);
  group.all_to_all_v(in.numel() ? in.raw_data() : nullptr, elements(send, C),
                     out.numel() ? out.raw_data() : nullptr, elements(recv, C), x.dtype(), ctx);
  return x.device().is_cpu() ? out : out.to(x.device());
}

}  // namespace

Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send,
                       const std::vector<int64_t>& recv, std::shared_ptr<comm::Group> group,
                       const std::string& ctx) {
  DS_CHECK(group, "[moe] all_to_all_rows: no group");
  const size_t n = static_cast<size_t>(group->size());
  DS_CHECK(x.dim() == 2 && send.size() == n && recv.size() == n && total(send) == x.size(0),
           "[moe] all_to_all_rows: x {} with {} send counts (sum {}) and {} receive counts for a "
           "group of {}",
           shape_str(x.shape()), send.size(), total(send), recv.size(), n);
  Tensor y = exchange(x, send, recv, *group, ctx);
  return autograd::record(y, "AllToAllRowsBackward", {x},
                          [send, recv, group, ctx](const Tensor& g) -> std::vector<Tensor> {
                            return {exchange(g, recv, send, *group, ctx + " (backward)")};
                          });
}

std::map<std::string, ExpertSplit> expert_splits(const Module& root) {
  std::map<std::string, ExpertSplit> out;
  for (const auto& [path, m] : root.named_modules()) {
    const auto* experts = dynamic_cast<const MoEExperts*>(m);
    if (!experts || !experts->sharded()) continue;
    const ExpertSplit s{experts->total_experts(), experts->first_expert(),
                        experts->first_expert() + experts->num_experts()};
    const std::string prefix = path.empty() ? "" : path + ".";
    out[prefix + "gate_up_proj"] = s;
    out[prefix + "down_proj"] = s;
  }
  return out;
}

int shard_experts(Module& root, const std::shared_ptr<comm::Group>& group) {
  DS_CHECK(group, "[moe] shard_experts: no expert-parallel group");
  int layers = 0;
  for (const auto& [path, m] : root.named_modules())
    if (auto* moe = dynamic_cast<MoEMLP*>(m)) {
      moe->set_expert_parallel(group);
      ++layers;
    }
  return layers;
}

}  // namespace ds::nn
