#include "worker/batch.hpp"

#include <fmt/format.h>

#include "worker/data_reader.hpp"
#include "worker/params.hpp"

namespace ht {

std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n, bool shuffle) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  if (!shuffle) return p;
  SplitMix64 rng(seed * 0x100000001b3ull + uint64_t(epoch));
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[int64_t(rng.next() % uint64_t(i + 1))]);
  return p;
}

BatchSource::BatchSource(const Config& config, const ShardPlan& plan, int rank, ComputeBackend& backend)
    : config_(config), plan_(plan), rank_(rank), backend_(&backend) {
  reader_ = std::make_unique<DataReader>(config.data.train, data_reader_options(config, plan.model));
  const bool spatial_out = plan.model.spatial_layers == int(plan.model.layers.size());
  if (spatial_out && !reader_->has_masks())
    throw ConfigError(fmt::format(
        "{}: model.loss {} on a full-resolution output needs masks [N, H, W, 1] in dataset '{}'; found labels",
        config.data.train, to_string(config.model.loss), config.data.targets));
  if (!spatial_out && reader_->has_masks())
    throw ConfigError(fmt::format(
        "{}: the model ends in a dense layer, so dataset '{}' must hold labels [N]; found masks",
        config.data.train, config.data.targets));
  if (reader_->count() < 1)
    throw ConfigError(fmt::format("{}: dataset '{}' holds no images", config.data.train, config.data.images));
}

BatchSource::~BatchSource() = default;

int64_t BatchSource::samples() const { return reader_->count(); }

int64_t BatchSource::epoch_of_step(int64_t step) const {
  return step * config_.training.batch_size / reader_->count();
}

int64_t BatchSource::sample_at(int64_t position) {
  const int64_t n = reader_->count();
  const int64_t epoch = position / n;
  if (epoch != cached_epoch_) {
    permutation_ = epoch_permutation(config_.seed, epoch, n, config_.data.shuffle);
    cached_epoch_ = epoch;
  }
  return permutation_[position % n];
}

Batch BatchSource::load(int64_t step) {
  const int groups = plan_.groups;
  const int b = config_.training.batch_size / groups;
  const int group = plan_.group_of(rank_);
  const Rect tile = plan_.owned_image(rank_);
  const int c = plan_.model.input.c;
  Batch batch;
  batch.images = Tensor(backend_->allocator(), b, c, tile.rows.size(), tile.cols.size(), "input tile");
  const size_t image_elems = size_t(c) * tile.area();
  std::vector<float> host(image_elems);
  const bool spatial_out = plan_.model.spatial_layers == int(plan_.model.layers.size());
  const Shape3 out = plan_.model.output();
  const Rect out_tile = plan_.owned_output(int(plan_.model.layers.size()) - 1, rank_);
  std::vector<float> targets;
  for (int i = 0; i < b; ++i) {
    const int64_t position = step * config_.training.batch_size + int64_t(group) * b + i;
    const int64_t sample = sample_at(position);
    batch.samples.push_back(sample);
    reader_->read_image_tile(sample, tile, float(config_.data.scale), host.data());
    backend_->from_host(batch.images.data() + i * image_elems, host.data(), image_elems * sizeof(float));
    if (spatial_out) {
      std::vector<float> mask(size_t(out_tile.area()));
      reader_->read_mask_tile(sample, out_tile, mask.data());
      targets.insert(targets.end(), mask.begin(), mask.end());
    } else {
      const int32_t label = reader_->read_label(sample);
      if (config_.model.loss == LossType::SoftmaxCrossEntropy && (label < 0 || label >= out.c))
        throw ConfigError(fmt::format("{}: '{}'[{}] = {} is not a class of the {}-unit output layer",
                                      config_.data.train, config_.data.targets, sample, label, out.c));
      batch.labels.push_back(label);
      if (out.c == 1) {
        targets.push_back(float(label));
      } else {
        for (int k = 0; k < out.c; ++k) targets.push_back(k == label ? 1.0f : 0.0f);
      }
    }
  }
  if (spatial_out)
    batch.targets = Tensor(backend_->allocator(), b, 1, out_tile.rows.size(), out_tile.cols.size(), "target tile");
  else
    batch.targets = Tensor(backend_->allocator(), b, out.c, 1, 1, "targets");
  backend_->from_host(batch.targets.data(), targets.data(), targets.size() * sizeof(float));
  return batch;
}

}  // namespace ht
