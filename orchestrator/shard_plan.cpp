#include "orchestrator/shard_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "orchestrator/layer_kind.hpp"

namespace ht {

Range intersect(const Range& a, const Range& b) {
  Range r{std::max(a.lo, b.lo), std::min(a.hi, b.hi)};
  if (r.hi < r.lo) r.hi = r.lo;  // one spelling of "empty" keeps comparisons simple
  return r;
}

Rect intersect(const Rect& a, const Rect& b) { return {intersect(a.rows, b.rows), intersect(a.cols, b.cols)}; }

namespace {

enum class Axis { Rows, Cols };

const char* axis_name(Axis a) { return a == Axis::Rows ? "rows" : "cols"; }
const char* axis_key(Axis a) { return a == Axis::Rows ? "max_grid_rows" : "max_grid_cols"; }

const Window1D& window_of(const LayerSpec& l, Axis a) { return a == Axis::Rows ? l.rows : l.cols; }
int extent(const Shape3& s, Axis a) { return a == Axis::Rows ? s.h : s.w; }

// A tensor's downsampling against the image along one axis: num / den (strides divide,
// upsampling multiplies). den 0: not a feature map.
struct Ratio {
  int64_t num = 1, den = 1;
  Ratio times(int64_t n, int64_t d) const {
    const int64_t a = num * n, b = den * d, g = std::gcd(a, b);
    return {a / g, b / g};
  }
  bool operator<(const Ratio& o) const { return num * o.den < o.num * den; }
  bool operator==(const Ratio& o) const { return num == o.num && den == o.den; }
  std::string text() const { return den == 1 ? fmt::format("{}x", num) : fmt::format("{}/{}x", num, den); }
};

// How far each tensor is downsampled along one axis (the strides and upsamplings on its
// path), and the tensor whose shard borders all others follow: the coarsest feature map,
// the last one at that scale (the global pool's input, the last output of a fully
// convolutional chain, a U-Net's bottom). Shard borders are even there and map to every
// other feature map by its scale against it, so a strided window never straddles a
// border, an upsampling's borders are its input's times its factor, and the inputs of a
// join line up.
struct Scales {
  std::vector<Ratio> factor;  // per tensor
  int reference = 0;          // the tensor the borders are split at
};

Scales scales_of(const ModelSpec& m, Axis axis) {
  Scales s;
  s.factor.assign(size_t(m.tensors()), Ratio{0, 0});
  s.factor[0] = {1, 1};
  for (int l = 0; l < int(m.layers.size()); ++l) {
    if (!m.tensor_spatial(l + 1)) continue;
    const LayerSpec& L = m.layers[l];
    Ratio f = s.factor[L.inputs[0]];
    for (int t : L.inputs) f = std::max(f, s.factor[t]);  // unequal scales: refused by plan_axis
    const Window1D& w = axis == Axis::Rows ? L.rows : L.cols;
    if (!L.windowed() || w.kind == WindowKind::Shift) s.factor[l + 1] = f;
    else if (w.upsamples()) s.factor[l + 1] = f.times(1, w.stride);
    else s.factor[l + 1] = f.times(w.stride, 1);
  }
  for (int t = 0; t < m.tensors(); ++t)
    if (s.factor[t].den != 0 && !(s.factor[t] < s.factor[s.reference])) s.reference = t;
  return s;
}

std::string describe(const ModelSpec& m, int layer) {
  if (layer < 0) return "model.input";
  const LayerConfig& c = m.layers[layer].config;
  if (c.line > 0)
    return fmt::format("model.layers[{}] ({} '{}', line {})", layer, c.type(), c.name, c.line);
  return fmt::format("model.layers[{}] ({} '{}')", layer, c.type(), c.name);
}

std::string show(const Range& r) { return fmt::format("[{}, {})", r.lo, r.hi); }

std::string tensor_name(const ModelSpec& m, int t) { return t == 0 ? kInputName : m.layers[t - 1].config.name; }

// Plans one axis for `parts` shards into `out` (one AxisPlan per layer). Returns "" on
// success, otherwise why this axis cannot be split that way (without the grid advice).
std::string plan_axis(const ModelSpec& m, Axis axis, int parts, std::vector<AxisPlan>* out) {
  const int nl = int(m.layers.size());
  const Scales scales = scales_of(m, axis);
  std::vector<AxisPlan> plan(nl);
  for (auto& a : plan) {
    a.owned_in.resize(parts);
    a.owned_out.resize(parts);
    a.needed_in.resize(parts);
    a.pad_lo.assign(parts, 0);
    a.pad_hi.assign(parts, 0);
  }

  // Borders of the reference tensor: as even as possible, the first n % P one larger.
  const int ref = scales.reference;
  const int n = extent(m.tensor_shape(ref), axis);
  if (n < parts)
    return fmt::format("{} has {} {} and cannot be split into {} shards",
                       ref == 0 ? "model.input" : describe(m, ref - 1) + ": its output", n, axis_name(axis), parts);
  std::vector<int> border(parts + 1, 0);
  for (int i = 0; i < parts; ++i) border[i + 1] = border[i] + n / parts + (i < n % parts ? 1 : 0);
  // Every feature map's borders: the reference's times its scale against the reference,
  // clamped to its size; the last border is its size.
  std::vector<std::vector<Range>> owned(size_t(m.tensors()));
  for (int t = 0; t < m.tensors(); ++t) {
    const Ratio f = scales.factor[t];
    if (f.den == 0) continue;
    const Ratio against = scales.factor[ref].times(f.den, f.num);  // the reference's scale against t's
    if (against.den != 1)
      return fmt::format("{} is downsampled {} along {} and the coarsest feature map {}; the shard borders of "
                         "the two cannot line up",
                         t == 0 ? "model.input" : describe(m, t - 1) + ": its output", f.text(), axis_name(axis),
                         scales.factor[ref].text());
    const int64_t scale = against.num, size = extent(m.tensor_shape(t), axis);
    std::vector<int> b(parts + 1, 0);
    for (int i = 1; i < parts; ++i) b[i] = int(std::min<int64_t>(border[i] * scale, size));
    b[parts] = int(size);
    for (int i = 0; i < parts; ++i) owned[t].push_back({b[i], b[i + 1]});
  }

  for (int l = nl - 1; l >= 0; --l) {
    const LayerSpec& L = m.layers[l];
    AxisPlan& a = plan[l];
    if (!L.spatial) {  // replicated after the global pool: whole ranges everywhere
      const Range in{0, extent(L.in, axis)}, o{0, extent(L.out, axis)};
      for (int i = 0; i < parts; ++i) {
        a.owned_in[i] = a.needed_in[i] = in;
        a.owned_out[i] = o;
      }
      continue;
    }
    const std::vector<Range>& in = owned[L.inputs[0]];
    for (size_t k = 1; k < L.inputs.size(); ++k)
      if (owned[L.inputs[k]] != in) {
        const int t0 = L.inputs[0], tk = L.inputs[k];
        return fmt::format("{}: its inputs '{}' and '{}' are split at different {} ({} and {} downsampled), so "
                           "their shards do not line up",
                           describe(m, l), tensor_name(m, t0), tensor_name(m, tk), axis_name(axis),
                           scales.factor[t0].text(), scales.factor[tk].text());
      }
    if (L.kind().traits.global_pool) {  // each shard reduces its own part; the result is replicated
      for (int i = 0; i < parts; ++i) {
        a.owned_in[i] = a.needed_in[i] = in[i];
        a.owned_out[i] = {0, 1};
      }
      continue;
    }
    const Window1D& w = window_of(L, axis);
    // needed_in is widened to cover owned_in (below); that keeps the local output count
    // only while the trailing owned rows a shard does not read are fewer than a stride,
    // i.e. pad_lo < span. A padding wider than the window cannot be split.
    const bool slide = w.kind == WindowKind::Slide;
    if (slide && parts > 1 && w.pad_lo >= w.span())
      return fmt::format(
          "{}: its padding {} is not smaller than its window span {} (kernel {}, dilation {}), so "
          "its input cannot be split along {}",
          describe(m, l), w.pad_lo, w.span(), w.kernel, w.dilation, axis_name(axis));
    for (int i = 0; i < parts; ++i) {
      a.owned_out[i] = owned[l + 1][i];
      a.owned_in[i] = in[i];
      if (a.owned_in[i].empty())
        return fmt::format(
            "{}: shard {} of {} along {} would own no input {} (its {} input {} split at output "
            "borders x stride {})",
            describe(m, l), i, parts, axis_name(axis), axis_name(axis), w.in, axis_name(axis), w.stride);
      const int first = w.first_input(a.owned_out[i].lo), end = w.end_input(a.owned_out[i].hi);
      // The read range, widened to cover owned_in: a strided window may skip the last owned
      // rows (a 2x2/2 pool over an odd size), yet the extended buffer must hold all owned
      // rows, since the layer's input tile and the neighbours' halos come from it.
      a.needed_in[i] = {std::min(std::clamp(first, 0, w.in), a.owned_in[i].lo),
                        std::max(std::clamp(end, 0, w.in), a.owned_in[i].hi)};
      if (slide) {  // the zeros of the window beyond the image
        a.pad_lo[i] = std::max(0, std::min(end, 0) - first);
        a.pad_hi[i] = std::max(0, end - std::max(first, w.in));
      } else if (w.kind == WindowKind::Transpose) {
        // The full transposed output of the needed rows, cropped to the owned ones.
        const Range& need = a.needed_in[i];
        a.pad_lo[i] = a.owned_out[i].lo + w.pad_lo - need.lo * w.stride;
        a.pad_hi[i] = (need.hi - 1) * w.stride + w.kernel - w.pad_lo - a.owned_out[i].hi;
      }  // the others index by image coordinates, with no padding of their own
    }
    // A shard may only read from its direct neighbours: no halo wider than a neighbour.
    for (int i = 0; i < parts; ++i) {
      const Range& need = a.needed_in[i];
      const int lo_limit = i > 0 ? a.owned_in[i - 1].lo : 0;
      const int hi_limit = i + 1 < parts ? a.owned_in[i + 1].hi : w.in;
      if (need.lo < lo_limit || need.hi > hi_limit) {
        const bool below = need.lo < lo_limit;
        const int j = below ? i - 1 : i + 1;
        return fmt::format(
            "{}: with {} shards along {}, shard {} reads input {} {} of {} but its neighbour "
            "shard {} owns only {} ({} {}); a shard must be at least as thick as the halo "
            "(kernel {}, dilation {}, stride {}) its neighbour needs",
            describe(m, l), parts, axis_name(axis), i, axis_name(axis), show(need), w.in, j,
            show(a.owned_in[j]), a.owned_in[j].size(), axis_name(axis), w.kernel, w.dilation, w.stride);
      }
    }
  }
  if (out) out->swap(plan);
  return "";
}

// Largest shard count along `axis` that plans. Feasibility only gets harder as shards get
// thinner, so a binary search over [1, n] finds the boundary (P plans, P + 1 does not).
int max_grid(const ModelSpec& m, Axis axis) {
  const int n = extent(m.tensor_shape(scales_of(m, axis).reference), axis);
  int lo = 1, hi = std::max(n, 1) + 1;  // lo plans (one shard always does), hi does not
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (plan_axis(m, axis, mid, nullptr).empty())
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace

int max_grid_rows(const ModelSpec& model) { return max_grid(model, Axis::Rows); }
int max_grid_cols(const ModelSpec& model) { return max_grid(model, Axis::Cols); }

ShardPlan make_shard_plan(const ModelSpec& model, GridShape grid, int world) {
  if (model.layers.empty()) throw ConfigError("shard plan: the model has no layers");
  if (grid.rows < 1 || grid.cols < 1)
    throw ConfigError(fmt::format("parallel.grid: expected positive [rows, cols], found [{}, {}]",
                                  grid.rows, grid.cols));
  const int shards = grid.rows * grid.cols;
  if (world == 0) world = shards;
  if (world < 0 || world % shards != 0)
    throw ConfigError(fmt::format(
        "parallel.grid [{}, {}] needs a world size divisible by {} (one shard per rank, whole "
        "sample groups); found {} ranks",
        grid.rows, grid.cols, shards, world));

  ShardPlan plan;
  plan.grid_rows = grid.rows;
  plan.grid_cols = grid.cols;
  plan.groups = world / shards;
  plan.model = model;

  std::vector<AxisPlan> rows, cols;
  const Axis axes[2] = {Axis::Rows, Axis::Cols};
  for (Axis axis : axes) {
    const int parts = axis == Axis::Rows ? grid.rows : grid.cols;
    const std::string why = plan_axis(model, axis, parts, axis == Axis::Rows ? &rows : &cols);
    if (!why.empty()) {
      const int best = max_grid(model, axis);
      throw ConfigError(fmt::format(
          "parallel.grid [{}, {}] does not work: {}. The largest grid along {} that works is {} = {} "
          "(e.g. parallel.grid: [{}, {}])",
          grid.rows, grid.cols, why, axis_name(axis), axis_key(axis), best,
          axis == Axis::Rows ? best : grid.rows, axis == Axis::Rows ? grid.cols : best));
    }
  }
  plan.layers.resize(model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    plan.layers[l].rows = std::move(rows[l]);
    plan.layers[l].cols = std::move(cols[l]);
    plan.layers[l].spatial = model.layers[l].spatial;
  }
  return plan;
}

Rect ShardPlan::owned_input(int layer, int rank) const {
  const LayerPlan& l = layers.at(layer);
  return {l.rows.owned_in.at(grid_row_of(rank)), l.cols.owned_in.at(grid_col_of(rank))};
}

Rect ShardPlan::needed_input(int layer, int rank) const {
  const LayerPlan& l = layers.at(layer);
  return {l.rows.needed_in.at(grid_row_of(rank)), l.cols.needed_in.at(grid_col_of(rank))};
}

Rect ShardPlan::owned_output(int layer, int rank) const {
  const LayerPlan& l = layers.at(layer);
  return {l.rows.owned_out.at(grid_row_of(rank)), l.cols.owned_out.at(grid_col_of(rank))};
}

std::vector<HaloRegion> ShardPlan::receives(int layer, int rank, HaloPhase phase) const {
  if (rank < 0 || rank >= world()) throw std::out_of_range(fmt::format("rank {} of {}", rank, world()));
  const LayerPlan& l = layers.at(layer);
  std::vector<HaloRegion> out;
  if (!l.spatial) return out;
  const int g = group_of(rank), gr = grid_row_of(rank), gc = grid_col_of(rank);
  if (phase == HaloPhase::Rows) {
    // Needed rows x OWNED cols, from the shards above and below in this grid column.
    const Range need = l.rows.needed_in[gr], cols = l.cols.owned_in[gc];
    for (int pr = 0; pr < grid_rows; ++pr) {
      if (pr == gr) continue;
      const Rect r{intersect(need, l.rows.owned_in[pr]), cols};
      if (!r.empty()) out.push_back({rank_at(g, pr, gc), r});
    }
  } else {
    // NEEDED rows x needed cols outside the owned cols, from the shards left and right in
    // this grid row, which hold those rows after the rows phase (corners included).
    const Range rows = l.rows.needed_in[gr], need = l.cols.needed_in[gc];
    for (int pc = 0; pc < grid_cols; ++pc) {
      if (pc == gc) continue;
      const Rect r{rows, intersect(need, l.cols.owned_in[pc])};
      if (!r.empty()) out.push_back({rank_at(g, gr, pc), r});
    }
  }
  return out;
}

std::vector<HaloRegion> ShardPlan::sends(int layer, int rank, HaloPhase phase) const {
  if (rank < 0 || rank >= world()) throw std::out_of_range(fmt::format("rank {} of {}", rank, world()));
  const LayerPlan& l = layers.at(layer);
  std::vector<HaloRegion> out;
  if (!l.spatial) return out;
  const int g = group_of(rank), gr = grid_row_of(rank), gc = grid_col_of(rank);
  const bool rows_phase = phase == HaloPhase::Rows;
  const int count = rows_phase ? grid_rows : grid_cols;
  for (int q = 0; q < count; ++q) {
    if (q == (rows_phase ? gr : gc)) continue;
    // Cheap pre-filter (peers whose needed range misses ours receive nothing from us); the
    // region itself always comes from the peer's receives(), so the two sides agree.
    const AxisPlan& a = rows_phase ? l.rows : l.cols;
    if (intersect(a.needed_in[q], a.owned_in[rows_phase ? gr : gc]).empty()) continue;
    const int peer = rows_phase ? rank_at(g, q, gc) : rank_at(g, gr, q);
    for (const HaloRegion& r : receives(layer, peer, phase))
      if (r.peer == rank) out.push_back({peer, r.rect});
  }
  return out;
}

}  // namespace ht
