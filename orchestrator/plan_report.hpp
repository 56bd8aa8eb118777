// What `halotrain plan` prints: the grid, each rank's pixel rectangle, halo widths per
// windowed layer, bytes per device against parallel.device_memory, halo traffic per step.
#pragma once

#include <string>

#include "orchestrator/config.hpp"
#include "orchestrator/memory_model.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/plan.hpp"
#include "orchestrator/shard_plan.hpp"

namespace ht {

// Rows/cols of the layer's input a shard reads from its neighbours: the widest over all
// shards (0 along an axis with one shard).
struct HaloWidths {
  int rows_above = 0, rows_below = 0, cols_left = 0, cols_right = 0;
};
HaloWidths halo_widths(const ShardPlan& plan, int layer);

std::string render_plan_text(const Config& config, const Plan& plan);
// The same content as one JSON object (per rank a `peak_device_bytes`), newline-terminated.
std::string render_plan_json(const Config& config, const Plan& plan);

// `plan --mode predict`: the inference peak per rank (estimate_inference_memory) against
// the budget, as text or JSON; and its verdict ("" when every rank fits).
std::string render_predict_plan(const Config& config, const ShardPlan& plan, bool json);
std::string predict_fit_verdict(const Config& config, const ShardPlan& plan);

// `plan --schedule`: one line per operation of a step schedule: what it does (layer names from the model), the bytes it
// allocates and frees by kind, and the device bytes live after it; the peak marked.
std::string render_schedule_text(const StepSchedule& schedule, const ModelSpec& model);
// {"rank", "micro_batches", "micro_batch": [first, end), "ops": [{"action", "index", "name",
// "events": [[kind, bytes], ...]}]}
std::string render_schedule_json(const StepSchedule& schedule, const ModelSpec& model);

}  // namespace ht
