// What every ZeRO strategy shares: gradient averaging factors, the global gradient norm, and the
// factory that picks the stage family.
#include "ds/zero/strategy.h"

#include <algorithm>
#include <vector>

#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "strategies.h"

namespace ds::zero {

Strategy::Strategy(nn::Module& model, std::shared_ptr<comm::Group> group, Options options)
    : model_(model), group_(std::move(group)), options_(options) {
  const int n = group_->size();
  if (options_.prescale_gradients) {
    comm_prescale_ = static_cast<float>(1.0 / n);
    grad_post_scale_ = 1.0;
  } else {
    comm_prescale_ = static_cast<float>(1.0 / options_.gradient_predivide_factor);
    grad_post_scale_ = options_.gradient_predivide_factor / n;
  }
}

Strategy::~Strategy() = default;

double Strategy::global_sum_of_squares(const Tensor& g, const std::string& ctx) {
  DS_CHECK(g.dtype() == DType::f32 && g.numel() == opt_numel_ && g.is_contiguous(),
           "[zero] the gradients for the norm must be ({},) fp32, got {} {}", opt_numel_,
           shape_str(g.shape()), dtype_name(g.dtype()));
  double sq = backend::get(g.device()).sum_of_squares(g);
  if (partitioned_) {
    // Global norm over the partitions; inf/NaN on any rank reaches every rank through the sum.
    float part = static_cast<float>(sq);
    group_->all_reduce(&part, 1, DType::f32, comm::ReduceOp::sum, ctx + " gradient norm");
    sq = part;
  }
  return sq;
}

std::unique_ptr<Strategy> make_strategy(nn::Module& model, std::shared_ptr<comm::Group> group,
                                        const Options& options) {
  DS_CHECK(group, "[zero] make_strategy needs a group");
  DS_CHECK(options.stage >= 0 && options.stage <= 3, "[zero] stage must be 0-3, got {}",
           options.stage);
  if (options.stage == 3) return detail::make_stage3_strategy(model, std::move(group), options);
  return detail::make_flat_strategy(model, std::move(group), options);
}

}  // namespace ds::zero
