#pragma once
// Expert parallelism for nn::MoEMLP (moe.h): each MoE layer's experts are split over the ranks of
// an expert-parallel group (comm/topology.h, ExpertGroups: ep consecutive data-parallel ranks),
// rank j holding experts [j E / ep, (j + 1) E / ep). Each rank routes its own tokens over all E
// experts, sends every row to the rank of its expert and gets the results back (DeepSpeed's MoE
// _AllToAll; GShard's dispatch and combine):
//
//   xs (M, C), sorted by expert, counts (E)              this rank's routed rows
//   counts for my experts from every rank                 all_to_all of E / ep int64 per rank
//   dispatch: xr = all_to_all_rows(xs, send, recv)        (R, C), by source rank then expert
//   xe = xr in (local expert, source) order; ye = experts(xe, local counts)
//   combine: back to (source, expert) order, all_to_all_rows with the counts swapped  (M, C)
//
// Every rank runs every step of this for every MoE layer, also when its experts receive no row
// (R = 0: zero-row tensors, the expert weights still get a zero gradient), so the collectives of
// the expert-parallel group and ZeRO's gathers and reductions of the expert weights stay in step.
//
// Threading: the training thread; all_to_all_rows is a collective on its group, in forward and
// again in backward.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ds/comm/group.h"
#include "ds/core/tensor.h"
#include "ds/nn/module.h"

namespace ds::nn {

// x (sum(send), C) -> (sum(recv), C): rows [prefix(send)_j, +send_j) go to rank j of `group`;
// rank j's rows for this rank arrive as the j-th run (recv[j] = rank j's send[rank]).
// Differentiable: backward sends the gradients back (counts swapped). A collective on `group`
// in forward and in backward; ctx names it in timeout reports. Host tensors travel directly; a
// device tensor goes through host memory.
Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send,
                       const std::vector<int64_t>& recv, std::shared_ptr<comm::Group> group,
                       const std::string& ctx);

// The slice of dimension 0 of a stacked expert weight this rank holds: [begin, end) of `full`.
struct ExpertSplit {
  int64_t full = 0, begin = 0, end = 0;
};
// Every expert-parallel parameter of the tree by its name in root.named_parameters() (empty
// without expert parallelism).
std::map<std::string, ExpertSplit> expert_splits(const Module& root);

// Splits the experts of every MoE layer of `root` over `group` (this rank keeps its slice; the
// others' storage is freed). Throws "[moe] ..." when the group size does not divide a layer's
// expert count or when it was split before. A group of one changes nothing. Returns the number
// of MoE layers (0: nothing to split, e.g. a pipeline stage without MoE blocks).
int shard_experts(Module& root, const std::shared_ptr<comm::Group>& group);

}  // namespace ds::nn
