#pragma once
// The global gradient norm of a ZeRO strategy, as one part of it (the strategy owns one): the sum
// of squares of this rank's gradients, summed over the axes that hold different gradients, as
// DeepSpeed's get_global_norm and Megatron's clip_grad_norm_fp32 count it.
//
//   GradNorm norm(dp_group);
//   norm.set_partitioned(true);                      // ZeRO 1-3: each dp rank holds a partition
//   norm.set_tensor_parallel(tp_group, shared);      // parts held by several tp ranks, discounted
//   double sq = norm.reduce(norm.local(grads), "step 17");   // a collective over each axis
//
// The axes: the data-parallel group when the optimizer range is partitioned (otherwise every dp
// rank holds the same, already reduced, gradients), the tensor-parallel group (each rank a part of
// the cut parameters; parts held by c ranks counted 1/c times on each, so once overall) and the
// pipeline group (each stage its own parameters; a tied weight belongs to one stage). inf/NaN on
// any rank reaches every rank through the sums. Deterministic: the device's sum of squares sums
// fixed tiles in order, and each reduction is one float.
//
// Threading: the training thread (reduce is a collective); local is const and may run on a
// worker (stage 3's step during backward takes partial sums there).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ds/comm/group.h"
#include "ds/core/tensor.h"

namespace ds::zero {

class GradNorm {
 public:
  // [begin, end) of the optimizer range held by `copies` tensor-parallel ranks.
  struct SharedRange {
    int64_t begin, end;
    int copies;
  };

  explicit GradNorm(std::shared_ptr<comm::Group> dp) : dp_(std::move(dp)) {}

  void set_partitioned(bool partitioned) { partitioned_ = partitioned; }
  // Tensor parallelism beside the dp group (a group of one is ignored), with the ranges whose
  // gradients several tp ranks hold.
  void set_tensor_parallel(std::shared_ptr<comm::Group> tp, std::vector<SharedRange> shared);
  // Pipeline parallelism beside the dp group (a group of one is ignored).
  void set_pipeline_parallel(std::shared_ptr<comm::Group> pipe);
  // Expert parallelism beside the (expert-data-parallel) dp group: each ep rank holds other
  // experts; `dense` are the ranges every ep rank holds alike (counted 1/ep on each).
  void set_expert_parallel(std::shared_ptr<comm::Group> ep, std::vector<SharedRange> dense);
  // Whether the norm sums over tensor-, pipeline- or expert-parallel ranks too.
  bool beside_other_axes() const { return tp_ != nullptr || pipe_ != nullptr || ep_ != nullptr; }

  // This rank's share of the sum of squares of g (the optimizer range, fp32 or 16-bit): shared
  // tensor-parallel parts discounted.
  double local(const Tensor& g) const;
  // The sum of `local` over every axis (collectives, named after `ctx`).
  double reduce(double local, const std::string& ctx) const;

 private:
  std::shared_ptr<comm::Group> dp_;
  bool partitioned_ = false;
  std::shared_ptr<comm::Group> tp_;    // set_tensor_parallel()
  std::shared_ptr<comm::Group> pipe_;  // set_pipeline_parallel()
  std::shared_ptr<comm::Group> ep_;    // set_expert_parallel()
  std::vector<SharedRange> tp_shared_, ep_dense_;
};

}  // namespace ds::zero
