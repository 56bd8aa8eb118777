#include "orchestrator/memory_model.hpp"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "orchestrator/conv_geometry.hpp"
#include "orchestrator/layer_kind.hpp"

namespace ht {

namespace {

constexpr uint64_t kFloat = sizeof(float);
const HaloPhase kPhases[2] = {HaloPhase::Rows, HaloPhase::Cols};

}  // namespace

uint64_t replicated_bytes(const Config& config, const ModelSpec& model) {
  return replicated_state(config, model).total();
}


int node_of(const Config& config, int rank) { return rank / std::max(config.parallel.devices_per_node, 1); }
int local_device_of(const Config& config, int rank) {
  return rank % std::max(config.parallel.devices_per_node, 1);
}

LayerPolicies uniform_policies(const ModelSpec& model, ActivationPolicy policy) {
  LayerPolicies p(model.layers.size(), ActivationPolicy::Keep);
  if (policy == ActivationPolicy::Auto) return p;
  for (int l = 0; l < int(p.size()); ++l) {
    if (!policy_applies(model, l)) continue;
    // Recompute keeps the outputs where the resolution drops (pools, strided convs): they
    // are the cheapest segment boundaries, and each segment is recomputed once.
    const LayerSpec& L = model.layers[l];
    const bool boundary = L.rows.stride > 1 || L.cols.stride > 1 || model.readers[l + 1].size() > 1;
    p[l] = policy == ActivationPolicy::Recompute && boundary ? ActivationPolicy::Keep : policy;
  }
  return p;
}

bool policy_applies(const ModelSpec& model, int layer) {
  // The last layer's output goes straight to the loss; the vector layers are tiny.
  const LayerSpec& l = model.layers[layer];
  return layer + 1 < int(model.layers.size()) && l.spatial && l.out_spatial;
}

bool policy_applies(const ShardPlan& plan, int layer) {
  return policy_applies(plan.model, layer) && plan.layers[layer].sharded;
}

LayerPolicies uniform_policies(const ShardPlan& plan, ActivationPolicy policy) {
  LayerPolicies p = uniform_policies(plan.model, policy);
  for (size_t l = 0; l < p.size(); ++l)
    if (!plan.layers[l].sharded) p[l] = ActivationPolicy::Keep;
  return p;
}

namespace {

// The memory model's sink: the device bytes live by kind, the peak and what was live at it,
// and the host pool's peak.
class PeakTally : public StepSink {
 public:
  void begin(StepAction, int) override {}
  void event(MemoryEvent e) override {
    if (e.kind == MemoryKind::Host) {
      host_ += e.bytes;
      host_peak_ = std::max(host_peak_, host_);
      return;
    }
    live_[int(e.kind)] += e.bytes;
    total_ += e.bytes;
    if (total_ > peak_) {
      peak_ = total_;
      std::copy(std::begin(live_), std::end(live_), std::begin(at_peak_));
    }
  }
  MemoryEstimate estimate() const {
    auto at = [&](MemoryKind k) { return uint64_t(at_peak_[int(k)]); };
    MemoryEstimate e;
    e.params = at(MemoryKind::Params);
    e.grads = at(MemoryKind::Grads);
    e.optimizer = at(MemoryKind::Optimizer);
    e.input = at(MemoryKind::Input);
    e.activations = at(MemoryKind::Activations);
    e.transient = at(MemoryKind::Transient);
    e.workspace = at(MemoryKind::Workspace);
    e.halo = at(MemoryKind::Halo);
    e.total = uint64_t(peak_);
    e.host_offload = uint64_t(host_peak_);
    return e;
  }

 private:
  int64_t live_[kMemoryKinds] = {}, at_peak_[kMemoryKinds] = {};
  int64_t total_ = 0, peak_ = 0, host_ = 0, host_peak_ = 0;
};

}  // namespace

MemoryEstimate sum_schedule(const StepSchedule& schedule) {
  PeakTally tally;
  for (const StepOp& op : schedule.ops)
    for (const MemoryEvent& e : op.events) tally.event(e);
  return tally.estimate();
}

StepMemory::StepMemory(const Config& config, const ShardPlan& plan)
    : config_(config), plan_(plan), local_batch_(local_batch(config, plan)), gradient_(gradient_flow(plan.model)) {
  // Sample groups are copies of group 0: its shards cover every distinct tile.
  for (int r = 0; r < plan.shards(); ++r) ranks_.push_back(rank_sizes(config, plan, r));
}

StepMemory::~StepMemory() = default;

MemoryEstimate StepMemory::replay(const RankSizes& sizes, int rank, const LayerPolicies& policies) const {
  PeakTally tally;
  walk_training_step(config_, plan_.model, sizes, policies, gradient_, tally);
  MemoryEstimate e = tally.estimate();
  e.rank = rank;
  e.local_batch = local_batch_;
  return e;
}

MemoryEstimate StepMemory::estimate(int shard, const LayerPolicies& policies) const {
  return replay(ranks_.at(shard), shard, policies);
}

uint64_t StepMemory::lower_bound() const {
  const ModelSpec& m = plan_.model;
  const uint64_t fixed = replicated_bytes(config_, m) + cudnn_workspace_bytes(config_, m);
  uint64_t bound = 0;
  for (const RankSizes& r : ranks_) {
    uint64_t step = 0;
    // A backward holds its input and its output where it reads them (LayerTraits), their
    // gradients; one of them where the input gradient takes the output gradient's memory.
    // A batch norm's chain that may be fused holds at least its input and its gradient
    // (fused_chains), and without a pool the ReLU's output; one of them where the gradient
    // takes the input's memory (LayerSizes::chain_dx_over_input). A conv's chain holds what
    // the conv and the activation each hold unfused.
    for (size_t l = 0; l < r.layers.size(); ++l) {
      const LayerSizes& z = r.layers[l];
      if (z.chain_tail >= 0 && !conv_heads_chains(m.layers[l])) {
        const uint64_t held = !z.chain_pools ? 3 : z.chain_dx_over_input ? 1 : 2;
        if (makes_input_gradient(m.layers[l])) step = std::max(step, held * z.owned_in);
        l = size_t(z.chain_tail);
      } else if (makes_input_gradient(m.layers[l])) {
        const LayerTraits& t = m.layers[l].kind().traits;
        const uint64_t read = (t.backward_reads_inputs ? z.owned_in : 0) + (t.backward_reads_output ? z.out : 0);
        step = std::max(step, read + (z.dx_over_dy ? z.out : z.owned_in + z.out));
      }
    }
    const uint64_t tiles = (r.input + r.targets) * (r.staged ? 2 : 1);
    bound = std::max(bound, fixed + r.conv_scratch + tiles + step);
  }
  return bound;
}

MemoryEstimate StepMemory::estimate_max(const LayerPolicies& policies, uint64_t* host_max) const {
  MemoryEstimate best = estimate(0, policies);
  if (host_max) *host_max = best.host_offload;
  for (int r = 1; r < int(ranks_.size()); ++r) {
    MemoryEstimate e = estimate(r, policies);
    if (host_max) *host_max = std::max(*host_max, e.host_offload);
    if (e.total > best.total) best = e;
  }
  return best;
}

MemoryEstimate estimate_memory(const Config& config, const ShardPlan& plan, const StepSchedule& step) {
  MemoryEstimate e = sum_schedule(step);
  e.rank = step.rank;
  e.local_batch = local_batch(config, plan);
  return e;
}
MemoryEstimate estimate_memory(const Config& config, const ShardPlan& plan, int rank,
                               const LayerPolicies& policies) {
  return estimate_memory(config, plan, training_schedule(config, plan, rank, policies));
}

MemoryEstimate estimate_memory_max(const Config& config, const ShardPlan& plan, const LayerPolicies& policies) {
  return StepMemory(config, plan).estimate_max(policies);
}

std::vector<LayerMemory> layer_memory(const Config& config, const ShardPlan& plan, int rank,
                                      const LayerPolicies& policies) {
  const ModelSpec& m = plan.model;
  const RankSizes sizes = rank_sizes(config, plan, rank);
  const uint64_t slots = replicated_state(config, m).optimizer_slots;
  const std::vector<int> fused = fused_chains(sizes);
  const std::vector<char> read = read_by_backward(m, sizes, policies);
  std::vector<LayerMemory> out;
  for (int l = 0; l < int(m.layers.size()); ++l) {
    const LayerSpec& L = m.layers[l];
    const LayerSizes& z = sizes.layers[l];
    LayerMemory x;
    x.params = uint64_t(L.param_count(false)) * kFloat;
    x.grads = uint64_t(L.param_count(true)) * kFloat * (config.training.accumulate > 1 ? 2 : 1);
    x.optimizer = slots * uint64_t(L.param_count(true)) * kFloat;
    // A conv heading a chain counts as a conv whose output is never made.
    const bool conv_head = fused[size_t(l)] == l && conv_heads_chains(L);
    if (fused[size_t(l)] >= 0 && !conv_head) {
      // A fused chain (step_schedule.hpp): the batch norm keeps a pool's argmax bytes and
      // makes the chain's input gradient from its output gradient (without a pool, over
      // it); the layers inside make nothing; the chain's output is kept as its policy says.
      const LayerSizes& head = sizes.layers[size_t(fused[size_t(l)])];
      if (fused[size_t(l)] == l) {
        x.activations = z.argmax;
        // The input gradient: over the input where the chain alone reads it (LayerSizes::chain_dx_over_input).
        const bool own = z.chain_pools && !z.chain_dx_over_input;
        x.transient = sizes.layers[size_t(z.chain_tail)].out + (makes_input_gradient(L) && own ? z.owned_in : 0);
      } else if (head.chain_tail == l) {
        const ActivationPolicy p = stored_as(read, policies, l + 1);
        if (p == ActivationPolicy::Offload) x.offloaded = z.out;
        else if (p == ActivationPolicy::Keep) x.activations = z.out;
        x.transient = z.out;
      }
      out.push_back(x);
      continue;
    }
    const uint64_t kept_input = keeps_extended_input(L, z, policies[l]) ? z.ext : 0;
    switch (conv_head ? ActivationPolicy::Recompute : stored_as(read, policies, l + 1)) {
      case ActivationPolicy::Offload: x.offloaded = z.out; break;
      case ActivationPolicy::Recompute: break;
      default: x.activations = z.out;
    }
    x.activations += kept_input;
    x.halo = std::max(z.stage(0), z.stage(1));
    uint64_t dx = 0;
    for (size_t k = 0; k < L.inputs.size(); ++k)
      if (makes_input_gradient(L, k)) dx += L.windowed() ? z.ext : z.owned_ins[k];
    x.transient = z.out + dx;
    out.push_back(x);
  }
  return out;
}

HaloTraffic halo_traffic(const Config& config, const ShardPlan& plan, int rank, const LayerPolicies& policies) {
  HaloTraffic t;
  const int b = local_batch(config, plan);
  const int node = node_of(config, rank);
  auto add = [&](int peer, uint64_t bytes) {
    (node_of(config, peer) == node ? t.intra_node : t.inter_node) += bytes;
  };
  // Per step: every micro-batch exchanges its halos.
  const uint64_t micro_batches = uint64_t(config.training.accumulate);
  auto add_step = [&](int peer, uint64_t bytes) { add(peer, bytes * micro_batches); };
  const RankSizes sizes = rank_sizes(config, plan, rank);
  const std::vector<int> fused = fused_chains(sizes);
  const std::vector<char> read = read_by_backward(plan.model, sizes, policies);
  for (int l = 0; l < int(plan.layers.size()); ++l) {
    const LayerSpec& L = plan.model.layers[l];
    // Forward: halos to the peers that need them; again when the tensor it makes (a chain's
    // output where it heads one) is dropped and made again during backward, and again when
    // its backward gathers its input anew.
    const int made = fused[size_t(l)] == l ? sizes.layers[size_t(l)].chain_tail + 1 : l + 1;
    const bool in_chain = fused[size_t(l)] >= 0 && fused[size_t(l)] != l;  // run again at its head
    const bool again = !in_chain && read[size_t(made)] && stored_as(read, policies, made) == ActivationPolicy::Recompute;
    const uint64_t forwards = 1 + (again ? 1 : 0) +
                              (policies[l] != ActivationPolicy::Keep && backward_reads_window(L) ? 1 : 0);
    for (HaloPhase ph : kPhases) {
      for (const HaloRegion& r : plan.sends(l, rank, ph)) add_step(r.peer, tile_bytes(r.rect, L.in.c, b) * forwards);
      // Backward: the gradient of every received region goes back to its owner (a layer
      // reading the image computes no input gradient).
      if (makes_input_gradient(L))
        for (const HaloRegion& r : plan.receives(l, rank, ph)) add_step(r.peer, tile_bytes(r.rect, L.in.c, b));
    }
  }
  return t;
}

HaloTraffic halo_traffic_total(const Config& config, const ShardPlan& plan, const LayerPolicies& policies) {
  HaloTraffic sum;
  for (int r = 0; r < plan.world(); ++r) {
    const HaloTraffic t = halo_traffic(config, plan, r, policies);
    sum.intra_node += t.intra_node;
    sum.inter_node += t.inter_node;
  }
  return sum;
}

}  // namespace ht
