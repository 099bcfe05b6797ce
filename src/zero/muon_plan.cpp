// Muon's view of a ZeRO strategy's optimizer range (zero/muon_plan.h).
#include "ds/zero/muon_plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "ds/comm/group.h"
#include "ds/core/error.h"

namespace ds::zero {

std::vector<optim::MuonTensor> muon_tensors(const Strategy& z) {
  const auto& entries = z.flat().entries;
  const std::vector<HeldRange> held = z.held_ranges();
  std::vector<optim::MuonTensor> out;
  out.reserve(entries.size());
  for (const auto& e : entries) {
    optim::MuonTensor t;
    t.use_muon = optim::muon_uses(e.name, e.shape);
    // (rows, rest): DeepSpeed views a 4-D conv filter as (out, in * kh * kw) the same way.
    t.rows = t.use_muon ? e.shape[0] : 1;
    t.cols = t.use_muon ? e.numel / e.shape[0] : std::max<int64_t>(e.numel, 1);
    for (const auto& h : held) {
      const int64_t b = std::max(h.flat_begin, e.offset);
      const int64_t en = std::min(h.flat_end, e.offset + e.numel);
      if (b >= en) continue;
      DS_CHECK(t.count == 0, "[muon] internal: tensor {} is held in two ranges", e.name);
      t.start = b - e.offset;
      t.count = en - b;
      t.local_offset = h.offset + (b - h.flat_begin);
    }
    out.push_back(t);
  }
  return out;
}

void attach_muon(optim::Muon& opt, const Strategy& z,
                 const std::function<void(const std::string&)>& log) {
  std::vector<optim::MuonTensor> tensors = muon_tensors(z);
  int64_t muon = 0, adam = 0, matrices = 0;
  for (const auto& t : tensors) {
    (t.use_muon ? muon : adam) += t.count;
    matrices += t.use_muon ? 1 : 0;
  }
  opt.set_tensors(std::move(tensors));
  comm::Group& g = z.group();
  if (g.size() > 1) {
    opt.set_exchange(g.rank(), g.size(), [&g](float* buf, int64_t count) {
      g.all_reduce(buf, static_cast<size_t>(count), DType::f32, comm::ReduceOp::sum,
                   "Muon matrices");
    });
  }
  if (log)
    log(
        fmt::format("[muon] {} matrices ({} elements on this rank) step with Muon, {} elements "
                    "with AdamW; state {:.1f} MiB vs AdamW's {:.1f} MiB",
                    matrices, muon, adam, static_cast<double>(muon + 2 * adam) * 4 / 1048576.0,
                    static_cast<double>(2 * (muon + adam)) * 4 / 1048576.0));
}

}  // namespace ds::zero
