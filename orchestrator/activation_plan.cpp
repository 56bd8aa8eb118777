#include "orchestrator/activation_plan.hpp"

#include <algorithm>
#include <optional>

#include "orchestrator/files.hpp"

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

// Every shard's per-layer seconds, computed once; a prediction for given policies is then
// a sum per shard (the policy search evaluates hundreds).
class StepTimeModel {
 public:
  StepTimeModel(const Config& config, const ShardPlan& plan, const DeviceCostModel& d)
      : model_(plan.model), overlap_(d.copies_overlap), micro_batches_(config.training.accumulate) {
    const ModelSpec& m = plan.model;
    const int b = local_batch(config, plan), L = int(m.layers.size());
    const double allreduce =
        plan.world() > 1 ? 2.0 * (plan.world() - 1) / plan.world() * double(m.param_count(true)) * sizeof(float) /
                               (node_of(config, plan.world() - 1) > 0 ? d.network_bw : d.peer_bw)
                         : 0.0;
    for (int r = 0; r < plan.shards(); ++r) {
      Shard s;
      s.allreduce = allreduce;
      s.sizes = rank_sizes(config, plan, r);
      s.fused = fused_chains(s.sizes);
      const int node = node_of(config, r);
      for (int l = 0; l < L; ++l) {
        const LayerSpec& spec = m.layers[l];
        const Rect out = plan.owned_output(l, r), in = plan.owned_input(l, r);
        // The larger of its arithmetic and its memory traffic.
        const double share = double(out.area()) / (double(spec.out.h) * spec.out.w);
        const double flops = double(spec.flops_per_image) * share * b;
        const double bytes = double(tile_bytes(in, spec.in.c, b) + tile_bytes(out, spec.out.c, b));
        s.forward.push_back(std::max(flops / d.flops, bytes / d.memory_bw));
        // Out after forward, back before backward; the devices on one link share it.
        s.offload.push_back(2.0 * double(tile_bytes(out, spec.out.c, b)) * d.devices_per_link / d.host_link_bw);
        double sends = 0, receives = 0;
        auto seconds = [&](int peer, uint64_t n) {
          return double(n) / (node_of(config, peer) == node ? d.peer_bw : d.network_bw);
        };
        for (HaloPhase ph : {HaloPhase::Rows, HaloPhase::Cols}) {
          for (const HaloRegion& h : plan.sends(l, r, ph)) sends += seconds(h.peer, tile_bytes(h.rect, spec.in.c, b));
          // A layer reading the image computes no input gradient: nothing goes back.
          if (makes_input_gradient(spec))
            for (const HaloRegion& h : plan.receives(l, r, ph))
              receives += seconds(h.peer, tile_bytes(h.rect, spec.in.c, b));
        }
        s.halo += sends + receives;
        s.sends.push_back(sends);                                           // again when recomputed
        s.regather.push_back(backward_reads_window(spec) ? sends : 0.0);  // when not kept
      }
      shards_.push_back(std::move(s));
    }
  }

  // The busiest shard sets the pace: every step ends in collectives.
  StepTime predict(const LayerPolicies& policies) const {
    StepTime worst;
    for (size_t r = 0; r < shards_.size(); ++r) {
      const Shard& s = shards_[r];
      StepTime t;
      t.overlapped = overlap_;
      t.halo = s.halo;
      t.allreduce = s.allreduce;
      // An output no backward (nor a recomputed forward) reads is dropped whatever its
      // policy: nothing goes to the host, nothing makes it again.
      const std::vector<char> read = read_by_backward(model_, s.sizes, policies);
      // Nor is one made inside a fused chain (the batch norm's output, a pooled chain's
      // ReLU's): never made, never sent.
      auto inner = [&](size_t l) { return inside_fused_chain(s.sizes, s.fused, int(l)); };
      for (size_t l = 0; l < policies.size(); ++l) {
        t.compute += 3 * s.forward[l];  // backward = 2 x forward
        if (policies[l] != ActivationPolicy::Keep) t.halo += s.regather[l];
        // A chain's output is made again by the whole chain, from its head.
        if (!inner(l) && stored_as(read, policies, int(l) + 1) == ActivationPolicy::Recompute && read[l + 1])
          for (size_t k = s.fused[l] >= 0 ? size_t(s.fused[l]) : l; k <= l; ++k) {
            t.recompute += s.forward[k];
            t.halo += s.sends[k];
          }
        if (policies[l] == ActivationPolicy::Offload && read[l + 1] && !inner(l)) t.offload += s.offload[l];
      }
      // Every micro-batch computes and exchanges; the gradients are reduced once a step.
      const double k = micro_batches_;
      t.compute *= k;
      t.recompute *= k;
      t.halo *= k;
      t.offload *= k;
      if (r == 0 || t.total() > worst.total()) worst = t;
    }
    return worst;
  }

 private:
  struct Shard {
    std::vector<double> forward, offload, sends, regather;
    double halo = 0, allreduce = 0;
    RankSizes sizes;
    std::vector<int> fused;  // fused_chains(sizes)
  };
  const ModelSpec& model_;
  bool overlap_;
  int micro_batches_;
  std::vector<Shard> shards_;
};

struct Candidate {
  LayerPolicies policies;
  uint64_t peak = 0;
  int worst = 0;  // the shard at that peak
  uint64_t host = 0;  // the largest host pool of any shard
  double seconds = 0;
};

Candidate evaluate(const StepMemory& memory, const StepTimeModel& time, LayerPolicies policies) {
  Candidate c;
  const MemoryEstimate e = memory.estimate_max(policies, &c.host);
  c.peak = e.total;
  c.worst = e.rank;
  c.seconds = time.predict(policies).total();
  c.policies = std::move(policies);
  return c;
}

}  // namespace

StepTime predict_step_time(const Config& config, const ShardPlan& plan, const LayerPolicies& policies,
                           const DeviceCostModel& device) {
  return StepTimeModel(config, plan, device).predict(policies);
}

uint64_t host_memory_budget(const Config& config, int world, uint64_t node_bytes) {
  if (config.parallel.host_memory > 0) return config.parallel.host_memory;
  world = std::max(world, 1);
  const int nodes = std::max(config.slurm.nodes, 1);
  const int per_node = config.parallel.backend == Backend::CUDA ? std::clamp(config.parallel.devices_per_node, 1, world)
                                                                 : (world + nodes - 1) / nodes;
  const uint64_t share = node_bytes / uint64_t(per_node);
  return share - share / 8;
}

uint64_t host_memory_budget(const Config& config, int world) {
  return host_memory_budget(config, world, physical_memory_bytes());
}

LayerPolicies activation_policies(const Config& config, const ShardPlan& plan) {
  const ModelSpec& m = plan.model;
  if (config.parallel.activations != ActivationPolicy::Auto)
    return uniform_policies(plan, config.parallel.activations);
  const StepMemory memory(config, plan);
  const StepTimeModel time(config, plan, cost_model_for(config));
  const uint64_t budget = config.parallel.device_memory;
  const uint64_t host_budget = host_memory_budget(config, plan.world());
  Candidate best = evaluate(memory, time, uniform_policies(plan, ActivationPolicy::Keep));
  if (best.peak <= budget) return best.policies;
  if (memory.lower_bound() > budget) {
    // Nothing can fit: the plan reports the closest of the plain choices.
    for (ActivationPolicy p : {ActivationPolicy::Offload, ActivationPolicy::Recompute}) {
      Candidate c = evaluate(memory, time, uniform_policies(plan, p));
      if (c.peak < best.peak && c.host <= host_budget) best = std::move(c);
    }
    return best.policies;
  }
  // Greedy: each round changes the one layer whose change frees the most bytes of the
  // peak per extra second; stops when it fits or nothing frees more.
  while (best.peak > budget) {
    std::optional<Candidate> next;
    double next_score = 0;
    for (int l = 0; l < int(m.layers.size()); ++l) {
      if (!policy_applies(plan, l) || best.policies[l] != ActivationPolicy::Keep) continue;
      for (ActivationPolicy p : {ActivationPolicy::Offload, ActivationPolicy::Recompute}) {
        LayerPolicies trial = best.policies;
        trial[l] = p;
        // A change that does not lower the busiest shard cannot lower the maximum.
        if (memory.estimate(best.worst, trial).total >= best.peak) continue;
        Candidate c = evaluate(memory, time, std::move(trial));
        if (c.peak >= best.peak || c.host > host_budget) continue;
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
    Candidate c = evaluate(memory, time, uniform_policies(plan, p));
    if (c.host > host_budget) continue;
    const bool fits = c.peak <= budget, best_fits = best.peak <= budget;
    if ((fits && (!best_fits || c.seconds < best.seconds)) || (!fits && !best_fits && c.peak < best.peak))
      best = std::move(c);
  }
  return best.policies;
}

}  // namespace ht
