// The plan of a job, computed once: how the image is sharded over the ranks, the activation
// policy of every layer, each rank's predicted peak memory and step time, and whether it
// fits. `plan`, `submit`, `train` (the launcher and every trainer) and the report read this
// one object instead of deriving its parts again.
//
// The planning files depend one way: model_spec <- shard_plan <- conv_geometry <-
// step_schedule (a rank's step, operation by operation) <- memory_model (the sum over it
// under given policies) <- activation_plan (chooses policies, predicts step time) <- plan
// (chooses the grid, judges the fit) <- plan_report (renders a Plan).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "orchestrator/activation_plan.hpp"
#include "orchestrator/memory_model.hpp"
#include "orchestrator/shard_plan.hpp"

namespace ht {

// The most shards `grid: auto` and the "smallest grid that fits" search consider.
constexpr int kMaxAutoShards = 256;

// Image files that cannot be streamed (SPEC section 13: interlaced PNG, progressive JPEG, a
// compressed DICOM frame) are decoded whole, once per image and reader, in host memory beside a rank's
// other figures. Read from the manifests' headers by the worker side (worker/run/batch.hpp
// data_whole_decodes); all zero for HDF5 data.
struct WholeDecodes {
  int64_t rows = 0;       // of data.train's and data.validation's manifests
  int64_t images = 0;     // of them decoded whole
  uint64_t per_rank = 0;  // the most a rank's readers hold at once, decoded and being decoded
  std::string largest;    // the row behind it: "train.csv:4: a.dcm (DICOM 4728x5928, ...)"
};

struct Plan {
  ShardPlan shards;               // holds the model spec
  LayerPolicies policies;         // one per layer, the same on every rank
  int local_batch = 0;            // images per (micro-)batch on each rank
  std::vector<MemoryEstimate> ranks;  // every rank's predicted peak (groups repeat group 0)
  MemoryEstimate busiest;         // the rank with the largest one
  StepTime step_time;             // the busiest rank's, on cost_model_for(config)
  uint64_t host_memory = 0;       // host_memory_budget: what each rank's host pool may hold
  // "" when every rank fits parallel.device_memory and parallel.host_memory; otherwise one
  // message naming the need against the budget: for the device, an accumulate that would
  // fit on this grid, and the smallest grid that fits (or that none up to kMaxAutoShards
  // shards does).
  std::string verdict;
  WholeDecodes decodes;  // filled by those that read the data's headers: the CLI, the launcher
  const ModelSpec& model() const { return shards.model; }
  bool fits() const { return verdict.empty(); }
};

Plan make_plan(const Config& config, ShardPlan shards);

// parallel.grid, or for `auto` choose_grid's.
GridShape plan_grid(const Config& config, const ModelSpec& model, int groups = 1);

// The grid for `parallel.grid: auto`: the fewest shards that plan and fit device_memory;
// among equal shard counts fewer halo bytes, then more rows than cols. `groups` sample
// groups share the batch. Throws ConfigError when no grid up to kMaxAutoShards fits.
GridShape choose_grid(const Config& config, const ModelSpec& model, int groups = 1);

// The same search, without throwing: nullopt when no grid up to `max_shards` fits.
std::optional<GridShape> smallest_fitting_grid(const Config& config, const ModelSpec& model, int groups = 1,
                                               int max_shards = kMaxAutoShards);

// One figure of a shard plan under the policies make_plan would choose.
MemoryEstimate estimate_memory(const Config& config, const ShardPlan& plan, int rank);
MemoryEstimate estimate_memory_max(const Config& config, const ShardPlan& plan);
HaloTraffic halo_traffic(const Config& config, const ShardPlan& plan, int rank);
HaloTraffic halo_traffic_total(const Config& config, const ShardPlan& plan);
bool plan_fits(const Config& config, const ShardPlan& plan);  // every rank within device_memory, validation included

}  // namespace ht
