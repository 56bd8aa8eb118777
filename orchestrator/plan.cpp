#include "orchestrator/plan.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "orchestrator/files.hpp"
#include "orchestrator/layer_kind.hpp"
#include "orchestrator/step_schedule.hpp"

namespace ht {

namespace {

struct SearchResult {
  std::optional<GridShape> best;
  bool planned_any = false;
  uint64_t min_total = 0;  // smallest max-over-ranks peak among grids that planned
  GridShape min_grid;
  uint64_t fixed = 0;  // params + grads + optimizer: no grid shrinks them
};

// Every rank's estimate: the training step's, or validation's where the run validates
// (data.validation: at least at its end) and that is larger.
std::vector<MemoryEstimate> all_estimates(const Config& config, const ShardPlan& plan,
                                          const LayerPolicies& policies) {
  std::vector<MemoryEstimate> v;
  for (int r = 0; r < plan.world(); ++r) {
    if (r < plan.shards()) {
      const StepSchedule step = training_schedule(config, plan, r, policies);
      v.push_back(estimate_memory(config, plan, step));
      if (!config.data.validation.empty()) {
        MemoryEstimate val = estimate_validation_memory(config, plan, step);
        val.host_offload = v.back().host_offload;  // the step's pool: validation offloads nothing
        if (val.total > v.back().total) v.back() = val;
      }
    } else {  // sample groups are copies of group 0
      v.push_back(v[plan.shard_of(r)]);
      v.back().rank = r;
    }
  }
  return v;
}

// What a training run needs on its busiest rank under these policies: all_estimates's
// largest. Without validation the step's alone, by StepMemory's replay, which records no
// schedule (the grid search asks this of every candidate).
uint64_t run_peak(const Config& config, const ShardPlan& plan, const LayerPolicies& policies) {
  if (config.data.validation.empty()) return estimate_memory_max(config, plan, policies).total;
  uint64_t peak = 0;
  for (const MemoryEstimate& e : all_estimates(config, plan, policies)) peak = std::max(peak, e.total);
  return peak;
}

SearchResult search(const Config& config, const ModelSpec& model, int groups, int max_shards) {
  SearchResult res;
  res.fixed = replicated_bytes(config, model);
  if (res.fixed > config.parallel.device_memory) return res;  // replicated state alone is too big
  groups = std::max(groups, 1);
  const int max_r = max_grid_rows(model), max_c = max_grid_cols(model);
  // A lower bound on the busiest rank of any S-shard grid, under any policy: when layer
  // l >= 1 makes its input gradient, its input and output are on the device where its
  // backward reads them (restored for it), with the output gradient and the new input
  // gradient (in the same memory where LayerTraits::backward_in_place), beside the image
  // tile and targets; a chain that may be fused (step_schedule.hpp chain_in_model), its
  // input and the input's gradient (one of them where the chain alone reads its input:
  // LayerSizes::chain_dx_over_input), and without a pool the ReLU's output. Owned tiles partition the
  // image, so some rank holds at least 1/S of the whole image's sizes.
  const ModelSpec& m = model;
  const uint64_t b = uint64_t(local_batch(config, groups));
  const auto whole = [&](const Shape3& sh) { return uint64_t(sh.elements()) * b * sizeof(float); };
  uint64_t scaled = 0;
  for (int l = 0; l < int(m.layers.size()); ++l) {
    const LayerSpec& spec = m.layers[l];
    const uint64_t in = whole(spec.in), out = whole(spec.out);
    // (A conv's chain holds what the conv and its activation each hold apart.)
    if (const int tail = chain_in_model(config, m, l); tail >= 0 && !conv_heads_chains(spec)) {
      const int t = spec.inputs[0];
      const uint64_t held = tail == l + 1 ? 3 : t > 0 && m.readers[size_t(t)] == std::vector<int>{l} ? 1 : 2;
      if (l >= 1) scaled = std::max(scaled, whole(m.input) + held * in);
      l = tail;
      continue;
    }
    if (l < 1 || !spec.spatial || !spec.out_spatial) continue;
    const LayerTraits& t = spec.kind().traits;
    const uint64_t read = (t.backward_reads_inputs ? in : 0) + (t.backward_reads_output ? out : 0);
    scaled = std::max(scaled, whole(m.input) + read + (t.backward_in_place ? out : in + out));
  }
  const uint64_t workspace = cudnn_workspace_bytes(config, model);
  for (int s = 1; s <= max_shards && s <= max_r * max_c; ++s) {
    if (res.fixed + workspace + scaled / uint64_t(s) > config.parallel.device_memory) continue;
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
      const LayerPolicies policies = activation_policies(config, plan);
      const uint64_t total = run_peak(config, plan, policies);
      if (!res.planned_any || total < res.min_total) {
        res.min_total = total;
        res.min_grid = {r, c};
      }
      res.planned_any = true;
      if (total > config.parallel.device_memory) continue;
      const uint64_t halo = halo_traffic_total(config, plan, policies).total();
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

std::string fit_verdict(const Config& config, const ShardPlan& plan, const MemoryEstimate& e) {
  const uint64_t budget = config.parallel.device_memory;
  if (e.total <= budget) return "";
  std::string msg = fmt::format(
      "{}: parallel.grid [{}, {}] does not fit: rank {} needs {} per device (params {}, grads {}, "
      "optimizer {}, activations {}, transient {}, halo {}, input {}, conv workspace {}) but parallel.device_memory "
      "is {}{}; ",
      config.source_path.empty() ? "config" : config.source_path, plan.grid_rows, plan.grid_cols, e.rank,
      format_size(e.total), format_size(e.params), format_size(e.grads), format_size(e.optimizer),
      format_size(e.activations), format_size(e.transient), format_size(e.halo), format_size(e.input),
      format_size(e.workspace), format_size(budget),
      e.validation ? " (in validation: its forward beside what the step holds, whatever the activation policies)"
      : config.parallel.activations == ActivationPolicy::Auto
          ? " (parallel.activations: auto found no mix of keep, offload and recompute that fits)"
          : fmt::format(" (parallel.activations: {})", to_string(config.parallel.activations)));
  // Micro-batches shrink the activations without another device.
  const int per_group = config.training.batch_size / std::max(plan.groups, 1);
  for (int k = config.training.accumulate + 1; k <= per_group; ++k) {
    if (per_group % k != 0) continue;
    Config micro = config;
    micro.training.accumulate = k;
    if (run_peak(micro, plan, activation_policies(micro, plan)) <= budget) {
      msg += fmt::format("training.accumulate: {} fits on this grid (micro-batches of {} image{} per group); or ", k,
                         per_group / k, per_group / k == 1 ? "" : "s");
      break;
    }
  }
  if (const auto g = smallest_fitting_grid(config, plan.model, plan.groups))
    return msg + fmt::format("smallest grid that fits: [{}, {}] (set parallel.grid: [{}, {}] or auto)",
                             g->rows, g->cols, g->rows, g->cols);
  if (e.params + e.grads + e.optimizer > budget)
    return msg + fmt::format(
                     "no grid fits: the weights, gradients and optimizer state alone need {} per "
                     "device and are not sharded",
                     format_size(e.params + e.grads + e.optimizer));
  return msg + fmt::format("no grid up to {} shards fits", kMaxAutoShards);
}

// The host pool of offloaded activations against parallel.host_memory, on every rank.
std::string host_verdict(const Config& config, const Plan& p) {
  const auto most = std::max_element(p.ranks.begin(), p.ranks.end(),
                                     [](const MemoryEstimate& a, const MemoryEstimate& b) {
                                       return a.host_offload < b.host_offload;
                                     });
  if (most == p.ranks.end() || most->host_offload <= p.host_memory) return "";
  const std::string resolved =
      config.parallel.host_memory
          ? ""
          : fmt::format(" (auto: this machine's {} shared by the ranks of a node, less an eighth)",
                        format_size(physical_memory_bytes()));
  return fmt::format(
      "{}: rank {}'s offloaded activations need {} of host memory but parallel.host_memory is {}{}; set "
      "parallel.host_memory to at least {} where the nodes have it, or parallel.activations: auto or recompute",
      config.source_path.empty() ? "config" : config.source_path, most->rank, format_size(most->host_offload),
      format_size(p.host_memory), resolved, format_size(most->host_offload));
}

}  // namespace

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

GridShape plan_grid(const Config& config, const ModelSpec& model, int groups) {
  if (config.parallel.grid_auto) return choose_grid(config, model, groups);
  return {config.parallel.grid_rows, config.parallel.grid_cols};
}

Plan make_plan(const Config& config, ShardPlan shards) {
  // torch refuses batch norm over fewer than 2 values per channel; so does training here.
  const int micro = config.training.batch_size / std::max(config.training.accumulate, 1);
  for (const LayerSpec& l : shards.model.layers)
    if (l.config.type() == "batch_norm" && int64_t(micro) * l.in.h * l.in.w < 2)
      throw ConfigError(fmt::format(
          "{}: layer '{}' (batch_norm) normalises a {} over {} image{} per (micro-)batch: fewer than 2 values per "
          "channel, which batch statistics cannot be taken of (torch refuses it too); raise training.batch_size "
          "(/ accumulate) to at least 2",
          config.source_path, l.config.name, l.spatial ? "1x1 map" : "channel vector", micro, micro == 1 ? "" : "s"));
  Plan p;
  p.shards = std::move(shards);
  p.policies = activation_policies(config, p.shards);
  p.local_batch = local_batch(config, p.shards);
  p.ranks = all_estimates(config, p.shards, p.policies);
  p.busiest = *std::max_element(p.ranks.begin(), p.ranks.end(),
                                [](const MemoryEstimate& a, const MemoryEstimate& b) { return a.total < b.total; });
  p.step_time = predict_step_time(config, p.shards, p.policies, cost_model_for(config));
  p.host_memory = host_memory_budget(config, p.shards.world());
  p.verdict = fit_verdict(config, p.shards, p.busiest);
  if (p.verdict.empty()) p.verdict = host_verdict(config, p);
  return p;
}

MemoryEstimate estimate_memory(const Config& config, const ShardPlan& plan, int rank) {
  return estimate_memory(config, plan, rank, activation_policies(config, plan));
}

MemoryEstimate estimate_memory_max(const Config& config, const ShardPlan& plan) {
  return estimate_memory_max(config, plan, activation_policies(config, plan));
}

HaloTraffic halo_traffic(const Config& config, const ShardPlan& plan, int rank) {
  return halo_traffic(config, plan, rank, activation_policies(config, plan));
}

HaloTraffic halo_traffic_total(const Config& config, const ShardPlan& plan) {
  return halo_traffic_total(config, plan, activation_policies(config, plan));
}

bool plan_fits(const Config& config, const ShardPlan& plan) {
  return run_peak(config, plan, activation_policies(config, plan)) <= config.parallel.device_memory;
}

}  // namespace ht
