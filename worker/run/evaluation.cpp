#include "worker/run/evaluation.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "worker/run/signals.hpp"

namespace ht {

namespace {

enum Sum { kLoss, kLossElements, kCorrect, kJudged, kTruePositive, kPredictedPositive, kPositive, kSums };

// Softplus without overflow: log(1 + e^x).
double softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))); }

}  // namespace

std::vector<std::string> validation_columns(const Config& config) {
  if (config.data.validation.empty()) return {};
  std::vector<std::string> columns{"val_loss"};
  for (Metric m : config.training.metrics) columns.push_back(std::string("val_") + to_string(m));
  return columns;
}

double roc_auc(const std::vector<double>& scores, const std::vector<int>& labels) {
  const size_t n = scores.size();
  // A score that is not a number ranks nowhere: the area is undefined.
  if (std::any_of(scores.begin(), scores.end(), [](double s) { return std::isnan(s); }))
    return std::numeric_limits<double>::quiet_NaN();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney: the rank sum of the positives, tied scores sharing their mean rank.
  double positive_ranks = 0, positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double mean_rank = (double(i) + double(j - 1)) / 2 + 1;
    for (size_t k = i; k < j; ++k)
      if (labels[order[k]]) {
        positive_ranks += mean_rank;
        positives += 1;
      }
    i = j;
  }
  const double negatives = double(n) - positives;
  if (positives == 0 || negatives == 0) return std::numeric_limits<double>::quiet_NaN();
  return (positive_ranks - positives * (positives + 1) / 2) / (positives * negatives);
}

MetricsAccumulator::MetricsAccumulator(const Config& config, const ShardPlan& plan, int rank, int64_t images)
    : config_(config), plan_(plan) {
  spatial_ = plan.model.spatial_output();
  counts_ = spatial_ || plan.shard_of(rank) == 0;
  const auto& m = config.training.metrics;
  if (std::find(m.begin(), m.end(), Metric::AUC) != m.end()) {
    scores_.assign(size_t(images), 0.0);
    labels_.assign(size_t(images), 0.0);
    seen_.assign(size_t(images), 0.0);
  }
}

void MetricsAccumulator::add(const std::vector<float>& y, const Batch& batch) {
  if (!counts_) return;
  const LossType loss = config_.model.loss;
  const int b = int(batch.samples.size());
  const size_t per_image = y.size() / size_t(std::max(b, 1));
  // The decision threshold on the raw output: a logit for sigmoid_bce, a value for mse.
  const double threshold = loss == LossType::SigmoidBCE ? 0.0 : 0.5;
  const int classes = plan_.model.output().c;
  for (int i = 0; i < b; ++i) {
    if (!batch.valid[size_t(i)]) continue;
    const float* x = y.data() + size_t(i) * per_image;
    if (spatial_ && loss == LossType::SoftmaxCrossEntropy) {
      // Per pixel over the K channel planes; targets are class ids, one per pixel.
      const size_t hw = per_image / size_t(classes);
      const float* t = batch.host_targets.data() + size_t(i) * hw;
      for (size_t p = 0; p < hw; ++p) {
        double top = x[p];
        int best = 0;
        for (int c = 1; c < classes; ++c)
          if (x[size_t(c) * hw + p] > top) top = x[size_t(c) * hw + p], best = c;
        double sum = 0;
        for (int c = 0; c < classes; ++c) sum += std::exp(double(x[size_t(c) * hw + p]) - top);
        const int label = int(t[p]);
        sums_[kLoss] += top + std::log(sum) - double(x[size_t(label) * hw + p]);
        const bool predicted = best == 1, positive = label == 1;  // dice and iou: two classes
        sums_[kCorrect] += best == label;
        sums_[kTruePositive] += predicted && positive;
        sums_[kPredictedPositive] += predicted;
        sums_[kPositive] += positive;
      }
      sums_[kLossElements] += double(hw);
      sums_[kJudged] += double(hw);
      continue;
    }
    const float* t = batch.host_targets.data() + size_t(i) * per_image;
    if (spatial_ || per_image == 1) {
      // Per element: masks, or one sigmoid / regression output per image.
      for (size_t e = 0; e < per_image; ++e) {
        const double v = x[e], target = t[e];
        sums_[kLoss] += loss == LossType::SigmoidBCE ? softplus(v) - v * target : (v - target) * (v - target);
        const bool predicted = v > threshold, positive = target > 0.5;
        sums_[kCorrect] += predicted == positive;
        sums_[kTruePositive] += predicted && positive;
        sums_[kPredictedPositive] += predicted;
        sums_[kPositive] += positive;
      }
      sums_[kLossElements] += double(per_image);
      sums_[kJudged] += double(per_image);
    } else {
      // Class scores: softmax cross-entropy, or mse against the one-hot target.
      const int k = int(per_image), label = batch.labels[size_t(i)];
      if (loss == LossType::SoftmaxCrossEntropy) {
        const double top = *std::max_element(x, x + k);
        double sum = 0;
        for (int c = 0; c < k; ++c) sum += std::exp(double(x[c]) - top);
        sums_[kLoss] += top + std::log(sum) - double(x[label]);
        sums_[kLossElements] += 1;
      } else {
        for (int c = 0; c < k; ++c) sums_[kLoss] += (double(x[c]) - t[c]) * (double(x[c]) - t[c]);
        sums_[kLossElements] += k;
      }
      sums_[kCorrect] += int(std::max_element(x, x + k) - x) == label;
      sums_[kJudged] += 1;
    }
    if (!scores_.empty()) {
      const size_t s = size_t(batch.samples[size_t(i)]);
      // The probability of class 1: softmax over two logits, or the sigmoid of one.
      const double z = per_image == 2 ? double(x[1]) - double(x[0]) : double(x[0]);
      scores_[s] = loss == LossType::MSE && per_image == 1 ? z : 1.0 / (1.0 + std::exp(-z));
      labels_[s] = batch.labels[size_t(i)] != 0;
      seen_[s] = 1;
    }
  }
}

MetricValues MetricsAccumulator::finish(Comm& world) {
  world.allreduce_sum_host(sums_, kSums);
  if (!scores_.empty()) {
    world.allreduce_sum_host(scores_.data(), scores_.size());
    world.allreduce_sum_host(labels_.data(), labels_.size());
    world.allreduce_sum_host(seen_.data(), seen_.size());
  }
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : std::numeric_limits<double>::quiet_NaN(); };
  MetricValues out{{"loss", ratio(sums_[kLoss], sums_[kLossElements])}};
  for (Metric m : config_.training.metrics) {
    double v = 0;
    const double tp = sums_[kTruePositive], pp = sums_[kPredictedPositive], p = sums_[kPositive];
    switch (m) {
      case Metric::Accuracy: v = ratio(sums_[kCorrect], sums_[kJudged]); break;
      case Metric::AUC: {
        std::vector<double> scores;
        std::vector<int> labels;
        for (size_t s = 0; s < scores_.size(); ++s)
          if (seen_[s] > 0) {
            scores.push_back(scores_[s]);
            labels.push_back(labels_[s] > 0.5);
          }
        v = roc_auc(scores, labels);
        break;
      }
      // Both empty (nothing predicted, nothing there) is a perfect match.
      case Metric::Dice: v = pp + p > 0 ? 2 * tp / (pp + p) : 1.0; break;
      case Metric::IoU: v = pp + p - tp > 0 ? tp / (pp + p - tp) : 1.0; break;
    }
    out.emplace_back(to_string(m), v);
  }
  return out;
}

MetricValues evaluate_file(const std::vector<std::unique_ptr<Layer>>& layers, const StepSchedule& schedule,
                           ComputeBackend& backend, BatchSource& data, const Config& config, const ShardPlan& plan,
                           int rank, Comm& world) {
  MetricsAccumulator metrics(config, plan, rank, data.samples());
  std::vector<float> host;
  for (int64_t round = 0; round < data.rounds(); ++round) {
    Batch batch = data.load_round(round);
    const Tensor y = forward_inference(layers, schedule, std::move(batch.images));
    host.resize(y.size());
    backend.to_host(host.data(), y.data(), y.bytes());
    metrics.add(host, batch);
    note_progress();  // a long validation is not a stuck one
  }
  return metrics.finish(world);
}

}  // namespace ht
