// MemoryModel: bytes per device predicted from the shard plan, halo traffic per step, and
// the choice of grid for `parallel.grid: auto`. Pure: no device, no MPI, no data.
//
// It mirrors the worker's keep policy: every layer keeps its output (owned region, local
// batch) until backward, and every windowed layer also keeps its extended input (the
// needed_input rectangle). Everything is float32.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "orchestrator/config.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/shard_plan.hpp"

namespace ht {

// The most shards `grid: auto` and the "smallest grid that fits" search consider.
constexpr int kMaxAutoShards = 256;

// Bytes one rank holds at its peak (a step's backward pass).
struct MemoryEstimate {
  int rank = 0;
  int local_batch = 0;      // images per step on this rank (batch_size / groups, rounded up)
  uint64_t params = 0;      // every weight, BN moving statistics included
  uint64_t grads = 0;       // one per trainable weight
  uint64_t optimizer = 0;   // adam: 2 x trainable; sgd: 1 x trainable with momentum, else 0
  uint64_t input = 0;       // the image tile (+ the mask tile for per-pixel losses)
  uint64_t activations = 0; // kept for backward: outputs, and extended inputs of windowed layers
  uint64_t transient = 0;   // peak gradient buffers of one layer's backward
  uint64_t workspace = 0;   // kernel scratch (cuDNN); 0 for now
  uint64_t halo = 0;        // staging for one layer's exchange (receive + send buffers)
  uint64_t total = 0;       // the predicted peak: the sum of the above
};

// Halo bytes one rank SENDS per step: forward halos plus backward halo gradients, split by
// whether the peer sits on the same node (rank / devices_per_node).
struct HaloTraffic {
  uint64_t intra_node = 0;
  uint64_t inter_node = 0;
  uint64_t total() const { return intra_node + inter_node; }
};

int local_batch(const Config& config, const ShardPlan& plan);
int node_of(const Config& config, int rank);          // rank / devices_per_node
int local_device_of(const Config& config, int rank);  // rank % devices_per_node

MemoryEstimate estimate_memory(const Config& config, const ShardPlan& plan, int rank);
// The estimate of the rank with the largest total (the one that decides whether it fits).
MemoryEstimate estimate_memory_max(const Config& config, const ShardPlan& plan);

HaloTraffic halo_traffic(const Config& config, const ShardPlan& plan, int rank);
HaloTraffic halo_traffic_total(const Config& config, const ShardPlan& plan);  // summed over ranks

// Every rank's predicted peak is within parallel.device_memory.
bool plan_fits(const Config& config, const ShardPlan& plan);

// The grid for `parallel.grid: auto`: the fewest shards that plan and fit device_memory;
// among equal shard counts fewer halo bytes, then more rows than cols. `groups` sample
// groups share the batch. Throws ConfigError when no grid up to kMaxAutoShards fits.
GridShape choose_grid(const Config& config, const ModelSpec& model, int groups = 1);

// The same search, without throwing: nullopt when no grid up to `max_shards` fits.
std::optional<GridShape> smallest_fitting_grid(const Config& config, const ModelSpec& model,
                                               int groups = 1, int max_shards = kMaxAutoShards);

}  // namespace ht
