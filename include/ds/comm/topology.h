#pragma once
// The 3D process grid (pipe x data x model) and the groups built from it.
//
//   ds::comm::Topology topo(ds::comm::world(), /*tp=*/2, /*pp=*/2);   // collective
//   topo.data_parallel()->all_reduce(grads, ReduceOp::sum, "step 17");
//   topo.coord();                        // {pipe, data, model} of this rank
//
// Rank ordering is DeepSpeed's PipeModelDataParallelTopology(num_pp, num_mp, num_dp): axes
// [pipe, data, model], the last axis fastest, so
//
//   rank = pipe * (dp * tp) + data * tp + model
//
// "model" is the tensor-parallel axis (Megatron's tp). Tensor-parallel peers are adjacent ranks
// (on one node when a node holds >= tp ranks); pipeline stages are the farthest apart, since they
// exchange the least. With pp = dp = tp = 2 (8 ranks):
//
//   pipe groups  [0,4] [1,5] [2,6] [3,7]
//   model (TP)   [0,1] [2,3] [4,5] [6,7]
//   data (DP)    [0,2] [1,3] [4,6] [5,7]
//   model-parallel (same data coordinate, pp * tp ranks)  [0,1,4,5] [2,3,6,7]
//
// The model-parallel group is DeepSpeed's ds_model_proc_group (grad-norm and overflow reductions
// over everything that holds a different part of one replica); a rank's index in it,
// pipe * tp + model, is the mp_rank of checkpoint names.
//
// Grid is a plain value (no communication, any rank can ask about any other), for sharding
// arithmetic and tests. Topology performs the splits on a live Group.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ds/comm/group.h"

namespace ds::comm {

enum class Axis : uint8_t { pipe, data, model };
const char* axis_name(Axis axis);  // "pipe", "data", "model"

// A rank's position in the grid; each coordinate in [0, size of its axis).
struct Coord {
  int pipe = 0;
  int data = 0;
  int model = 0;
  int operator[](Axis axis) const;
  bool operator==(const Coord&) const = default;
};

// pp x dp x tp = world size. Cheap to copy; every member function is const and thread-safe.
struct Grid {
  int pp = 1;
  int dp = 1;
  int tp = 1;

  // dp = world_size / (tp * pp). Throws "[topology] ..." unless every size is >= 1 and tp * pp
  // divides world_size.
  static Grid make(int world_size, int tp, int pp);

  int world_size() const { return pp * dp * tp; }
  int size(Axis axis) const;  // pp, dp or tp

  // rank <-> coordinates; both throw "[topology] ..." when out of range.
  Coord coord(int rank) const;
  int rank(Coord c) const;

  // DeepSpeed's get_axis_comm_lists(axis): one list per combination of the other two coordinates,
  // lists ordered by that combination's linear index (color()), each list sorted (= ordered by the
  // coordinate on `axis`). size(axis) ranks per list, world_size() / size(axis) lists.
  std::vector<std::vector<int>> groups(Axis axis) const;
  // The model-parallel groups: one per data coordinate (list d holds the ranks with data == d),
  // pp * tp ranks each, sorted.
  std::vector<std::vector<int>> model_parallel_groups() const;

  // What Topology passes to Group::split for `rank`: the colour is the index of rank's list in
  // groups(axis), the key its index within it (its coordinate on the axis).
  int color(int rank, Axis axis) const;
  // rank's index in its model-parallel group: pipe * tp + model. Its colour there is `data`.
  int model_parallel_rank(int rank) const;

  std::string str() const;  // "pp=2 dp=2 tp=2"
};

// This rank's groups along every axis of the grid over `world`.
//
// Construction is collective over `world`: every rank of it must construct a Topology with the
// same tp and pp, at the same point of its sequence of collectives on `world`. It issues one
// all_reduce (every rank checks that all passed the same tp and pp, so a mismatch throws on every
// rank instead of leaving some waiting), then four splits, always in the order pipe, data, model,
// model-parallel (also when an axis has size 1, so every rank issues the same collectives), and
// checks that each new group has the size and rank the Grid predicts. world->rank() is the rank
// in the grid.
//
// The groups are shared: copies of a Topology use the same groups, and the collective-ordering
// rule of group.h applies to each of them. Accessors are const and thread-safe.
class Topology {
 public:
  // Throws "[topology] ..." for a bad factorisation (see Grid::make) or a null world.
  Topology(std::shared_ptr<Group> world, int tp, int pp);

  const Grid& grid() const { return grid_; }
  const Coord& coord() const { return coord_; }  // this rank's coordinates
  int rank() const { return rank_; }             // this rank in `world` (= in the grid)

  const std::shared_ptr<Group>& world() const { return world_; }
  const std::shared_ptr<Group>& pipeline() const { return pipe_; }       // pp ranks; rank = stage
  const std::shared_ptr<Group>& data_parallel() const { return data_; }  // dp ranks
  const std::shared_ptr<Group>& tensor_parallel() const { return model_; }  // tp ranks
  // pp * tp ranks with this rank's data coordinate; rank = pipe * tp + model.
  const std::shared_ptr<Group>& model_parallel() const { return model_parallel_; }
  const std::shared_ptr<Group>& group(Axis axis) const;

  int stage() const { return coord_.pipe; }
  int dp_rank() const { return coord_.data; }
  int tp_rank() const { return coord_.model; }
  int mp_rank() const { return grid_.model_parallel_rank(rank_); }

 private:
  Grid grid_;
  int rank_ = 0;
  Coord coord_;
  std::shared_ptr<Group> world_, pipe_, data_, model_, model_parallel_;
};

// Expert parallelism inside a data-parallel group (DeepSpeed's expert and expert-data groups):
// the dp ranks are cut into dp / ep groups of `ep` consecutive ranks, each holding every expert
// once (expert-parallel group: experts split over its ranks, tokens exchanged by all-to-all);
// the ranks at the same position in those groups hold the same experts (expert-data-parallel
// group: their expert gradients are summed). With dp = 4, ep = 2 (data ranks 0..3):
//
//   expert parallel       [0,1] [2,3]
//   expert data parallel  [0,2] [1,3]
//
// Dense parameters are replicated over the whole data-parallel group.
struct ExpertGroups {
  std::shared_ptr<Group> expert;       // ep ranks; rank = this rank's expert slice
  std::shared_ptr<Group> expert_data;  // dp / ep ranks holding the same experts
};
// Collective over `data`: two splits. Throws "[topology] ..." unless 1 <= ep and ep divides
// data->size().
ExpertGroups split_expert_parallel(const std::shared_ptr<Group>& data, int ep);

// " (pipe 1, data 0, tensor 1)": a world rank's coordinates in the grid of the latest Topology
// built over the whole job, or "" when there is none. The communication layer's failure reports
// (a rank that did not arrive, exited, or never matched a send) name ranks with it, so a dead rank
// of a 3D job is reported with its coordinates. Thread-safe.
std::string rank_coordinates(int world_rank);

}  // namespace ds::comm
