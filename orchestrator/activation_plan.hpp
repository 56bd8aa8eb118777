// The activation policy of every layer (keep / offload / recompute) and the step-time model
// that chooses among them: for `parallel.activations: auto` the planner keeps everything
// when that fits, and otherwise moves layers to offload or recompute, one at a time, each
// time taking the change that frees the most peak memory per second of predicted extra
// step time, until the busiest rank fits `parallel.device_memory`. Pure and deterministic:
// every rank computes the same policies (recompute and gather-again run collectives).
#pragma once

#include <string>

#include "orchestrator/memory_model.hpp"

namespace ht {

// What one device can do, for predicting a step's time. No device is queried: `plan` runs
// anywhere, so the target is named by the backend.
struct DeviceCostModel {
  std::string name;
  double flops = 0;           // fp32 FLOP/s of one device (one K80 die)
  double memory_bw = 0;       // device memory, bytes/s (element-wise layers are bound by it)
  double host_link_bw = 0;    // host <-> device, bytes/s, for the whole link
  int devices_per_link = 1;   // devices sharing that link (a K80's two dies share one x16)
  double peer_bw = 0;         // halo and all-reduce bytes/s between devices of one node
  double network_bw = 0;      // between nodes
  bool copies_overlap = false;  // offload copies run beside compute (a transfer stream)
};

// Tesla K80, per GK210 die: 4.37 TFLOP/s fp32 at boost, 240 GB/s, PCIe 3 x16 about
// 12 GB/s shared by the two dies (also the path between them), FDR InfiniBand between nodes.
DeviceCostModel k80_die();
// The CPU backend: a rough host model (all shards of a machine share its cores and memory).
DeviceCostModel cpu_host();
DeviceCostModel cost_model_for(const Config& config);  // cuda: k80_die(), cpu: cpu_host()

// Predicted seconds of one training step on the busiest rank, by part.
struct StepTime {
  double compute = 0;    // forward + backward of every layer (backward = 2 x forward)
  double recompute = 0;  // forward of the recomputed layers, again
  double halo = 0;       // forward and backward halos (and gathers again for backward)
  double allreduce = 0;  // the weight gradients, ring all-reduce over every rank
  double offload = 0;    // host traffic of offloaded activations (out and back)
  bool overlapped = false;  // offload runs beside compute: only what outlasts it shows
  double total() const;
};
StepTime predict_step_time(const Config& config, const ShardPlan& plan, const LayerPolicies& policies,
                           const DeviceCostModel& device);

// parallel.host_memory for each of a job's `world` ranks: as set, or for auto this
// machine's memory shared among the ranks of one node (a CUDA job's devices_per_node; a
// CPU job's world over slurm.nodes), less an eighth for the rest of the processes.
uint64_t host_memory_budget(const Config& config, int world);
// The same for nodes of `node_bytes` (submit: the partition's smallest node).
uint64_t host_memory_budget(const Config& config, int world, uint64_t node_bytes);

// The policies the worker runs with: `parallel.activations` keep/offload/recompute applies
// to every layer that can take it; auto chooses as described above, offloading no more than
// host_memory_budget holds on any rank (when nothing fits, the choice with the smallest
// peak: the plan then says it does not fit).
LayerPolicies activation_policies(const Config& config, const ShardPlan& plan);

}  // namespace ht
