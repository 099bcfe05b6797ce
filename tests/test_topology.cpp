// comm::Grid and comm::Topology. The Grid tests need no processes: every factorisation of 1, 2, 4
// and 8 ranks, and DeepSpeed's 8-rank example. The Topology tests run the real splits: on the
// size-1 world when run plainly, and on every factorisation of the world under mpirun (CMake runs
// this program again with 4 ranks), where each group's all-reduce and all-gather must cover
// exactly the ranks the Grid lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "ds/comm/group.h"
#include "ds/comm/topology.h"

namespace ds::comm {
namespace {

using Lists = std::vector<std::vector<int>>;

struct Factor {
  int tp, pp;
};

// Every (tp, pp) with tp * pp dividing world_size.
std::vector<Factor> factorisations(int world_size) {
  std::vector<Factor> out;
  for (int tp = 1; tp <= world_size; ++tp)
    for (int pp = 1; tp * pp <= world_size; ++pp)
      if (world_size % (tp * pp) == 0) out.push_back({tp, pp});
  return out;
}

// Every rank in exactly one list, each list sorted and of size `want`.
void expect_partition(const Lists& lists, int world_size, int want, const std::string& what) {
  std::vector<int> seen(world_size, 0);
  for (const auto& l : lists) {
    EXPECT_EQ(static_cast<int>(l.size()), want) << what;
    EXPECT_TRUE(std::is_sorted(l.begin(), l.end())) << what;
    for (int r : l) {
      ASSERT_TRUE(r >= 0 && r < world_size) << what << ": rank " << r;
      ++seen[r];
    }
  }
  EXPECT_EQ(static_cast<int>(lists.size()), world_size / want) << what;
  for (int r = 0; r < world_size; ++r) EXPECT_EQ(seen[r], 1) << what << ": rank " << r;
}

void expect_topology_error(auto&& fn, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "no error; wanted one containing " << fragment;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[topology]", 0), 0u) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
  }
}

TEST(Grid, EveryFactorisation) {
  for (int world : {1, 2, 4, 8}) {
    for (auto [tp, pp] : factorisations(world)) {
      const Grid g = Grid::make(world, tp, pp);
      const std::string where = g.str() + " world " + std::to_string(world);
      SCOPED_TRACE(where);
      ASSERT_EQ(g.tp, tp);
      ASSERT_EQ(g.pp, pp);
      ASSERT_EQ(g.dp * tp * pp, world);
      ASSERT_EQ(g.world_size(), world);

      for (int r = 0; r < world; ++r) {
        const Coord c = g.coord(r);
        EXPECT_EQ(g.rank(c), r);
        EXPECT_EQ(r, c.pipe * (g.dp * g.tp) + c.data * g.tp + c.model);  // last axis fastest
        EXPECT_EQ(g.model_parallel_rank(r), c.pipe * g.tp + c.model);
      }
      for (int p = 0; p < g.pp; ++p)
        for (int d = 0; d < g.dp; ++d)
          for (int m = 0; m < g.tp; ++m) {
            const Coord c{.pipe = p, .data = d, .model = m};
            EXPECT_EQ(g.coord(g.rank(c)), c);
          }

      for (Axis axis : {Axis::pipe, Axis::data, Axis::model}) {
        const Lists lists = g.groups(axis);
        expect_partition(lists, world, g.size(axis), axis_name(axis));
        // A list's members differ only on `axis`, ordered by it; its index is their colour.
        for (size_t i = 0; i < lists.size(); ++i)
          for (size_t k = 0; k < lists[i].size(); ++k) {
            const int r = lists[i][k];
            EXPECT_EQ(g.color(r, axis), static_cast<int>(i)) << axis_name(axis) << " rank " << r;
            EXPECT_EQ(g.coord(r)[axis], static_cast<int>(k)) << axis_name(axis) << " rank " << r;
            Coord c0 = g.coord(lists[i][0]), c = g.coord(r);
            for (Axis other : {Axis::pipe, Axis::data, Axis::model})
              if (other != axis) {
                EXPECT_EQ(c[other], c0[other]) << axis_name(axis) << " rank " << r;
              }
          }
      }

      const Lists mp = g.model_parallel_groups();
      expect_partition(mp, world, g.pp * g.tp, "model-parallel");
      for (int d = 0; d < g.dp; ++d)
        for (size_t k = 0; k < mp[d].size(); ++k) {
          EXPECT_EQ(g.coord(mp[d][k]).data, d);
          EXPECT_EQ(g.model_parallel_rank(mp[d][k]), static_cast<int>(k));
        }
    }
  }
}

// DeepSpeed's PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2).
TEST(Grid, DeepSpeedEightRankExample) {
  const Grid g = Grid::make(8, /*tp=*/2, /*pp=*/2);
  EXPECT_EQ(g.dp, 2);
  EXPECT_EQ(g.groups(Axis::pipe), (Lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.groups(Axis::model), (Lists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.groups(Axis::data), (Lists{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.model_parallel_groups(), (Lists{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(g.coord(5), (Coord{.pipe = 1, .data = 0, .model = 1}));
  EXPECT_EQ(g.coord(6), (Coord{.pipe = 1, .data = 1, .model = 0}));
  EXPECT_EQ(g.model_parallel_rank(5), 3);
  EXPECT_EQ(g.str(), "pp=2 dp=2 tp=2");
}

TEST(Grid, BadFactorisations) {
  expect_topology_error([] { Grid::make(8, 3, 1); }, "does not divide the world size 8");
  expect_topology_error([] { Grid::make(6, 4, 1); }, "does not divide");
  expect_topology_error([] { Grid::make(4, 2, 4); }, "does not divide");
  expect_topology_error([] { Grid::make(2, 1, 4); }, "does not divide");
  expect_topology_error([] { Grid::make(4, 0, 1); }, ">= 1");
  expect_topology_error([] { Grid::make(4, 1, 0); }, ">= 1");
  expect_topology_error([] { Grid::make(4, -2, 1); }, ">= 1");
  expect_topology_error([] { Grid::make(0, 1, 1); }, ">= 1");
  const Grid g = Grid::make(4, 2, 1);
  expect_topology_error([&] { g.coord(4); }, "outside the grid");
  expect_topology_error([&] { g.coord(-1); }, "outside the grid");
  expect_topology_error([&] { g.rank(Coord{.pipe = 0, .data = 0, .model = 2}); }, "model");
  expect_topology_error([&] { g.rank(Coord{.pipe = 1, .data = 0, .model = 0}); }, "pipe");
}

// The splits on a size-1 group: every group is a size-1 group, every collective a no-op.
TEST(Topology, SingleProcess) {
  Topology t(single_process_group(), 1, 1);
  EXPECT_EQ(t.grid().world_size(), 1);
  EXPECT_EQ(t.coord(), Coord{});
  EXPECT_EQ(t.mp_rank(), 0);
  for (const auto& g : {t.pipeline(), t.data_parallel(), t.tensor_parallel(), t.model_parallel()}) {
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->size(), 1);
    int64_t x = 7;
    g->all_reduce(&x, 1, DType::i64);
    EXPECT_EQ(x, 7);
  }
  expect_topology_error([] { Topology(single_process_group(), 2, 1); }, "does not divide");
  expect_topology_error([] { Topology(nullptr, 1, 1); }, "null");
}

// Every factorisation of the world: each group's sum of (world rank + 1) and its gathered world
// ranks are exactly the Grid's list holding this rank, in the Grid's order.
TEST(Topology, GroupsMatchGrid) {
  auto world = comm::world();
  const int n = world->size(), me = world->rank();
  if (n < 2) GTEST_SKIP() << "needs several ranks: run under mpirun (ctest -R test_topology_np4)";

  for (auto [tp, pp] : factorisations(n)) {
    Topology t(world, tp, pp);
    const Grid& g = t.grid();
    SCOPED_TRACE(g.str() + " rank " + std::to_string(me));
    ASSERT_EQ(t.rank(), me);
    ASSERT_EQ(t.coord(), g.coord(me));

    struct Case {
      const char* name;
      std::shared_ptr<Group> group;
      Lists lists;
    };
    const std::vector<Case> cases = {
        {"pipe", t.pipeline(), g.groups(Axis::pipe)},
        {"data", t.data_parallel(), g.groups(Axis::data)},
        {"model", t.tensor_parallel(), g.groups(Axis::model)},
        {"model-parallel", t.model_parallel(), g.model_parallel_groups()},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      const auto it = std::find_if(c.lists.begin(), c.lists.end(), [&](const auto& l) {
        return std::find(l.begin(), l.end(), me) != l.end();
      });
      ASSERT_NE(it, c.lists.end());
      const std::vector<int>& want = *it;
      ASSERT_EQ(c.group->size(), static_cast<int>(want.size()));
      EXPECT_EQ(want[c.group->rank()], me);

      int64_t sum = me + 1;
      c.group->all_reduce(&sum, 1, DType::i64, ReduceOp::sum, c.name);
      EXPECT_EQ(sum, std::accumulate(want.begin(), want.end(), int64_t{0}) +
                         static_cast<int64_t>(want.size()));

      const int32_t mine = me;
      std::vector<int32_t> got(want.size(), -1);
      c.group->all_gather(&mine, got.data(), 1, DType::i32, c.name);
      EXPECT_EQ(std::vector<int>(got.begin(), got.end()), want);
    }
    EXPECT_EQ(t.model_parallel()->rank(), t.mp_rank());
    EXPECT_EQ(t.pipeline()->rank(), t.stage());
    EXPECT_EQ(t.data_parallel()->rank(), t.dp_rank());
    EXPECT_EQ(t.tensor_parallel()->rank(), t.tp_rank());
  }
}

// Ranks that disagree on the grid all get the error (none is left waiting in a split).
TEST(Topology, DisagreementThrowsOnEveryRank) {
  auto world = comm::world();
  if (world->size() < 2) GTEST_SKIP() << "needs several ranks: run under mpirun";
  const int tp = world->rank() == 0 ? 2 : 1;
  expect_topology_error([&] { Topology(world, tp, 1); }, "disagree");
  world->barrier("after disagreement");
}

}  // namespace
}  // namespace ds::comm
