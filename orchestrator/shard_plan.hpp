// ShardPlan: who owns which rows/cols of every layer's tensors, and which halo regions
// move between which ranks, forward and backward. Pure and deterministic: every rank
// computes the same plan from the config, and every send region is derived by the same
// function as the matching receive region.
#pragma once

#include <string>
#include <vector>

#include "orchestrator/model_spec.hpp"

namespace ht {

struct Range {
  int lo = 0, hi = 0;  // [lo, hi)
  int size() const { return hi > lo ? hi - lo : 0; }
  bool empty() const { return hi <= lo; }
  bool contains(const Range& o) const { return o.empty() || (lo <= o.lo && o.hi <= hi); }
  bool operator==(const Range& o) const { return lo == o.lo && hi == o.hi; }
};
Range intersect(const Range& a, const Range& b);

struct Rect {
  Range rows, cols;
  int64_t area() const { return int64_t(rows.size()) * cols.size(); }
  bool empty() const { return rows.empty() || cols.empty(); }
  bool operator==(const Rect& o) const { return rows == o.rows && cols == o.cols; }
};
Rect intersect(const Rect& a, const Rect& b);

// The two phases of a 2-D exchange: rows first, then columns including the received rows
// (which covers the corners). Backward runs them in reverse.
enum class HaloPhase { Rows = 0, Cols = 1 };

// One message of a halo exchange: `rect` in the global coordinates of the layer's INPUT.
struct HaloRegion {
  int peer = -1;  // the other rank
  Rect rect;
};

// A layer's sharding along one axis, for every shard index along that axis.
struct AxisPlan {
  std::vector<Range> owned_in;   // input rows owned (= previous layer's owned_out)
  std::vector<Range> owned_out;  // output rows owned
  // Input rows read, clamped to [0, in), and widened to cover owned_in (a strided window
  // may not read the last owned rows; the extended buffer still holds them). The kernel
  // run on needed_in with pad_lo/pad_hi yields exactly owned_out.
  std::vector<Range> needed_in;
  // Implicit zero padding at the image border, per shard: the part of the unclamped read
  // range below 0 / above `in` (0 on sides that face another shard).
  std::vector<int> pad_lo, pad_hi;
};

// For a layer whose output is replicated (the same on every shard of a sample group: a
// channel vector, or a map of the gathered tail) owned_in, needed_in and owned_out are the
// whole extents: it computes as an unsharded run would, and pad_lo / pad_hi are its
// window's own padding.
struct LayerPlan {
  AxisPlan rows, cols;
  bool sharded = true;        // its output is split over the grid
  bool input_sharded = true;  // its first input is split over the grid (halos come from neighbours)
  // Replicated, reading a split feature map: the map is gathered whole on every shard first
  // (a flatten, the tail where maps become too small to split).
  bool gathers = false;
};

struct ShardPlan {
  int grid_rows = 1, grid_cols = 1;
  int groups = 1;  // sample groups: world = grid_rows * grid_cols * groups
  int world() const { return grid_rows * grid_cols * groups; }
  int shards() const { return grid_rows * grid_cols; }
  ModelSpec model;
  std::vector<LayerPlan> layers;  // one per model layer
  // Per tensor (0 the image, l + 1 layer l's output): the same on every shard of a group
  // (channel vectors, and the feature maps of the tail), else split over the grid.
  std::vector<bool> replicated;
  // The first tensor of the tail: from it on every feature map is too small to split (or
  // follows one that is) and every layer runs replicated; -1: none.
  int tail = -1;
  // Per tensor, the rows / cols each shard index along that axis owns (whole when replicated).
  std::vector<std::vector<Range>> tensor_rows, tensor_cols;

  // rank = group * shards() + grid_row * grid_cols + grid_col
  int group_of(int rank) const { return rank / shards(); }
  int shard_of(int rank) const { return rank % shards(); }
  int grid_row_of(int rank) const { return shard_of(rank) / grid_cols; }
  int grid_col_of(int rank) const { return shard_of(rank) % grid_cols; }
  int rank_at(int group, int grid_row, int grid_col) const {
    return group * shards() + grid_row * grid_cols + grid_col;
  }

  Rect owned_tensor(int tensor, int rank) const;  // this rank's part of a tensor (all of a replicated one)
  Rect owned_input(int layer, int rank) const;   // of the layer's input, as its kernel takes it
  Rect needed_input(int layer, int rank) const;  // owned + halo, clamped to the image
  Rect owned_output(int layer, int rank) const;
  Rect owned_image(int rank) const { return owned_input(0, rank); }  // the data tile to read

  // What `rank` receives in `phase` of layer `layer`'s forward exchange, one region per
  // peer, peers in increasing order. Rows phase: needed rows x owned cols, from the
  // shards above and below. Cols phase: needed rows x needed cols outside the owned cols,
  // from the shards left and right. Backward sends the gradient of exactly these regions
  // back to their owners.
  std::vector<HaloRegion> receives(int layer, int rank, HaloPhase phase) const;
  // What `rank` sends: for every peer p, the region p receives from `rank`.
  std::vector<HaloRegion> sends(int layer, int rank, HaloPhase phase) const;
};

struct GridShape {
  int rows = 1, cols = 1;
};

// Plans `model` over a grid; `world` ranks (0: rows*cols) make world/(rows*cols) sample
// groups. Shard borders at the coarsest split feature map split its rows as evenly as
// possible (the first n % P get one more), and map up through every layer by multiplying
// with its stride, so strided windows never straddle a border. Where feature maps get
// fewer rows or cols than the grid, the plan gathers them and the layers from there on run
// replicated (the tail). Throws ConfigError when the grid cannot work: a shard thinner
// than the halo its neighbour needs, borders that cannot line up, or a world not divisible
// by the grid, naming the layer, the sizes and the largest grid along that axis that would
// work.
ShardPlan make_shard_plan(const ModelSpec& model, GridShape grid, int world = 0);

// The largest number of shards along rows (or cols) that plans, for error messages.
int max_grid_rows(const ModelSpec& model);
int max_grid_cols(const ModelSpec& model);

}  // namespace ht
