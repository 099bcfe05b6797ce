// The global gradient norm across the parallel axes (ds/zero/grad_norm.h).
#include "ds/zero/grad_norm.h"

#include "ds/backend/backend.h"

namespace ds::zero {

void GradNorm::set_tensor_parallel(std::shared_ptr<comm::Group> tp,
                                   std::vector<SharedRange> shared) {
  if (!tp || tp->size() == 1) return;
  tp_ = std::move(tp);
  tp_shared_ = std::move(shared);
}

void GradNorm::set_pipeline_parallel(std::shared_ptr<comm::Group> pipe) {
  if (pipe && pipe->size() > 1) pipe_ = std::move(pipe);
}

void GradNorm::set_expert_parallel(std::shared_ptr<comm::Group> ep,
                                   std::vector<SharedRange> dense) {
  if (!ep || ep->size() == 1) return;
  ep_ = std::move(ep);
  ep_dense_ = std::move(dense);
}

double GradNorm::local(const Tensor& g) const {
  backend::Backend& be = backend::get(g.device());
  double sq = be.sum_of_squares(g);
  // A part held by c ranks of an axis is counted 1/c times on each, so once over the axis.
  for (const auto* shared : {&tp_shared_, &ep_dense_})
    for (const SharedRange& r : *shared)
      sq -= be.sum_of_squares(g.flat_range(r.begin, r.end - r.begin)) * (1.0 - 1.0 / r.copies);
  return sq;
}

double GradNorm::reduce(double sq, const std::string& ctx) const {
  auto sum_over = [&](comm::Group& g, const std::string& what) {
    float part = static_cast<float>(sq);
    g.all_reduce(&part, 1, DType::f32, comm::ReduceOp::sum, ctx + what);
    sq = part;
  };
  // Global norm over the partitions; inf/NaN on any rank reaches every rank through the sum.
  if (partitioned_) sum_over(*dp_, " gradient norm");
  if (tp_) sum_over(*tp_, " gradient norm over tensor-parallel ranks");
  if (pipe_) sum_over(*pipe_, " gradient norm over pipeline stages");
  if (ep_) sum_over(*ep_, " gradient norm over expert-parallel ranks");
  return sq;
}

}  // namespace ds::zero
