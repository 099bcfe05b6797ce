#pragma once
// Gradient buckets for stages 0 and 2 (internal to zero/): gradients are reduced bucket by bucket
// as backward produces them, so communication overlaps the rest of backward.
//
//   stage 0  a bucket is a range of the flat gradient buffer, all-reduced in place (or through a
//            converted copy when the communication dtype differs) on the boundary micro-step;
//   stage 2  each parameter's gradient is copied into the staging buffer of every bucket it
//            overlaps and dropped at once; a full bucket is reduced to the owners of its pieces
//            (or all-reduced with reduce_scatter off), and the owner adds its piece into its
//            partition's gradients. With one rank (and the communication dtype the gradients'),
//            there is nothing to reduce: each gradient is added into the partition directly,
//            without staging (the same sums; a bucket-sized buffer less at the peak).
//
// Buckets are laid from the end of the buffer (plan_buckets): backward produces the last layers'
// gradients first. Threading: the training thread only (the hooks run inside backward).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ds/comm/group.h"
#include "ds/core/tensor.h"
#include "ds/nn/flat.h"
#include "ds/zero/partition.h"

namespace ds::zero::detail {

class GradientBuckets {
 public:
  struct Setup {
    int stage = 0;                             // 0 or 2
    const nn::FlatParameters* flat = nullptr;  // entries; stage 0 also its grads buffer
    PartitionPlan plan;
    int64_t bucket_numel = 1;
    DType comm_dtype = DType::f32;
    float prescale = 1.0f;         // multiplies gradients before a reduction (with several ranks)
    bool reduce_to_owners = true;  // stage 2: reduce (true) or all-reduce (false) each bucket
    // Stage 2: this rank's partition of the gradients, (partition_numel,), and where it starts.
    Tensor partition_grads;
    int64_t partition_begin = 0;
    size_t keep_in_flight = 0;  // reductions left running while backward goes on
    // Called with [lo, hi) of the flat buffer when those reduced gradients are final for this
    // backward (stage 0: in flat->grads; stage 2: the part of it in partition_grads): when their
    // bucket's reduction is added back, or, on one rank, when the gradient was added (and at
    // begin() for the padding, which no gradient writes). May be empty.
    std::function<void(int64_t lo, int64_t hi)> on_final;
  };
  GradientBuckets(Setup setup, std::shared_ptr<comm::Group> group);

  // Arms the buckets for one backward pass; ctx ("step 17") names its collectives.
  void begin(const std::string& ctx);
  bool active() const { return active_; }
  // Parameter i's gradient is complete (the parameter's grad-ready hook).
  void on_grad_ready(int i, const Tensor& param);
  // After backward: launches the buckets still waiting (padding-only buckets, parameters without
  // a gradient) and waits for every reduction.
  void end();

 private:
  void launch(int bucket);
  // Waits for reductions, oldest first, until at most keep remain.
  void finish(size_t keep);

  struct Pending {
    int bucket = 0;
    Tensor buf;  // what travels: the bucket itself, its converted copy, or its staging
    std::vector<comm::Work> works;  // several when a stage-2 bucket spans partitions
  };
  Setup s_;
  std::shared_ptr<comm::Group> group_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<int>> param_buckets_;  // for each flat entry, the buckets it writes
  std::vector<int> pending_params_;              // parameters not yet ready, per bucket
  std::vector<Tensor> staging_;                  // stage 2: a bucket's gradients until reduced
  bool direct_ = false;  // stage 2 on one rank: gradients go straight into partition_grads
  std::vector<Pending> in_flight_;
  std::string ctx_;
  bool active_ = false;
};

}  // namespace ds::zero::detail
