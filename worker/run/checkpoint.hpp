// Checkpoints in the Keras 2 weights format (SPEC section 4) plus halotrain's own state
// under /halotrain, and loading Keras weights for `training.init_weights`.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "orchestrator/model_spec.hpp"
#include "worker/layers/params.hpp"

namespace ht {

// Training produced something that is not finite (the loss, or a weight about to be
// checkpointed): a user-visible failure (exit 1), no checkpoint written.
class TrainingDiverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the optimizer keeps besides the weights: Adam's m and v, or SGD's velocity.
struct OptimizerState {
  Tensor m, v;  // m doubles as SGD's velocity
};

struct TrainingProgress {
  int64_t step = 0;    // optimizer steps done
  int64_t epoch = 0;   // epoch of the next sample
  int64_t cursor = 0;  // stream position of the next sample (step * batch_size)
  std::string monitors;  // the validation monitors' state (worker/run/monitors.hpp)
  std::string data_identity;  // data.train's, when it is a manifest
};

// Writes run_dir/checkpoints/ckpt-<step>.h5 (or `file_name` there: best.h5) atomically and
// returns its path; pruning is CheckpointDir's. Throws TrainingDiverged naming the first
// weight or optimizer slot that is not finite, before anything is written.
std::string save_checkpoint(const Config& config, const ModelSpec& model, ParamStore& params,
                            OptimizerState& optimizer, ComputeBackend& backend,
                            const TrainingProgress& progress, const std::string& file_name = "");

// "" when `path` is a complete halotrain checkpoint whose checksum verifies, else why not.
std::string checkpoint_problem(const std::string& path);
// Whether `path` is a readable Keras weights file without halotrain's state (an import's
// init weights, a Keras save_weights file).
bool is_plain_keras_weights(const std::string& path);

// Loads weights, batch-norm statistics and optimizer state from `path`; refuses a file of
// another model (its model hash differs) and logs config keys that changed. Streams as
// load_init_weights does; optimizer slots go in pieces no larger than the largest weight.
TrainingProgress load_checkpoint(const std::string& path, const Config& config, const ModelSpec& model,
                                 ParamStore& params, OptimizerState& optimizer, ComputeBackend& backend,
                                 bool verbose);

// Loads `training.init_weights` into `params` (strict: the layers with weights are matched
// in order, count and every shape must agree; by name: matching names only). Reads one
// tensor at a time through at most one tensor of host staging, counted by
// params.staging_allocator(). Throws ConfigError naming the file, layer, weight, expected
// and found.
void load_init_weights(const Config& config, const ModelSpec& model, ParamStore& params);
// The same from any Keras weights file (a plain one given to predict or evaluate as
// --checkpoint); `what` starts the messages ("--checkpoint x.h5").
void load_keras_weights(const std::string& path, const std::string& what, bool by_name, const ModelSpec& model,
                        ParamStore& params);

// A short hex digest of the model part of the config (input, loss, every layer's type,
// name and the values that are part of the model: LayerKey::in_model_hash).
std::string model_hash(const ModelSpec& model);

}  // namespace ht
