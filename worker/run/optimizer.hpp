// The optimizer's step (SPEC sections 8 and 14): Adam (AdamW's decoupled decay) or SGD
// with momentum (L2 decay), over the weights that train this step.
#pragma once

#include <cstdint>
#include <vector>

#include "orchestrator/config.hpp"
#include "orchestrator/model_spec.hpp"
#include "worker/layers/params.hpp"
#include "worker/run/checkpoint.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {

// Updates `params` from their summed gradients at rate `lr`, for optimizer step `step`
// (0-based); `frozen` per layer (frozen_layers) leaves a layer's weights and state alone.
void optimizer_step(const Config& config, const ModelSpec& model, const std::vector<char>& frozen, double lr,
                    int64_t step, ParamStore& params, OptimizerState& state, ComputeBackend& backend);

}  // namespace ht
