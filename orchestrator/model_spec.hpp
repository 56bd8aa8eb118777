// ModelSpec: the shape of every layer's input and output, its weights, and the window
// geometry along each spatial axis. Pure, derived from the config alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orchestrator/config.hpp"

namespace ht {

// The largest rows, cols or channels of a tensor, and elements of one image's tensor or of a
// weight: what the kernels index with int and int64_t leaves room for.
inline constexpr int64_t kMaxExtent = (int64_t(1) << 31) - 1;
inline constexpr int64_t kMaxElements = int64_t(1) << 40;

struct Shape3 {
  int c = 0, h = 0, w = 0;  // a feature map of one image; dense features are {units, 1, 1}
  int64_t elements() const { return int64_t(c) * h * w; }
  bool operator==(const Shape3& o) const { return c == o.c && h == o.h && w == o.w; }
};

// Whether s has more than `limit` elements, without overflow (sides of 1 to 2^31 - 1).
inline bool exceeds(const Shape3& s, int64_t limit) {
  return int64_t(s.c) * s.h > limit / s.w;
}

// How the output of a layer reads its input along one axis.
enum class WindowKind {
  Slide,      // conv, pools: output o reads [o*stride - pad_lo, o*stride - pad_lo + span),
              // zeros (or -inf) outside the input; pointwise layers: kernel = stride = 1
  Shift,      // zero_padding2d, cropping2d: output o is input o - pad_lo (pad_lo < 0 crops)
  Transpose,  // conv2d_transpose: input i adds into full outputs [i*stride, i*stride + kernel),
              // whose first pad_lo and last pad_hi are cropped (padding same)
  Nearest,    // upsampling2d, resize: output o is input floor(o * scale), at most in - 1
  Bilinear,   // upsampling2d, resize: half-pixel source (o + 0.5) * scale - 0.5, edges clamped
};

struct Window1D {
  WindowKind kind = WindowKind::Slide;
  int kernel = 1, stride = 1, dilation = 1;  // stride: the upsampling factor for the kinds that upsample
  float scale = 1.f;  // Nearest, Bilinear: input pixels per output pixel, as the kernels take it
  int pad_lo = 0, pad_hi = 0;
  // Ceil mode (pools): the part of pad_hi beyond the declared padding, where the last window
  // hangs over the padded input (torch's ceil_mode); padding that count_include_pad counts
  // stops before it.
  int ceil_extra = 0;
  int in = 0, out = 0;
  int span() const { return dilation * (kernel - 1) + 1; }
  bool upsamples() const { return kind == WindowKind::Transpose || kind == WindowKind::Nearest || kind == WindowKind::Bilinear; }
  // Input range [first, last) that output range [a, b) reads, before clamping to [0, in).
  int first_input(int a) const;
  int end_input(int b) const;
};

// How a weight is laid out on the device, against its Keras layout.
enum class WeightLayout {
  Keras,       // the same
  ConvKernel,  // Keras (kh, kw, cin, cout); the device holds OIHW [cout][cin][kh][kw]
  DepthwiseKernel,  // Keras (kh, kw, cin, m); the device holds [cin * m][1][kh][kw], output
                    // channel c * m + j reading input channel c (a grouped conv's OIHW)
};
// A weight's first value (Keras's defaults).
enum class WeightInit {
  Zeros,
  Ones,
  GlorotUniform,  // limit sqrt(6 / (fan_in + fan_out)), shape (receptive field..., in, out)
};

// A weight tensor in Keras naming and layout ("kernel:0" (kh, kw, cin, cout), ...).
struct WeightSpec {
  std::string name;           // "kernel:0", "bias:0", "gamma:0", "beta:0", ...
  std::vector<int64_t> keras_shape;
  bool trainable = true;      // BN moving statistics are not
  WeightLayout layout = WeightLayout::Keras;
  WeightInit init = WeightInit::Zeros;
  int64_t elements() const;
};

// A model is a graph of layers over tensors: tensor 0 is the image, tensor l + 1 the
// output of layer l. A layer reads earlier tensors only, so the list order is a
// topological order, and the last layer's output is the model's.
struct LayerSpec {
  LayerConfig config;
  std::vector<int> inputs;  // the tensors it reads, in the order of config.inputs
  std::vector<Shape3> ins;  // their shapes
  Shape3 in, out;           // in: the first input's shape
  // Whether its first input is a feature map (H x W, split over the grid unless the plan
  // gathers it), or a per-image channel vector (a global pool's output and what follows from
  // it: the same on every shard of a sample group). `ins_spatial` says it of every input.
  bool spatial = true;
  std::vector<bool> ins_spatial;
  // Whether its output is a feature map; the kind's shape function sets it where the output
  // is not like the first input (a global pool makes a vector, an upsampling of a vector a map).
  bool out_spatial = true;
  Window1D rows, cols;  // identity windows for pointwise layers
  std::vector<WeightSpec> weights;
  int64_t flops_per_image = 0;  // forward multiply-adds x 2, for the cost model
  // Channels of a tensor of the output's size made and freed inside the layer's forward
  // and again in its backward (separable conv: the depthwise result); 0: none.
  int inner_channels = 0;
  // Whether training's backward reaches it: a weight that trains (WeightSpec::trainable) is
  // at or before it. Where none is (a frozen stem, SPEC section 14) the backward stops; per
  // input, whether its gradient is made (never for the image). build_model_spec sets both.
  bool output_gradient = true;
  std::vector<char> input_gradients;
  const LayerKind& kind() const { return *config.kind; }
  // The kind reads a window of its input (conv, pools): it needs halos from neighbours.
  bool windowed() const;
  int64_t param_count(bool trainable_only = false) const;
};

struct ModelSpec {
  Shape3 input;
  std::vector<LayerSpec> layers;
  LossType loss = LossType::SoftmaxCrossEntropy;
  std::vector<std::vector<int>> readers;  // per tensor: the layers that read it, in order
  Shape3 output() const { return layers.empty() ? input : layers.back().out; }
  int tensors() const { return int(layers.size()) + 1; }
  const Shape3& tensor_shape(int t) const { return t == 0 ? input : layers[t - 1].out; }
  bool tensor_spatial(int t) const;  // a feature map (the image, a layer's map), not a channel vector
  bool spatial_output() const { return tensor_spatial(tensors() - 1); }  // per-pixel outputs: masks, class maps
  int last_reader(int t) const { return readers[t].empty() ? -1 : readers[t].back(); }
  // Every layer reads the one before it (and only it): the models before graphs.
  bool chain() const;
  int64_t param_count(bool trainable_only = false) const;
};

// A sliding window along one axis (SPEC section 5): explicit padding pad_lo / pad_hi, or
// TensorFlow's same, or none (valid); floor mode, or torch's ceil_mode, where a last window
// that starts in the right padding is dropped.
Window1D make_window(int in, int kernel, int stride, int dilation, PaddingMode mode, int pad_lo = 0, int pad_hi = 0,
                     bool ceil_mode = false);
// The same with a padding that is the same on both sides of this axis (its top and bottom).
Window1D make_window(int in, int kernel, int stride, int dilation, const Padding& padding);

// One layer reading tensors of shapes `ins` (feature maps or channel vectors as
// `ins_spatial` says): its kind's windows, output, weights and flops, with every size
// checked against kMaxExtent / kMaxElements. `inputs` is left for the caller. Throws
// LayerShapeError (without the layer's location) when the inputs do not suit it.
LayerSpec shape_layer(const LayerConfig& config, const std::vector<Shape3>& ins, const std::vector<bool>& ins_spatial);

// Builds the spec from a validated config. Throws ConfigError naming the layer (and its
// config line) when shapes do not work: a window larger than its input, a dense layer
// on a spatial input, a loss that does not match the output.
ModelSpec build_model_spec(const Config& config);

// SPEC section 14. Whether layer `l` is one of training.freeze's (a name or glob pattern).
bool in_freeze(const Config& config, const ModelSpec& model, int l);
// Per layer, whether its weights stay as they are at optimizer step `step` (0-based):
// `trainable: false`, and training.freeze's before unfreeze_at (always when it is 0).
std::vector<char> frozen_layers(const Config& config, const ModelSpec& model, int64_t step);
// The step at which layer `l`'s weights start to train: unfreeze_at for training.freeze's
// layers, else 0. Adam counts each weight's steps from there, as torch does.
int64_t training_starts(const Config& config, const ModelSpec& model, int l);
// Per tensor, whether training's backward makes its gradient: a weight that trains lies at
// or before it. `frozen` (per layer, frozen_layers) holds back weights that would train;
// empty: only WeightSpec::trainable counts (what the plan and the memory model assume).
std::vector<char> gradient_flow(const ModelSpec& model, const std::vector<char>& frozen = {});
// Whether the layer makes the gradient of its `k`th input: not of the image, nor of a
// tensor before which no weight trains (LayerSpec::input_gradients).
inline bool makes_input_gradient(const LayerSpec& layer, size_t k = 0) {
  return layer.inputs[k] > 0 && (layer.input_gradients.empty() || layer.input_gradients[k]);
}


}  // namespace ht
