#include "orchestrator/model_spec.hpp"

#include <fmt/format.h>

#include <map>

#include "orchestrator/layer_kind.hpp"

namespace ht {

int64_t WeightSpec::elements() const {
  int64_t n = 1;
  for (int64_t d : keras_shape) n *= d;
  return n;
}

bool LayerSpec::windowed() const { return kind().traits.windowed; }

int64_t LayerSpec::param_count(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& w : weights)
    if (w.trainable || !trainable_only) n += w.elements();
  return n;
}

bool ModelSpec::tensor_spatial(int t) const {
  return t == 0 || (layers[t - 1].spatial && !layers[t - 1].kind().traits.global_pool);
}

bool ModelSpec::chain() const {
  for (int l = 0; l < int(layers.size()); ++l)
    if (layers[l].inputs.size() != 1 || layers[l].inputs[0] != l) return false;
  return true;
}

int64_t ModelSpec::param_count(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& l : layers) n += l.param_count(trainable_only);
  return n;
}

namespace {
int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int ceil_div(int a, int b) { return -floor_div(-a, b); }
}  // namespace

int Window1D::first_input(int a) const {
  switch (kind) {
    case WindowKind::Slide: return a * stride - pad_lo;
    case WindowKind::Shift: return a - pad_lo;
    case WindowKind::Transpose: return ceil_div(a + pad_lo - kernel + 1, stride);
    case WindowKind::Nearest: return floor_div(a, stride);
    case WindowKind::Bilinear: return floor_div(2 * a + 1 - stride, 2 * stride);  // floor((a + 0.5) / s - 0.5)
  }
  return 0;
}

int Window1D::end_input(int b) const {
  switch (kind) {
    case WindowKind::Slide: return (b - 1) * stride - pad_lo + span();
    case WindowKind::Shift: return b - pad_lo;
    case WindowKind::Transpose: return floor_div(b - 1 + pad_lo, stride) + 1;
    case WindowKind::Nearest: return floor_div(b - 1, stride) + 1;
    case WindowKind::Bilinear: return floor_div(2 * (b - 1) + 1 - stride, 2 * stride) + 2;
  }
  return 0;
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
  const std::string at = l.line > 0 ? fmt::format("{}:{}", config.source_path, l.line) : config.source_path;
  return fmt::format("{}: model.layers[{}] ({} '{}')", at, index, l.type(), l.name);
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
    if (spatial_out && classes > 2 && (m == Metric::Dice || m == Metric::IoU))
      throw ConfigError(fmt::format("{}: training.metrics: {} is for two-class masks; this model outputs {} classes "
                                    "per pixel (use accuracy)",
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
  spec.spatial_layers = int(config.model.layers.size());
  std::map<std::string, int> counters;  // per Keras name prefix, as name_layers (config.cpp)
  std::map<std::string, int> tensor_of = {{kInputName, 0}};
  bool vectors_seen = false;  // a layer after the global pool came already
  for (size_t i = 0; i < config.model.layers.size(); ++i) {
    LayerSpec l;
    l.config = config.model.layers[i];
    if (l.config.name.empty())
      l.config.name = fmt::format("{}_{}", l.kind().keras_prefix, ++counters[l.kind().keras_prefix]);
    // Specs built in code (not by load_config, which checks the graph) may be wrong too.
    for (const std::string& name : l.config.inputs) {
      auto t = tensor_of.find(name);
      if (t == tensor_of.end())
        throw ConfigError(fmt::format("{}: inputs: '{}' is no earlier layer", where(config, l.config, i), name));
      l.inputs.push_back(t->second);
    }
    if (l.inputs.empty()) l.inputs.push_back(int(i));
    const int min_in = l.kind().traits.min_inputs, max_in = l.kind().traits.max_inputs;
    if (int(l.inputs.size()) < min_in || (max_in > 0 && int(l.inputs.size()) > max_in))
      throw ConfigError(fmt::format("{}: takes {} inputs; found {}", where(config, l.config, i),
                                    max_in == min_in ? std::to_string(min_in) : fmt::format("at least {}", min_in),
                                    l.inputs.size()));
    tensor_of[l.config.name] = int(i) + 1;
    for (int t : l.inputs) l.ins.push_back(spec.tensor_shape(t));
    l.in = l.ins[0];
    l.spatial = spec.tensor_spatial(l.inputs[0]);
    for (size_t k = 1; k < l.inputs.size(); ++k)
      if (spec.tensor_spatial(l.inputs[k]) != l.spatial)
        throw ConfigError(fmt::format("{}: its inputs '{}' and '{}' are not both feature maps (one comes after the "
                                      "global pool)",
                                      where(config, l.config, i), l.config.inputs[0], l.config.inputs[k]));
    if (l.spatial && vectors_seen)
      throw ConfigError(fmt::format("{}: reads a feature map after a layer that works on the pooled vector; put the "
                                    "layers on feature maps before the first layer after the global pool",
                                    where(config, l.config, i)));
    if (!l.spatial) {
      if (!vectors_seen) spec.spatial_layers = int(i);
      vectors_seen = true;
    }
    l.rows = make_window(l.in.h, 1, 1, 1, Padding{});
    l.cols = make_window(l.in.w, 1, 1, 1, Padding{});
    try {
      l.kind().shape(l);
      // The built-in kinds say this in their own words; a kind whose shape does not check
      // where it sits gets these.
      const LayerInput where_it_sits = l.kind().traits.input;
      if (where_it_sits == LayerInput::FeatureMap && !l.spatial)
        throw LayerShapeError("needs a feature map input, but it comes after the global pool");
      if (where_it_sits == LayerInput::Vector && l.spatial)
        throw LayerShapeError(
            fmt::format("needs a vector input; found a {}x{}x{} feature map", l.in.h, l.in.w, l.in.c));
    } catch (const LayerShapeError& e) {
      throw ConfigError(fmt::format("{}: {}", where(config, l.config, i), e.what()));
    }
    spec.layers.push_back(std::move(l));
  }
  if (spec.layers.empty())
    throw ConfigError(fmt::format("{}: model.layers is empty; expected at least one layer", config.source_path));
  spec.readers.assign(spec.layers.size() + 1, {});
  for (int l = 0; l < int(spec.layers.size()); ++l)
    for (int t : spec.layers[l].inputs)
      if (spec.readers[t].empty() || spec.readers[t].back() != l) spec.readers[t].push_back(l);
  for (int t = 1; t < int(spec.layers.size()); ++t)
    if (spec.readers[t].empty())
      throw ConfigError(fmt::format("{}: is read by no later layer, so it does not lead to the model's output",
                                    where(config, spec.layers[t - 1].config, size_t(t - 1))));

  const Shape3 out = spec.output();
  const bool spatial_out = spec.spatial_layers == int(spec.layers.size());
  switch (spec.loss) {
    case LossType::SoftmaxCrossEntropy:
      // Per pixel (SPEC section 7): K >= 2 channels at the input's size, class maps as targets.
      if (spatial_out && (out.c < 2 || out.h != spec.input.h || out.w != spec.input.w))
        throw ConfigError(fmt::format(
            "{}: model.loss softmax_cross_entropy on class maps expects an output of {}x{}xK (the input size, "
            "K >= 2 classes); found {}x{}x{}",
            config.source_path, spec.input.h, spec.input.w, out.h, out.w, out.c));
      if (!spatial_out && out.c < 2)
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
