// The RAM home of the optimizer state (zero/state_store.h): master() and the optimizer's own
// buffers, visited as one chunk.
#include "ds/zero/state_store.h"

#include <algorithm>
#include <utility>

#include "ds/core/error.h"

namespace ds::zero {

StateStore::~StateStore() = default;

int64_t StateStore::chunks() const {
  const int64_t s = chunk_numel();
  return std::max<int64_t>(1, (numel() + s - 1) / s);
}

void StateStore::for_each(Access access, const std::function<void(const StateChunk&)>& fn) {
  const int64_t n = chunks();
  int64_t next = 0;
  for_each(access, [&]() -> int64_t { return next < n ? next++ : -1; }, fn);
}

namespace {

class HostStateStore final : public StateStore {
 public:
  HostStateStore(Tensor master, optim::Optimizer& opt, int64_t chunk)
      : master_(std::move(master)), opt_(opt), chunk_(chunk > 0 ? chunk : master_.numel()) {
    opt_.init_state(master_.numel());
  }

  int64_t numel() const override { return master_.numel(); }
  std::vector<std::string> state_names() const override {
    // SGD's momentum buffer appears when momentum is first set (OneCycle may cycle it).
    std::vector<std::string> out;
    for (const auto& sb : opt_.state_buffers()) out.push_back(sb.name);
    return out;
  }

  int64_t chunk_numel() const override { return std::max<int64_t>(chunk_, 1); }
  using StateStore::for_each;
  void for_each(Access, const ChunkOrder& order,
                const std::function<void(const StateChunk&)>& fn) override {
    // SGD without momentum has no buffer; with momentum set later its buffer appears on demand.
    const auto buffers = opt_.state_buffers();
    const int64_t n = master_.numel();
    for (int64_t k = order(); k >= 0; k = order()) {
      StateChunk c;
      c.begin = k * chunk_numel();
      c.numel = std::min(chunk_numel(), n - c.begin);
      DS_CHECK(c.begin <= n && (c.numel > 0 || n == 0),
               "[zero] internal: sub-group {} is outside the optimizer range", k);
      c.master = master_.data<float>() + c.begin;
      for (const auto& sb : buffers) c.states.push_back(sb.data + c.begin);
      fn(c);
    }
  }

  std::string describe() const override { return "optimizer state in RAM"; }
  StoreStats stats() const override {
    StoreStats s;
    s.ram_bytes = opt_.state_bytes();
    return s;
  }
  bool holds_master() const override { return false; }

 private:
  Tensor master_;
  optim::Optimizer& opt_;
  int64_t chunk_;
};

}  // namespace

std::unique_ptr<StateStore> host_state_store(Tensor master, optim::Optimizer& opt, int64_t chunk) {
  return std::make_unique<HostStateStore>(std::move(master), opt, chunk);
}

}  // namespace ds::zero
