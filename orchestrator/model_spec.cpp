#include "orchestrator/model_spec.hpp"

#include <fnmatch.h>

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>

#include "kernels/geometry.hpp"
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

bool ModelSpec::tensor_spatial(int t) const { return t == 0 || layers[t - 1].out_spatial; }

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

namespace {
// The taps of image output o of a Nearest or Bilinear window (kernels/geometry.hpp, as the
// kernels compute them).
ResampleTaps taps_of(const Window1D& w, int o) {
  ResampleAxis a;
  a.out = w.out;
  a.in = a.size = w.in;
  a.scale = w.scale;
  return resample_taps(w.kind == WindowKind::Nearest ? Resample::Nearest : Resample::Bilinear, a,
                       std::clamp(o, 0, std::max(w.out - 1, 0)));
}
}  // namespace

int Window1D::first_input(int a) const {
  switch (kind) {
    case WindowKind::Slide: return a * stride - pad_lo;
    case WindowKind::Shift: return a - pad_lo;
    case WindowKind::Transpose: return ceil_div(a + pad_lo - kernel + 1, stride);
    case WindowKind::Nearest:
    case WindowKind::Bilinear: return taps_of(*this, a).i0;
  }
  return 0;
}

int Window1D::end_input(int b) const {
  switch (kind) {
    case WindowKind::Slide: return (b - 1) * stride - pad_lo + span();
    case WindowKind::Shift: return b - pad_lo;
    case WindowKind::Transpose: return floor_div(b - 1 + pad_lo, stride) + 1;
    case WindowKind::Nearest:
    case WindowKind::Bilinear: {
      const ResampleTaps t = taps_of(*this, b - 1);
      return std::max(t.i0, t.i1) + 1;
    }
  }
  return 0;
}

Window1D make_window(int in, int kernel, int stride, int dilation, PaddingMode mode, int pad_lo, int pad_hi,
                     bool ceil_mode) {
  Window1D w;
  w.kernel = kernel;
  w.stride = stride;
  w.dilation = dilation;
  w.in = in;
  const int64_t span = w.span();
  switch (mode) {
    case PaddingMode::Valid: pad_lo = pad_hi = 0; break;
    case PaddingMode::Explicit: break;
    case PaddingMode::Same: {
      // TensorFlow: total = max((ceil(in/s)-1)*s + span - in, 0), the extra pixel at the end.
      const int64_t out = (int64_t(in) + stride - 1) / stride;
      const int64_t total = std::max<int64_t>((out - 1) * stride + span - in, 0);
      pad_lo = int(total / 2);
      pad_hi = int(total - pad_lo);
      break;
    }
  }
  w.pad_lo = pad_lo;
  w.pad_hi = pad_hi;
  const int64_t padded = int64_t(in) + pad_lo + pad_hi;
  if (padded < span) return w;  // out 0: the caller says the window does not fit
  int64_t out = (padded - span) / stride + 1;
  if (ceil_mode) {
    out = (padded - span + stride - 1) / stride + 1;
    if ((out - 1) * stride >= int64_t(in) + pad_lo) --out;  // torch: no window starts in the right padding
    w.ceil_extra = int(std::max<int64_t>((out - 1) * stride + span - padded, 0));
    w.pad_hi += w.ceil_extra;
  }
  w.out = int(std::min<int64_t>(out, std::numeric_limits<int>::max()));
  return w;
}

Window1D make_window(int in, int kernel, int stride, int dilation, const Padding& padding) {
  return make_window(in, kernel, stride, dilation, padding.mode, padding.top, padding.bottom);
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

// training.class_weights name one weight per class of the loss (K for a softmax, classes 0
// and 1 for a BCE); pos_weight is the BCE's.
void check_loss_weights(const Config& config, int classes) {
  const TrainingConfig& t = config.training;
  const LossType loss = config.model.loss;
  if (!t.class_weights.empty()) {
    if (loss == LossType::MSE)
      throw ConfigError(fmt::format("{}: training.class_weights weighs softmax_cross_entropy and sigmoid_bce; "
                                    "model.loss is mse",
                                    config.source_path));
    const size_t want = loss == LossType::SigmoidBCE ? 2 : size_t(classes);
    if (t.class_weights.size() != want)
      throw ConfigError(fmt::format(
          "{}: training.class_weights has {} weights; model.loss {} has {} classes ({}), one weight each",
          config.source_path, t.class_weights.size(), to_string(loss), want,
          loss == LossType::SigmoidBCE ? "0 and 1" : "the output's channels"));
  }
  if (t.pos_weight != 1 && loss != LossType::SigmoidBCE)
    throw ConfigError(fmt::format("{}: training.pos_weight weighs the positive term of sigmoid_bce; model.loss is {}",
                                  config.source_path, to_string(loss)));
}

// Every training.freeze pattern names at least one layer with weights.
void check_freeze(const Config& config, const ModelSpec& spec) {
  for (const std::string& pattern : config.training.freeze) {
    bool any = false;
    for (const LayerSpec& l : spec.layers)
      any = any || (!l.weights.empty() && fnmatch(pattern.c_str(), l.config.name.c_str(), 0) == 0);
    if (any) continue;
    std::vector<std::string> weighted;
    for (const LayerSpec& l : spec.layers)
      if (!l.weights.empty()) weighted.push_back(l.config.name);
    if (weighted.size() > 12) weighted.resize(12), weighted.push_back("...");
    throw ConfigError(fmt::format("{}: training.freeze: '{}' matches no layer with weights (the layers with weights: "
                                  "{})",
                                  config.source_path, pattern, fmt::join(weighted, ", ")));
  }
}

}  // namespace

bool in_freeze(const Config& config, const ModelSpec& model, int l) {
  const std::string& name = model.layers.at(size_t(l)).config.name;
  for (const std::string& pattern : config.training.freeze)
    if (fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return true;
  return false;
}

std::vector<char> frozen_layers(const Config& config, const ModelSpec& model, int64_t step) {
  const int64_t release = config.training.unfreeze_at;
  std::vector<char> frozen(model.layers.size(), 0);
  for (size_t l = 0; l < model.layers.size(); ++l)
    frozen[l] = !model.layers[l].config.trainable ||
                (in_freeze(config, model, int(l)) && (release == 0 || step < release));
  return frozen;
}

std::vector<char> gradient_flow(const ModelSpec& model, const std::vector<char>& frozen) {
  std::vector<char> gradient(model.layers.size() + 1, 0);
  for (size_t l = 0; l < model.layers.size(); ++l) {
    bool reaches = model.layers[l].param_count(true) > 0 && (frozen.empty() || !frozen[l]);
    for (int t : model.layers[l].inputs) reaches = reaches || gradient[size_t(t)];
    gradient[l + 1] = reaches;
  }
  return gradient;
}

int64_t training_starts(const Config& config, const ModelSpec& model, int l) {
  return in_freeze(config, model, l) ? config.training.unfreeze_at : 0;
}

LayerSpec shape_layer(const LayerConfig& config, const std::vector<Shape3>& ins, const std::vector<bool>& ins_spatial) {
  LayerSpec l;
  l.config = config;
  l.ins = ins;
  l.ins_spatial = ins_spatial;
  l.in = ins.at(0);
  l.spatial = ins_spatial.at(0);
  l.out_spatial = l.spatial;
  for (size_t k = 1; k < ins.size(); ++k)
    if (ins_spatial[k] != l.spatial && !l.kind().traits.broadcasts_vectors)
      throw LayerShapeError(fmt::format("its inputs '{}' and '{}' are not both feature maps (one is a per-image "
                                        "channel vector: a global pool's output or a layer after it)",
                                        config.inputs.at(0), config.inputs.at(k)));
  l.rows = make_window(l.in.h, 1, 1, 1, PaddingMode::Valid);
  l.cols = make_window(l.in.w, 1, 1, 1, PaddingMode::Valid);
  l.kind().shape(l);
  // The built-in kinds say this in their own words; a kind whose shape does not check
  // where it sits gets these.
  const LayerInput where_it_sits = l.kind().traits.input;
  if (where_it_sits == LayerInput::FeatureMap && !l.spatial)
    throw LayerShapeError("needs a feature map input, but it reads a per-image channel vector (the output of a "
                          "global pool or a layer after it)");
  if (where_it_sits == LayerInput::Vector && l.spatial)
    throw LayerShapeError(fmt::format("needs a vector input; found a {}x{}x{} feature map", l.in.h, l.in.w, l.in.c));
  // Sizes from a file or a config are untrusted: every product must fit what the kernels
  // index with before anything is allocated or multiplied further.
  const Shape3& o = l.out;
  if (o.c < 1 || o.h < 1 || o.w < 1 || o.c > kMaxExtent || exceeds(o, kMaxElements))
    throw LayerShapeError(fmt::format("its output of {}x{}x{} (H x W x C) is {}; at most {} elements per image fit",
                                      o.h, o.w, o.c, o.c < 1 || o.h < 1 || o.w < 1 ? "empty" : "too large",
                                      kMaxElements));
  if (!config.trainable)
    for (WeightSpec& w : l.weights) w.trainable = false;
  for (const WeightSpec& w : l.weights) {
    double elements = 1;
    for (int64_t d : w.keras_shape) elements *= double(d);
    if (elements > double(kMaxElements) || elements < 1)
      throw LayerShapeError(fmt::format("its weight '{}' of {} elements is {}; at most {} fit", w.name, elements,
                                        elements < 1 ? "empty" : "too large", kMaxElements));
  }
  return l;
}

ModelSpec build_model_spec(const Config& config) {
  ModelSpec spec;
  spec.input = {config.model.channels, config.model.height, config.model.width};
  spec.loss = config.model.loss;
  if (exceeds(spec.input, kMaxElements))
    throw ConfigError(fmt::format("{}: model.input: [{}, {}, {}] is more than {} pixel values an image",
                                  config.source_path, spec.input.h, spec.input.w, spec.input.c, kMaxElements));
  std::map<std::string, int> counters;  // per Keras name prefix, as name_layers (config.cpp)
  std::map<std::string, int> tensor_of = {{kInputName, 0}};
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
    std::vector<Shape3> ins;
    std::vector<bool> ins_spatial;
    for (int t : l.inputs) {
      ins.push_back(spec.tensor_shape(t));
      ins_spatial.push_back(spec.tensor_spatial(t));
    }
    try {
      LayerSpec shaped = shape_layer(l.config, ins, ins_spatial);
      shaped.inputs = std::move(l.inputs);
      l = std::move(shaped);
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
  const std::vector<char> gradient = gradient_flow(spec);
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    LayerSpec& layer = spec.layers[l];
    layer.output_gradient = gradient[l + 1];
    layer.input_gradients.clear();
    for (int t : layer.inputs) layer.input_gradients.push_back(gradient[size_t(t)]);
  }
  for (int t = 1; t < int(spec.layers.size()); ++t)
    if (spec.readers[t].empty())
      throw ConfigError(fmt::format("{}: is read by no later layer, so it does not lead to the model's output",
                                    where(config, spec.layers[t - 1].config, size_t(t - 1))));

  const Shape3 out = spec.output();
  const bool spatial_out = spec.spatial_output();
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
  check_loss_weights(config, out.c);
  check_freeze(config, spec);
  return spec;
}

}  // namespace ht
