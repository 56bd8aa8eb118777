// The built-in layer kinds (SPEC section 4): keys, names, traits, shapes, weights, flops.
// Their kernels are in worker/layers.cpp.
#include <fmt/format.h>

#include "orchestrator/layer_kind.hpp"

namespace ht {

namespace {

LayerKey required_int(const char* name) { return {name, KeyType::Int, std::nullopt, "", 1}; }
LayerKey with_default(const char* name, KeyType type, LayerValue def) { return {name, type, def, "", 1}; }
const Padding kValid{PaddingMode::Valid, 0};

void require_feature_map(const LayerSpec& l) {
  if (!l.spatial) throw LayerShapeError("needs a spatial input, but it comes after the global pool");
}

LayerKind conv2d() {
  LayerKind k{"conv2d", "Conv2D", "conv2d", {}, {}, {}};
  k.keys = {required_int("filters"),
            with_default("kernel", KeyType::Int, int64_t(1)),
            with_default("stride", KeyType::Int, int64_t(1)),
            with_default("padding", KeyType::Padding, kValid),
            with_default("dilation", KeyType::Int, int64_t(1)),
            with_default("bias", KeyType::Bool, true)};
  k.traits = {LayerInput::FeatureMap, false, true, WindowUse::WeightGradient, true};
  k.shape = [](LayerSpec& l) {
    const LayerConfig& c = l.config;
    require_feature_map(l);
    const int kernel = c.integer("kernel"), cout = c.integer("filters");
    set_windows(l, kernel, c.integer("stride"), c.integer("dilation"), c.padding("padding"));
    l.out = {cout, l.rows.out, l.cols.out};
    l.weights.push_back({"kernel:0", {kernel, kernel, l.in.c, cout}, true, WeightLayout::ConvKernel,
                         WeightInit::GlorotUniform});
    if (c.flag("bias")) l.weights.push_back({"bias:0", {cout}, true, WeightLayout::Keras, WeightInit::Zeros});
    l.flops_per_image = 2ll * kernel * kernel * l.in.c * cout * l.out.h * l.out.w;
  };
  return k;
}

// depthwise_conv2d and separable_conv2d (SPEC section 7): output channel c * m + j of the
// depthwise part reads input channel c; separable follows it with a 1x1 conv to `filters`.
LayerKind depthwise(bool separable) {
  LayerKind k{separable ? "separable_conv2d" : "depthwise_conv2d", separable ? "SeparableConv2D" : "DepthwiseConv2D",
              separable ? "separable_conv2d" : "depthwise_conv2d", {}, {}, {}};
  if (separable) k.keys.push_back(required_int("filters"));
  for (LayerKey key : {with_default("kernel", KeyType::Int, int64_t(1)), with_default("stride", KeyType::Int, int64_t(1)),
                       with_default("padding", KeyType::Padding, kValid),
                       with_default("dilation", KeyType::Int, int64_t(1)),
                       with_default("depth_multiplier", KeyType::Int, int64_t(1)),
                       with_default("bias", KeyType::Bool, true)})
    k.keys.push_back(key);
  k.traits = {LayerInput::FeatureMap, false, true, WindowUse::WeightGradient, true};
  k.shape = [separable](LayerSpec& l) {
    const LayerConfig& c = l.config;
    require_feature_map(l);
    const int kernel = c.integer("kernel"), m = c.integer("depth_multiplier"), inner = l.in.c * m;
    set_windows(l, kernel, c.integer("stride"), c.integer("dilation"), c.padding("padding"));
    const int cout = separable ? c.integer("filters") : inner;
    l.out = {cout, l.rows.out, l.cols.out};
    l.weights.push_back({"depthwise_kernel:0", {kernel, kernel, l.in.c, m}, true, WeightLayout::DepthwiseKernel,
                         WeightInit::GlorotUniform});
    const int64_t pixels = int64_t(l.out.h) * l.out.w;
    l.flops_per_image = 2ll * kernel * kernel * inner * pixels;
    if (separable) {
      l.weights.push_back({"pointwise_kernel:0", {1, 1, inner, cout}, true, WeightLayout::ConvKernel,
                           WeightInit::GlorotUniform});
      l.flops_per_image += 2ll * inner * cout * pixels;
      l.inner_channels = inner;
    }
    if (c.flag("bias")) l.weights.push_back({"bias:0", {cout}, true, WeightLayout::Keras, WeightInit::Zeros});
  };
  return k;
}

// One axis of a window that is not a sliding one (model_spec.hpp's WindowKind).
Window1D axis_window(WindowKind kind, int in, int out, int kernel, int stride, int pad_lo, int pad_hi) {
  Window1D w;
  w.kind = kind;
  w.in = in;
  w.out = out;
  w.kernel = kernel;
  w.stride = stride;
  w.pad_lo = pad_lo;
  w.pad_hi = pad_hi;
  return w;
}

// upsampling2d (SPEC section 7): F.interpolate(scale_factor=size, mode=nearest or bilinear,
// align_corners=False).
LayerKind upsampling2d() {
  LayerKind k{"upsampling2d", "UpSampling2D", "up_sampling2d", {}, {}, {}};
  LayerKey interpolation{"interpolation", KeyType::Choice, std::string("nearest"), "", 1};
  interpolation.choices = {"nearest", "bilinear"};
  k.keys = {with_default("size", KeyType::Size2, std::vector<int64_t>{2, 2}), interpolation};
  k.traits = {LayerInput::FeatureMap, false, true, WindowUse::None, false};
  k.shape = [](LayerSpec& l) {
    require_feature_map(l);
    const std::vector<int64_t>& size = l.config.ints("size");
    const WindowKind kind = l.config.choice("interpolation") == "bilinear" ? WindowKind::Bilinear : WindowKind::Nearest;
    const int sh = int(size[0]), sw = int(size[1]);
    l.rows = axis_window(kind, l.in.h, l.in.h * sh, 1, sh, 0, 0);
    l.cols = axis_window(kind, l.in.w, l.in.w * sw, 1, sw, 0, 0);
    l.out = {l.in.c, l.rows.out, l.cols.out};
    l.flops_per_image = (kind == WindowKind::Bilinear ? 8 : 1) * l.out.elements();
  };
  return k;
}

// conv2d_transpose: F.conv_transpose2d; valid: out = (in - 1) * s + k; same: out = in * s,
// the k - s extra rows and cols of the full output cropped half at top/left (the smaller
// half), the rest at bottom/right.
LayerKind conv2d_transpose() {
  LayerKind k{"conv2d_transpose", "Conv2DTranspose", "conv2d_transpose", {}, {}, {}};
  k.keys = {required_int("filters"), with_default("kernel", KeyType::Int, int64_t(1)),
            with_default("stride", KeyType::Int, int64_t(1)), with_default("padding", KeyType::Padding, kValid),
            with_default("bias", KeyType::Bool, true)};
  k.traits = {LayerInput::FeatureMap, false, true, WindowUse::WeightGradient, true};
  k.shape = [](LayerSpec& l) {
    const LayerConfig& c = l.config;
    require_feature_map(l);
    const int kernel = c.integer("kernel"), stride = c.integer("stride"), cout = c.integer("filters");
    const Padding& padding = c.padding("padding");
    if (padding.mode == PaddingMode::Explicit)
      throw LayerShapeError(fmt::format("padding must be valid or same; found {}", padding.value));
    if (kernel < stride)
      throw LayerShapeError(fmt::format("kernel {} must be at least the stride {}", kernel, stride));
    const bool same = padding.mode == PaddingMode::Same;
    const int crop = same ? kernel - stride : 0;
    auto window = [&](int in) {
      return axis_window(WindowKind::Transpose, in, same ? in * stride : (in - 1) * stride + kernel, kernel, stride,
                         crop / 2, crop - crop / 2);
    };
    l.rows = window(l.in.h);
    l.cols = window(l.in.w);
    l.out = {cout, l.rows.out, l.cols.out};
    l.weights.push_back({"kernel:0", {kernel, kernel, cout, l.in.c}, true, WeightLayout::ConvKernel,
                         WeightInit::GlorotUniform});
    if (c.flag("bias")) l.weights.push_back({"bias:0", {cout}, true, WeightLayout::Keras, WeightInit::Zeros});
    l.flops_per_image = 2ll * kernel * kernel * l.in.c * cout * l.in.h * l.in.w;
  };
  return k;
}

// zero_padding2d and cropping2d: zeros around the image, or its border rows and cols
// removed; margins {top, bottom, left, right}.
LayerKind shift(bool crop) {
  LayerKind k{crop ? "cropping2d" : "zero_padding2d", crop ? "Cropping2D" : "ZeroPadding2D",
              crop ? "cropping2d" : "zero_padding2d", {}, {}, {}};
  const char* key = crop ? "cropping" : "padding";
  k.keys = {with_default(key, KeyType::Margins, std::vector<int64_t>(4, crop ? 0 : 1))};
  k.traits = {LayerInput::FeatureMap, false, true, WindowUse::None, false};
  k.shape = [crop, key](LayerSpec& l) {
    require_feature_map(l);
    const std::vector<int64_t>& m = l.config.ints(key);
    const int sign = crop ? -1 : 1;
    const int h = l.in.h + sign * int(m[0] + m[1]), w = l.in.w + sign * int(m[2] + m[3]);
    if (h < 1 || w < 1)
      throw LayerShapeError(fmt::format("cropping [[{}, {}], [{}, {}]] leaves nothing of its {}x{} input", m[0], m[1],
                                        m[2], m[3], l.in.h, l.in.w));
    l.rows = axis_window(WindowKind::Shift, l.in.h, h, 1, 1, sign * int(m[0]), sign * int(m[1]));
    l.cols = axis_window(WindowKind::Shift, l.in.w, w, 1, 1, sign * int(m[2]), sign * int(m[3]));
    l.out = {l.in.c, h, w};
    l.flops_per_image = l.out.elements();
  };
  return k;
}

LayerKind pool2d(const char* type, const char* keras_class, const char* keras_prefix, WindowUse backward) {
  LayerKind k{type, keras_class, keras_prefix, {}, {}, {}};
  k.keys = {with_default("pool", KeyType::Int, int64_t(2)), {"stride", KeyType::Int, std::nullopt, "pool", 1},
            with_default("padding", KeyType::Padding, kValid)};
  k.traits = {LayerInput::FeatureMap, false, true, backward, false};
  k.shape = [](LayerSpec& l) {
    const LayerConfig& c = l.config;
    require_feature_map(l);
    const int pool = c.integer("pool");
    const Padding& padding = c.padding("padding");
    set_windows(l, pool, c.integer("stride"), 1, padding);
    if (padding.mode == PaddingMode::Explicit && padding.value >= l.rows.span())
      throw LayerShapeError(fmt::format("padding {} must be smaller than the pool window {}", padding.value, pool));
    l.out = {l.in.c, l.rows.out, l.cols.out};
    l.flops_per_image = int64_t(pool) * pool * l.out.elements();
  };
  return k;
}

LayerKind batch_norm() {
  LayerKind k{"batch_norm", "BatchNormalization", "batch_normalization", {}, {}, {}};
  // center / scale false: no beta / gamma (Keras's BatchNormalization(center=False, ...)).
  k.keys = {with_default("momentum", KeyType::Unit, 0.99), with_default("epsilon", KeyType::Positive, 1e-3),
            with_default("center", KeyType::Bool, true), with_default("scale", KeyType::Bool, true)};
  // Not in the model hash: momentum and epsilon may change on resume (as before layer
  // kinds), and a change of center or scale changes the weights, which loading refuses.
  for (LayerKey& key : k.keys) key.in_model_hash = false;
  k.traits.input = LayerInput::FeatureMap;
  k.shape = [](LayerSpec& l) {
    if (!l.spatial)
      throw LayerShapeError("batch_norm after the global pool is not supported; put it before global_avg_pool");
    const int64_t c = l.in.c;
    l.out = l.in;
    if (l.config.flag("scale")) l.weights.push_back({"gamma:0", {c}, true, WeightLayout::Keras, WeightInit::Ones});
    if (l.config.flag("center")) l.weights.push_back({"beta:0", {c}, true, WeightLayout::Keras, WeightInit::Zeros});
    l.weights.push_back({"moving_mean:0", {c}, false, WeightLayout::Keras, WeightInit::Zeros});
    l.weights.push_back({"moving_variance:0", {c}, false, WeightLayout::Keras, WeightInit::Ones});
    l.flops_per_image = 8 * l.in.elements();
  };
  return k;
}

// Element-wise, shape-preserving: relu, and leaky_relu, sigmoid, tanh (worker/layers.cpp's
// ActivationLayer).
LayerKind elementwise(const char* type, const char* keras_class, const char* keras_prefix) {
  LayerKind k{type, keras_class, keras_prefix, {}, {}, {}};
  k.shape = [](LayerSpec& l) {
    l.out = l.in;
    l.flops_per_image = l.in.elements();
  };
  return k;
}

LayerKind leaky_relu() {
  LayerKind k = elementwise("leaky_relu", "LeakyReLU", "leaky_re_lu");
  k.keys = {with_default("alpha", KeyType::NonNegative, 0.3)};
  return k;
}

LayerKind dropout() {
  LayerKind k = elementwise("dropout", "Dropout", "dropout");
  k.keys = {{"rate", KeyType::Unit, std::nullopt, "", 1}};
  return k;
}

LayerKind global_pool(const char* type, const char* keras_class, const char* keras_prefix) {
  LayerKind k{type, keras_class, keras_prefix, {}, {}, {}};
  k.traits.input = LayerInput::FeatureMap;
  k.traits.global_pool = true;
  k.shape = [](LayerSpec& l) {
    if (!l.spatial) throw LayerShapeError("a second " + l.config.type() + " has no spatial input");
    l.out = {l.in.c, 1, 1};
    l.flops_per_image = l.in.elements();
  };
  return k;
}

LayerKind dense() {
  LayerKind k{"dense", "Dense", "dense", {}, {}, {}};
  k.keys = {required_int("units"), with_default("bias", KeyType::Bool, true)};
  k.traits.input = LayerInput::Vector;
  k.shape = [](LayerSpec& l) {
    const LayerConfig& c = l.config;
    if (l.spatial)
      throw LayerShapeError(
          fmt::format("dense needs a vector input; put a global_avg_pool before it (found a {}x{}x{} feature map)",
                      l.in.h, l.in.w, l.in.c));
    const int units = c.integer("units");
    l.out = {units, 1, 1};
    l.weights.push_back({"kernel:0", {l.in.c, units}, true, WeightLayout::Keras, WeightInit::GlorotUniform});
    if (c.flag("bias")) l.weights.push_back({"bias:0", {units}, true, WeightLayout::Keras, WeightInit::Zeros});
    l.flops_per_image = 2ll * l.in.c * units;
  };
  return k;
}

std::string describe_shape(const Shape3& s) { return fmt::format("{}x{}x{}", s.h, s.w, s.c); }

// Joins (SPEC section 7): several inputs, at least two, named by `inputs`.
LayerKind join(const char* type, const char* keras_class, const char* keras_prefix) {
  LayerKind k{type, keras_class, keras_prefix, {}, {}, {}};
  k.traits.min_inputs = 2;
  k.traits.max_inputs = 0;
  return k;
}

// The first input whose shape differs from the first's along what must agree.
template <class Agree>
void require_agreeing(const LayerSpec& l, const char* what, Agree agree) {
  for (size_t k = 1; k < l.ins.size(); ++k)
    if (!agree(l.ins[0], l.ins[k]))
      throw LayerShapeError(fmt::format("{}: input '{}' is {} but input '{}' is {} (H x W x C)", what,
                                        l.config.inputs[0], describe_shape(l.ins[0]), l.config.inputs[k],
                                        describe_shape(l.ins[k])));
}

LayerKind add() {
  LayerKind k = join("add", "Add", "add");
  k.shape = [](LayerSpec& l) {
    require_agreeing(l, "add needs inputs of one shape", [](const Shape3& a, const Shape3& b) { return a == b; });
    l.out = l.in;
    l.flops_per_image = int64_t(l.ins.size() - 1) * l.in.elements();
  };
  return k;
}

LayerKind concatenate() {
  LayerKind k = join("concatenate", "Concatenate", "concatenate");
  k.shape = [](LayerSpec& l) {
    require_agreeing(l, "concatenate joins channels of maps of one size",
                     [](const Shape3& a, const Shape3& b) { return a.h == b.h && a.w == b.w; });
    l.out = l.in;
    for (size_t i = 1; i < l.ins.size(); ++i) l.out.c += l.ins[i].c;
  };
  return k;
}

}  // namespace

std::vector<LayerKind> builtin_layer_kinds() {
  std::vector<LayerKind> kinds;
  kinds.push_back(conv2d());
  kinds.push_back(batch_norm());
  kinds.push_back(elementwise("relu", "Activation", "activation"));
  kinds.push_back(pool2d("max_pool2d", "MaxPooling2D", "max_pooling2d", WindowUse::InputGradient));
  kinds.push_back(pool2d("avg_pool2d", "AveragePooling2D", "average_pooling2d", WindowUse::None));
  kinds.push_back(global_pool("global_avg_pool", "GlobalAveragePooling2D", "global_average_pooling2d"));
  kinds.push_back(dense());
  kinds.push_back(leaky_relu());
  kinds.push_back(elementwise("sigmoid", "Activation", "activation"));
  kinds.push_back(elementwise("tanh", "Activation", "activation"));
  kinds.push_back(global_pool("global_max_pool", "GlobalMaxPooling2D", "global_max_pooling2d"));
  kinds.push_back(dropout());
  kinds.push_back(add());
  kinds.push_back(concatenate());
  kinds.push_back(depthwise(false));
  kinds.push_back(depthwise(true));
  kinds.push_back(upsampling2d());
  kinds.push_back(conv2d_transpose());
  kinds.push_back(shift(false));
  kinds.push_back(shift(true));
  return kinds;
}

}  // namespace ht
