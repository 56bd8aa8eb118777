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

// How far each split feature map is downsampled along one axis (the strides and
// upsamplings on its path), and the tensor whose shard borders all others follow: the
// coarsest split feature map, the last one at that scale (the global pool's input, the last
// output of a fully convolutional chain, a U-Net's bottom). Shard borders are even there and
// map to every other feature map by its scale against it, so a strided window never
// straddles a border, an upsampling's borders are its input's times its factor, and the
// inputs of a join line up. A map made from channel vectors alone (a broadcast), or resized
// by a ratio that is no integer, takes the scale of the join that reads it, else its size's
// against the image.
struct Scales {
  std::vector<Ratio> factor;  // per tensor; den 0: replicated
  int reference = 0;          // the tensor the borders are split at
};

Scales scales_of(const ModelSpec& m, const std::vector<bool>& replicated, Axis axis) {
  Scales s;
  s.factor.assign(size_t(m.tensors()), Ratio{0, 0});
  s.factor[0] = {1, 1};
  std::vector<bool> free(size_t(m.tensors()), false);
  for (int l = 0; l < int(m.layers.size()); ++l) {
    if (replicated[l + 1]) continue;
    const LayerSpec& L = m.layers[l];
    Ratio f{0, 0};
    for (int t : L.inputs)  // unequal scales: refused by plan_axis
      if (s.factor[t].den != 0 && (f.den == 0 || f < s.factor[t])) f = s.factor[t];
    if (f.den == 0) {
      free[l + 1] = true;
      continue;
    }
    const Window1D& w = axis == Axis::Rows ? L.rows : L.cols;
    const bool resample = w.kind == WindowKind::Nearest || w.kind == WindowKind::Bilinear;
    if (!L.windowed() || w.kind == WindowKind::Shift) s.factor[l + 1] = f;
    else if (resample && w.out % w.in == 0) s.factor[l + 1] = f.times(1, w.out / w.in);
    else if (resample && w.in % w.out == 0) s.factor[l + 1] = f.times(w.in / w.out, 1);
    else if (resample) free[l + 1] = true;  // any ratio: its borders need not line up with its input's
    else if (w.kind == WindowKind::Transpose) s.factor[l + 1] = f.times(1, w.stride);
    else s.factor[l + 1] = f.times(w.stride, 1);
  }
  for (int t = m.tensors() - 1; t > 0; --t) {
    if (!free[t]) continue;
    for (int reader : m.readers[t])
      if (s.factor[reader + 1].den != 0 && !m.layers[reader].windowed()) s.factor[t] = s.factor[reader + 1];
    if (s.factor[t].den == 0) {  // read by nothing that sets it: as far from the image as its size says
      const Ratio whole{extent(m.input, axis), extent(m.tensor_shape(t), axis)};
      s.factor[t] = whole.times(1, 1);
    }
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

std::string tensor_name(const ModelSpec& m, int t) { return t == 0 ? kInputName : m.layers[t - 1].config.name; }

// The part of a tensor each shard owns along one axis, one AxisPlan per layer, for one
// split of the tensors into split and replicated ones.
struct AxisResult {
  std::vector<AxisPlan> layers;
  std::vector<std::vector<Range>> tensors;
};

// Pads and needed range of a layer that computes the whole of its output from the whole of
// its input (replicated), as an unsharded run would.
void plan_whole(const Window1D& w, int out, AxisPlan& a, int i) {
  a.owned_in[i] = a.needed_in[i] = {0, w.in};
  a.owned_out[i] = {0, out};
  if (w.kind == WindowKind::Slide) {
    a.pad_lo[i] = w.pad_lo;
    a.pad_hi[i] = std::max(0, w.end_input(out) - w.in);
  } else if (w.kind == WindowKind::Transpose) {
    a.pad_lo[i] = w.pad_lo;
    a.pad_hi[i] = (w.in - 1) * w.stride + w.kernel - w.pad_lo - out;
  }
}

// Every tensor's shard borders along `axis` into `owned`: the reference tensor's as even as
// possible, the others scaled from it. Returns "" on success, otherwise why they cannot be.
std::string split_tensors(const ModelSpec& m, const Scales& scales, Axis axis, int parts,
                          std::vector<std::vector<Range>>& owned) {
  // Borders of the reference tensor: as even as possible, the first n % P one larger.
  const int ref = scales.reference;
  const int n = extent(m.tensor_shape(ref), axis);
  if (n < parts)
    return fmt::format("{} has {} {} and cannot be split into {} shards",
                       ref == 0 ? "model.input" : describe(m, ref - 1) + ": its output", n, axis_name(axis), parts);
  std::vector<int> border(parts + 1, 0);
  for (int i = 0; i < parts; ++i) border[i + 1] = border[i] + n / parts + (i < n % parts ? 1 : 0);
  // Every split feature map's borders: the reference's times its scale against the
  // reference, clamped to its size; the last border is its size. Replicated tensors: whole.
  owned.assign(size_t(m.tensors()), {});
  for (int t = 0; t < m.tensors(); ++t) {
    const int64_t size = extent(m.tensor_shape(t), axis);
    const Ratio f = scales.factor[t];
    if (f.den == 0) {
      owned[t].assign(parts, Range{0, int(size)});
      continue;
    }
    const Ratio against = scales.factor[ref].times(f.den, f.num);  // the reference's scale against t's
    // A ratio that is no integer (after a resize by any ratio): borders rounded, which only
    // windows that do not stride may read.
    if (against.den != 1)
      for (int reader : m.readers[t]) {
        const Window1D& w = window_of(m.layers[reader], axis);
        if (m.layers[reader].windowed() && w.kind != WindowKind::Nearest && w.kind != WindowKind::Bilinear &&
            w.stride > 1)
          return fmt::format("{} is downsampled {} along {} and the coarsest feature map {}; the shard borders of "
                             "the two cannot line up for the stride {} of {}",
                             t == 0 ? "model.input" : describe(m, t - 1) + ": its output", f.text(), axis_name(axis),
                             scales.factor[ref].text(), w.stride, describe(m, reader));
      }
    std::vector<int> b(parts + 1, 0);
    for (int i = 1; i < parts; ++i)
      b[i] = int(std::min<int64_t>((2 * border[i] * against.num + against.den) / (2 * against.den), size));
    b[parts] = int(size);
    for (int i = 0; i < parts; ++i) owned[t].push_back({b[i], b[i + 1]});
  }
  return "";
}

// Plans one axis for `parts` shards into `out`. Returns "" on success, otherwise why this
// axis cannot be split that way (without the grid advice).
std::string plan_axis(const ModelSpec& m, const std::vector<bool>& replicated, Axis axis, int parts,
                      AxisResult* out) {
  const int nl = int(m.layers.size());
  const Scales scales = scales_of(m, replicated, axis);
  std::vector<AxisPlan> plan(nl);
  for (auto& a : plan) {
    a.owned_in.resize(parts);
    a.owned_out.resize(parts);
    a.needed_in.resize(parts);
    a.pad_lo.assign(parts, 0);
    a.pad_hi.assign(parts, 0);
  }

  std::vector<std::vector<Range>> owned;
  if (std::string why = split_tensors(m, scales, axis, parts, owned); !why.empty()) return why;

  for (int l = nl - 1; l >= 0; --l) {
    const LayerSpec& L = m.layers[l];
    AxisPlan& a = plan[l];
    const Window1D& w = window_of(L, axis);
    if (replicated[l + 1] && !L.kind().traits.global_pool) {  // gathered or replicated: the whole, as unsharded
      for (int i = 0; i < parts; ++i) plan_whole(w, extent(L.out, axis), a, i);
      continue;
    }
    // The split inputs share their borders; replicated ones (channel vectors) are read whole.
    int first_split = -1;
    for (size_t k = 0; k < L.inputs.size(); ++k) {
      const int t = L.inputs[k];
      if (replicated[t]) continue;
      if (first_split < 0) {
        first_split = t;
      } else if (owned[t] != owned[first_split]) {
        return fmt::format("{}: its inputs '{}' and '{}' are split at different {} ({} and {} downsampled), so "
                           "their shards do not line up",
                           describe(m, l), tensor_name(m, first_split), tensor_name(m, t), axis_name(axis),
                           scales.factor[first_split].text(), scales.factor[t].text());
      }
    }
    const std::vector<Range>& in = owned[L.inputs[0]];
    if (L.kind().traits.global_pool) {  // each shard reduces its own part; the result is replicated
      for (int i = 0; i < parts; ++i) {
        a.owned_in[i] = a.needed_in[i] = in[i];
        a.owned_out[i] = {0, 1};
      }
      continue;
    }
    // needed_in is widened to cover owned_in (below); that keeps the local output count
    // only while the trailing owned rows a shard does not read are fewer than a stride,
    // i.e. pad_lo < span. A padding wider than the window cannot be split.
    const bool slide = w.kind == WindowKind::Slide;
    const bool split_input = !replicated[L.inputs[0]];
    if (slide && parts > 1 && split_input && w.pad_lo >= w.span())
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
  }
  if (out) {
    out->layers.swap(plan);
    out->tensors.swap(owned);
  }
  return "";
}

// The tensors a grid replicates: the channel vectors, and from `tail` on (-1: none) every
// feature map.
std::vector<bool> replicated_tensors(const ModelSpec& m, int tail) {
  std::vector<bool> r(size_t(m.tensors()));
  for (int t = 0; t < m.tensors(); ++t) r[t] = !m.tensor_spatial(t) || (tail >= 0 && t >= tail);
  return r;
}

// Both axes of a grid, the tail included: none when the grid plans without one; otherwise,
// when some feature map has fewer rows or cols than the grid, the latest tail that plans,
// starting no later than the first such map (never the image or the model's output map).
// Returns "" and fills `rows`, `cols`, `tail` on success; else why the grid fails without a
// tail.
struct GridResult {
  AxisResult rows, cols;
  int tail = -1;
};
std::string plan_grid(const ModelSpec& m, GridShape grid, GridResult* out) {
  GridResult r;
  auto attempt = [&](int tail) {
    const std::vector<bool> rep = replicated_tensors(m, tail);
    std::string why = plan_axis(m, rep, Axis::Rows, grid.rows, out ? &r.rows : nullptr);
    if (why.empty()) why = plan_axis(m, rep, Axis::Cols, grid.cols, out ? &r.cols : nullptr);
    return why;
  };
  const std::string why = attempt(-1);
  if (why.empty()) {
    if (out) *out = std::move(r);
    return "";
  }
  int small = -1;  // the first feature map with fewer rows or cols than the grid
  for (int t = 1; t < m.tensors() && small < 0; ++t)
    if (m.tensor_spatial(t) && (m.tensor_shape(t).h < grid.rows || m.tensor_shape(t).w < grid.cols)) small = t;
  if (small < 0 || (m.spatial_output() && small == m.tensors() - 1)) return why;
  for (int tail = small; tail >= 2; --tail) {
    if (m.spatial_output()) break;  // a per-pixel output stays split (its targets are read per shard)
    if (attempt(tail).empty()) {
      r.tail = tail;
      if (out) *out = std::move(r);
      return "";
    }
  }
  return why;
}

// Largest shard count along `axis` that plans. Feasibility only gets harder as shards get
// thinner, so a binary search over [1, n] finds the boundary (P plans, P + 1 does not).
int max_grid(const ModelSpec& m, Axis axis) {
  const int n = extent(m.input, axis);
  int lo = 1, hi = std::max(n, 1) + 1;  // lo plans (one shard always does), hi does not
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    const GridShape g = axis == Axis::Rows ? GridShape{mid, 1} : GridShape{1, mid};
    if (plan_grid(m, g, nullptr).empty())
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

  GridResult r;
  const std::string why = plan_grid(model, grid, &r);
  if (!why.empty()) {
    const bool rows_fail = plan_grid(model, {grid.rows, 1}, nullptr).size() > 0;
    const Axis axis = rows_fail ? Axis::Rows : Axis::Cols;
    const int best = max_grid(model, axis);
    throw ConfigError(fmt::format(
        "parallel.grid [{}, {}] does not work: {}. The largest grid along {} that works is {} = {} "
        "(e.g. parallel.grid: [{}, {}])",
        grid.rows, grid.cols, why, axis_name(axis), axis_key(axis), best, axis == Axis::Rows ? best : grid.rows,
        axis == Axis::Rows ? grid.cols : best));
  }
  plan.tail = r.tail;
  plan.replicated = replicated_tensors(model, r.tail);
  plan.tensor_rows = std::move(r.rows.tensors);
  plan.tensor_cols = std::move(r.cols.tensors);
  plan.layers.resize(model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    LayerPlan& lp = plan.layers[l];
    const LayerSpec& L = model.layers[l];
    lp.rows = std::move(r.rows.layers[l]);
    lp.cols = std::move(r.cols.layers[l]);
    lp.sharded = !plan.replicated[l + 1];
    lp.input_sharded = !plan.replicated[L.inputs[0]];
    if (!lp.sharded && !L.kind().traits.global_pool)
      for (int t : L.inputs) lp.gathers = lp.gathers || !plan.replicated[t];
  }
  return plan;
}

Rect ShardPlan::owned_tensor(int tensor, int rank) const {
  return {tensor_rows.at(tensor).at(grid_row_of(rank)), tensor_cols.at(tensor).at(grid_col_of(rank))};
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
  if (!l.sharded || !l.input_sharded) return out;
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
  if (!l.sharded || !l.input_sharded) return out;
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
