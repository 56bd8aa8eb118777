// The step schedule: one training step of one rank as the ordered operations the worker
// runs (gather a halo and run a layer's forward, stash, offload, prefetch, recompute, a
// layer's backward, free, sum, all-reduce, update), each with the device and host-pool
// bytes it allocates and frees; and a batch of inference (validation, evaluate, predict) as
// operations of the same kind. worker/run/train_step.cpp and worker/layers/layers.cpp
// (forward_inference) run the operations in this order; the memory model
// (memory_model.hpp) is the sum over them; `halotrain plan --schedule` prints them
// (plan_report.hpp); `train --trace-memory` and `predict --trace-memory` record a real
// step's allocations under the same operations, and the tests compare the two operation
// for operation. There is no second description of the step's order.
//
// What happens inside one operation follows the layer kinds' LayerTraits, which the
// worker's layers (worker/layers/, worker/comm/halo_exchange.cpp) follow too. Everything
// is float32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orchestrator/config.hpp"
#include "orchestrator/conv_geometry.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/shard_plan.hpp"

namespace ht {

// Per layer: what happens to the activations saved for its backward (its output, and the
// halo-extended input of a windowed layer) between forward and backward. Keep, Offload or
// Recompute only (never Auto). The last layer and the layers after the global pool always
// keep.
using LayerPolicies = std::vector<ActivationPolicy>;

// float32 bytes of `rect` for `channels` planes of `batch` images.
uint64_t tile_bytes(const Rect& rect, int channels, int batch);

// Whether the layer's backward reads its halo-extended input (convolution for its weight
// gradient, max pooling for its input gradient, which a layer reading the image computes
// not). A layer that does not keep it gathers it again, halo exchange included, on every
// rank.
bool backward_reads_window(const LayerSpec& layer);

// The weights, their gradients and the optimizer state: every rank holds all of them.
struct ReplicatedState {
  uint64_t params = 0;     // every weight, BN moving statistics included
  uint64_t grads = 0;      // one per trainable weight (two with micro-batches: their running sum)
  uint64_t optimizer = 0;  // adam: 2 x trainable; sgd: 1 x trainable with momentum, else 0
  uint64_t optimizer_slots = 0;
  uint64_t total() const { return params + grads + optimizer; }
};
ReplicatedState replicated_state(const Config& config, const ModelSpec& model);

// Every size one rank's step allocates, in bytes (halo regions and rectangles are not free
// to compute, so the planner's policy search computes them once per plan).
struct LayerSizes {
  uint64_t out = 0;        // the owned output (the next layer's input)
  uint64_t ext = 0;        // the needed input rectangle, halo included
  uint64_t owned_in = 0;   // the owned input, as the kernel takes it (gathered: the whole)
  std::vector<uint64_t> owned_ins;  // this rank's part of each input (joins: several)
  std::vector<uint64_t> gathered;   // per input: the whole of it where the layer gathers it, else 0
  uint64_t inner = 0;      // a tensor inside the layer (LayerSpec::inner_channels)
  // Per phase (rows, cols): the regions this rank sends in a forward exchange and those it
  // receives; a backward exchange sends the received ones' gradients back.
  uint64_t sends[2] = {}, receives[2] = {};
  uint64_t stage(int phase) const { return sends[phase] + receives[phase]; }
  bool in_place = false;   // needed == owned: no extended copy
  bool extended_everywhere = false;  // windowed, and no rank reads its input in place
  bool dx_over_dy = false; // backward_in_place: the input gradient takes the output gradient's memory
  uint64_t padded = 0;     // CUDA conv: the zeroed copy for asymmetric padding, rounded up
  // A conv or batch norm that heads a chain that may be fused (fusable_chain): the index of the
  // chain's last layer (its ReLU, or its max pool), whether it is a pool, the bytes of the
  // pool's argmax (one per window, in whole floats), and whether its input gradient is
  // written over its input (LayerSizes::chain_dx_over_input): a pooled chain's is (a per-element pass
  // that reads each input value before writing the gradient there; the CPU's and the CUDA
  // kernels) where the chain alone reads the input, which is a layer's output (not the
  // image) whose own backward does not read it. Without a pool the input gradient takes the
  // output gradient's memory instead.
  int chain_tail = -1;
  bool chain_pools = false;
  uint64_t argmax = 0;
  bool chain_dx_over_input = false;
};
struct RankSizes {
  uint64_t input = 0, targets = 0;
  uint64_t conv_scratch = 0;  // CPU backend: oneDNN's reorder buffers and scratchpad (conv_geometry.hpp)
  // CPU backend: the next micro-batch's image and target tiles are read in the background
  // during this one (worker/run/batch.hpp), so two micro-batches' tiles are on the device; on
  // CUDA the next one waits in host memory.
  bool staged = false;
  std::vector<LayerSizes> layers;
};
RankSizes rank_sizes(const Config& config, const ShardPlan& plan, int rank, ConvUse use = ConvUse::Training);

// Whether layer l's backward writes its input gradient over its output gradient, when it
// makes one (LayerTraits::backward_in_place; not where it gathers its input whole, whose
// gradient is then cut to this rank's part). Layer::backward_over does it; the schedule
// then allocates no input gradient and frees no output gradient.
bool backward_in_place(const ShardPlan& plan, int l);

// Pointwise fusion, a property of the schedule (the layers stay separate descriptions): a
// convolution (conv_heads_chains) read only by a ReLU or a ReLU6 runs with it as one
// chain: its Forward writes the activation's output (ConvKernel::forward_relu: the ReLU in
// the conv's pass where the kernel can), its Backward takes the chain's output gradient,
// masks it in place with the activation's output (then freed) and runs the conv's backward
// as it would unfused; the conv's output is never made. A
// batch norm on a feature map read only by a ReLU or a ReLU6 (whose gradient its output
// alone decides) runs with it as one chain, and with a max pool too when a ReLU is read
// only by one whose windows tile its input on every
// rank (kernel == stride, no padding, no halo; kernels/cpu/norm_relu_pool.hpp and
// kernels/cuda/norm_relu_pool.cu; without a pool the CUDA backend runs the batch norm's and
// the ReLU's kernels in place). The batch
// norm's Forward gathers its statistics and writes only the chain's output (the ReLU's, or
// the pool's and one argmax byte per window); the batch norm's output, and in a pooled
// chain the ReLU's, are never made, so their policies have nothing to act on. The other
// layers' Forward do nothing; their Backward pass the chain's output gradient down as it
// is, and the batch norm's Backward makes the chain's input gradient from it and the batch
// norm's input: in a pooled chain from the argmax bytes (the pool's Backward frees its
// output), without a pool from the ReLU's output (freed there), over the output gradient's
// memory (norm.hpp bn_relu_backward_*: the bits of the ReLU's backward, then the batch
// norm's). The chain's output is offloaded or dropped as its policy says like any other;
// dropped, the whole chain is recomputed (at the batch norm, making the output again and
// keeping the argmax bytes). Every policy runs the same kernels, so their results stay the
// same bits.
//
// fusable_chain: the chain's last layer when layer `head` may head one in a training step
// of this plan (its backend, shapes and halos: a pool that crosses the shards' borders
// stays apart), else -1; chain_in_model: the same
// from the model's shapes alone (no halos), for bounds that hold on every grid.
// fused_chains: per layer, the head of the fusable chain it is part of
// (LayerSizes::chain_tail), else -1. Where no gradient reaches a chain (a frozen stem) its
// SkipBackward drop the argmax bytes (a conv's, its kept window) and the chain's output.
// Per tensor (0 the image, t layer t - 1's output): whether a backward reads it, its own
// layer's or a reader's (LayerTraits::backward_reads_output, backward_reads_inputs; a
// reader that gathers its inputs does; a windowed reader that keeps its halo-extended
// input reads that instead; a reader under recompute does, its forward running again).
// One that none reads goes after its last reader's forward as a dropped one does,
// whatever its layer's policy; a conv chain's output under recompute whose conv is under
// keep stays (kReadAndKept). The same on every rank: a recompute runs the halo
// exchanges of all of them.
std::vector<char> read_by_backward(const ModelSpec& model, const RankSizes& sizes, const LayerPolicies& policies);
// Whether layer l's backward reads its own output: its kind's trait; inside a fused chain
// (`fused`: fused_chains) only the last layer of one without a pool does (the batch norm's
// backward reads the ReLU's output for its mask).
bool backward_reads_output(const ModelSpec& model, const RankSizes& sizes, const std::vector<int>& fused, int l);
// read_by_backward's mark of a tensor read again that stays whatever its policy (a conv
// chain's output under recompute whose conv is under keep).
constexpr char kReadAndKept = 2;
// What happens to tensor t (t >= 1, layer t - 1's output) after its last reader's forward:
// its layer's policy where it is read again (`read`: read_by_backward), else it goes as
// under recompute.
inline ActivationPolicy stored_as(const std::vector<char>& read, const LayerPolicies& policies, int t) {
  if (read[size_t(t)] == kReadAndKept) return ActivationPolicy::Keep;
  return read[size_t(t)] ? policies[size_t(t) - 1] : ActivationPolicy::Recompute;
}
// Whether a layer's backward reads its inputs: its kind's trait, unless it reads its
// halo-extended input instead (reads_extended_only), or the whole inputs it gathered.
bool backward_reads_inputs(const LayerSpec& layer, const LayerSizes& sizes, ActivationPolicy policy);

// The kinds of convolution that head a chain with their activation.
bool conv_heads_chains(const LayerSpec& layer);
int fusable_chain(const Config& config, const ShardPlan& plan, int head);
int chain_in_model(const Config& config, const ModelSpec& model, int head);
std::vector<int> fused_chains(const RankSizes& sizes);
// Whether layer l is inside a fused chain (`fused`: fused_chains) before its last layer:
// its output is never made.
bool inside_fused_chain(const RankSizes& sizes, const std::vector<int>& fused, int l);

// Whether a windowed layer keeps its halo-extended input from forward to backward (under
// keep, when its backward reads it and it is not the input itself).
bool keeps_extended_input(const LayerSpec& layer, const LayerSizes& sizes, ActivationPolicy policy);
// Whether its backward then reads only the extended copy, not the input it was made from:
// it keeps it on this rank and every other rank makes one too (extended_everywhere), so
// that the input is read, or not, alike on every rank. The extended copy holds the input
// whole, so the input itself need not wait for this backward.
bool reads_extended_only(const LayerSpec& layer, const LayerSizes& sizes, ActivationPolicy policy);

// What an operation's memory is, as the plan's breakdown names it.
enum class MemoryKind : uint8_t {
  Params,       // the weights
  Grads,        // their gradients
  Optimizer,    // the optimizer's state
  Input,        // image and target tiles
  Activations,  // saved for backward: layer outputs, extended inputs of windowed layers
  Transient,    // gradients in flight, inputs gathered again for a backward
  Workspace,    // conv scratch: cuDNN workspace and padded copies (CUDA), oneDNN's (CPU)
  Halo,         // staging of an exchange (send and receive buffers)
  Host,         // the host pool holding offloaded activations (not device memory)
};
constexpr int kMemoryKinds = 9;
const char* memory_kind_name(MemoryKind kind);

struct MemoryEvent {
  MemoryKind kind;
  int64_t bytes;  // > 0 allocated, < 0 freed; never 0
};

enum class StepAction : uint8_t {
  Hold,           // what lives from step to step: the weights, their gradients, the optimizer
                  // state, the conv scratch; on CPU also this micro-batch's tiles, read during
                  // the one before
  LoadBatch,      // the micro-batch's tiles (CUDA), or the next one's, read beside this one (CPU)
  Forward,        // layer `index`'s forward: its gathered inputs and halo, its output
  Stash,          // tensor `index` was read for the last time: offloaded to the host pool, or dropped
  FinishOffload,  // tensor `index`'s copy to the host pool is done: its device memory goes
  LossGradient,   // the loss, and the gradient of the last layer's output
  Prefetch,       // tensor `index` starts coming back from the host pool
  Restore,        // tensor `index` is back on the device for compute; its host copy goes
  Recompute,      // layer `index`'s forward again, for its dropped output
  Backward,       // layer `index`'s backward: weight gradients, input gradients summed into
                  // each input's; its output and the output gradient go
  SkipBackward,   // no gradient reaches layer `index` (nothing before it trains): what its
                  // forward kept goes
  Free,           // inference: tensor `index` was read for the last time and goes
  SendOutput,     // predict: the output goes to rank 0 in bands of rows
  EndMicroBatch,  // the micro-batch's tiles and its activations left in the host pool go
                  // (inference: the batch's output)
  SumGradients,   // accumulate > 1: the micro-batch's weight gradients into their running sum
  AllReduce,      // every weight gradient summed over ranks, in rank order
  Update,         // the optimizer step
};
const char* step_action_name(StepAction action);

struct StepOp {
  StepAction action;
  int index = -1;  // the layer (Forward, Recompute, Backward, SkipBackward), the tensor
                   // (Stash, FinishOffload, Prefetch, Restore: t = 0 the image, t = l + 1
                   // layer l's output), else -1
  std::vector<MemoryEvent> events;
};

// ops[0] is Hold; ops[micro_begin, micro_end) are one micro-batch, run `micro_batches`
// times (training.accumulate); the rest end the step. An inference schedule is one batch
// (a round of evaluate or predict, or of validation during training): ops[1, end).
struct StepSchedule {
  int rank = 0;
  int micro_batches = 1;
  size_t micro_begin = 1, micro_end = 1;
  std::vector<StepOp> ops;
  std::vector<int> fused;  // training: fused_chains, per layer the head of its chain or -1
  std::vector<char> read_by_backward;  // training: per tensor, read_by_backward
  std::vector<char> dx_over_input;     // training: per chain head, LayerSizes::chain_dx_over_input
};

// Receives a step's operations as they are walked: the memory model tallies them without
// storing them (the planner's policy search walks thousands of steps).
class StepSink {
 public:
  virtual ~StepSink() = default;
  virtual void begin(StepAction action, int index) = 0;
  virtual void event(MemoryEvent e) = 0;
};

// Walks one training step of a rank with these sizes under `policies`. `gradient` says per
// tensor whether the backward makes its gradient (model_spec.hpp gradient_flow: during a
// `training.freeze` phase the backward stops earlier); empty: the plan's, every freeze
// released (LayerSpec::output_gradient).
void walk_training_step(const Config& config, const ModelSpec& model, const RankSizes& sizes,
                        const LayerPolicies& policies, const std::vector<char>& gradient, StepSink& sink);

// The schedule of `rank`, as the trainer runs it.
StepSchedule training_schedule(const Config& config, const ShardPlan& plan, int rank, const LayerPolicies& policies,
                               const std::vector<char>& gradient = {});

// Inference: evaluate and validation (the forward in inference mode, each tensor freed once
// its last reader has read it), and predict (then the output to rank 0 in bands). A batch
// of the local batch size; the weights without gradients or optimizer state.
enum class Inference { Evaluate, Predict };
void walk_inference(const Config& config, const ShardPlan& plan, int rank, Inference kind, StepSink& sink);
StepSchedule inference_schedule(const Config& config, const ShardPlan& plan, int rank, Inference kind);

// Prediction moves each output tile to rank 0 in bands of rows of at most this many bytes
// (at least one row).
constexpr uint64_t kPredictionBandBytes = uint64_t(16) << 20;
int prediction_band_rows(int channels, int cols);

// kConvWorkspaceLimit (kernels/device_memory.hpp) when the backend is CUDA and the model has a convolution, else 0.
uint64_t cudnn_workspace_bytes(const Config& config, const ModelSpec& model);

}  // namespace ht
