#include "orchestrator/activation_plan.hpp"

#include <algorithm>
#include <optional>

namespace ht {

DeviceCostModel k80_die() {
  DeviceCostModel d;
  d.name = "Tesla K80 die (GK210)";
  d.flops = 4.37e12;
  d.memory_bw = 240e9;
  d.host_link_bw = 12e9;
  d.devices_per_link = 2;
  d.peer_bw = 12e9;
  d.network_bw = 6e9;
  d.copies_overlap = true;
  return d;
}

DeviceCostModel cpu_host() {
  DeviceCostModel d;
  d.name = "CPU host";
  d.flops = 50e9;
  d.memory_bw = 10e9;
  d.host_link_bw = 10e9;  // a memcpy into the offload pool
  d.devices_per_link = 1;
  d.peer_bw = 10e9;
  d.network_bw = 6e9;
  return d;
}

DeviceCostModel cost_model_for(const Config& config) {
  return config.parallel.backend == Backend::CUDA ? k80_die() : cpu_host();
}

double StepTime::total() const {
  const double exposed = overlapped ? std::max(0.0, offload - compute - recompute) : offload;
  return compute + recompute + halo + allreduce + exposed;
}

namespace {

uint64_t tile_bytes(const Rect& r, int channels, int batch) {
  return uint64_t(r.area()) * uint64_t(channels) * uint64_t(batch) * sizeof(float);
}

// Forward seconds of layer l on `rank`: the larger of its arithmetic and its memory traffic.
double forward_seconds(const ShardPlan& plan, int l, int rank, int batch, const DeviceCostModel& d) {
  const LayerSpec& L = plan.model.layers[l];
  const Rect out = L.spatial ? plan.owned_output(l, rank) : Rect{{0, 1}, {0, 1}};
  const Rect in = L.spatial ? plan.owned_input(l, rank) : Rect{{0, 1}, {0, 1}};
  const double share = double(out.area()) / (double(L.out.h) * L.out.w);
  const double flops = double(L.flops_per_image) * share * batch;
  const double bytes = double(tile_bytes(in, L.in.c, batch) + tile_bytes(out, L.out.c, batch));
  return std::max(flops / d.flops, bytes / d.memory_bw);
}

StepTime rank_step_time(const Config& config, const ShardPlan& plan, const LayerPolicies& policies,
                        const DeviceCostModel& d, int rank) {
  StepTime t;
  t.overlapped = d.copies_overlap;
  const int b = local_batch(config, plan);
  const ModelSpec& m = plan.model;
  for (int l = 0; l < int(m.layers.size()); ++l) {
    const double f = forward_seconds(plan, l, rank, b, d);
    t.compute += 3 * f;
    if (policies[l] == ActivationPolicy::Recompute) t.recompute += f;
    if (policies[l] == ActivationPolicy::Offload) {
      // Out after forward, back before backward; the dies of a card share the link.
      const Rect out = plan.owned_output(l, rank);
      t.offload += 2.0 * double(tile_bytes(out, m.layers[l].out.c, b)) * d.devices_per_link / d.host_link_bw;
    }
  }
  const HaloTraffic h = halo_traffic(config, plan, rank, policies);
  t.halo = double(h.intra_node) / d.peer_bw + double(h.inter_node) / d.network_bw;
  const int world = plan.world();
  if (world > 1) {
    const double grads = double(m.param_count(true)) * sizeof(float);
    const bool multi_node = node_of(config, world - 1) > 0;
    t.allreduce = 2.0 * (world - 1) / world * grads / (multi_node ? d.network_bw : d.peer_bw);
  }
  return t;
}

// How much better `b` is than `a` to reach the budget: peak bytes freed per extra second.
struct Candidate {
  LayerPolicies policies;
  uint64_t peak = 0;
  double seconds = 0;
};

Candidate evaluate(const Config& config, const ShardPlan& plan, LayerPolicies policies,
                   const DeviceCostModel& d) {
  Candidate c;
  c.peak = estimate_memory_max(config, plan, policies).total;
  c.seconds = predict_step_time(config, plan, policies, d).total();
  c.policies = std::move(policies);
  return c;
}

}  // namespace

StepTime predict_step_time(const Config& config, const ShardPlan& plan, const LayerPolicies& policies,
                           const DeviceCostModel& device) {
  // The busiest rank sets the pace: every step ends in collectives.
  StepTime worst;
  for (int r = 0; r < plan.shards(); ++r) {
    const StepTime t = rank_step_time(config, plan, policies, device, r);
    if (r == 0 || t.total() > worst.total()) worst = t;
  }
  return worst;
}

LayerPolicies activation_policies(const Config& config, const ShardPlan& plan) {
  const ModelSpec& m = plan.model;
  if (config.parallel.activations != ActivationPolicy::Auto)
    return uniform_policies(m, config.parallel.activations);
  const DeviceCostModel d = cost_model_for(config);
  const uint64_t budget = config.parallel.device_memory;
  Candidate best = evaluate(config, plan, uniform_policies(m, ActivationPolicy::Keep), d);
  // Greedy: each round changes the one layer whose change frees the most bytes of the
  // peak per extra second; stops when it fits or nothing frees more.
  while (best.peak > budget) {
    std::optional<Candidate> next;
    double next_score = 0;
    for (int l = 0; l < int(m.layers.size()); ++l) {
      if (!policy_applies(m, l) || best.policies[l] != ActivationPolicy::Keep) continue;
      for (ActivationPolicy p : {ActivationPolicy::Offload, ActivationPolicy::Recompute}) {
        LayerPolicies trial = best.policies;
        trial[l] = p;
        Candidate c = evaluate(config, plan, std::move(trial), d);
        if (c.peak >= best.peak) continue;
        const double score = double(best.peak - c.peak) / std::max(c.seconds - best.seconds, 1e-9);
        if (!next || score > next_score) {
          next_score = score;
          next = std::move(c);
        }
      }
    }
    if (!next) break;
    best = std::move(*next);
  }
  if (best.peak <= budget) return best.policies;
  // A single change may not lower the peak (two equal tensors at it): try all of one kind.
  // Of what fits, the fastest; when nothing fits, the smallest peak.
  for (ActivationPolicy p : {ActivationPolicy::Offload, ActivationPolicy::Recompute}) {
    Candidate c = evaluate(config, plan, uniform_policies(m, p), d);
    const bool fits = c.peak <= budget, best_fits = best.peak <= budget;
    if ((fits && (!best_fits || c.seconds < best.seconds)) || (!fits && !best_fits && c.peak < best.peak))
      best = std::move(c);
  }
  return best.policies;
}

}  // namespace ht
