// The memory model of inference (evaluate, predict, validation during training): the sum
// over its schedule (step_schedule.hpp inference_schedule).
#include "orchestrator/memory_model.hpp"

namespace ht {

MemoryEstimate estimate_inference_memory(const Config& config, const ShardPlan& plan, int rank, Inference kind) {
  MemoryEstimate e = sum_schedule(inference_schedule(config, plan, rank, kind));
  e.rank = rank;
  e.local_batch = local_batch(config, plan);
  return e;
}

MemoryEstimate estimate_inference_memory_max(const Config& config, const ShardPlan& plan, Inference kind) {
  MemoryEstimate best = estimate_inference_memory(config, plan, 0, kind);
  for (int r = 1; r < plan.world(); ++r) {
    MemoryEstimate e = estimate_inference_memory(config, plan, r, kind);
    if (e.total > best.total) best = e;
  }
  return best;
}

}  // namespace ht
