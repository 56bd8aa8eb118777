// ShardPlan against brute force: every output element owned once, every needed input
// element held exactly once after the two exchange phases, sends == the peer's receives,
// padding consistent with the window, and impossible grids rejected (never planned).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "orchestrator/config.hpp"
#include "orchestrator/layer_kind.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/shard_plan.hpp"

#include "common/shard_plan_checks.hpp"

namespace ht {
namespace {

using namespace plan_checks;

Padding random_padding(std::mt19937& rng, int max_explicit) {
  const int k = int(rng() % 3);
  if (k == 0) return {PaddingMode::Same, 0};
  if (k == 1) return {PaddingMode::Valid, 0};
  return {PaddingMode::Explicit, int(rng() % (max_explicit + 1))};
}

// A random model whose every window fits its input (so build_model_spec accepts it).
std::vector<LayerConfig> random_layers(std::mt19937& rng, int h, int w) {
  std::vector<LayerConfig> layers;
  const int n = 1 + int(rng() % 6);
  for (int tries = 0; int(layers.size()) < n && tries < 50; ++tries) {
    LayerConfig l;
    switch (rng() % 6) {
      case 0:
      case 1: {
        const int ks[] = {1, 3, 5, 7};
        l = conv(1 + int(rng() % 3), ks[rng() % 4], 1 + int(rng() % 2), 1 + int(rng() % 2));
        l.set("padding", random_padding(rng, 3));
        break;
      }
      case 2:
      case 3: {
        // The draws in the order they always had: type, stride, then padding.
        const int size = 2 + int(rng() % 2);
        const char* type = rng() % 2 ? "max_pool2d" : "avg_pool2d";
        const int stride = 1 + int(rng() % size);
        l = pool(type, size, stride, random_padding(rng, size / 2));
        break;
      }
      case 4: l = simple("batch_norm"); break;
      default: l = simple("relu"); break;
    }
    if (l.kind->traits.windowed) {
      const bool is_conv = l.type() == "conv2d";
      const int k = l.integer(is_conv ? "kernel" : "pool"), stride = l.integer("stride");
      const int dilation = is_conv ? l.integer("dilation") : 1;
      const Window1D wr = make_window(h, k, stride, dilation, l.padding("padding"));
      const Window1D wc = make_window(w, k, stride, dilation, l.padding("padding"));
      if (wr.out < 1 || wc.out < 1) continue;
      h = wr.out;
      w = wc.out;
    }
    layers.push_back(l);
  }
  return layers;
}

TEST(ShardPlan, RandomSweepAgainstBruteForce) {
  std::mt19937 rng(20240611);
  const GridShape grids[] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {3, 2}, {2, 3}, {3, 1}, {1, 3},
                             {4, 1}, {1, 4}, {3, 3}, {4, 2}, {2, 4}, {4, 3}, {4, 4}};
  int planned = 0, rejected = 0;
  for (int iter = 0; iter < 160; ++iter) {
    const int h = 7 + int(rng() % 294), w = 7 + int(rng() % 294);
    const bool fcn = rng() % 3 == 0;
    const std::vector<LayerConfig> layers = random_layers(rng, h, w);
    const ModelSpec m = make_model(h, w, 1 + int(rng() % 2), layers, fcn);
    const int max_r = max_grid_rows(m), max_c = max_grid_cols(m);
    ASSERT_TRUE(feasible_grid(m, max_r, 1));
    ASSERT_TRUE(feasible_grid(m, 1, max_c));
    // Smaller models get checked on every grid, larger ones on a few.
    for (const GridShape g : grids) {
      if (int64_t(h) * w > 40000 && rng() % 3 != 0) continue;
      const int groups = 1 + int(rng() % 2);
      SCOPED_TRACE(::testing::Message() << "iter " << iter << " input " << h << "x" << w << " grid " << g.rows
                                      << "x" << g.cols << " groups " << groups << " fcn " << fcn);
      const bool feasible = feasible_grid(m, g.rows, g.cols);
      try {
        const ShardPlan plan = make_shard_plan(m, g, groups * g.rows * g.cols);
        ASSERT_TRUE(feasible) << "planned a grid that cannot work";
        ASSERT_EQ(plan.groups, groups);
        ASSERT_EQ(plan.tail >= 0, !(reference_feasible(m, true, g.rows) && reference_feasible(m, false, g.cols)));
        ASSERT_LE(g.rows, max_r);
        ASSERT_LE(g.cols, max_c);
        check_plan(m, plan);
        if (HasFatalFailure()) return;
        ++planned;
      } catch (const ConfigError& e) {
        ASSERT_FALSE(feasible) << "rejected a grid that works: " << e.what();
        const std::string msg = e.what();
        EXPECT_NE(msg.find("max_grid_"), std::string::npos) << msg;
        EXPECT_TRUE(msg.find("rows") != std::string::npos || msg.find("cols") != std::string::npos) << msg;
        ++rejected;
      }
    }
  }
  EXPECT_GT(planned, 300);
  EXPECT_GT(rejected, 10);
}

TEST(ShardPlan, MaxGridIsTheBoundary) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 60; ++iter) {
    const int h = 7 + int(rng() % 120), w = 7 + int(rng() % 120);
    const ModelSpec m = make_model(h, w, 1, random_layers(rng, h, w), rng() % 2 == 0);
    const int r = max_grid_rows(m), c = max_grid_cols(m);
    EXPECT_TRUE(feasible_grid(m, r, 1));
    EXPECT_FALSE(feasible_grid(m, r + 1, 1));
    EXPECT_TRUE(feasible_grid(m, 1, c));
    EXPECT_FALSE(feasible_grid(m, 1, c + 1));
  }
}

TEST(ShardPlan, TwoShardsOfASameConv) {
  const ModelSpec m = make_model(10, 6, 1, {conv(2, 3)}, true);
  const ShardPlan p = make_shard_plan(m, {2, 1});
  EXPECT_EQ(p.owned_image(0), (Rect{{0, 5}, {0, 6}}));
  EXPECT_EQ(p.owned_image(1), (Rect{{5, 10}, {0, 6}}));
  EXPECT_EQ(p.needed_input(0, 0), (Rect{{0, 6}, {0, 6}}));
  EXPECT_EQ(p.needed_input(0, 1), (Rect{{4, 10}, {0, 6}}));
  EXPECT_EQ(p.layers[0].rows.pad_lo, (std::vector<int>{1, 0}));
  EXPECT_EQ(p.layers[0].rows.pad_hi, (std::vector<int>{0, 1}));
  EXPECT_EQ(p.layers[0].cols.pad_lo, (std::vector<int>{1}));
  const auto r0 = p.receives(0, 0, HaloPhase::Rows);
  ASSERT_EQ(r0.size(), 1u);
  EXPECT_EQ(r0[0].peer, 1);
  EXPECT_EQ(r0[0].rect, (Rect{{5, 6}, {0, 6}}));
  EXPECT_TRUE(p.receives(0, 0, HaloPhase::Cols).empty());
  const auto s1 = p.sends(0, 1, HaloPhase::Rows);
  ASSERT_EQ(s1.size(), 1u);
  EXPECT_EQ(s1[0].peer, 0);
  EXPECT_EQ(s1[0].rect, r0[0].rect);
}

TEST(ShardPlan, UnevenSplitGivesTheFirstShardsMore) {
  const ModelSpec m = make_model(10, 10, 1, {conv(1, 3)}, true);
  const ShardPlan p = make_shard_plan(m, {3, 1});
  EXPECT_EQ(p.layers[0].rows.owned_out, (std::vector<Range>{{0, 4}, {4, 7}, {7, 10}}));
}

TEST(ShardPlan, CornersComeThroughTheColsPhase) {
  const ModelSpec m = make_model(8, 8, 1, {conv(1, 3)}, true);
  const ShardPlan p = make_shard_plan(m, {2, 2});
  // Rank 0 (top left) gets the corner pixel (4,4) from rank 1 (top right), which received
  // it from rank 3 in the rows phase.
  const auto cols = p.receives(0, 0, HaloPhase::Cols);
  ASSERT_EQ(cols.size(), 1u);
  EXPECT_EQ(cols[0].peer, 1);
  EXPECT_EQ(cols[0].rect, (Rect{{0, 5}, {4, 5}}));
}

TEST(ShardPlan, StridedLayersAlignBorders) {
  // conv stride 2 then pool 2: the coarsest map has 4 rows; 2 shards split it [0,2),[2,4),
  // which is [0,4),[4,8) after the pool input and [0,8),[8,16) of the image.
  const ModelSpec m = make_model(16, 16, 1, {conv(1, 3, 2), pool("max_pool2d", 2, 2)}, false);
  const ShardPlan p = make_shard_plan(m, {2, 1});
  EXPECT_EQ(p.layers[1].rows.owned_out, (std::vector<Range>{{0, 2}, {2, 4}}));
  EXPECT_EQ(p.layers[1].rows.owned_in, (std::vector<Range>{{0, 4}, {4, 8}}));
  EXPECT_EQ(p.layers[0].rows.owned_in, (std::vector<Range>{{0, 8}, {8, 16}}));
  EXPECT_EQ(p.owned_output(2, 0), (Rect{{0, 1}, {0, 1}}));  // the global pool
  EXPECT_FALSE(p.layers[3].sharded);                        // dense
}

TEST(ShardPlan, NeededCoversTheOwnedRowsAStridedWindowSkips) {
  // A 2x2/2 pool over 7 rows reads rows [0, 6): the last owned row is in no window, but
  // the extended input (needed) still holds it, and the local output count stays right.
  const ModelSpec m = make_model(7, 4, 1, {pool("max_pool2d", 2, 2)}, true);
  const ShardPlan one = make_shard_plan(m, {1, 1});
  EXPECT_EQ(one.needed_input(0, 0), one.owned_input(0, 0));
  const ShardPlan two = make_shard_plan(m, {2, 1});
  EXPECT_EQ(two.layers[0].rows.owned_in, (std::vector<Range>{{0, 4}, {4, 7}}));
  EXPECT_EQ(two.layers[0].rows.needed_in, (std::vector<Range>{{0, 4}, {4, 7}}));
  EXPECT_TRUE(two.receives(0, 0, HaloPhase::Rows).empty());
}

TEST(ShardPlan, RejectsPaddingWiderThanTheWindow) {
  // A 1x1 conv with padding 1: output row o reads input row o - 1, so shard borders of the
  // output and the input cannot line up.
  const ModelSpec m = make_model(8, 8, 1, {conv(1, 1, 1, 1, {PaddingMode::Explicit, 1})}, true);
  EXPECT_NO_THROW(make_shard_plan(m, {1, 1}));
  EXPECT_THROW(make_shard_plan(m, {2, 1}), ConfigError);
  EXPECT_EQ(max_grid_rows(m), 1);
}

TEST(ShardPlan, HalosComeFromBeyondTheNeighbours) {
  // 8 rows into 4 shards of 2, and a 7x7 dilation-2 conv reads 6 rows on each side: shard 1
  // receives rows from shards 0, 2 and 3 (DeepLab's atrous rates on a small map).
  const ModelSpec m = make_model(8, 8, 1, {conv(1, 7, 1, 2)}, true);
  const ShardPlan p = make_shard_plan(m, {4, 1});
  check_plan(m, p);
  std::vector<int> peers;
  for (const HaloRegion& r : p.receives(0, 1, HaloPhase::Rows)) peers.push_back(r.peer);
  EXPECT_EQ(peers, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(max_grid_rows(m), 8);
}

TEST(ShardPlan, RejectsMoreShardsThanRowsAndBadWorlds) {
  const ModelSpec m = make_model(12, 12, 1, {conv(1, 3), pool("max_pool2d", 2, 2)}, false);
  EXPECT_EQ(make_shard_plan(m, {6, 1}).tail, -1);
  // The pool's output has 6 rows: split 7 ways, it is gathered whole (the tail) ...
  const ShardPlan tail = make_shard_plan(m, {7, 1});
  EXPECT_EQ(tail.tail, 2);
  EXPECT_TRUE(tail.layers[1].gathers);
  EXPECT_TRUE(tail.layers[0].sharded);
  // ... but nothing splits the 12 rows of the image 13 ways.
  EXPECT_THROW(make_shard_plan(m, {13, 1}), ConfigError);
  EXPECT_THROW(make_shard_plan(m, {2, 2}, 6), ConfigError);
  EXPECT_THROW(make_shard_plan(m, {0, 1}), ConfigError);
  const ShardPlan p = make_shard_plan(m, {2, 2}, 8);
  EXPECT_EQ(p.groups, 2);
  EXPECT_EQ(p.rank_at(1, 1, 0), 6);
  EXPECT_EQ(p.owned_image(6), p.owned_image(2));
  for (const auto& r : p.receives(0, 6, HaloPhase::Rows)) EXPECT_EQ(p.group_of(r.peer), 1);
}

}  // namespace
}  // namespace ht
