// The memory model of inference (evaluate, predict, validation during training): the sum
// over its schedule (step_schedule.hpp inference_schedule).
#include "orchestrator/memory_model.hpp"

#include <algorithm>

#include "orchestrator/step_schedule.hpp"

namespace ht {

MemoryEstimate estimate_inference_memory(const Config& config, const ShardPlan& plan, int rank, Inference kind) {
  MemoryEstimate e = sum_schedule(inference_schedule(config, plan, rank, kind));
  e.rank = rank;
  e.local_batch = local_batch(config, plan);
  return e;
}

MemoryEstimate estimate_validation_memory(const Config& config, const ShardPlan& plan, const StepSchedule& step) {
  const int rank = step.rank;
  const StepSchedule eval = inference_schedule(config, plan, rank, Inference::Evaluate);
  // The workspace live after a step or beside a forward, past its Hold: cuDNN's (CUDA).
  auto later_workspace = [](const StepSchedule& s) {
    int64_t bytes = 0;
    for (size_t i = 1; i < s.ops.size(); ++i)
      for (const MemoryEvent& e : s.ops[i].events)
        if (e.kind == MemoryKind::Workspace) bytes += e.bytes;
    return bytes;
  };
  StepSchedule v;
  v.rank = rank;
  v.ops.push_back(step.ops.at(0));  // the step's Hold
  StepOp grown{StepAction::Hold, -1, {}};
  const int64_t workspace = std::max(later_workspace(step), later_workspace(eval));
  if (workspace > 0) grown.events.push_back({MemoryKind::Workspace, workspace});
  v.ops.push_back(grown);
  for (size_t i = 1; i < eval.ops.size(); ++i) {
    StepOp op{eval.ops[i].action, eval.ops[i].index, {}};
    for (const MemoryEvent& e : eval.ops[i].events)
      if (e.kind != MemoryKind::Workspace) op.events.push_back(e);
    v.ops.push_back(op);
  }
  MemoryEstimate e = sum_schedule(v);
  e.rank = rank;
  e.local_batch = local_batch(config, plan);
  e.validation = true;
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
