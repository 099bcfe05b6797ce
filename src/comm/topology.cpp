#include "ds/comm/topology.h"

#include <array>
#include <mutex>
#include <optional>
#include <utility>

#include "ds/core/error.h"

namespace ds::comm {

namespace {
std::mutex g_grid_mu;
std::optional<Grid> g_job_grid;  // the latest Topology over the whole job
}  // namespace


namespace {

constexpr std::array<Axis, 3> kAxes = {Axis::pipe, Axis::data, Axis::model};  // slowest first

int& at(Coord& c, Axis axis) {
  return axis == Axis::pipe ? c.pipe : axis == Axis::data ? c.data : c.model;
}

// The two axes other than `axis`, in grid order (the slower one first).
std::array<Axis, 2> others(Axis axis) {
  std::array<Axis, 2> o{};
  int n = 0;
  for (Axis a : kAxes)
    if (a != axis) o[n++] = a;
  return o;
}

}  // namespace

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::pipe:
      return "pipe";
    case Axis::data:
      return "data";
    case Axis::model:
      return "model";
  }
  return "?";
}

int Coord::operator[](Axis axis) const {
  return axis == Axis::pipe ? pipe : axis == Axis::data ? data : model;
}

Grid Grid::make(int world_size, int tp, int pp) {
  DS_CHECK(world_size >= 1 && tp >= 1 && pp >= 1,
           "[topology] world size {}, tp {} and pp {} must all be >= 1", world_size, tp, pp);
  DS_CHECK(world_size % (tp * pp) == 0,
           "[topology] tp * pp = {} * {} = {} does not divide the world size {}: choose tensor "
           "and pipeline parallel sizes whose product divides the number of ranks",
           tp, pp, tp * pp, world_size);
  return Grid{.pp = pp, .dp = world_size / (tp * pp), .tp = tp};
}

int Grid::size(Axis axis) const {
  return axis == Axis::pipe ? pp : axis == Axis::data ? dp : tp;
}

Coord Grid::coord(int rank) const {
  DS_CHECK(rank >= 0 && rank < world_size(), "[topology] rank {} is outside the grid {} ({} ranks)",
           rank, str(), world_size());
  return Coord{.pipe = rank / (dp * tp), .data = rank / tp % dp, .model = rank % tp};
}

int Grid::rank(Coord c) const {
  for (Axis a : kAxes)
    DS_CHECK(c[a] >= 0 && c[a] < size(a), "[topology] {} coordinate {} is outside [0, {}) in {}",
             axis_name(a), c[a], size(a), str());
  return c.pipe * (dp * tp) + c.data * tp + c.model;
}

std::vector<std::vector<int>> Grid::groups(Axis axis) const {
  const auto [outer, inner] = others(axis);
  std::vector<std::vector<int>> lists;
  lists.reserve(world_size() / size(axis));
  Coord c;
  for (at(c, outer) = 0; at(c, outer) < size(outer); ++at(c, outer))
    for (at(c, inner) = 0; at(c, inner) < size(inner); ++at(c, inner)) {
      std::vector<int>& list = lists.emplace_back();
      for (at(c, axis) = 0; at(c, axis) < size(axis); ++at(c, axis)) list.push_back(rank(c));
    }
  return lists;
}

std::vector<std::vector<int>> Grid::model_parallel_groups() const {
  std::vector<std::vector<int>> lists(dp);
  for (int r = 0; r < world_size(); ++r) lists[coord(r).data].push_back(r);
  return lists;
}

int Grid::color(int rank, Axis axis) const {
  const auto [outer, inner] = others(axis);
  const Coord c = coord(rank);
  return c[outer] * size(inner) + c[inner];
}

int Grid::model_parallel_rank(int rank) const {
  const Coord c = coord(rank);
  return c.pipe * tp + c.model;
}

std::string Grid::str() const {
  return fmt::format("pp={} dp={} tp={}", pp, dp, tp);
}

Topology::Topology(std::shared_ptr<Group> world, int tp, int pp) : world_(std::move(world)) {
  DS_CHECK(world_ != nullptr, "[topology] the world group is null: pass comm::world()");
  // Agree on tp and pp before anything can throw on some ranks only: ranks that disagreed would
  // otherwise leave the others waiting in a split until the deadline.
  int32_t sizes[4] = {tp, -tp, pp, -pp};  // max of x and of -x: everyone learns max and min
  world_->all_reduce(sizes, 4, DType::i32, ReduceOp::max, "topology sizes");
  DS_CHECK(sizes[0] == -sizes[1] && sizes[2] == -sizes[3],
           "[topology] ranks disagree on the grid: tp ranges over [{}, {}] and pp over [{}, {}]; "
           "every rank must pass the same tp and pp",
           -sizes[1], sizes[0], -sizes[3], sizes[2]);
  grid_ = Grid::make(world_->size(), tp, pp);
  rank_ = world_->rank();
  coord_ = grid_.coord(rank_);

  // The same splits in the same order on every rank, whatever the sizes (see the header).
  auto split = [&](int color, int key, int want_size, const char* what) {
    std::shared_ptr<Group> g = world_->split(color, key);
    DS_CHECK(g != nullptr && g->size() == want_size && g->rank() == key,
             "[topology] the {} group of rank {} in {} has size {} and rank {} instead of {} and "
             "{}: every rank must build the Topology with the same tp and pp",
             what, rank_, grid_.str(), g ? g->size() : 0, g ? g->rank() : -1, want_size, key);
    return g;
  };
  pipe_ = split(grid_.color(rank_, Axis::pipe), coord_.pipe, grid_.pp, "pipe");
  data_ = split(grid_.color(rank_, Axis::data), coord_.data, grid_.dp, "data");
  model_ = split(grid_.color(rank_, Axis::model), coord_.model, grid_.tp, "model");
  model_parallel_ =
      split(coord_.data, grid_.model_parallel_rank(rank_), grid_.pp * grid_.tp, "model-parallel");
  if (world_->size() == ds::comm::world()->size() && world_->world_rank(rank_) == rank_) {
    std::lock_guard lk(g_grid_mu);
    g_job_grid = grid_;
  }
}

std::string rank_coordinates(int world_rank) {
  std::lock_guard lk(g_grid_mu);
  if (!g_job_grid || world_rank < 0 || world_rank >= g_job_grid->world_size()) return "";
  const Coord c = g_job_grid->coord(world_rank);
  return fmt::format(" (pipe {}, data {}, tensor {})", c.pipe, c.data, c.model);
}

const std::shared_ptr<Group>& Topology::group(Axis axis) const {
  return axis == Axis::pipe ? pipe_ : axis == Axis::data ? data_ : model_;
}

ExpertGroups split_expert_parallel(const std::shared_ptr<Group>& data, int ep) {
  DS_CHECK(data, "[topology] split_expert_parallel: no data-parallel group");
  const int dp = data->size(), d = data->rank();
  DS_CHECK(ep >= 1 && dp % ep == 0,
           "[topology] expert-parallel size {} must divide the data-parallel size {} (experts are "
           "split over groups of ep consecutive data-parallel ranks)",
           ep, dp);
  ExpertGroups g;
  g.expert = data->split(d / ep, d % ep);
  g.expert_data = data->split(d % ep, d / ep);
  DS_CHECK(g.expert && g.expert->size() == ep && g.expert->rank() == d % ep && g.expert_data &&
               g.expert_data->size() == dp / ep && g.expert_data->rank() == d / ep,
           "[topology] internal: the expert-parallel split of {} ranks by {} gave groups of {} "
           "and {}",
           dp, ep, g.expert ? g.expert->size() : 0, g.expert_data ? g.expert_data->size() : 0);
  return g;
}

}  // namespace ds::comm
