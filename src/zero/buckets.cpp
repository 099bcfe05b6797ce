// Gradient buckets of stages 0 and 2 (buckets.h).
#include "buckets.h"

#include <algorithm>

#include "ds/ops/ops.h"

namespace ds::zero::detail {

GradientBuckets::GradientBuckets(Setup setup, std::shared_ptr<comm::Group> group)
    : s_(std::move(setup)), group_(std::move(group)) {
  buckets_ = plan_buckets(s_.flat->entries, s_.plan.padded_numel, s_.bucket_numel);
  param_buckets_.assign(s_.flat->entries.size(), {});
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (int i : buckets_[b].params)
      param_buckets_[static_cast<size_t>(i)].push_back(static_cast<int>(b));
  pending_params_.assign(buckets_.size(), 0);
  staging_.assign(buckets_.size(), Tensor());
  direct_ = s_.stage == 2 && group_->size() == 1 && s_.comm_dtype == s_.partition_grads.dtype();
}

void GradientBuckets::begin(const std::string& ctx) {
  ctx_ = ctx;
  active_ = true;
  if (direct_) {  // nothing to reduce: no bucket is armed
    if (s_.on_final && s_.flat->numel < s_.plan.padded_numel)
      s_.on_final(s_.flat->numel, s_.plan.padded_numel);
    return;
  }
  for (size_t b = 0; b < buckets_.size(); ++b)
    pending_params_[b] = static_cast<int>(buckets_[b].params.size());
}

void GradientBuckets::on_grad_ready(int i, const Tensor& p) {
  if (!active_) return;
  const auto& e = s_.flat->entries[static_cast<size_t>(i)];
  if (direct_) {
    // One rank: the reduction is the identity, so the gradient is added where the staged bucket
    // would have been added (the same sum, bit for bit) without a bucket-sized staging buffer.
    ops::add_(s_.partition_grads.flat_range(e.offset - s_.partition_begin, e.numel), p.grad());
    p.set_grad({});
    if (s_.on_final) s_.on_final(e.offset, e.offset + e.numel);
    return;
  }
  if (s_.stage == 2) {
    // Copy this parameter's gradient into each bucket it overlaps, then drop it: after this hook
    // the rank holds no full-size gradient of the parameter.
    Tensor g = p.grad().contiguous();
    for (int b : param_buckets_[static_cast<size_t>(i)]) {
      const auto& bk = buckets_[static_cast<size_t>(b)];
      Tensor& staging = staging_[static_cast<size_t>(b)];
      if (!staging.defined())
        staging = Tensor::zeros({bk.end - bk.begin}, s_.comm_dtype, g.device());
      const int64_t lo = std::max(bk.begin, e.offset), hi = std::min(bk.end, e.offset + e.numel);
      staging.flat_range(lo - bk.begin, hi - lo).copy_from(g.flat_range(lo - e.offset, hi - lo));
    }
    p.set_grad({});
  }
  for (int b : param_buckets_[static_cast<size_t>(i)])
    if (--pending_params_[static_cast<size_t>(b)] == 0) launch(b);
  if (s_.stage == 2) finish(s_.keep_in_flight);
}

void GradientBuckets::end() {
  // Buckets with no parameters (all padding) or parameters that got no gradient.
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (pending_params_[b] > 0) {
      pending_params_[b] = 0;
      launch(static_cast<int>(b));
    }
  finish(0);
  active_ = false;
}

void GradientBuckets::launch(int b) {
  const auto& bk = buckets_[static_cast<size_t>(b)];
  const int n = group_->size();
  Pending pending;
  pending.bucket = b;
  if (s_.stage == 2) {
    Tensor& staging = staging_[static_cast<size_t>(b)];
    if (!staging.defined())  // beside the gradients (a GPU model's are on the GPU)
      staging = Tensor::zeros({bk.end - bk.begin}, s_.comm_dtype, s_.partition_grads.device());
    pending.buf = staging;
  } else {
    // Stage 0: the bucket is a range of the flat gradients, reduced in place unless the
    // communication dtype differs (then a converted copy travels and is copied back).
    Tensor view = s_.flat->grads.flat_range(bk.begin, bk.end - bk.begin);
    if (n > 1 && s_.prescale != 1.0f) ops::mul_(view, s_.prescale);
    pending.buf = s_.comm_dtype == view.dtype() ? view : view.to(s_.comm_dtype);
  }
  if (n == 1) {
    in_flight_.push_back(std::move(pending));
    return;
  }
  if (s_.stage == 2 && s_.prescale != 1.0f) ops::mul_(pending.buf, s_.prescale);
  const std::string ctx = fmt::format("{} bucket {}", ctx_, b);
  if (s_.stage == 2 && s_.reduce_to_owners) {
    // Reduce to the owners: the bucket splits at partition boundaries and each piece is reduced
    // to the rank that owns it (half the traffic of an all-reduce; DeepSpeed's reduce_scatter).
    for (int r = 0; r < n; ++r) {
      const int64_t lo = std::max(bk.begin, s_.plan.begin(r)),
                    hi = std::min(bk.end, s_.plan.end(r));
      if (lo >= hi) continue;
      pending.works.push_back(group_->reduce_async(pending.buf.flat_range(lo - bk.begin, hi - lo),
                                                   r, comm::ReduceOp::sum, ctx));
    }
  } else {
    pending.works.push_back(group_->all_reduce_async(pending.buf, comm::ReduceOp::sum, ctx));
  }
  in_flight_.push_back(std::move(pending));
}

void GradientBuckets::finish(size_t keep) {
  // Oldest first (the order they were issued in); stops when at most `keep` remain, so that during
  // backward only the last few buckets' staging memory is alive.
  size_t done = 0;
  for (; in_flight_.size() - done > keep; ++done) {
    Pending& pending = in_flight_[done];
    for (auto& w : pending.works) w.wait();
    const auto& bk = buckets_[static_cast<size_t>(pending.bucket)];
    if (s_.stage != 2) {
      Tensor view = s_.flat->grads.flat_range(bk.begin, bk.end - bk.begin);
      if (pending.buf.raw_data() != view.raw_data()) view.copy_from(pending.buf);
      if (s_.on_final) s_.on_final(bk.begin, bk.end);
      continue;
    }
    // Keep only this rank's part of the reduced bucket.
    const int64_t part = s_.partition_grads.numel();
    const int64_t lo = std::max(bk.begin, s_.partition_begin),
                  hi = std::min(bk.end, s_.partition_begin + part);
    if (lo < hi) {
      ops::add_(s_.partition_grads.flat_range(lo - s_.partition_begin, hi - lo),
                pending.buf.flat_range(lo - bk.begin, hi - lo));
      if (s_.on_final) s_.on_final(lo, hi);
    }
    staging_[static_cast<size_t>(pending.bucket)] = Tensor();
  }
  in_flight_.erase(in_flight_.begin(), in_flight_.begin() + static_cast<std::ptrdiff_t>(done));
}

}  // namespace ds::zero::detail
