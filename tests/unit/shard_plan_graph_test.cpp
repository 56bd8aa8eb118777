// ShardPlan on graphs (SPEC section 7): random ResNet and U-Net shapes planned on several
// grids and checked by brute force (tests/common/shard_plan_checks.hpp), and joins whose
// inputs are split differently refused.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "orchestrator/shard_plan.hpp"

#include "common/shard_plan_checks.hpp"

namespace ht {
namespace {

using namespace plan_checks;

// A random ResNet/U-Net-encoder style graph: a stem, then blocks with an identity or a
// strided 1x1 shortcut, a concatenated skip, or a padded 3x3/2 max pool.
std::vector<LayerConfig> random_graph(std::mt19937& rng, int h, int w) {
  std::vector<LayerConfig> layers;
  int counter = 0;
  auto named = [&](LayerConfig l, std::vector<std::string> inputs = {}) {
    l.name = "l" + std::to_string(++counter);
    l.inputs = std::move(inputs);
    layers.push_back(l);
    return layers.back().name;
  };
  int c = 3;  // channels
  std::string last = named(conv(c, 3));
  const int blocks = 1 + int(rng() % 4);
  for (int b = 0; b < blocks; ++b) {
    const std::string in = last;
    switch (rng() % 6) {
      case 0: {  // identity
        named(conv(c, 3));
        named(simple("relu"));
        last = named(simple("add"), {named(conv(c, 3)), in});
        break;
      }
      case 1: {  // strided, with a 1x1/2 shortcut
        if (h < 4 || w < 4) break;
        named(conv(c, 3, 2, 1, {PaddingMode::Explicit, 1}));
        const std::string main = named(conv(c, 3));
        const std::string shortcut = named(conv(c, 1, 2, 1, {PaddingMode::Valid, 0}), {in});
        last = named(simple("add"), {main, shortcut});
        h = (h + 1) / 2;
        w = (w + 1) / 2;
        break;
      }
      case 2: {  // a concatenated skip
        last = named(simple("concatenate"), {named(conv(2, 3 + 2 * int(rng() % 2))), in});
        c += 2;
        break;
      }
      case 3: {  // a U-Net level: down, and up again by upsampling or a transposed conv
        if (h % 2 || w % 2 || h < 4 || w < 4) break;
        named(pool("max_pool2d", 2, 2));
        named(conv(c, 3));
        std::string up;
        if (rng() % 2) {
          up = named(make_layer_config("upsampling2d", {{"interpolation", std::string(rng() % 2 ? "bilinear" : "nearest")}}));
        } else {
          up = named(make_layer_config("conv2d_transpose", {{"filters", int64_t(c)},
                                                             {"kernel", int64_t(2 + rng() % 3)},
                                                             {"stride", int64_t(2)},
                                                             {"padding", Padding{PaddingMode::Same, 0}}}));
        }
        last = named(simple("concatenate"), {up, in});
        c *= 2;
        break;
      }
      case 4: {  // coordinates shifted and back: zero padding, cropping, an identity shortcut
        named(make_layer_config("zero_padding2d", {{"padding", std::vector<int64_t>{2, 1, 0, 1}}}));
        const std::string back = named(make_layer_config("cropping2d", {{"cropping", std::vector<int64_t>{1, 2, 1, 0}}}));
        last = named(simple("add"), {back, in});
        break;
      }
      default: {
        if (h < 4 || w < 4) break;
        last = named(pool("max_pool2d", 3, 2, {PaddingMode::Explicit, 1}));
        h = (h - 1) / 2 + 1;
        w = (w - 1) / 2 + 1;
      }
    }
  }
  return layers;
}

TEST(ShardPlan, RandomGraphsPlanConsistently) {
  std::mt19937 rng(77);
  const GridShape grids[] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {3, 2}, {1, 4}, {4, 3}};
  int planned = 0, graphs = 0;
  for (int iter = 0; iter < 60; ++iter) {
    const int h = 9 + int(rng() % 90), w = 9 + int(rng() % 90);
    const bool fcn = rng() % 2 == 0;
    const ModelSpec m = make_model(h, w, 1, random_graph(rng, h, w), fcn);
    graphs += m.chain() ? 0 : 1;
    const int max_r = max_grid_rows(m), max_c = max_grid_cols(m);
    for (const GridShape g : grids) {
      SCOPED_TRACE(::testing::Message() << "iter " << iter << " input " << h << "x" << w << " grid " << g.rows << "x"
                                      << g.cols << " fcn " << fcn);
      if (g.rows > max_r || g.cols > max_c) {
        EXPECT_THROW(make_shard_plan(m, g), ConfigError);
        continue;
      }
      const ShardPlan plan = make_shard_plan(m, g);  // every grid up to the largest plans
      check_plan(m, plan);
      if (HasFatalFailure()) return;
      ++planned;
    }
  }
  EXPECT_GT(planned, 200);
  EXPECT_GT(graphs, 40);
}

TEST(ShardPlan, JoinInputsAtDifferentScalesDoNotLineUp) {
  // 16 rows: a 2x2/2 conv and a valid 9x9 conv both make 8 rows, downsampled 2x and 1x.
  LayerConfig a = conv(2, 2, 2, 1, {PaddingMode::Valid, 0}), b = conv(2, 9, 1, 1, {PaddingMode::Valid, 0});
  a.name = "a";
  b.name = "b";
  b.inputs = {"input"};
  LayerConfig sum = simple("add");
  sum.inputs = {"a", "b"};
  const ModelSpec m = make_model(16, 16, 1, {a, b, sum}, false);
  EXPECT_NO_THROW(make_shard_plan(m, {1, 1}));
  try {
    make_shard_plan(m, {2, 1});
    FAIL() << "planned a join whose inputs' shards do not line up";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("(add 'add_1'): its inputs 'a' and 'b' are split at different rows (2x and "
                                         "1x downsampled), so their shards do not line up"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ht
