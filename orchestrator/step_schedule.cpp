#include "orchestrator/step_schedule.hpp"

#include <algorithm>

#include "kernels/device_memory.hpp"
#include "orchestrator/layer_kind.hpp"

namespace ht {

namespace {

constexpr uint64_t kFloat = sizeof(float);
const HaloPhase kPhases[2] = {HaloPhase::Rows, HaloPhase::Cols};

using K = MemoryKind;
using A = StepAction;

// Walks one step of one rank into a StepSink: the order of the worker's operations, and
// within each the allocations its layers and halo exchanges make.
class StepWalk {
 public:
  StepWalk(const Config& config, const ModelSpec& m, const RankSizes& sizes, const LayerPolicies& policies,
           const std::vector<char>& gradient, StepSink& sink)
      : config_(config),
        m_(m),
        z_(sizes),
        policy_(policies),
        own_gradient_(gradient.empty() ? gradient_flow(m) : std::vector<char>()),
        gradient_(gradient.empty() ? own_gradient_ : gradient),
        sink_(sink),
        fused_(fused_chains(sizes)),
        read_(read_by_backward(m, sizes, policies)) {}

  // One batch of inference (worker/layers/layers.cpp forward_inference, worker/run/inference.cpp).
  void run_inference(const ShardPlan& plan, int rank, Inference kind) {
    inference_ = true;
    const int L = layers();
    begin(A::Hold);
    alloc(K::Params, uint64_t(m_.param_count(false)) * kFloat);
    alloc(K::Workspace, z_.conv_scratch);  // reserved with the layers
    begin(A::LoadBatch);
    alloc(K::Activations, z_.input);  // the image tile is an activation here: freed once read
    for (int l = 0; l < L; ++l) {
      begin(A::Forward, l);
      forward(l);
      for (size_t k = 0; k < inputs(l).size(); ++k) {
        const int t = inputs(l)[k];
        if (!first_mention(l, k) || m_.last_reader(t) != l) continue;
        begin(A::Free, t);
        release(K::Activations, act_bytes(t));
      }
    }
    if (kind == Inference::Predict) send_output(plan, rank);
    begin(A::EndMicroBatch);
    release(K::Activations, act_bytes(L));
  }

  void run() {
    const ReplicatedState s = replicated_state(config_, m_);
    begin(A::Hold);
    alloc(K::Params, s.params);
    alloc(K::Grads, s.grads);
    alloc(K::Optimizer, s.optimizer);
    alloc(K::Workspace, z_.conv_scratch);  // reserved with the layers (ComputeBackend::reserve_conv_scratch)
    if (z_.staged) load_tiles();           // read during the micro-batch before
    begin(A::LoadBatch);
    load_tiles();
    micro_batch();
    begin(A::AllReduce);
    begin(A::Update);
  }

 private:
  // Where tensor t (the input of layer t - 1's readers; t = 0 the image tile) lives.
  enum class Where { Device, Host, Prefetched, Dropped, Freed };

  void begin(StepAction action, int index = -1) { sink_.begin(action, index); }
  void alloc(K k, uint64_t bytes) {
    if (bytes) sink_.event({k, int64_t(bytes)});
  }
  void release(K k, uint64_t bytes) {
    if (bytes) sink_.event({k, -int64_t(bytes)});
  }
  void load_tiles() {
    alloc(K::Input, z_.input);
    alloc(K::Input, z_.targets);
  }

  int layers() const { return int(m_.layers.size()); }
  const LayerTraits& traits(int l) const { return m_.layers[l].kind().traits; }
  bool windowed(int l) const { return m_.layers[l].windowed(); }
  const LayerSizes& at(int l) const { return z_.layers[l]; }
  const std::vector<int>& inputs(int l) const { return m_.layers[l].inputs; }
  // Whether layer l makes the gradient of its k-th input this step.
  bool makes_dx(int l, size_t k) const { return inputs(l)[k] > 0 && gradient_[size_t(inputs(l)[k])]; }
  bool makes_any_dx(int l) const {
    for (size_t k = 0; k < inputs(l).size(); ++k)
      if (makes_dx(l, k)) return true;
    return false;
  }
  // Whether layer l keeps its extended input from forward to backward (worker/layers/window_layers.cpp).
  bool keeps_ext(int l) const { return keeps_extended_input(m_.layers[l], at(l), policy_[l]); }
  bool regathers(int l) const {
    const WindowUse use = traits(l).backward_window;
    const bool reads = use == WindowUse::WeightGradient || (use == WindowUse::InputGradient && makes_any_dx(l));
    return windowed(l) && policy_[l] != ActivationPolicy::Keep && reads;
  }
  // Whether inputs(l)[k] appears there for the first time (a join may read one twice).
  bool first_mention(int l, size_t k) const {
    const std::vector<int>& in = inputs(l);
    return std::find(in.begin(), in.begin() + k, in[k]) == in.begin() + k;
  }
  uint64_t act_bytes(int t) const { return t == 0 ? z_.input : inner_of_chain(t) ? 0 : at(t - 1).out; }
  // Fusion (fused_chains): whether layer l is part of a fused chain this step, and whether
  // tensor t is made inside one (the batch norm's output, or a pooled chain's ReLU's): never made.
  bool fused(int l) const { return fused_[size_t(l)] >= 0; }
  // A conv that heads a chain: its forward and backward are a conv's, its output the chain's.
  bool conv_head(int l) const { return fused_[size_t(l)] == l && conv_heads_chains(m_.layers[size_t(l)]); }
  // What layer l's backward reads (LayerTraits): its inputs; its own output, which its
  // readers may not have brought back (a fused chain: the batch norm reads its ReLU's, at
  // the ReLU's turn).
  bool reads_inputs(int l) const {
    if (fused(l) && fused_[size_t(l)] != l) return false;  // a chain's inner tensors are never made
    return backward_reads_inputs(m_.layers[size_t(l)], at(l), policy_[size_t(l)]);
  }
  bool reads_own_output(int l) const { return backward_reads_output(m_, z_, fused_, l); }
  bool inner_of_chain(int t) const { return t > 0 && inside_fused_chain(z_, fused_, t - 1); }

  // One phase of an exchange (HaloExchange::start_phase, finish_phase): the buffer packed
  // for the peers and the one received into, both freed at its end. A backward exchange
  // packs the gradients of what the forward received.
  void phase_start(int l, HaloPhase ph, bool backward) {
    alloc(K::Halo, backward ? at(l).receives[int(ph)] : at(l).sends[int(ph)]);
    alloc(K::Halo, backward ? at(l).sends[int(ph)] : at(l).receives[int(ph)]);
  }
  void phase_finish(int l, HaloPhase ph, bool backward) {
    release(K::Halo, backward ? at(l).sends[int(ph)] : at(l).receives[int(ph)]);
    release(K::Halo, backward ? at(l).receives[int(ph)] : at(l).sends[int(ph)]);
  }
  void phase(int l, HaloPhase ph, bool backward) {
    phase_start(l, ph, backward);
    phase_finish(l, ph, backward);
  }
  // HaloExchange::gather / gather_in_place; returns the bytes of the extended copy.
  uint64_t gather(int l, K k) {
    const uint64_t ext = at(l).in_place ? 0 : at(l).ext;
    alloc(k, ext);
    phase(l, HaloPhase::Rows, false);
    phase(l, HaloPhase::Cols, false);
    return ext;
  }

  // The CUDA backend's conv scratch (worker/runtime/cuda/cudnn_conv.cpp), shared by all convs:
  // the cuDNN workspace (counted at its limit from the first conv on), and the zeroed
  // copy of the input that turns asymmetric padding into cuDNN's symmetric one, which
  // grows to the largest such input.
  void cudnn_scratch(int l) {
    if (!cuda_workspace_) alloc(K::Workspace, kConvWorkspaceLimit);
    cuda_workspace_ = true;
    if (at(l).padded <= padded_) return;
    release(K::Workspace, padded_);
    padded_ = at(l).padded;
    alloc(K::Workspace, padded_);
  }

  // A layer's forward. Training keeps the gathered inputs for backward, and the extended
  // input where the policy says; inference frees both once the output is made.
  void forward(int l, bool again = false) {
    if (fused(l) && !conv_head(l)) return fused_forward(l, again);
    const int out = fused(l) ? at(l).chain_tail + 1 : l + 1;  // the tensor it makes
    const K saved = inference_ ? K::Transient : K::Activations;
    for (uint64_t whole : at(l).gathered) alloc(saved, whole);  // Layer::gather_inputs
    const bool w = windowed(l);
    uint64_t ext = 0;
    if (w) ext = gather(l, saved);
    alloc(K::Transient, at(l).inner);  // a separable conv's inner tensor, for its forward only
    alloc(K::Activations, act_bytes(out));
    if (traits(l).conv_workspace && config_.parallel.backend == Backend::CUDA) cudnn_scratch(l);
    release(K::Transient, at(l).inner);
    if (w && (inference_ || !keeps_ext(l))) release(saved, ext);
    if (inference_)
      for (uint64_t whole : at(l).gathered) release(saved, whole);
    else
      where_[l + 1] = where_[out] = Where::Device;
  }

  // A fused chain's forward, all of it at the batch norm's: the pool's output and argmax
  // (a recompute makes the output again; the argmax bytes stay from the forward).
  void fused_forward(int l, bool again) {
    where_[l + 1] = Where::Device;  // the inner tensors too, for the walk's bookkeeping
    if (fused_[size_t(l)] != l) return;
    const int tail = at(l).chain_tail;
    alloc(K::Activations, act_bytes(tail + 1));
    if (!again) alloc(K::Activations, at(l).argmax);
    where_[tail + 1] = Where::Device;
  }

  // InferenceWorker::predict: in rank order, every rank whose output counts sends it to rank
  // 0 in bands of rows (a classifier's output is its group's); rank 0 takes its own the same
  // way. A whole batch of images.
  void send_output(const ShardPlan& plan, int rank) {
    begin(A::SendOutput);
    const int L = layers(), C = m_.output().c, b = local_batch(config_, plan);
    for (int r = 0; r < plan.world(); ++r) {
      if (!m_.spatial_output() && plan.shard_of(r) != 0) continue;
      if (rank != 0 && rank != r) continue;
      if (!m_.spatial_output()) {
        alloc(K::Transient, uint64_t(b) * C * kFloat);
        release(K::Transient, uint64_t(b) * C * kFloat);
        continue;
      }
      const Rect tile = plan.owned_output(L - 1, r);
      const int rows = tile.rows.size(), cols = tile.cols.size();
      const int per_band = std::min(rows, prediction_band_rows(C, cols));
      for (int i = 0; i < b; ++i)
        for (int r0 = 0; r0 < rows; r0 += per_band) {
          const uint64_t band = uint64_t(C) * std::min(per_band, rows - r0) * cols * kFloat;
          alloc(K::Transient, band);
          release(K::Transient, band);
        }
    }
  }

  // Trainer::prefetch: device memory for an offloaded activation, copied back beside compute.
  void prefetch(int t) {
    begin(A::Prefetch, t);
    alloc(K::Activations, act_bytes(t));
    where_[t] = Where::Prefetched;
  }
  // Tensor t is on the device (fetched, or recomputed from its layer's inputs).
  void restore(int t) {
    if (where_[t] == Where::Host) prefetch(t);
    if (where_[t] == Where::Prefetched) {
      begin(A::Restore, t);
      release(K::Host, act_bytes(t));
      where_[t] = Where::Device;
    } else if (where_[t] == Where::Dropped) {
      const int l = fused(t - 1) ? fused_[size_t(t) - 1] : t - 1;  // a fused chain runs again whole
      for (int u : inputs(l)) restore(u);
      begin(A::Recompute, l);
      forward(l, true);
    }
  }

  // After layer l's forward: each tensor it read for the last time waits as the policy of
  // the layer that made it says.
  void stash(int t) {
    finish_offload();
    const ActivationPolicy p = stored_as(read_, policy_, t);
    if (p == ActivationPolicy::Keep) return;
    begin(A::Stash, t);
    if (p == ActivationPolicy::Offload) {
      alloc(K::Host, act_bytes(t));
      where_[t] = Where::Host;
      leaving_ = t;
    } else {
      release(K::Activations, act_bytes(t));
      where_[t] = Where::Dropped;
    }
  }
  // The offloaded copy under way is done: its device memory goes.
  void finish_offload() {
    if (leaving_ < 0) return;
    begin(A::FinishOffload, leaving_);
    release(K::Activations, act_bytes(leaving_));
    leaving_ = -1;
  }

  // No gradient reaches layer l: what its forward kept goes, its inputs are not brought back.
  void skip_backward(int l) {
    begin(A::SkipBackward, l);
    for (uint64_t whole : at(l).gathered) release(K::Activations, whole);
    if (fused_[size_t(l)] == l) release(K::Activations, at(l).argmax);  // a pooled chain keeps them at its head
    if (keeps_ext(l) && (!fused(l) || conv_head(l))) release(K::Activations, at(l).ext);  // a chain's pool made none
    if (where_[l + 1] == Where::Device) release(K::Activations, act_bytes(l + 1));
    if (where_[l + 1] != Where::Host) where_[l + 1] = Where::Freed;
  }

  // A windowed layer's backward (worker/layers/window_layers.cpp).
  void windowed_backward(int l) {
    const bool need_dx = makes_any_dx(l);
    // A window used for the weight gradient only is freed before the input gradient is made.
    const bool frees_window_first = traits(l).backward_window == WindowUse::WeightGradient;
    uint64_t ext = keeps_ext(l) ? at(l).ext : 0;
    K ext_kind = K::Activations;
    if (regathers(l)) {
      ext = gather(l, K::Transient);
      ext_kind = K::Transient;
    }
    // A separable conv makes its inner tensor again, then its gradient; the inner goes.
    const uint64_t inner = at(l).inner;
    alloc(K::Transient, inner);
    alloc(K::Transient, inner);
    release(K::Transient, inner);
    if (frees_window_first) release(ext_kind, ext);
    if (!need_dx) {
      if (!frees_window_first) release(ext_kind, ext);
      release(K::Transient, inner);
      return;
    }
    alloc(K::Transient, at(l).ext);  // gradient of the extended input
    release(K::Transient, inner);    // the inner gradient, read by the input gradient
    if (!frees_window_first) release(ext_kind, ext);
    phase(l, HaloPhase::Cols, true);
    if (at(l).in_place) {
      phase(l, HaloPhase::Rows, true);
      return;
    }
    // HaloExchange::scatter_add: the owned gradient is made while the rows' are in flight.
    phase_start(l, HaloPhase::Rows, true);
    alloc(K::Transient, at(l).owned_in);
    phase_finish(l, HaloPhase::Rows, true);
    release(K::Transient, at(l).ext);
  }

  // A fused chain's backward: its later layers pass the chain's output gradient down (a
  // pool frees its output); the batch norm makes the chain's input gradient from it: in a
  // new tensor from the argmax bytes, or without a pool over it, reading the ReLU's output,
  // which goes then.
  void fused_backward(int l) {
    const int t = inputs(l)[0];
    const int head = fused_[size_t(l)];
    if (head != l) {
      if (at(head).chain_pools) {  // unless no backward read it (dropped, or left in the host pool)
        if (where_[l + 1] == Where::Device) release(K::Activations, act_bytes(l + 1));
        if (where_[l + 1] != Where::Host) where_[l + 1] = Where::Freed;
      }
      has_grad_[t] = true;
      return;
    }
    const int tail = at(l).chain_tail;
    const uint64_t dy = at(tail).out;  // the chain's output gradient
    const bool dx = makes_dx(l, 0);
    if (at(l).chain_pools) {
      if (dx && at(l).chain_dx_over_input) {
        // The input's memory passes to its gradient (BatchNorm's backward_chain): counted
        // as a gradient from here, and its maker's backward has nothing to free.
        release(K::Activations, act_bytes(t));
        alloc(K::Transient, act_bytes(t));
        where_[t] = Where::Freed;
      } else if (dx) {
        alloc(K::Transient, at(l).owned_in);
      }
      release(K::Transient, dy);
      release(K::Activations, at(l).argmax);
    } else {
      release(K::Activations, act_bytes(tail + 1));  // the ReLU's output
      where_[tail + 1] = Where::Freed;
      if (!dx) release(K::Transient, dy);
    }
    where_[l + 1] = Where::Freed;
    if (!dx) return;
    if (has_grad_[t]) release(K::Transient, at(l).owned_in);
    has_grad_[t] = true;
  }

  void backward(int l) {
    begin(A::Backward, l);
    if (fused(l) && !conv_head(l)) return fused_backward(l);
    const uint64_t dy = fused(l) ? at(l).out : act_bytes(l + 1);  // a conv chain's: its activation's
    if (fused(l)) {  // a conv chain's activation output goes once its mask is applied
      release(K::Activations, act_bytes(at(l).chain_tail + 1));
      where_[size_t(at(l).chain_tail) + 1] = Where::Freed;
    }
    // Layer::backward_over: the input gradient is the output gradient's memory.
    const bool over = at(l).dx_over_dy && makes_dx(l, 0);
    if (windowed(l)) {
      windowed_backward(l);
    } else if (!over) {
      for (size_t k = 0; k < inputs(l).size(); ++k)
        if (makes_dx(l, k)) alloc(K::Transient, at(l).gathered[k] ? at(l).gathered[k] : at(l).owned_ins[k]);
    }
    // Layer::crop_to_owned: the gradient of a gathered input becomes this rank's part; then
    // the gathered inputs go.
    for (size_t k = 0; k < inputs(l).size(); ++k) {
      if (!at(l).gathered[k] || !makes_dx(l, k)) continue;
      alloc(K::Transient, at(l).owned_ins[k]);
      release(K::Transient, windowed(l) ? at(l).ext : at(l).gathered[k]);
    }
    for (uint64_t whole : at(l).gathered) release(K::Activations, whole);
    if (where_[l + 1] == Where::Device) release(K::Activations, act_bytes(l + 1));  // the output, unless dropped unread
    if (where_[l + 1] != Where::Host) where_[l + 1] = Where::Freed;  // offloaded unread: it waits for the micro-batch's end
    if (!over) release(K::Transient, dy);  // the output gradient gives way to dx
    // A tensor read by several layers sums their gradients: the later ones add in and go.
    for (size_t k = 0; k < inputs(l).size(); ++k) {
      const int t = inputs(l)[k];
      if (!makes_dx(l, k)) continue;
      if (has_grad_[t]) release(K::Transient, at(l).owned_ins[k]);
      has_grad_[t] = true;
    }
  }

  void micro_batch() {
    const int L = layers();
    where_.assign(L + 1, Where::Freed);
    has_grad_.assign(L + 1, false);
    where_[0] = Where::Device;
    for (int l = 0; l < L; ++l) {
      begin(A::Forward, l);
      forward(l);
      for (size_t k = 0; k < inputs(l).size(); ++k) {
        const int t = inputs(l)[k];
        if (t > 0 && first_mention(l, k) && m_.last_reader(t) == l && !inner_of_chain(t)) stash(t);
      }
    }
    finish_offload();
    begin(A::LossGradient);
    alloc(K::Transient, act_bytes(L));
    has_grad_[L] = true;
    for (int l = L - 1; l >= 0; --l) {
      if (!gradient_[size_t(l) + 1]) {
        skip_backward(l);
        continue;
      }
      if (reads_inputs(l))
        for (int t : inputs(l)) restore(t);
      if (reads_own_output(l)) restore(l + 1);
      if (l > 0 && gradient_[size_t(l)] && reads_inputs(l - 1))  // the next backward's inputs come back beside this one
        for (int t : inputs(l - 1))
          if (where_[t] == Where::Host) prefetch(t);
      backward(l);
    }
    // Activations offloaded for a backward that did not run wait in the host pool until here.
    begin(A::EndMicroBatch);
    for (int t = 1; t <= L; ++t)
      if (where_[t] == Where::Host) release(K::Host, act_bytes(t));
    load_tiles_release();
    if (config_.training.accumulate > 1) begin(A::SumGradients);
  }
  void load_tiles_release() {
    release(K::Input, z_.input);
    release(K::Input, z_.targets);
  }

  const Config& config_;
  const ModelSpec& m_;
  const RankSizes& z_;
  const LayerPolicies& policy_;
  std::vector<char> own_gradient_;      // the plan's flow, when none was given
  const std::vector<char>& gradient_;  // per tensor: the backward makes its gradient
  StepSink& sink_;
  std::vector<Where> where_;
  std::vector<bool> has_grad_;  // per tensor: a gradient of it is on the device
  bool inference_ = false;      // walking inference's forward, not a training step
  int leaving_ = -1;            // offloaded, its device copy freed after the next layer's forward
  bool cuda_workspace_ = false;
  uint64_t padded_ = 0;  // the CUDA conv's padded-input scratch
  std::vector<int> fused_;  // fused_chains: per layer, the head of its chain or -1
  std::vector<char> read_;  // read_by_backward: per tensor
};

// Stores the operations.
class Recorder : public StepSink {
 public:
  explicit Recorder(StepSchedule& s) : s_(s) {}
  void begin(StepAction action, int index) override {
    if (action == A::LoadBatch) s_.micro_begin = s_.ops.size();
    if (action == A::AllReduce) s_.micro_end = s_.ops.size();
    s_.ops.push_back({action, index, {}});
  }
  void event(MemoryEvent e) override { s_.ops.back().events.push_back(e); }

 private:
  StepSchedule& s_;
};

}  // namespace

const char* memory_kind_name(MemoryKind kind) {
  static const char* const names[kMemoryKinds] = {"params",    "grads",     "optimizer", "input", "activations",
                                                  "transient", "workspace", "halo",      "host"};
  return names[int(kind)];
}

const char* step_action_name(StepAction action) {
  static const char* const names[] = {
      "hold",     "load_batch",    "forward",   "stash",       "finish_offload",  "loss_gradient",
      "prefetch", "restore",       "recompute", "backward",    "skip_backward",   "free",
      "send_output", "end_micro_batch", "sum_gradients", "all_reduce", "update"};
  static_assert(sizeof(names) / sizeof(names[0]) == size_t(StepAction::Update) + 1, "a name per action");
  return names[int(action)];
}

void walk_training_step(const Config& config, const ModelSpec& model, const RankSizes& sizes,
                        const LayerPolicies& policies, const std::vector<char>& gradient, StepSink& sink) {
  StepWalk(config, model, sizes, policies, gradient, sink).run();
}

StepSchedule training_schedule(const Config& config, const ShardPlan& plan, int rank, const LayerPolicies& policies,
                               const std::vector<char>& gradient) {
  StepSchedule s;
  s.rank = rank;
  s.micro_batches = config.training.accumulate;
  Recorder recorder(s);
  const RankSizes sizes = rank_sizes(config, plan, rank);
  walk_training_step(config, plan.model, sizes, policies, gradient, recorder);
  s.fused = fused_chains(sizes);
  s.read_by_backward = read_by_backward(plan.model, sizes, policies);
  for (const LayerSizes& z : sizes.layers) s.dx_over_input.push_back(z.chain_dx_over_input);
  return s;
}

void walk_inference(const Config& config, const ShardPlan& plan, int rank, Inference kind, StepSink& sink) {
  const RankSizes sizes = rank_sizes(config, plan, rank, ConvUse::Inference);
  const LayerPolicies keep(plan.model.layers.size(), ActivationPolicy::Keep);
  StepWalk(config, plan.model, sizes, keep, {}, sink).run_inference(plan, rank, kind);
}

StepSchedule inference_schedule(const Config& config, const ShardPlan& plan, int rank, Inference kind) {
  StepSchedule s;
  s.rank = rank;
  Recorder recorder(s);
  walk_inference(config, plan, rank, kind, recorder);
  s.micro_end = s.ops.size();
  return s;
}

}  // namespace ht
