#include "orchestrator/memory_model.hpp"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "orchestrator/conv_geometry.hpp"
#include "orchestrator/layer_kind.hpp"

namespace ht {

namespace {

constexpr uint64_t kFloat = sizeof(float);

// Optimizer state per trainable weight: adam's two moments, sgd's velocity when it has momentum.
uint64_t optimizer_slots(const Config& config) {
  const OptimizerConfig& o = config.training.optimizer;
  return o.type == OptimizerType::Adam ? 2 : (o.momentum > 0 ? 1 : 0);
}

uint64_t fixed_bytes(const Config& config, const ModelSpec& m, uint64_t* params, uint64_t* grads,
                     uint64_t* optimizer) {
  const uint64_t all = uint64_t(m.param_count(false)), trainable = uint64_t(m.param_count(true));
  const uint64_t slots = optimizer_slots(config);
  *params = all * kFloat;
  // With micro-batches the trainer keeps their sum beside the gradients of the current one.
  *grads = trainable * kFloat * (config.training.accumulate > 1 ? 2 : 1);
  *optimizer = slots * trainable * kFloat;
  return *params + *grads + *optimizer;
}

const HaloPhase kPhases[2] = {HaloPhase::Rows, HaloPhase::Cols};

}  // namespace

uint64_t replicated_bytes(const Config& config, const ModelSpec& model) {
  uint64_t p, g, o;
  return fixed_bytes(config, model, &p, &g, &o);
}

uint64_t tile_bytes(const Rect& rect, int channels, int batch) {
  return uint64_t(rect.area()) * uint64_t(channels) * uint64_t(batch) * kFloat;
}

uint64_t cudnn_workspace_bytes(const Config& config, const ModelSpec& model) {
  const bool conv = std::any_of(model.layers.begin(), model.layers.end(),
                                [](const LayerSpec& l) { return l.kind().traits.conv_workspace; });
  return config.parallel.backend == Backend::CUDA && conv ? kConvWorkspaceLimit : 0;
}

bool backward_reads_window(const LayerSpec& layer) {
  const WindowUse use = layer.kind().traits.backward_window;
  return layer.windowed() &&
         (use == WindowUse::WeightGradient || (use == WindowUse::InputGradient && makes_input_gradient(layer)));
}

int local_batch(const Config& config, int groups) {
  groups = std::max(groups, 1);
  return std::max(1, (config.training.batch_size / config.training.accumulate + groups - 1) / groups);
}

int local_batch(const Config& config, const ShardPlan& plan) { return local_batch(config, plan.groups); }

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

StepMemory::RankSizes StepMemory::sizes_of(const Config& config, const ShardPlan& plan, int rank) {
  const ModelSpec& m = plan.model;
  const int b = local_batch(config, plan), L = int(m.layers.size());
  RankSizes r;
  r.input = tile_bytes(plan.owned_image(rank), m.input.c, b);
  r.conv_scratch = conv_scratch_bytes(config, plan, rank, ConvUse::Training);
  r.targets = m.spatial_output() ? tile_bytes(plan.owned_output(L - 1, rank), 1, b)
                                    : uint64_t(b) * m.output().c * kFloat;
  if (config.parallel.backend == Backend::CPU) r.staged = r.input + r.targets;
  const int iy = plan.grid_row_of(rank), ix = plan.grid_col_of(rank);
  for (int l = 0; l < L; ++l) {
    const LayerSpec& spec = m.layers[l];
    LayerSizes z;
    z.out = tile_bytes(plan.owned_output(l, rank), spec.out.c, b);
    const Rect owned = plan.owned_input(l, rank);
    z.owned_in = tile_bytes(owned, spec.in.c, b);
    if (spec.inner_channels > 0) z.inner = tile_bytes(plan.owned_output(l, rank), spec.inner_channels, b);
    for (size_t k = 0; k < spec.ins.size(); ++k) {
      const int t = spec.inputs[k];
      z.owned_ins.push_back(tile_bytes(plan.owned_tensor(t, rank), spec.ins[k].c, b));
      const Rect whole{{0, spec.ins[k].h}, {0, spec.ins[k].w}};
      z.gathered.push_back(plan.layers[l].gathers && !plan.replicated[t] ? tile_bytes(whole, spec.ins[k].c, b) : 0);
    }
    if (spec.windowed()) {
      const Rect need = plan.needed_input(l, rank);
      z.ext = tile_bytes(need, spec.in.c, b);
      z.in_place = need == owned;
      for (HaloPhase ph : kPhases) {
        for (const HaloRegion& h : plan.sends(l, rank, ph)) z.stage[int(ph)] += tile_bytes(h.rect, spec.in.c, b);
        for (const HaloRegion& h : plan.receives(l, rank, ph)) z.stage[int(ph)] += tile_bytes(h.rect, spec.in.c, b);
      }
      const LayerPlan& lp = plan.layers[l];
      const int extra_h = std::abs(lp.rows.pad_lo[iy] - lp.rows.pad_hi[iy]);
      const int extra_w = std::abs(lp.cols.pad_lo[ix] - lp.cols.pad_hi[ix]);
      if (spec.kind().traits.conv_workspace && (extra_h || extra_w))
        z.padded = round_device_scratch(uint64_t(b) * spec.in.c * uint64_t(need.rows.size() + extra_h) *
                                             uint64_t(need.cols.size() + extra_w) * kFloat);
    }
    r.layers.push_back(z);
  }
  return r;
}

namespace {

// Whether layer l keeps its extended input from forward to backward (worker/layers.cpp).
bool keeps_extended_input(const LayerSpec& layer, const StepMemory::LayerSizes& sizes, ActivationPolicy policy) {
  return layer.windowed() && !sizes.in_place && policy == ActivationPolicy::Keep &&
         layer.kind().traits.backward_window != WindowUse::None;
}

// One step of one rank, replayed allocation by allocation. What differs between layer
// kinds comes from their LayerTraits, which the worker's layers follow too; the order of
// the step (worker/trainer.cpp, the windowed and pointwise layers of worker/layers.cpp,
// worker/halo_exchange.cpp) is the worker's, and the memory tests compare the two on real
// runs to the byte.
class StepReplay {
 public:
  enum Kind { kParams, kGrads, kOptimizer, kInput, kActivations, kTransient, kWorkspace, kHalo, kKinds };

  StepReplay(const Config& config, const ModelSpec& m, const StepMemory::RankSizes& sizes,
             const LayerPolicies& policies)
      : config_(config), m_(m), z_(sizes), policy_(policies) {}

  MemoryEstimate run() {
    uint64_t p, g, o;
    fixed_bytes(config_, m_, &p, &g, &o);
    alloc(kParams, p);
    alloc(kGrads, g);
    alloc(kOptimizer, o);
    alloc(kWorkspace, z_.conv_scratch);  // reserved with the layers (ComputeBackend::reserve_conv_scratch)
    step();
    MemoryEstimate e;
    e.params = at_peak_[kParams];
    e.grads = at_peak_[kGrads];
    e.optimizer = at_peak_[kOptimizer];
    e.input = at_peak_[kInput];
    e.activations = at_peak_[kActivations];
    e.transient = at_peak_[kTransient];
    e.workspace = at_peak_[kWorkspace];
    e.halo = at_peak_[kHalo];
    e.total = peak_;
    e.host_offload = host_peak_;
    return e;
  }

 private:
  // Where act[i] (the input of layer i; act[0] the image tile) lives.
  enum class Where { Device, Host, Prefetched, Dropped, Freed };

  void alloc(Kind k, uint64_t bytes) {
    live_[k] += bytes;
    total_ += bytes;
    if (total_ > peak_) {
      peak_ = total_;
      std::copy(std::begin(live_), std::end(live_), std::begin(at_peak_));
    }
  }
  void release(Kind k, uint64_t bytes) {
    live_[k] -= bytes;
    total_ -= bytes;
  }

  int layers() const { return int(m_.layers.size()); }
  const LayerTraits& traits(int l) const { return m_.layers[l].kind().traits; }
  bool windowed(int l) const { return m_.layers[l].windowed(); }
  const StepMemory::LayerSizes& at(int l) const { return z_.layers[l]; }
  bool keeps_ext(int l) const { return keeps_extended_input(m_.layers[l], at(l), policy_[l]); }
  bool regathers(int l) const {
    return policy_[l] != ActivationPolicy::Keep && backward_reads_window(m_.layers[l]);
  }
  const std::vector<int>& inputs(int l) const { return m_.layers[l].inputs; }
  // Whether inputs(l)[k] appears there for the first time (a join may read one twice).
  bool first_mention(int l, size_t k) const {
    const std::vector<int>& in = inputs(l);
    return std::find(in.begin(), in.begin() + k, in[k]) == in.begin() + k;
  }
  uint64_t act_bytes(int i) const { return i == 0 ? z_.input : at(i - 1).out; }

  // One phase of an exchange: a send and a receive buffer at once, freed at its end.
  void phase(int l, HaloPhase ph) {
    alloc(kHalo, at(l).stage[int(ph)]);
    release(kHalo, at(l).stage[int(ph)]);
  }
  // HaloExchange::gather / gather_in_place; returns the bytes of the extended copy.
  uint64_t gather(int l, Kind k) {
    const uint64_t ext = at(l).in_place ? 0 : at(l).ext;
    alloc(k, ext);
    phase(l, HaloPhase::Rows);
    phase(l, HaloPhase::Cols);
    return ext;
  }

  // The CUDA backend's conv scratch (worker/cuda/cudnn_conv.cpp), shared by all convs:
  // the cuDNN workspace (counted at its limit from the first conv on), and the zeroed
  // copy of the input that turns asymmetric padding into cuDNN's symmetric one, which
  // grows to the largest such input.
  void cudnn_scratch(int l) {
    if (!cuda_workspace_) alloc(kWorkspace, kConvWorkspaceLimit);
    cuda_workspace_ = true;
    if (at(l).padded <= padded_) return;
    release(kWorkspace, padded_);
    padded_ = at(l).padded;
    alloc(kWorkspace, padded_);
  }

  void forward(int l) {
    for (uint64_t whole : at(l).gathered) alloc(kActivations, whole);  // Layer::gather_inputs, kept for backward
    const bool w = windowed(l);
    uint64_t ext = 0;
    if (w) ext = gather(l, kActivations);
    alloc(kTransient, at(l).inner);  // a separable conv's inner tensor, for its forward only
    alloc(kActivations, act_bytes(l + 1));
    if (traits(l).conv_workspace && config_.parallel.backend == Backend::CUDA) cudnn_scratch(l);
    release(kTransient, at(l).inner);
    if (w && !keeps_ext(l)) release(kActivations, ext);
    where_[l + 1] = Where::Device;
  }

  // Trainer::prefetch: device memory for an offloaded activation, copied back beside compute.
  void prefetch(int i) {
    alloc(kActivations, act_bytes(i));
    where_[i] = Where::Prefetched;
  }
  // Tensor t is on the device (fetched, or recomputed from its layer's inputs).
  void restore(int t) {
    if (where_[t] == Where::Host) prefetch(t);
    if (where_[t] == Where::Prefetched) {
      host_ -= act_bytes(t);
      where_[t] = Where::Device;
    } else if (where_[t] == Where::Dropped) {
      for (int u : inputs(t - 1)) restore(u);
      forward(t - 1);  // again: recomputed
    }
  }

  // After layer l's forward: each tensor it read for the last time waits as the policy of
  // the layer that made it says (Trainer::stash).
  void stash(int t) {
    finish_offload();
    if (policy_[t - 1] == ActivationPolicy::Offload) {
      host_ += act_bytes(t);
      host_peak_ = std::max(host_peak_, host_);
      where_[t] = Where::Host;
      leaving_ = t;
    } else if (policy_[t - 1] == ActivationPolicy::Recompute) {
      release(kActivations, act_bytes(t));
      where_[t] = Where::Dropped;
    }
  }
  // The offloaded copy under way is done: its device memory goes.
  void finish_offload() {
    if (leaving_ >= 0) release(kActivations, act_bytes(leaving_));
    leaving_ = -1;
  }

  // Trainer: no gradient reaches layer l (nothing before it trains): what its forward kept
  // goes, its inputs are not brought back.
  void skip_backward(int l) {
    for (uint64_t whole : at(l).gathered) release(kActivations, whole);
    if (keeps_ext(l)) release(kActivations, at(l).ext);
    if (where_[l + 1] == Where::Device) release(kActivations, act_bytes(l + 1));
    where_[l + 1] = Where::Freed;
  }

  void backward(int l) {
    const bool need_dx = makes_input_gradient(m_.layers[l]);
    const uint64_t dy = act_bytes(l + 1);
    // A window used for the weight gradient only is freed before the input gradient is made.
    const bool frees_window_first = traits(l).backward_window == WindowUse::WeightGradient;
    if (windowed(l)) {
      uint64_t ext = keeps_ext(l) ? at(l).ext : 0;
      Kind ext_kind = kActivations;
      if (regathers(l)) {
        ext = gather(l, kTransient);
        ext_kind = kTransient;
      }
      // A separable conv makes its inner tensor again, then its gradient; the inner goes.
      const uint64_t inner = at(l).inner;
      alloc(kTransient, inner);
      alloc(kTransient, inner);
      release(kTransient, inner);
      if (frees_window_first) release(ext_kind, ext);
      if (need_dx) {
        alloc(kTransient, at(l).ext);  // gradient of the extended input
        release(kTransient, inner);    // the inner gradient, read by the input gradient
        if (!frees_window_first) release(ext_kind, ext);
        phase(l, HaloPhase::Cols);
        if (!at(l).in_place) {
          // HaloExchange::scatter_add: the owned gradient is made while the rows' are in flight.
          alloc(kHalo, at(l).stage[int(HaloPhase::Rows)]);
          alloc(kTransient, at(l).owned_in);
          release(kHalo, at(l).stage[int(HaloPhase::Rows)]);
          release(kTransient, at(l).ext);
        } else {
          phase(l, HaloPhase::Rows);
        }
      } else {
        if (!frees_window_first) release(ext_kind, ext);
        release(kTransient, inner);
      }
    } else {
      for (size_t k = 0; k < inputs(l).size(); ++k)
        if (makes_input_gradient(m_.layers[l], k))
          alloc(kTransient, at(l).gathered[k] ? at(l).gathered[k] : at(l).owned_ins[k]);
    }
    // Layer::crop_to_owned: the gradient of a gathered input becomes this rank's part; then
    // the gathered inputs go.
    for (size_t k = 0; k < inputs(l).size(); ++k) {
      if (!at(l).gathered[k] || !makes_input_gradient(m_.layers[l], k)) continue;
      alloc(kTransient, at(l).owned_ins[k]);
      release(kTransient, windowed(l) ? at(l).ext : at(l).gathered[k]);
    }
    for (uint64_t whole : at(l).gathered) release(kActivations, whole);
    release(kActivations, act_bytes(l + 1));  // the output (acts[l + 1])
    where_[l + 1] = Where::Freed;
    release(kTransient, dy);  // the output gradient gives way to dx
    // A tensor read by several layers sums their gradients: the later ones add in and go.
    for (size_t k = 0; k < inputs(l).size(); ++k) {
      const int t = inputs(l)[k];
      if (!makes_input_gradient(m_.layers[l], k)) continue;
      if (has_grad_[t]) release(kTransient, at(l).owned_ins[k]);
      has_grad_[t] = true;
    }
  }

  void step() {
    const int L = layers();
    where_.assign(L + 1, Where::Freed);
    has_grad_.assign(L + 1, false);
    alloc(kInput, z_.input);
    alloc(kInput, z_.targets);
    alloc(kInput, z_.staged);  // the next micro-batch, read while this one computes
    where_[0] = Where::Device;
    for (int l = 0; l < L; ++l) {
      forward(l);
      for (size_t k = 0; k < inputs(l).size(); ++k) {
        const int t = inputs(l)[k];
        if (t > 0 && first_mention(l, k) && m_.last_reader(t) == l) stash(t);
      }
    }
    finish_offload();
    alloc(kTransient, act_bytes(L));  // the loss gradient
    has_grad_[L] = true;
    for (int l = L - 1; l >= 0; --l) {
      if (!m_.layers[l].output_gradient) {
        skip_backward(l);
        continue;
      }
      for (int t : inputs(l)) restore(t);
      if (l > 0 && m_.layers[l - 1].output_gradient)  // the next backward's inputs come back beside this one
        for (int t : inputs(l - 1))
          if (where_[t] == Where::Host) prefetch(t);
      backward(l);
    }
  }

  const Config& config_;
  const ModelSpec& m_;
  const StepMemory::RankSizes& z_;
  const LayerPolicies& policy_;
  std::vector<Where> where_;
  std::vector<bool> has_grad_;  // per tensor: a gradient of it is on the device
  int leaving_ = -1;            // offloaded, its device copy freed after the next layer's forward
  bool cuda_workspace_ = false;
  uint64_t padded_ = 0;  // the CUDA conv's padded-input scratch
  uint64_t live_[kKinds] = {}, at_peak_[kKinds] = {};
  uint64_t total_ = 0, peak_ = 0, host_ = 0, host_peak_ = 0;
};

}  // namespace

StepMemory::StepMemory(const Config& config, const ShardPlan& plan)
    : config_(config), plan_(plan), local_batch_(local_batch(config, plan)) {
  // Sample groups are copies of group 0: its shards cover every distinct tile.
  for (int r = 0; r < plan.shards(); ++r) ranks_.push_back(sizes_of(config, plan, r));
}

StepMemory::~StepMemory() = default;

MemoryEstimate StepMemory::replay(const RankSizes& sizes, int rank, const LayerPolicies& policies) const {
  MemoryEstimate e = StepReplay(config_, plan_.model, sizes, policies).run();
  e.rank = rank;
  e.local_batch = local_batch_;
  return e;
}

MemoryEstimate StepMemory::estimate(int shard, const LayerPolicies& policies) const {
  return replay(ranks_.at(shard), shard, policies);
}

uint64_t StepMemory::lower_bound() const {
  uint64_t p, g, o;
  const ModelSpec& m = plan_.model;
  const uint64_t fixed = fixed_bytes(config_, m, &p, &g, &o) + cudnn_workspace_bytes(config_, m);
  uint64_t bound = 0;
  for (const RankSizes& r : ranks_) {
    uint64_t step = 0;
    for (size_t l = 0; l < r.layers.size(); ++l)
      if (makes_input_gradient(m.layers[l])) step = std::max(step, 2 * (r.layers[l].owned_in + r.layers[l].out));
    bound = std::max(bound, fixed + r.conv_scratch + r.input + r.targets + r.staged + step);
  }
  return bound;
}

MemoryEstimate StepMemory::estimate_max(const LayerPolicies& policies) const {
  MemoryEstimate best = estimate(0, policies);
  for (int r = 1; r < int(ranks_.size()); ++r) {
    MemoryEstimate e = estimate(r, policies);
    if (e.total > best.total) best = e;
  }
  return best;
}

MemoryEstimate estimate_memory(const Config& config, const ShardPlan& plan, int rank,
                               const LayerPolicies& policies) {
  MemoryEstimate e = StepReplay(config, plan.model, StepMemory::sizes_of(config, plan, rank), policies).run();
  e.rank = rank;
  e.local_batch = local_batch(config, plan);
  return e;
}

MemoryEstimate estimate_memory_max(const Config& config, const ShardPlan& plan, const LayerPolicies& policies) {
  return StepMemory(config, plan).estimate_max(policies);
}

std::vector<LayerMemory> layer_memory(const Config& config, const ShardPlan& plan, int rank,
                                      const LayerPolicies& policies) {
  const ModelSpec& m = plan.model;
  const StepMemory::RankSizes sizes = StepMemory::sizes_of(config, plan, rank);
  const uint64_t slots = optimizer_slots(config);
  std::vector<LayerMemory> out;
  for (int l = 0; l < int(m.layers.size()); ++l) {
    const LayerSpec& L = m.layers[l];
    const StepMemory::LayerSizes& z = sizes.layers[l];
    LayerMemory x;
    x.params = uint64_t(L.param_count(false)) * kFloat;
    x.grads = uint64_t(L.param_count(true)) * kFloat * (config.training.accumulate > 1 ? 2 : 1);
    x.optimizer = slots * uint64_t(L.param_count(true)) * kFloat;
    const uint64_t kept_input = keeps_extended_input(L, z, policies[l]) ? z.ext : 0;
    switch (policies[l]) {
      case ActivationPolicy::Offload: x.offloaded = z.out; break;
      case ActivationPolicy::Recompute: break;
      default: x.activations = z.out;
    }
    x.activations += kept_input;
    x.halo = std::max(z.stage[0], z.stage[1]);
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
  for (int l = 0; l < int(plan.layers.size()); ++l) {
    const LayerSpec& L = plan.model.layers[l];
    // Forward: halos to the peers that need them; again when the layer's output is dropped
    // and recomputed during backward, and again when its backward gathers its input anew.
    const uint64_t forwards = 1 + (policies[l] == ActivationPolicy::Recompute ? 1 : 0) +
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
