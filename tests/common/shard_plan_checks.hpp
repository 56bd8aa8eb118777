// Shared by the shard plan tests: small layer builders, an independent brute-force
// statement of when a grid works along one axis, and the brute-force checks of a plan
// (every element owned once, every needed element held once after the exchange, sends ==
// the peer's receives, each window kind's reads).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "orchestrator/config.hpp"
#include "orchestrator/layer_kind.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/shard_plan.hpp"

namespace ht::plan_checks {

inline LayerConfig conv(int filters, int kernel, int stride = 1, int dilation = 1, Padding pad = {PaddingMode::Same, 0}) {
  return make_layer_config("conv2d", {{"filters", int64_t(filters)},
                                      {"kernel", int64_t(kernel)},
                                      {"stride", int64_t(stride)},
                                      {"dilation", int64_t(dilation)},
                                      {"padding", pad}});
}
inline LayerConfig pool(const std::string& type, int size, int stride, Padding pad = {}) {
  return make_layer_config(type, {{"pool", int64_t(size)}, {"stride", int64_t(stride)}, {"padding", pad}});
}
inline LayerConfig simple(const std::string& type) { return make_layer_config(type); }
inline LayerConfig dense(int units) { return make_layer_config("dense", {{"units", int64_t(units)}}); }

// A classifier (global pool + dense + softmax) or, with `fcn`, the same layers before the
// global pool: build_model_spec insists that a per-pixel output has the input's size, a
// rule of the losses that the planner does not depend on, so the spec is truncated.
inline ModelSpec make_model(int h, int w, int c, std::vector<LayerConfig> layers, bool fcn) {
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
    spec.readers.resize(spatial + 1);
    spec.readers.back().clear();
  }
  return spec;
}

// ---- An independent, brute-force statement of when a grid works along one axis. ----
inline const Window1D& win(const LayerSpec& l, bool rows) { return rows ? l.rows : l.cols; }

inline int level_of(const ModelSpec& m) {
  for (int l = 0; l < int(m.layers.size()); ++l)
    if (m.layers[l].config.type() == "global_avg_pool") return l;
  return int(m.layers.size());
}

inline bool reference_feasible(const ModelSpec& m, bool rows, int parts) {
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
    b = bi;  // a halo may come from any shard of the row or column, not only a neighbour
  }
  return true;
}

// The model's first `layers` layers, as a fully convolutional model.
inline ModelSpec truncated(const ModelSpec& m, int layers) {
  ModelSpec p = m;
  p.layers.resize(size_t(layers));
  p.readers.resize(size_t(layers) + 1);
  p.readers.back().clear();
  return p;
}

// A grid of a chain works without a tail when both axes do; otherwise, when some feature
// map has fewer rows or cols than the grid (T0, the first), with a tail from a tensor T in
// [2, T0] whose prefix (tensors before T, split at tensor T - 1) works. A per-pixel output
// is never in a tail.
inline bool feasible_grid(const ModelSpec& m, int rows, int cols) {
  if (reference_feasible(m, true, rows) && reference_feasible(m, false, cols)) return true;
  const int level = level_of(m);
  if (level == int(m.layers.size())) return false;  // a per-pixel output
  int small = -1;
  for (int t = 1; t <= level && small < 0; ++t)
    if (m.tensor_shape(t).h < rows || m.tensor_shape(t).w < cols) small = t;
  for (int tail = small; tail >= 2; --tail) {
    const ModelSpec prefix = truncated(m, tail - 1);
    if (reference_feasible(prefix, true, rows) && reference_feasible(prefix, false, cols)) return true;
  }
  return false;
}

// ---- Brute-force checks of a plan. ----
// The input rows output row o reads, from each window kind's definition (SPEC sections 5
// and 7), unclamped.
inline std::vector<int> reads(const Window1D& w, int o) {
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

inline bool inside(const Rect& r, int y, int x) { return y >= r.rows.lo && y < r.rows.hi && x >= r.cols.lo && x < r.cols.hi; }

inline void check_window_geometry(const ModelSpec& m, const ShardPlan& plan, int l, bool rows) {
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
inline void check_exchange(const ShardPlan& plan, int l, int rank) {
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

inline void check_sends_match(const ShardPlan& plan, int l, int rank) {
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

inline void check_plan(const ModelSpec& m, const ShardPlan& plan) {
  // Layers [0, level) run split; `level` is the global pool, or the first layer of the tail,
  // which gathers its input; the rest run replicated.
  const int level = plan.tail >= 0 ? plan.tail - 1 : level_of(m);
  ASSERT_EQ(plan.layers.size(), m.layers.size());
  for (int l = 0; l < int(m.layers.size()); ++l) {
    const LayerSpec& L = m.layers[l];
    SCOPED_TRACE("layer " + std::to_string(l) + " " + L.config.name);
    if (plan.tail >= 0 && l == level) {
      ASSERT_FALSE(plan.layers[l].sharded);
      ASSERT_TRUE(plan.layers[l].gathers);
      for (int r = 0; r < plan.world(); ++r) {
        EXPECT_EQ(plan.owned_output(l, r), (Rect{{0, L.out.h}, {0, L.out.w}}));
        EXPECT_EQ(plan.owned_input(l, r), (Rect{{0, L.in.h}, {0, L.in.w}}));
        EXPECT_TRUE(plan.receives(l, r, HaloPhase::Rows).empty() && plan.receives(l, r, HaloPhase::Cols).empty());
      }
      continue;
    }
    if (l > level) {  // replicated, after the global pool or in the tail
      ASSERT_FALSE(plan.layers[l].sharded);
      for (int r = 0; r < plan.world(); ++r) {
        EXPECT_EQ(plan.owned_output(l, r), (Rect{{0, L.out.h}, {0, L.out.w}}));
        EXPECT_TRUE(plan.receives(l, r, HaloPhase::Rows).empty() && plan.sends(l, r, HaloPhase::Cols).empty());
      }
      continue;
    }
    ASSERT_EQ(plan.layers[l].sharded, l < level);  // the global pool's output is replicated
    ASSERT_TRUE(plan.layers[l].input_sharded);
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


}  // namespace ht::plan_checks
