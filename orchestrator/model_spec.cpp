#include "orchestrator/model_spec.hpp"

#include <fmt/format.h>

#include <map>

namespace ht {

int64_t WeightSpec::elements() const {
  int64_t n = 1;
  for (int64_t d : keras_shape) n *= d;
  return n;
}

bool LayerSpec::windowed() const {
  switch (config.type) {
    case LayerType::Conv2D:
    case LayerType::MaxPool2D:
    case LayerType::AvgPool2D:
      return true;
    default:
      return false;
  }
}

int64_t LayerSpec::param_count(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& w : weights)
    if (w.trainable || !trainable_only) n += w.elements();
  return n;
}

int64_t ModelSpec::param_count(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& l : layers) n += l.param_count(trainable_only);
  return n;
}

std::string keras_class_prefix(LayerType t) {
  switch (t) {
    case LayerType::Conv2D: return "conv2d";
    case LayerType::BatchNorm: return "batch_normalization";
    case LayerType::ReLU: return "activation";
    case LayerType::MaxPool2D: return "max_pooling2d";
    case LayerType::AvgPool2D: return "average_pooling2d";
    case LayerType::GlobalAvgPool: return "global_average_pooling2d";
    case LayerType::Dense: return "dense";
  }
  return "layer";
}

Window1D make_window(int in, int kernel, int stride, int dilation, const Padding& padding) {
  Window1D w;
  w.kernel = kernel;
  w.stride = stride;
  w.dilation = dilation;
  w.in = in;
  const int span = w.span();
  switch (padding.mode) {
    case PaddingMode::Valid:
      w.out = in >= span ? (in - span) / stride + 1 : 0;
      break;
    case PaddingMode::Explicit:
      w.pad_lo = w.pad_hi = padding.value;
      w.out = in + 2 * padding.value >= span ? (in + 2 * padding.value - span) / stride + 1 : 0;
      break;
    case PaddingMode::Same: {
      // TensorFlow: total = max((ceil(in/s)-1)*s + span - in, 0), the extra pixel at the end.
      w.out = (in + stride - 1) / stride;
      const int total = std::max((w.out - 1) * stride + span - in, 0);
      w.pad_lo = total / 2;
      w.pad_hi = total - w.pad_lo;
      break;
    }
  }
  return w;
}

namespace {

std::string where(const Config& config, const LayerConfig& l, size_t index) {
  return fmt::format("{}:{}: model.layers[{}] ({} '{}')", config.source_path, l.line, index,
                     to_string(l.type), l.name);
}

}  // namespace

namespace {

// training.metrics against what the model outputs: accuracy and auc are for labels (auc
// for two classes), dice and iou for masks; accuracy on masks is per pixel.
void check_metrics(const Config& config, bool spatial_out, int classes) {
  for (Metric m : config.training.metrics) {
    const char* name = to_string(m);
    if (spatial_out && m == Metric::AUC)
      throw ConfigError(fmt::format("{}: training.metrics: auc is for label outputs; this model outputs masks "
                                    "(use dice, iou or accuracy)",
                                    config.source_path));
    if (!spatial_out && (m == Metric::Dice || m == Metric::IoU))
      throw ConfigError(fmt::format("{}: training.metrics: {} is for masks; this model outputs {} class scores "
                                    "(use accuracy or auc)",
                                    config.source_path, name, classes));
    if (m == Metric::AUC && classes > 2)
      throw ConfigError(fmt::format("{}: training.metrics: auc needs two classes (dense units 1 or 2); the "
                                    "model's output has {} classes",
                                    config.source_path, classes));
  }
}

}  // namespace

ModelSpec build_model_spec(const Config& config) {
  ModelSpec spec;
  spec.input = {config.model.channels, config.model.height, config.model.width};
  spec.loss = config.model.loss;
  Shape3 shape = spec.input;
  bool spatial = true;
  spec.spatial_layers = int(config.model.layers.size());
  std::map<LayerType, int> counters;
  for (size_t i = 0; i < config.model.layers.size(); ++i) {
    LayerSpec l;
    l.config = config.model.layers[i];
    if (l.config.name.empty())
      l.config.name = fmt::format("{}_{}", keras_class_prefix(l.config.type), ++counters[l.config.type]);
    l.in = shape;
    l.spatial = spatial;
    l.rows = make_window(shape.h, 1, 1, 1, Padding{});
    l.cols = make_window(shape.w, 1, 1, 1, Padding{});
    const LayerConfig& c = l.config;
    switch (c.type) {
      case LayerType::Conv2D:
      case LayerType::MaxPool2D:
      case LayerType::AvgPool2D: {
        if (!spatial)
          throw ConfigError(fmt::format("{}: needs a spatial input, but it comes after the global pool",
                                        where(config, c, i)));
        const bool conv = c.type == LayerType::Conv2D;
        const int k = conv ? c.kernel : c.pool;
        const int d = conv ? c.dilation : 1;
        l.rows = make_window(shape.h, k, c.stride, d, c.padding);
        l.cols = make_window(shape.w, k, c.stride, d, c.padding);
        if (l.rows.out < 1 || l.cols.out < 1)
          throw ConfigError(fmt::format(
              "{}: window {}x{} (dilation {}) with padding {} does not fit its {}x{} input; "
              "expected an input of at least {} pixels per side",
              where(config, c, i), k, k, d, to_string(c.padding.mode), shape.h, shape.w,
              l.rows.span() - (c.padding.mode == PaddingMode::Explicit ? 2 * c.padding.value : 0)));
        if (c.padding.mode == PaddingMode::Explicit && c.padding.value >= l.rows.span() && !conv)
          throw ConfigError(fmt::format("{}: padding {} must be smaller than the pool window {}",
                                        where(config, c, i), c.padding.value, k));
        const int cout = conv ? c.filters : shape.c;
        l.out = {cout, l.rows.out, l.cols.out};
        if (conv) {
          l.weights.push_back({"kernel:0", {k, k, shape.c, cout}, true});
          if (c.bias) l.weights.push_back({"bias:0", {cout}, true});
          l.flops_per_image = 2ll * k * k * shape.c * cout * l.out.h * l.out.w;
        } else {
          l.flops_per_image = int64_t(k) * k * l.out.elements();
        }
        break;
      }
      case LayerType::BatchNorm:
        if (!spatial)
          throw ConfigError(fmt::format(
              "{}: batch_norm after the global pool is not supported; put it before global_avg_pool",
              where(config, c, i)));
        l.out = shape;
        l.weights = {{"gamma:0", {shape.c}, true},
                     {"beta:0", {shape.c}, true},
                     {"moving_mean:0", {shape.c}, false},
                     {"moving_variance:0", {shape.c}, false}};
        l.flops_per_image = 8 * shape.elements();
        break;
      case LayerType::ReLU:
        l.out = shape;
        l.flops_per_image = shape.elements();
        break;
      case LayerType::GlobalAvgPool:
        if (!spatial)
          throw ConfigError(fmt::format("{}: a second global_avg_pool has no spatial input",
                                        where(config, c, i)));
        l.out = {shape.c, 1, 1};
        l.flops_per_image = shape.elements();
        spatial = false;
        spec.spatial_layers = int(i) + 1;
        break;
      case LayerType::Dense:
        if (spatial)
          throw ConfigError(fmt::format(
              "{}: dense needs a vector input; put a global_avg_pool before it (found a {}x{}x{} feature map)",
              where(config, c, i), shape.h, shape.w, shape.c));
        l.out = {c.units, 1, 1};
        l.weights.push_back({"kernel:0", {shape.c, c.units}, true});
        if (c.bias) l.weights.push_back({"bias:0", {c.units}, true});
        l.flops_per_image = 2ll * shape.c * c.units;
        break;
    }
    shape = l.out;
    spec.layers.push_back(std::move(l));
  }
  if (spec.layers.empty())
    throw ConfigError(fmt::format("{}: model.layers is empty; expected at least one layer", config.source_path));

  const Shape3 out = spec.output();
  const bool spatial_out = spec.spatial_layers == int(spec.layers.size());
  switch (spec.loss) {
    case LossType::SoftmaxCrossEntropy:
      if (spatial_out || out.c < 2)
        throw ConfigError(fmt::format(
            "{}: model.loss softmax_cross_entropy expects a class vector (global_avg_pool then dense "
            "with units >= 2); found output {}x{}x{}",
            config.source_path, out.h, out.w, out.c));
      break;
    case LossType::SigmoidBCE:
      if (spatial_out && (out.c != 1 || out.h != spec.input.h || out.w != spec.input.w))
        throw ConfigError(fmt::format(
            "{}: model.loss sigmoid_bce on masks expects an output of {}x{}x1 (the input size); "
            "found {}x{}x{}",
            config.source_path, spec.input.h, spec.input.w, out.h, out.w, out.c));
      if (!spatial_out && out.c != 1)
        throw ConfigError(fmt::format(
            "{}: model.loss sigmoid_bce on labels expects dense units: 1; found {}",
            config.source_path, out.c));
      break;
    case LossType::MSE:
      if (spatial_out && (out.c != 1 || out.h != spec.input.h || out.w != spec.input.w))
        throw ConfigError(fmt::format(
            "{}: model.loss mse on masks expects an output of {}x{}x1 (the input size); found {}x{}x{}",
            config.source_path, spec.input.h, spec.input.w, out.h, out.w, out.c));
      break;
  }
  check_metrics(config, spatial_out, out.c);
  return spec;
}

}  // namespace ht
