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

namespace ht {
namespace {

LayerConfig conv(int filters, int kernel, int stride = 1, int dilation = 1, Padding pad = {PaddingMode::Same, 0}) {
  return make_layer_config("conv2d", {{"filters", int64_t(filters)},
                                      {"kernel", int64_t(kernel)},
                                      {"stride", int64_t(stride)},
                                      {"dilation", int64_t(dilation)},
                                      {"padding", pad}});
}
LayerConfig pool(const std::string& type, int size, int stride, Padding pad = {}) {
  return make_layer_config(type, {{"pool", int64_t(size)}, {"stride", int64_t(stride)}, {"padding", pad}});
}
LayerConfig simple(const std::string& type) { return make_layer_config(type); }
LayerConfig dense(int units) { return make_layer_config("dense", {{"units", int64_t(units)}}); }

// A classifier (global pool + dense + softmax) or, with `fcn`, the same layers before the
// global pool: build_model_spec insists that a per-pixel output has the input's size, a
// rule of the losses that the planner does not depend on, so the spec is truncated.
ModelSpec make_model(int h, int w, int c, std::vector<LayerConfig> layers, bool fcn) {
  Config cfg;
  cfg.source_path = "test.yaml";
  cfg.model.height = h;
  cfg.model.width = w;
  cfg.model.channels = c;
  const int spatial = int(layers.size());
  layers.push_back(simple("global_avg_pool"));
  layers.push_back(dense(2));
  cfg.model.layers = layers;
  cfg.model.loss = LossType::SoftmaxCrossEntropy;
  ModelSpec spec = build_model_spec(cfg);
  if (fcn) {
    spec.layers.resize(spatial);
    spec.spatial_layers = spatial;
    spec.readers.resize(spatial + 1);
    spec.readers.back().clear();
  }
  return spec;
}

// ---- An independent, brute-force statement of when a grid works along one axis. ----
const Window1D& win(const LayerSpec& l, bool rows) { return rows ? l.rows : l.cols; }

int level_of(const ModelSpec& m) {
  for (int l = 0; l < int(m.layers.size()); ++l)
    if (m.layers[l].config.type() == "global_avg_pool") return l;
  return int(m.layers.size());
}

bool reference_feasible(const ModelSpec& m, bool rows, int parts) {
  const int level = level_of(m);
  const int n = level == 0 ? (rows ? m.input.h : m.input.w) : (rows ? m.layers[level - 1].out.h : m.layers[level - 1].out.w);
  if (parts > n) return false;
  std::vector<int> sizes(parts, n / parts);
  for (int i = 0; i < n % parts; ++i) sizes[i]++;
  std::vector<int> b(parts + 1, 0);
  for (int i = 0; i < parts; ++i) b[i + 1] = b[i] + sizes[i];
  for (int l = level - 1; l >= 0; --l) {
    const Window1D& w = win(m.layers[l], rows);
    if (parts > 1 && w.pad_lo >= w.span()) return false;  // shards would not line up
    std::vector<int> bi(parts + 1, 0);
    for (int i = 1; i < parts; ++i) bi[i] = std::min(b[i] * w.stride, w.in);
    bi[parts] = w.in;
    for (int i = 0; i < parts; ++i)
      if (bi[i + 1] <= bi[i]) return false;
    for (int i = 0; i < parts; ++i) {
      int lo = w.in, hi = 0;  // clamped hull of every read
      for (int o = b[i]; o < b[i + 1]; ++o)
        for (int j = 0; j < w.kernel; ++j) {
          const int x = o * w.stride - w.pad_lo + j * w.dilation;
          if (x >= 0 && x < w.in) lo = std::min(lo, x), hi = std::max(hi, x + 1);
        }
      if (hi <= lo) continue;
      if (i > 0 && lo < bi[i - 1]) return false;
      if (i + 1 < parts && hi > bi[i + 2]) return false;
    }
    b = bi;
  }
  return true;
}

// ---- Brute-force checks of a plan. ----
// The input rows output row o reads, from each window kind's definition (SPEC sections 5
// and 7), unclamped.
std::vector<int> reads(const Window1D& w, int o) {
  std::vector<int> r;
  switch (w.kind) {
    case WindowKind::Slide:
      for (int j = 0; j < w.kernel; ++j) r.push_back(o * w.stride - w.pad_lo + j * w.dilation);
      break;
    case WindowKind::Shift: r.push_back(o - w.pad_lo); break;
    case WindowKind::Nearest: r.push_back(o / w.stride); break;
    case WindowKind::Bilinear: {
      const double src = std::max((o + 0.5) / w.stride - 0.5, 0.0);
      r.push_back(int(src));
      r.push_back(std::min(int(src) + 1, w.in - 1));
      break;
    }
    case WindowKind::Transpose:  // every input whose kernel footprint covers the full output row
      for (int i = 0; i < w.in; ++i)
        if (i * w.stride <= o + w.pad_lo && o + w.pad_lo < i * w.stride + w.kernel) r.push_back(i);
      break;
  }
  return r;
}

bool inside(const Rect& r, int y, int x) { return y >= r.rows.lo && y < r.rows.hi && x >= r.cols.lo && x < r.cols.hi; }

void check_window_geometry(const ModelSpec& m, const ShardPlan& plan, int l, bool rows) {
  const Window1D& w = win(m.layers[l], rows);
  const AxisPlan& a = rows ? plan.layers[l].rows : plan.layers[l].cols;
  for (size_t i = 0; i < a.owned_out.size(); ++i) {
    const Range out = a.owned_out[i];
    ASSERT_FALSE(out.empty());
    int lo = INT32_MAX, hi = INT32_MIN;  // unclamped hull of every read
    for (int o = out.lo; o < out.hi; ++o)
      for (int x : reads(w, o)) {
        lo = std::min(lo, x);
        hi = std::max(hi, x + 1);
      }
    // The clamped reads, widened to cover the owned input rows.
    const Range own = a.owned_in[i];
    const Range expected{std::min(std::clamp(lo, 0, w.in), own.lo), std::max(std::clamp(hi, 0, w.in), own.hi)};
    EXPECT_EQ(a.needed_in[i], expected) << "layer " << l << " shard " << i;
    if (w.kind == WindowKind::Transpose) {
      // The full transposed output of the needed rows, less the crops, is the owned output.
      const Range& need = a.needed_in[i];
      EXPECT_GE(a.pad_lo[i], 0);
      EXPECT_GE(a.pad_hi[i], 0);
      EXPECT_EQ(need.lo * w.stride - w.pad_lo + a.pad_lo[i], out.lo) << "layer " << l << " shard " << i;
      EXPECT_EQ((need.hi - 1) * w.stride + w.kernel - w.pad_lo - a.pad_hi[i], out.hi) << "layer " << l;
      continue;
    }
    if (w.kind != WindowKind::Slide) {  // read by image coordinates: no padding of their own
      EXPECT_EQ(a.pad_lo[i], 0);
      EXPECT_EQ(a.pad_hi[i], 0);
      continue;
    }
    EXPECT_LT(own.hi - std::clamp(hi, 0, w.in), w.stride) << "unread owned rows must not add an output";
    EXPECT_EQ(a.pad_lo[i], std::max(0, std::min(hi, 0) - lo));
    EXPECT_EQ(a.pad_hi[i], std::max(0, hi - std::max(lo, w.in)));
    // The local window over the needed rows with this padding yields exactly the owned outputs.
    const int local = (a.needed_in[i].size() + a.pad_lo[i] + a.pad_hi[i] - w.span()) / w.stride + 1;
    EXPECT_EQ(local, out.size()) << "layer " << l << " shard " << i;
    if (a.pad_lo[i] > 0) {
      EXPECT_EQ(a.needed_in[i].lo, 0);
    }
    if (a.pad_hi[i] > 0) {
      EXPECT_EQ(a.needed_in[i].hi, w.in);
    }
  }
}

// Simulates the forward exchange of layer `l` for one rank, with counts over the hull of its
// owned and needed rectangles.
void check_exchange(const ShardPlan& plan, int l, int rank) {
  const Rect own = plan.owned_input(l, rank), need = plan.needed_input(l, rank);
  const Rect hull{{std::min(own.rows.lo, need.rows.lo), std::max(own.rows.hi, need.rows.hi)},
                  {std::min(own.cols.lo, need.cols.lo), std::max(own.cols.hi, need.cols.hi)}};
  const int hh = hull.rows.size(), hw = hull.cols.size();
  std::vector<int> count(size_t(hh) * hw, 0);
  auto at = [&](int y, int x) -> int& { return count[size_t(y - hull.rows.lo) * hw + (x - hull.cols.lo)]; };
  for (int y = own.rows.lo; y < own.rows.hi; ++y)
    for (int x = own.cols.lo; x < own.cols.hi; ++x) at(y, x) = 1;
  const Rect after_rows{need.rows, own.cols};

  for (HaloPhase ph : {HaloPhase::Rows, HaloPhase::Cols}) {
    int last_peer = -1;
    for (const HaloRegion& r : plan.receives(l, rank, ph)) {
      ASSERT_GT(r.peer, last_peer) << "peers in increasing order";
      last_peer = r.peer;
      ASSERT_NE(r.peer, rank);
      ASSERT_EQ(plan.group_of(r.peer), plan.group_of(rank));
      const Rect peer_own = plan.owned_input(l, r.peer);
      if (ph == HaloPhase::Rows) {
        ASSERT_EQ(plan.grid_col_of(r.peer), plan.grid_col_of(rank));
        ASSERT_TRUE(peer_own.rows.contains(r.rect.rows) && peer_own.cols.contains(r.rect.cols));
        ASSERT_TRUE(after_rows.rows.contains(r.rect.rows) && after_rows.cols.contains(r.rect.cols));
      } else {
        ASSERT_EQ(plan.grid_row_of(r.peer), plan.grid_row_of(rank));
        ASSERT_TRUE(need.rows.contains(r.rect.rows) && need.cols.contains(r.rect.cols));
      }
      // What the peer holds by now: its owned rect, plus (cols phase) its rows-phase halo.
      const Rect peer_rows{plan.needed_input(l, r.peer).rows, peer_own.cols};
      for (int y = r.rect.rows.lo; y < r.rect.rows.hi; ++y)
        for (int x = r.rect.cols.lo; x < r.rect.cols.hi; ++x) {
          // Plain ifs: a gtest assertion per cell would dominate the run time.
          if (!(inside(peer_own, y, x) || (ph == HaloPhase::Cols && inside(peer_rows, y, x))))
            FAIL() << "peer " << r.peer << " does not hold (" << y << "," << x << ")";
          if (!inside(hull, y, x)) FAIL() << "received (" << y << "," << x << ") outside owned + needed";
          ++at(y, x);
        }
    }
    const Rect must = ph == HaloPhase::Rows ? after_rows : need;
    for (int y = hull.rows.lo; y < hull.rows.hi; ++y)
      for (int x = hull.cols.lo; x < hull.cols.hi; ++x) {
        const int c = at(y, x);
        if (c > 1) FAIL() << "layer " << l << " rank " << rank << " holds (" << y << "," << x << ") twice";
        if (inside(must, y, x) && c != 1)
          FAIL() << "layer " << l << " rank " << rank << " lacks (" << y << "," << x << ")";
        if (c == 1 && !inside(own, y, x) && !inside(must, y, x))
          FAIL() << "received a cell it does not need (" << y << "," << x << ")";
      }
  }
}

void check_sends_match(const ShardPlan& plan, int l, int rank) {
  for (HaloPhase ph : {HaloPhase::Rows, HaloPhase::Cols}) {
    int last_peer = -1;
    for (const HaloRegion& s : plan.sends(l, rank, ph)) {
      ASSERT_GT(s.peer, last_peer);
      last_peer = s.peer;
      int matches = 0;
      for (const HaloRegion& r : plan.receives(l, s.peer, ph))
        if (r.peer == rank) matches += r.rect == s.rect ? 1 : 100;
      ASSERT_EQ(matches, 1) << "layer " << l << " rank " << rank << " -> " << s.peer;
    }
    for (const HaloRegion& r : plan.receives(l, rank, ph)) {
      int matches = 0;
      for (const HaloRegion& s : plan.sends(l, r.peer, ph))
        if (s.peer == rank) matches += s.rect == r.rect ? 1 : 100;
      ASSERT_EQ(matches, 1);
    }
  }
}

void check_plan(const ModelSpec& m, const ShardPlan& plan) {
  const int level = level_of(m);
  ASSERT_EQ(plan.layers.size(), m.layers.size());
  for (int l = 0; l < int(m.layers.size()); ++l) {
    const LayerSpec& L = m.layers[l];
    SCOPED_TRACE("layer " + std::to_string(l) + " " + L.config.name);
    if (l > level) {  // replicated, after the global pool
      ASSERT_FALSE(plan.layers[l].spatial);
      for (int r = 0; r < plan.world(); ++r) {
        EXPECT_EQ(plan.owned_output(l, r), (Rect{{0, L.out.h}, {0, L.out.w}}));
        EXPECT_TRUE(plan.receives(l, r, HaloPhase::Rows).empty() && plan.sends(l, r, HaloPhase::Cols).empty());
      }
      continue;
    }
    ASSERT_TRUE(plan.layers[l].spatial);
    // Every input element of the layer owned by exactly one shard per group; owned_in is
    // what the layers that made its inputs own of their outputs.
    for (int g = 0; g < plan.groups; ++g) {
      std::vector<int> count(size_t(L.in.h) * L.in.w, 0);
      for (int s = 0; s < plan.shards(); ++s) {
        const int r = g * plan.shards() + s;
        const Rect own = plan.owned_input(l, r);
        for (int t : L.inputs) {
          ASSERT_EQ(own, t == 0 ? plan.owned_image(r) : plan.owned_output(t - 1, r)) << "input tensor " << t;
        }
        ASSERT_EQ(own, plan.owned_input(l, s)) << "groups are copies of group 0";
        for (int y = own.rows.lo; y < own.rows.hi; ++y)
          for (int x = own.cols.lo; x < own.cols.hi; ++x) ++count[size_t(y) * L.in.w + x];
      }
      ASSERT_TRUE(std::all_of(count.begin(), count.end(), [](int c) { return c == 1; }));
    }
    if (l == level) {  // the global pool: replicated output, nothing exchanged
      for (int r = 0; r < plan.world(); ++r) {
        EXPECT_EQ(plan.owned_output(l, r), (Rect{{0, 1}, {0, 1}}));
        EXPECT_EQ(plan.needed_input(l, r), plan.owned_input(l, r));
      }
    } else {
      check_window_geometry(m, plan, l, true);
      check_window_geometry(m, plan, l, false);
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (int r = 0; r < plan.world(); ++r) {
      if (!L.windowed()) {
        EXPECT_EQ(plan.needed_input(l, r), plan.owned_input(l, r));
        EXPECT_TRUE(plan.receives(l, r, HaloPhase::Rows).empty());
        EXPECT_TRUE(plan.receives(l, r, HaloPhase::Cols).empty());
      }
      // The worker feeds a rank that receives nothing its owned tile as is.
      if (plan.receives(l, r, HaloPhase::Rows).empty() && plan.receives(l, r, HaloPhase::Cols).empty()) {
        EXPECT_EQ(plan.needed_input(l, r), plan.owned_input(l, r));
      }
      check_exchange(plan, l, r);
      check_sends_match(plan, l, r);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  // Outputs of the last feature-map layer: every element owned exactly once per group.
  if (level > 0) {
    const LayerSpec& L = m.layers[level - 1];
    std::vector<int> count(size_t(L.out.h) * L.out.w, 0);
    for (int s = 0; s < plan.shards(); ++s) {
      const Rect o = plan.owned_output(level - 1, s);
      for (int y = o.rows.lo; y < o.rows.hi; ++y)
        for (int x = o.cols.lo; x < o.cols.hi; ++x) ++count[size_t(y) * L.out.w + x];
    }
    ASSERT_TRUE(std::all_of(count.begin(), count.end(), [](int c) { return c == 1; }));
  }
}

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
    ASSERT_TRUE(reference_feasible(m, true, max_r));
    ASSERT_TRUE(reference_feasible(m, false, max_c));
    // Smaller models get checked on every grid, larger ones on a few.
    for (const GridShape g : grids) {
      if (int64_t(h) * w > 40000 && rng() % 3 != 0) continue;
      const int groups = 1 + int(rng() % 2);
      SCOPED_TRACE(testing::Message() << "iter " << iter << " input " << h << "x" << w << " grid " << g.rows
                                      << "x" << g.cols << " groups " << groups << " fcn " << fcn);
      const bool feasible = reference_feasible(m, true, g.rows) && reference_feasible(m, false, g.cols);
      try {
        const ShardPlan plan = make_shard_plan(m, g, groups * g.rows * g.cols);
        ASSERT_TRUE(feasible) << "planned a grid that cannot work";
        ASSERT_EQ(plan.groups, groups);
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
      SCOPED_TRACE(testing::Message() << "iter " << iter << " input " << h << "x" << w << " grid " << g.rows << "x"
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

TEST(ShardPlan, MaxGridIsTheBoundary) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 60; ++iter) {
    const int h = 7 + int(rng() % 120), w = 7 + int(rng() % 120);
    const ModelSpec m = make_model(h, w, 1, random_layers(rng, h, w), rng() % 2 == 0);
    const int r = max_grid_rows(m), c = max_grid_cols(m);
    EXPECT_TRUE(reference_feasible(m, true, r));
    EXPECT_FALSE(reference_feasible(m, true, r + 1));
    EXPECT_TRUE(reference_feasible(m, false, c));
    EXPECT_FALSE(reference_feasible(m, false, c + 1));
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
  EXPECT_FALSE(p.layers[3].spatial);                        // dense
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

TEST(ShardPlan, RejectsAShardThinnerThanTheHalo) {
  // 8 rows into 4 shards of 2, but a 7x7 dilation-2 conv reads 6 rows on each side: only
  // two shards of 4 rows are as thick as that halo.
  const ModelSpec m = make_model(8, 8, 1, {conv(1, 7, 1, 2)}, true);
  EXPECT_EQ(max_grid_rows(m), 2);
  try {
    make_shard_plan(m, {4, 1});
    FAIL() << "planned an impossible grid";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("conv2d_1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rows"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max_grid_rows = 2"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(make_shard_plan(m, {2, 1}));
  EXPECT_THROW(make_shard_plan(m, {3, 1}), ConfigError);
}

TEST(ShardPlan, RejectsMoreShardsThanRowsAndBadWorlds) {
  const ModelSpec m = make_model(12, 12, 1, {conv(1, 3), pool("max_pool2d", 2, 2)}, false);
  EXPECT_THROW(make_shard_plan(m, {7, 1}), ConfigError);  // the pool output has 6 rows
  EXPECT_NO_THROW(make_shard_plan(m, {6, 1}));
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
