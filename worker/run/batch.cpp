#include "worker/run/batch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <tuple>

#include "worker/io/manifest.hpp"
#include "worker/io/manifest_images.hpp"
#include "worker/layers/params.hpp"

namespace ht {

std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n, bool shuffle) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  if (!shuffle) return p;
  SplitMix64 rng(seed * 0x100000001b3ull + uint64_t(epoch));
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[int64_t(rng.next() % uint64_t(i + 1))]);
  return p;
}

SampleView augment_view(const Config& config, int64_t step, int64_t sample, int view_height, int view_width) {
  // Four draws in a fixed order, whichever augmentations are on, so turning one on or
  // off changes no other: horizontal flip, vertical flip, crop top, crop left.
  const AugmentConfig& a = config.data.augment;
  SplitMix64 rng(config.seed * 0x9e3779b97f4a7c15ull + uint64_t(step) * 0xbf58476d1ce4e5b9ull +
                 uint64_t(sample) * 0x94d049bb133111ebull);
  SampleView v;
  const uint64_t h = rng.next(), vflip = rng.next(), top = rng.next(), left = rng.next();
  v.flip_cols = a.flip_horizontal && (h >> 63);
  v.flip_rows = a.flip_vertical && (vflip >> 63);
  if (a.crops()) {
    v.top = int(top % uint64_t(view_height - config.model.height + 1));
    v.left = int(left % uint64_t(view_width - config.model.width + 1));
  }
  return v;
}

namespace {

DataReaderOptions options_for(const Config& config, const ModelSpec& model, DataPurpose purpose,
                              const std::string& key) {
  DataReaderOptions o = data_reader_options(config, model);
  o.key = key;
  // Prediction writes the whole image's output: its images must be model.input's size.
  if (purpose == DataPurpose::Predict) {
    o.targets.clear();
    o.larger_ok = false;
  }
  return o;
}

}  // namespace

WholeDecodes data_whole_decodes(const Config& config, const ModelSpec& model, const std::string& input,
                                DataPurpose input_purpose) {
  using File = std::tuple<std::string, const char*, DataPurpose>;
  const std::vector<File> files =
      input.empty() ? std::vector<File>{{config.data.train, "data.train", DataPurpose::Train},
                                        {config.data.validation, "data.validation", DataPurpose::Evaluate}}
                    : std::vector<File>{{input, input_purpose == DataPurpose::Predict ? "--input" : "--data",
                                         input_purpose}};
  WholeDecodes all;
  uint64_t largest = 0;
  for (const auto& [file, key, purpose] : files) {
    if (file.empty() || !is_manifest(file)) continue;
    const ManifestImages images(file, options_for(config, model, purpose, key));
    const ManifestImages::WholeDecodes w = images.whole_decodes();
    all.rows += int64_t(images.manifest().rows.size());
    all.images += w.images;
    all.per_rank += w.bytes;  // a rank's training and validation readers each keep theirs
    if (w.bytes > largest) largest = w.bytes, all.largest = w.largest;
  }
  return all;
}

BatchSource::BatchSource(const Config& config, const ShardPlan& plan, int rank, ComputeBackend& backend,
                         DataPurpose purpose, const std::string& path)
    : config_(config),
      plan_(plan),
      rank_(rank),
      backend_(&backend),
      purpose_(purpose),
      micro_batch_(config.training.batch_size / (plan.groups * config.training.accumulate)) {
  const std::string file = path.empty() ? config.data.train : path;
  const std::string key = path.empty()                       ? "data.train"
                          : path == config.data.validation    ? "data.validation"
                          : purpose == DataPurpose::Predict   ? "--input"
                                                              : "--data";
  reader_ = std::make_unique<DataReader>(file, options_for(config, plan.model, purpose, key));
  const bool spatial_out = plan.model.spatial_output();
  if (purpose != DataPurpose::Predict) {
    if (spatial_out && !reader_->has_masks())
      throw ConfigError(fmt::format(
          "{}: model.loss {} on a full-resolution output needs masks [N, H, W, 1] in dataset '{}'; found labels",
          file, to_string(config.model.loss), config.data.targets));
    if (!spatial_out && reader_->has_masks())
      throw ConfigError(fmt::format(
          "{}: the model ends in a dense layer, so dataset '{}' must hold labels [N]; found masks", file,
          config.data.targets));
  }
  if (reader_->count() < 1)
    throw ConfigError(fmt::format("{}: dataset '{}' holds no images", file, config.data.images));
  // Fewer images than a batch would put one image twice into the same batch.
  if (purpose == DataPurpose::Train && reader_->count() < config.training.batch_size)
    throw ConfigError(fmt::format("{}: data.train holds {} image{}, fewer than training.batch_size {}: every batch "
                                  "would repeat images; lower training.batch_size or add images",
                                  file, reader_->count(), reader_->count() == 1 ? "" : "s",
                                  config.training.batch_size));
}

// A training micro-batch read on a background thread: on the CPU its tensors were
// allocated on the loading thread and the reader fills the image tensor itself; on a device
// it fills `host`, and the device tensors are allocated when the batch is taken.
struct BatchSource::Pending {
  int64_t step = 0;
  int micro = 0;
  int64_t first = 0;
  Batch batch;
  std::vector<float> host;
  std::future<void> done;
};

BatchSource::~BatchSource() { cancel_prefetch(); }

void BatchSource::rebind(ComputeBackend* backend) {
  cancel_prefetch();
  backend_ = backend;
}

void BatchSource::cancel_prefetch() {
  if (!pending_) return;
  if (pending_->done.valid()) pending_->done.wait();  // an error in a batch never used is dropped
  pending_.reset();
}

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

void BatchSource::training_samples(int64_t step, int micro, std::vector<int64_t>& samples,
                                   std::vector<SampleView>& views, int64_t& first) {
  const int b = micro_batch_;
  const int group = plan_.group_of(rank_);
  first = step * config_.training.batch_size + int64_t(micro) * b * plan_.groups + int64_t(group) * b;
  for (int i = 0; i < b; ++i) {
    samples.push_back(sample_at(first + i));
    views.push_back(augment_view(config_, step, samples.back(), reader_->view_height(), reader_->view_width()));
  }
}

Batch BatchSource::load(int64_t step, int micro, int64_t next_step, int next_micro) {
  Batch batch;
  int64_t first = 0;
  if (pending_ && pending_->step == step && pending_->micro == micro) {
    pending_->done.get();  // rethrows what the reader threw
    batch = std::move(pending_->batch);
    first = pending_->first;
    if (!pending_->host.empty()) {  // read into host memory: the device tensors now
      Batch device = allocate(micro_batch_);
      batch.images = std::move(device.images);
      batch.targets = std::move(device.targets);
    }
    upload(batch, pending_->host.empty() ? nullptr : pending_->host.data());
    pending_.reset();
  } else {
    cancel_prefetch();
    std::vector<int64_t> samples;
    std::vector<SampleView> views;
    training_samples(step, micro, samples, views, first);
    batch = read(samples, views);
  }
  batch.valid.assign(size_t(micro_batch_), 1);
  batch.batch_position = first - step * config_.training.batch_size;
  if (next_step >= 0) start_prefetch(next_step, next_micro);
  return batch;
}

void BatchSource::start_prefetch(int64_t step, int micro) {
  auto p = std::make_unique<Pending>();
  p->step = step;
  p->micro = micro;
  std::vector<int64_t> samples;
  std::vector<SampleView> views;
  training_samples(step, micro, samples, views, p->first);
  // On the CPU the reader fills the batch's tensors in place; a device's are allocated when
  // the batch is taken (the step schedule counts one micro-batch's tiles on the device), and
  // until then the batch waits in host memory.
  float* images = nullptr;
  if (backend_->kind() == Backend::CPU) {
    p->batch = allocate(micro_batch_);
    images = p->batch.images.data();
  } else {
    const Rect tile = plan_.owned_image(rank_);
    p->host.resize(size_t(micro_batch_) * plan_.model.input.c * tile.area());
    images = p->host.data();
  }
  p->batch.samples = std::move(samples);
  Pending* raw = p.get();
  p->done = std::async(std::launch::async, [this, raw, images, views] { fill(raw->batch, images, views); });
  pending_ = std::move(p);
}

int64_t BatchSource::rounds() const {
  const int64_t per_round = int64_t(micro_batch_) * plan_.groups;
  return (reader_->count() + per_round - 1) / per_round;
}

Batch BatchSource::load_round(int64_t round) {
  const int b = micro_batch_;
  const int64_t n = reader_->count();
  const int64_t first = round * b * plan_.groups + int64_t(plan_.group_of(rank_)) * b;
  // A crop window sits at the centre of a larger image.
  SampleView centre;
  centre.top = (reader_->view_height() - config_.model.height) / 2;
  centre.left = (reader_->view_width() - config_.model.width) / 2;
  std::vector<int64_t> samples;
  std::vector<char> valid;
  for (int i = 0; i < b; ++i) {
    valid.push_back(first + i < n);
    samples.push_back(std::min(first + i, n - 1));
  }
  Batch batch = read(samples, std::vector<SampleView>(size_t(b), centre));
  batch.valid = valid;
  return batch;
}

Batch BatchSource::allocate(int b) {
  const Rect tile = plan_.owned_image(rank_);
  Batch batch;
  batch.images = Tensor(backend_->allocator(), b, plan_.model.input.c, tile.rows.size(), tile.cols.size(),
                        "input tile");
  if (purpose_ != DataPurpose::Train) return batch;  // evaluation reads host_targets
  const Rect out_tile = plan_.owned_output(int(plan_.model.layers.size()) - 1, rank_);
  if (plan_.model.spatial_output())
    batch.targets = Tensor(backend_->allocator(), b, 1, out_tile.rows.size(), out_tile.cols.size(), "target tile");
  else
    batch.targets = Tensor(backend_->allocator(), b, plan_.model.output().c, 1, 1, "targets");
  return batch;
}

void BatchSource::fill(Batch& batch, float* images, const std::vector<SampleView>& views) {
  const std::vector<int64_t>& samples = batch.samples;
  const int b = int(samples.size());
  const Rect tile = plan_.owned_image(rank_);
  const size_t image_elems = size_t(plan_.model.input.c) * tile.area();
  const bool spatial_out = plan_.model.spatial_output();
  const Shape3 out = plan_.model.output();
  const Rect out_tile = plan_.owned_output(int(plan_.model.layers.size()) - 1, rank_);
  std::vector<float>& t = batch.host_targets;
  for (int i = 0; i < b; ++i) {
    const int64_t sample = samples[i];
    reader_->read_image_tile(sample, tile, float(config_.data.scale), images + i * image_elems, views[i]);
    if (purpose_ == DataPurpose::Predict) continue;
    if (spatial_out) {
      std::vector<float> mask(size_t(out_tile.area()));
      reader_->read_mask_tile(sample, out_tile, mask.data(), views[i]);
      t.insert(t.end(), mask.begin(), mask.end());
    } else {
      const int32_t label = reader_->read_label(sample);
      if (config_.model.loss == LossType::SoftmaxCrossEntropy && (label < 0 || label >= out.c))
        throw ConfigError(fmt::format("{}: '{}'[{}] = {} is not a class of the {}-unit output layer",
                                      reader_->path(), config_.data.targets, sample, label, out.c));
      batch.labels.push_back(label);
      if (out.c == 1) {
        t.push_back(float(label));
      } else {
        for (int k = 0; k < out.c; ++k) t.push_back(k == label ? 1.0f : 0.0f);
      }
    }
  }
}

void BatchSource::upload(Batch& batch, const float* images) {
  if (images) backend_->from_host(batch.images.data(), images, batch.images.bytes());
  if (!batch.targets.empty())
    backend_->from_host(batch.targets.data(), batch.host_targets.data(), batch.host_targets.size() * sizeof(float));
}

Batch BatchSource::read(const std::vector<int64_t>& samples, const std::vector<SampleView>& views) {
  Batch batch = allocate(int(samples.size()));
  batch.samples = samples;
  std::vector<float> host;
  float* images = batch.images.data();
  if (backend_->kind() != Backend::CPU) {
    host.resize(batch.images.size());
    images = host.data();
  }
  fill(batch, images, views);
  upload(batch, host.empty() ? nullptr : host.data());
  return batch;
}

}  // namespace ht
