#include "worker/run/optimizer.hpp"

namespace ht {

// PyTorch's semantics: weight decay as torch.optim.AdamW (the weights shrink by lr*wd
// before the Adam update) or torch.optim.SGD (wd*w added to the gradient). A frozen layer's
// weights are left alone (no update, no decay, no state); Adam's step count of a weight
// starts where it starts to train (training_starts), as torch's per-parameter state does.
// Weights alike in both are updated by one call per run of them in the arena (all of them
// in one call when nothing is frozen).
void optimizer_step(const Config& config, const ModelSpec& model, const std::vector<char>& frozen, double lr,
                    int64_t step, ParamStore& params, OptimizerState& state, ComputeBackend& backend) {
  const OptimizerConfig& o = config.training.optimizer;
  const double decay = config.training.weight_decay;
  struct Run {
    size_t offset, count;
    int64_t start;
  };
  std::vector<Run> runs;
  for (const ParamRef& r : params.refs()) {
    if (!r.trainable || frozen[size_t(r.layer)]) continue;
    const int64_t start = training_starts(config, model, r.layer);
    if (!runs.empty() && runs.back().offset + runs.back().count == r.offset && runs.back().start == start)
      runs.back().count += r.count;
    else
      runs.push_back({r.offset, r.count, start});
  }
  for (const Run& run : runs) {
    const size_t n = run.count;
    float* w = params.values().data() + run.offset;
    float* g = params.grads().data() + run.offset;
    if (o.type == OptimizerType::Adam) {
      if (decay > 0) backend.scale(w, float(1.0 - lr * decay), n);
      backend.adam_step(n, w, g, state.m.data() + run.offset, state.v.data() + run.offset, lr, o.beta1, o.beta2,
                        o.epsilon, step + 1 - run.start);
    } else {
      if (decay > 0) backend.add_scaled(g, w, float(decay), n);
      backend.sgd_step(n, w, g, state.m.empty() ? nullptr : state.m.data() + run.offset, float(lr),
                       float(o.momentum));
    }
  }
}

}  // namespace ht
