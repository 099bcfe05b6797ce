#include "ds/ops/flop_count.h"

namespace ds::ops {
namespace {

thread_local FlopSink* t_sink = nullptr;
thread_local int t_depth = 0;  // ops reporting on this thread (nested calls inside an op)

}  // namespace

FlopCounting::FlopCounting(FlopSink* sink) : prev_(t_sink) { t_sink = sink; }
FlopCounting::~FlopCounting() { t_sink = prev_; }

namespace detail {

bool counting_flops() { return t_sink != nullptr; }

CountOp::CountOp(const char* name, const OpCost& cost) {
  if (t_sink == nullptr) return;
  active_ = true;
  if (t_depth++ == 0) t_sink->add(name, cost);
}

CountOp::~CountOp() {
  if (active_) --t_depth;
}

}  // namespace detail
}  // namespace ds::ops
