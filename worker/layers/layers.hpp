// Layers on one shard. The public forward/backward check shapes against the plan, then a
// virtual computes on the backend (caffe / tiny-cuda-nn style). Layers never ask which
// backend or comm they run on.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "orchestrator/memory_model.hpp"
#include "orchestrator/shard_plan.hpp"
#include "worker/comm/comm.hpp"
#include "worker/comm/halo_exchange.hpp"
#include "worker/layers/params.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {

// What a forward is for. Train keeps what backward needs and updates batch-norm moving
// statistics; Recompute runs it again during backward (the recompute policy) and leaves
// the model state as the first run left it; Eval is inference: batch norm uses its moving
// statistics and nothing is kept.
enum class ForwardMode { Train, Recompute, Eval };

// Where a training forward stands, for layers whose result depends on it (dropout's mask):
// the trainer sets it before each micro-batch.
struct StepPosition {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t first_image = 0;  // the position of this rank's first image in the step's batch
};

struct LayerContext {
  const ShardPlan& plan;
  int rank;
  Comm& world;  // all ranks: halos, batch-norm statistics, gradients
  Comm& group;  // the shards of this rank's sample group: global pooling
  ComputeBackend& backend;
  ParamStore& params;
  int local_batch;   // images per (micro-)batch on this rank's group, when training
  int global_batch;  // images per (micro-)batch, all groups: batch-norm statistics
  const LayerPolicies& policies;  // activation policy per layer, the same on every rank
  const StepPosition* position = nullptr;  // training; null in inference
  // Training: per layer, whether its weights stay as they are this step (SPEC section 14;
  // orchestrator/model_spec.hpp frozen_layers). Null: only `trainable: false` freezes.
  const std::vector<char>* frozen = nullptr;
  bool group_leader() const { return plan.shard_of(rank) == 0; }
};

// A layer's inputs, in the order of its spec's `inputs`.
using LayerInputs = std::vector<const Tensor*>;

class Layer {
 public:
  Layer(const LayerContext& ctx, int index);
  virtual ~Layer() = default;

  const LayerSpec& spec() const { return ctx_.plan.model.layers[index_]; }
  const ModelSpec& model() const { return ctx_.plan.model; }
  int index() const { return index_; }

  // xs: this rank's owned parts of the inputs [b, c, h, w]; returns the owned output.
  // Train and Recompute take local_batch images; Eval any number.
  Tensor forward(const LayerInputs& xs, ForwardMode mode = ForwardMode::Train);
  Tensor forward(const Tensor& x, ForwardMode mode = ForwardMode::Train) { return forward(LayerInputs{&x}, mode); }
  // xs, y: the inputs and output of forward; dy: gradient of y. Writes weight gradients
  // and returns the gradient of each owned input (empty where !need_dx[k]).
  std::vector<Tensor> backward(const LayerInputs& xs, const Tensor& y, const Tensor& dy,
                               const std::vector<bool>& need_dx);
  Tensor backward(const Tensor& x, const Tensor& y, const Tensor& dy, bool need_dx) {
    return std::move(backward(LayerInputs{&x}, y, dy, {need_dx})[0]);
  }
  // The backward of a layer for which step_schedule.hpp's backward_in_place holds, when its
  // input gradient is needed: returns dy's memory holding the input gradient.
  Tensor backward_in_place(const Tensor& x, const Tensor& y, Tensor dy);
  // Drops what forward kept for backward (the gathered inputs too).
  void release_saved();

  // A fused chain headed by this layer (orchestrator/step_schedule.hpp fused_chains; a
  // batch norm's): the training forward (Train or Recompute) from this layer's input x to
  // y, the output of layer `tail`, keeping what the chain's backward needs; the backward
  // from y's gradient dy to x's (empty unless need_dx; a chain whose backward reads y
  // returns it in dy's memory; with dx_over_x, step_schedule.hpp LayerSizes::chain_dx_over_input, it
  // is written over x and takes x's memory, leaving x empty), writing this layer's weight
  // gradients. std::logic_error for a kind that heads no chain.
  virtual Tensor forward_chain(const Tensor& x, int tail, ForwardMode mode);
  virtual Tensor backward_chain(Tensor& x, Tensor& y, Tensor dy, int tail, bool need_dx, bool dx_over_x);

  // Wall seconds this layer has spent in collectives (batch statistics, global pools,
  // gathers, the gradients of replicated inputs) since it was made, waiting included.
  double collective_seconds() const { return collective_seconds_; }

 protected:
  // For a chain's head: std::logic_error unless x is this rank's owned input at the
  // training batch; whether the chain's activation (layer `tail`) is a ReLU6.
  void check_chain_input(const Tensor& x) const;
  bool chain_ends_in_relu6(int tail) const { return model().layers[size_t(tail)].config.type() == "relu6"; }
  // What a kind keeps between its forward and backward, dropped.
  virtual void release_kept() {}
  // Layers of one input implement these; joins (several inputs) the two below.
  virtual Tensor forward_impl(const Tensor& x, ForwardMode mode) = 0;
  virtual Tensor backward_impl(const Tensor& x, const Tensor& y, const Tensor& dy, bool need_dx) = 0;
  virtual Tensor forward_inputs(const LayerInputs& xs, ForwardMode mode) { return forward_impl(*xs[0], mode); }
  // Kinds with LayerTraits::backward_in_place: backward_impl's work, the input gradient
  // written over dy element by element.
  virtual void backward_over(const Tensor& x, const Tensor& y, Tensor& dy);
  virtual std::vector<Tensor> backward_inputs(const LayerInputs& xs, const Tensor& y, const Tensor& dy,
                                              const std::vector<bool>& need_dx) {
    std::vector<Tensor> dx;
    dx.push_back(backward_impl(*xs[0], y, dy, need_dx[0]));
    return dx;
  }
  Tensor make_output(int n, int c, const Rect& rect, const std::string& what);
  float* weight(const std::string& name);
  float* weight_grad(const std::string& name);  // null when the weight does not train (now)
  // Its weights stay as they are (SPEC section 14): no weight gradient; a batch norm
  // normalises with its moving statistics.
  bool frozen() const {
    return !spec().config.trainable || (ctx_.frozen && !ctx_.frozen->empty() && (*ctx_.frozen)[size_t(index_)]);
  }
  std::string label() const;  // "conv2d_1 (rank 0)" for allocation messages
  ActivationPolicy policy() const { return ctx_.policies[index_]; }
  // Placement (orchestrator/shard_plan.hpp): whether the output is the same on every shard
  // of the group, and whether input k is.
  bool replicated() const { return !ctx_.plan.layers[index_].sharded; }
  bool input_replicated(size_t k = 0) const { return ctx_.plan.replicated[spec().inputs[k]]; }
  // Sums per-channel statistics over every image of the batch (every rank): a replicated
  // input's images count once, its group leader's.
  void sum_over_batch(double* values, size_t count);
  // Sums per-image statistics over the whole image: over the shards of this rank's group
  // when the first input is split; a replicated one is whole here already.
  void sum_over_image(double* values, size_t count);
  // Runs one collective, timed into collective_seconds().
  template <class F>
  void collective(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  LayerContext ctx_;
  int index_;

 private:
  LayerInputs gather_inputs(const LayerInputs& xs);  // the split ones whole, kept in gathered_
  void check_output(const Tensor& y, const Tensor& dy) const;  // dy against y, unless y went unread
  void crop_to_owned(std::vector<Tensor>& dx);        // the gradients of gathered inputs, this rank's part
  void zero_weight_gradients();
  std::vector<Tensor> gathered_;
  double collective_seconds_ = 0;
};

// Makes the layer at `index` of the plan's model from the kernels registered for its kind.
std::unique_ptr<Layer> make_layer(const LayerContext& ctx, int index);

// The kernels of a layer kind (orchestrator/layer_kind.hpp): the built-in kinds' are in
// the tables of layers.cpp, window_layers.cpp and pixel_layers.cpp (layer_registry.cpp
// holds them); another kind registers its factory under its type before a run starts.
// std::logic_error when the type has kernels already. Not thread-safe.
using LayerFactory = std::function<std::unique_ptr<Layer>(const LayerContext& ctx, int index)>;
void register_layer_kernels(const std::string& type, LayerFactory factory);
// A factory making L(ctx, index, args...).
template <class L, class... Args>
LayerFactory layer_factory(Args... args) {
  return [args...](const LayerContext& ctx, int index) -> std::unique_ptr<Layer> {
    return std::make_unique<L>(ctx, index, args...);
  };
}
// The kinds of layers.cpp: batch norm (its layer in batch_norm_layer.cpp), the activations,
// global pools, dense, dropout, add, concatenate.
std::map<std::string, LayerFactory> basic_layer_kernels();
LayerFactory batch_norm_factory();
// ConfigError naming the layer and its kind when a layer of `model` has no kernels in this
// build: a run refuses it at start-up, before any rank starts.
void check_layer_kernels(const ModelSpec& model);

// The sharded forward in inference mode (ForwardMode::Eval) from the input tile `x`: the
// Forward and Free operations of an inference schedule (orchestrator/step_schedule.hpp
// inference_schedule), each activation freed once its last reader has read it. `on_op`
// sees each operation before it runs. Returns the owned output.
Tensor forward_inference(const std::vector<std::unique_ptr<Layer>>& layers, const StepSchedule& schedule, Tensor x,
                         const std::function<void(const StepOp&)>& on_op = {});

// The inputs of `layer` among the step's tensors (0 the image, l + 1 layer l's output).
LayerInputs inputs_of(const ModelSpec& model, int layer, const std::vector<Tensor>& tensors);

}  // namespace ht
