// Loss and metrics over every image of a file (SPEC section 8): each rank adds what its
// output tiles say, on the host in double, and one collective reduces them over all ranks.
// Spatial outputs (masks) count every shard's pixels; class outputs are replicated on the
// shards of a group, so only its first shard counts them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "orchestrator/shard_plan.hpp"
#include "worker/comm/comm.hpp"
#include "worker/layers/layers.hpp"
#include "worker/run/batch.hpp"

namespace ht {

// (name, value) in the order of metrics.csv: loss first, then training.metrics.
using MetricValues = std::vector<std::pair<std::string, double>>;

// The metrics.csv columns of validation: val_loss, then val_<metric> per training.metrics
// (Keras CSVLogger's names); none without data.validation.
std::vector<std::string> validation_columns(const Config& config);

// The area under the ROC curve of `scores` for binary `labels` (ties count one half, as
// sklearn's roc_auc_score); NaN when one class is absent.
double roc_auc(const std::vector<double>& scores, const std::vector<int>& labels);

class MetricsAccumulator {
 public:
  // `images`: how many images the file holds (auc keeps one score per image).
  MetricsAccumulator(const Config& config, const ShardPlan& plan, int rank, int64_t images);
  // y: this rank's output of the batch on the host ([b, C, rows, cols] or [b, K]).
  void add(const std::vector<float>& y, const Batch& batch);
  // Collective over every rank: loss and metrics, the same on every rank.
  MetricValues finish(Comm& world);

 private:
  const Config& config_;
  const ShardPlan& plan_;
  bool counts_;   // this rank's outputs are counted (spatial, or the group's first shard)
  bool spatial_;  // masks
  // loss sum, loss elements, correct, judged, true positives, predicted positives, positives
  double sums_[7] = {};
  std::vector<double> scores_, labels_, seen_;  // auc: per image of the file
};

// Collective: `layers` in inference mode over every image of `data` (DataPurpose::Evaluate),
// each batch the rank's inference schedule (Inference::Evaluate).
MetricValues evaluate_file(const std::vector<std::unique_ptr<Layer>>& layers, const StepSchedule& schedule,
                           ComputeBackend& backend, BatchSource& data, const Config& config, const ShardPlan& plan,
                           int rank, Comm& world);

}  // namespace ht
