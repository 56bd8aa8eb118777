// `halotrain evaluate` and `halotrain predict` (SPEC section 8): a checkpoint's sharded
// forward in inference mode (batch norm on its moving statistics, nothing kept for a
// backward) over every image of a file, on the config's grid, launched as training is.
#pragma once

#include <cstdint>
#include <string>

#include "worker/run/evaluation.hpp"

namespace ht {

struct EvaluationResult {
  std::string checkpoint, data;
  int64_t step = 0;    // of the checkpoint
  int64_t images = 0;
  MetricValues values;  // loss, then training.metrics
  uint64_t peak_device_bytes = 0, predicted_peak_device_bytes = 0;  // the busiest rank's
  std::string json;     // run_dir/eval-<step>.json
};

// `checkpoint` empty: the newest valid one in run_dir/checkpoints; `data` empty:
// data.validation. Throws ConfigError for a checkpoint of another model, a file whose
// shapes do not match the model, or no checkpoint at all.
EvaluationResult run_evaluation(const Config& config, const std::string& checkpoint, const std::string& data);

struct PredictionResult {
  int64_t images = 0;
  std::vector<int64_t> shape;  // of the dataset `predictions`
  uint64_t peak_device_bytes = 0, predicted_peak_device_bytes = 0;
};

// Writes `output` (worker/io/prediction_output.hpp): an HDF5 file's dataset `predictions`
// ([N, H', W', C'] probabilities of a fully convolutional model, or [N, K] of a classifier:
// the sigmoid of one output, the softmax of several; float32, chunked), or a directory of
// BigTIFFs (uint8, and float32 ones with `float32`) or a classifier's scores.csv. Every
// rank's output tile goes to rank 0 in bands of rows, which writes them. `trace_memory`:
// every allocation and free of the first batch to run_dir/memory-trace-predict-RANK.json,
// under the operations of `plan --mode predict --schedule`.
PredictionResult run_prediction(const Config& config, const std::string& checkpoint, const std::string& input,
                                const std::string& output, bool float32 = false, bool trace_memory = false);

}  // namespace ht
