// MemoryModel: bytes per device predicted from the shard plan under given activation
// policies, and halo traffic per step (the grid search is plan.hpp's). Pure: no device, no
// MPI, no data.
//
// The training peak is the sum over the step schedule (step_schedule.hpp), the operations
// the worker runs, under the per-layer activation policies of the plan: keep (saved until
// backward), offload (moved to a host pool between forward and backward) or recompute
// (dropped, and the run of dropped layers is recomputed from the last stored activation
// during backward). Everything is float32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/device_memory.hpp"
#include "orchestrator/config.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/shard_plan.hpp"
#include "orchestrator/step_schedule.hpp"

namespace ht {

// Every layer that can take `policy` gets it, except that Recompute keeps the outputs of
// strided layers and tensors with several readers as segment boundaries.
LayerPolicies uniform_policies(const ModelSpec& model, ActivationPolicy policy);
// Layers whose policy may be other than Keep: feature maps in and out, not the last.
bool policy_applies(const ModelSpec& model, int layer);
// The same for a plan, whose replicated layers (the tail) keep.
bool policy_applies(const ShardPlan& plan, int layer);
LayerPolicies uniform_policies(const ShardPlan& plan, ActivationPolicy policy);

// The weights, their gradients and the optimizer state: every rank holds all of them.
uint64_t replicated_bytes(const Config& config, const ModelSpec& model);

// float32 bytes of `rect` for `channels` planes of `batch` images.
uint64_t tile_bytes(const Rect& rect, int channels, int batch);


// Bytes one rank holds at the moment of its peak, by kind. The kinds add up to the total.
struct MemoryEstimate {
  int rank = 0;
  int local_batch = 0;      // images per step on this rank (batch_size / groups, rounded up)
  uint64_t params = 0;      // every weight, BN moving statistics included
  uint64_t grads = 0;       // one per trainable weight
  uint64_t optimizer = 0;   // adam: 2 x trainable; sgd: 1 x trainable with momentum, else 0
  uint64_t input = 0;       // the image tile and the targets (CPU: and the next micro-batch's)
  uint64_t activations = 0; // saved for backward: layer outputs, extended inputs of windowed layers
  uint64_t transient = 0;   // gradients in flight, inputs gathered again for a backward
  uint64_t workspace = 0;   // conv scratch: cuDNN workspace and padded copies (CUDA), oneDNN's (CPU)
  uint64_t halo = 0;        // staging of the exchange running at the peak (send + receive)
  uint64_t total = 0;       // the predicted peak device bytes: the sum of the above
  uint64_t host_offload = 0;  // peak of the host pool holding offloaded activations
  bool validation = false;    // the peak is a validation pass's (estimate_validation_memory), not the step's
};

// One layer's share of a rank's device memory, by kind: sizes held at some time of the
// step, not one moment (the peak is MemoryEstimate's). The plan's per-layer view.
struct LayerMemory {
  uint64_t params = 0, grads = 0, optimizer = 0;  // its weights, their gradients and optimizer slots
  uint64_t activations = 0;  // on the device from forward to backward: its output, and its
                             // halo-extended input when it keeps it
  uint64_t offloaded = 0;    // its output in the host pool (policy offload), not on the device
  uint64_t halo = 0;         // staging of the larger phase of its exchange (send + receive)
  uint64_t transient = 0;    // during its backward: the output gradient and the input gradient
};

// Halo bytes one rank SENDS per step: forward halos plus backward halo gradients, split by
// whether the peer sits on the same node (rank / devices_per_node).
struct HaloTraffic {
  uint64_t intra_node = 0;
  uint64_t inter_node = 0;
  uint64_t total() const { return intra_node + inter_node; }
};

// Images per (micro-)batch on one rank: batch_size / accumulate / groups, rounded up.
int local_batch(const Config& config, const ShardPlan& plan);
int local_batch(const Config& config, int groups);

// Inference (evaluate, predict, and validation during training): the sum over its schedule
// (step_schedule.hpp inference_schedule). Activations are the layer outputs and the input
// tile live at the peak, transient a gathered or halo-extended input.
MemoryEstimate estimate_inference_memory(const Config& config, const ShardPlan& plan, int rank, Inference kind);
MemoryEstimate estimate_inference_memory_max(const Config& config, const ShardPlan& plan, Inference kind);
// Validation inside a training run (worker/run/trainer.cpp evaluates between steps): what
// the step holds from step to step (its Hold: weights, gradients, optimizer state, conv
// scratch, the next tiles) stays, and the evaluate schedule's operations after its own
// Hold run on top. One scratch serves both: oneDNN's arena, sized for the step's passes,
// holds the forward's (the same convs at the same batch); on CUDA the cuDNN workspace and
// the padded copy the step left, grown to the evaluate forward's where that is larger.
// validation is set. `step`: the rank's training_schedule.
MemoryEstimate estimate_validation_memory(const Config& config, const ShardPlan& plan, const StepSchedule& step);
int node_of(const Config& config, int rank);          // rank / devices_per_node
int local_device_of(const Config& config, int rank);  // rank % devices_per_node

MemoryEstimate estimate_memory(const Config& config, const ShardPlan& plan, int rank,
                               const LayerPolicies& policies);
// The same from the rank's training_schedule, recorded already.
MemoryEstimate estimate_memory(const Config& config, const ShardPlan& plan, const StepSchedule& step);
// The estimate of the rank with the largest total (the one that decides whether it fits).
MemoryEstimate estimate_memory_max(const Config& config, const ShardPlan& plan, const LayerPolicies& policies);
// The same for one plan under many policies: the plan's sizes are computed once, so each
// estimate is a replay of arithmetic (the planner's policy search).
// The peak of a schedule and the bytes by kind live at it (its first peak), and the host
// pool's peak.
MemoryEstimate sum_schedule(const StepSchedule& schedule);

class StepMemory {
 public:
  StepMemory(const Config& config, const ShardPlan& plan);
  ~StepMemory();
  int shards() const { return int(ranks_.size()); }
  MemoryEstimate estimate(int shard, const LayerPolicies& policies) const;  // shard of group 0
  // The busiest shard; with host_max, also the largest host pool of any shard.
  MemoryEstimate estimate_max(const LayerPolicies& policies, uint64_t* host_max = nullptr) const;
  // No policy brings the busiest shard below this: when layer l >= 1 makes its input
  // gradient, its input and output are on the device where its backward reads them, with
  // both gradients (one, where the input gradient takes the output gradient's memory),
  // beside the weights, the image tile
  // and the targets (and the cuDNN workspace on CUDA).
  uint64_t lower_bound() const;

 private:
  MemoryEstimate replay(const RankSizes& sizes, int rank, const LayerPolicies& policies) const;
  const Config& config_;
  const ShardPlan& plan_;
  int local_batch_;
  std::vector<char> gradient_;  // gradient_flow of the model: every replay walks with it
  std::vector<RankSizes> ranks_;
};

// Per layer of `rank`, under `policies`.
std::vector<LayerMemory> layer_memory(const Config& config, const ShardPlan& plan, int rank,
                                      const LayerPolicies& policies);

// Windowed layers that do not keep their extended input gather it again for backward:
// their forward halo moves twice.
HaloTraffic halo_traffic(const Config& config, const ShardPlan& plan, int rank, const LayerPolicies& policies);
// Summed over ranks.
HaloTraffic halo_traffic_total(const Config& config, const ShardPlan& plan, const LayerPolicies& policies);

}  // namespace ht
