#include "orchestrator/memory_model.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ht {

namespace {

constexpr uint64_t kFloat = sizeof(float);

// Bytes of `rect` for `channels` planes of `batch` images.
uint64_t bytes_of(const Rect& rect, int channels, int batch) {
  return uint64_t(rect.area()) * uint64_t(channels) * uint64_t(batch) * kFloat;
}

// Per-pixel losses read a target tile beside the image tile.
bool spatial_loss(const ModelSpec& m) {
  return m.spatial_layers == int(m.layers.size()) &&
         m.layers.back().config.type != LayerType::GlobalAvgPool;
}

uint64_t fixed_bytes(const Config& config, const ModelSpec& m, uint64_t* params, uint64_t* grads,
                     uint64_t* optimizer) {
  const uint64_t all = uint64_t(m.param_count(false)), trainable = uint64_t(m.param_count(true));
  const OptimizerConfig& o = config.training.optimizer;
  const uint64_t slots = o.type == OptimizerType::Adam ? 2 : (o.momentum > 0 ? 1 : 0);
  *params = all * kFloat;
  *grads = trainable * kFloat;
  *optimizer = slots * trainable * kFloat;
  return *params + *grads + *optimizer;
}

const HaloPhase kPhases[2] = {HaloPhase::Rows, HaloPhase::Cols};

struct SearchResult {
  std::optional<GridShape> best;
  bool planned_any = false;
  uint64_t min_total = 0;  // smallest max-over-ranks peak among grids that planned
  GridShape min_grid;
  uint64_t fixed = 0;  // params + grads + optimizer: no grid shrinks them
};

SearchResult search(const Config& config, const ModelSpec& model, int groups, int max_shards) {
  SearchResult res;
  uint64_t p, g, o;
  res.fixed = fixed_bytes(config, model, &p, &g, &o);
  if (res.fixed > config.parallel.device_memory) return res;  // replicated state alone is too big
  groups = std::max(groups, 1);
  const int max_r = max_grid_rows(model), max_c = max_grid_cols(model);
  // A lower bound on the busiest rank of any S-shard grid: the mean over ranks. Owned
  // tiles partition the image and the halo-extended inputs cover the whole one, so the
  // sharded input, activations and transient sum to at least the unsharded ones.
  const MemoryEstimate whole = estimate_memory(config, make_shard_plan(model, {1, 1}, groups), 0);
  const uint64_t scaled = whole.input + whole.activations + whole.transient;
  for (int s = 1; s <= max_shards && s <= max_r * max_c; ++s) {
    if (res.fixed + scaled / uint64_t(s) > config.parallel.device_memory) continue;
    std::optional<GridShape> best;
    uint64_t best_halo = 0;
    // Rows descending: on equal halo bytes the first (more rows) wins.
    for (int r = s; r >= 1; --r) {
      if (s % r != 0) continue;
      const int c = s / r;
      if (r > max_r || c > max_c) continue;  // would throw; its message search is not free
      ShardPlan plan;
      try {
        plan = make_shard_plan(model, {r, c}, s * groups);
      } catch (const ConfigError&) {
        continue;
      }
      const uint64_t total = estimate_memory_max(config, plan).total;
      if (!res.planned_any || total < res.min_total) {
        res.min_total = total;
        res.min_grid = {r, c};
      }
      res.planned_any = true;
      if (total > config.parallel.device_memory) continue;
      const uint64_t halo = halo_traffic_total(config, plan).total();
      if (!best || halo < best_halo) {
        best = GridShape{r, c};
        best_halo = halo;
      }
    }
    if (best) {
      res.best = best;
      return res;
    }
  }
  return res;
}

}  // namespace

int local_batch(const Config& config, const ShardPlan& plan) {
  const int groups = std::max(plan.groups, 1);
  return std::max(1, (config.training.batch_size + groups - 1) / groups);
}

int node_of(const Config& config, int rank) { return rank / std::max(config.parallel.devices_per_node, 1); }
int local_device_of(const Config& config, int rank) {
  return rank % std::max(config.parallel.devices_per_node, 1);
}

MemoryEstimate estimate_memory(const Config& config, const ShardPlan& plan, int rank) {
  const ModelSpec& m = plan.model;
  MemoryEstimate e;
  e.rank = rank;
  e.local_batch = local_batch(config, plan);
  const int b = e.local_batch;
  fixed_bytes(config, m, &e.params, &e.grads, &e.optimizer);

  e.input = bytes_of(plan.owned_image(rank), m.input.c, b);
  if (spatial_loss(m)) e.input += bytes_of(plan.owned_output(int(m.layers.size()) - 1, rank), 1, b);

  for (int l = 0; l < int(m.layers.size()); ++l) {
    const LayerSpec& L = m.layers[l];
    const uint64_t out = bytes_of(plan.owned_output(l, rank), L.out.c, b);
    // Windowed layers read (and get gradients for) the extended input, halo included.
    const Rect in_rect = L.windowed() ? plan.needed_input(l, rank) : plan.owned_input(l, rank);
    const uint64_t in = bytes_of(in_rect, L.in.c, b);
    e.activations += out + (L.windowed() ? in : 0);
    e.transient = std::max(e.transient, out + in);  // dY and dX of one layer at a time
    uint64_t staging = 0;
    for (HaloPhase ph : kPhases) {
      for (const HaloRegion& r : plan.receives(l, rank, ph)) staging += bytes_of(r.rect, L.in.c, b);
      for (const HaloRegion& r : plan.sends(l, rank, ph)) staging += bytes_of(r.rect, L.in.c, b);
    }
    e.halo = std::max(e.halo, staging);
  }
  e.total = e.params + e.grads + e.optimizer + e.input + e.activations + e.transient + e.workspace + e.halo;
  return e;
}

MemoryEstimate estimate_memory_max(const Config& config, const ShardPlan& plan) {
  // Sample groups are copies of group 0: its shards cover every distinct tile.
  MemoryEstimate best = estimate_memory(config, plan, 0);
  for (int r = 1; r < plan.shards(); ++r) {
    MemoryEstimate e = estimate_memory(config, plan, r);
    if (e.total > best.total) best = e;
  }
  return best;
}

HaloTraffic halo_traffic(const Config& config, const ShardPlan& plan, int rank) {
  HaloTraffic t;
  const int b = local_batch(config, plan);
  const int node = node_of(config, rank);
  auto add = [&](int peer, uint64_t bytes) {
    (node_of(config, peer) == node ? t.intra_node : t.inter_node) += bytes;
  };
  for (int l = 0; l < int(plan.layers.size()); ++l) {
    const int cin = plan.model.layers[l].in.c;
    for (HaloPhase ph : kPhases) {
      // Forward: halos to the peers that need them. Backward: the gradient of every
      // received region goes back to its owner.
      for (const HaloRegion& r : plan.sends(l, rank, ph)) add(r.peer, bytes_of(r.rect, cin, b));
      for (const HaloRegion& r : plan.receives(l, rank, ph)) add(r.peer, bytes_of(r.rect, cin, b));
    }
  }
  return t;
}

HaloTraffic halo_traffic_total(const Config& config, const ShardPlan& plan) {
  HaloTraffic sum;
  for (int r = 0; r < plan.world(); ++r) {
    const HaloTraffic t = halo_traffic(config, plan, r);
    sum.intra_node += t.intra_node;
    sum.inter_node += t.inter_node;
  }
  return sum;
}

bool plan_fits(const Config& config, const ShardPlan& plan) {
  return estimate_memory_max(config, plan).total <= config.parallel.device_memory;
}

std::optional<GridShape> smallest_fitting_grid(const Config& config, const ModelSpec& model, int groups,
                                               int max_shards) {
  return search(config, model, groups, max_shards).best;
}

GridShape choose_grid(const Config& config, const ModelSpec& model, int groups) {
  const SearchResult res = search(config, model, groups, kMaxAutoShards);
  if (res.best) return *res.best;
  const uint64_t budget = config.parallel.device_memory;
  if (res.fixed > budget)
    throw ConfigError(fmt::format(
        "parallel.grid: auto: no grid fits parallel.device_memory {}: the weights, gradients and "
        "optimizer state alone need {} per device, and sharding does not split them",
        format_size(budget), format_size(res.fixed)));
  if (!res.planned_any)
    throw ConfigError(fmt::format("parallel.grid: auto: no grid up to {} shards can split the model",
                                  kMaxAutoShards));
  throw ConfigError(fmt::format(
      "parallel.grid: auto: no grid up to {} shards fits parallel.device_memory {}; the smallest "
      "per-device need found is {} with grid [{}, {}]",
      kMaxAutoShards, format_size(budget), format_size(res.min_total), res.min_grid.rows,
      res.min_grid.cols));
}

}  // namespace ht
