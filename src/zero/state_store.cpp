// The RAM home of the optimizer state (zero/state_store.h): master() and the optimizer's own
// buffers, visited as one chunk.
#include "ds/zero/state_store.h"

#include <algorithm>
#include <utility>

#include "ds/core/error.h"

namespace ds::zero {

StateStore::~StateStore() = default;

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

  void for_each(Access, const std::function<void(const StateChunk&)>& fn) override {
    // SGD without momentum has no buffer; with momentum set later its buffer appears on demand.
    const auto buffers = opt_.state_buffers();
    const int64_t n = master_.numel();
    for (int64_t b = 0; b < n || b == 0; b += chunk_) {
      StateChunk c;
      c.begin = b;
      c.numel = std::min(chunk_, n - b);
      c.master = master_.data<float>() + b;
      for (const auto& sb : buffers) c.states.push_back(sb.data + b);
      fn(c);
      if (n == 0) break;
    }
  }

  std::string describe() const override { return "optimizer state in RAM"; }
  StoreStats stats() const override {
    StoreStats s;
    s.ram_bytes = static_cast<int64_t>(opt_.state_numel()) * opt_.state_floats_per_param() * 4;
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
