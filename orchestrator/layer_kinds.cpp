// The built-in windowed layer kinds (SPEC sections 5, 7 and 11): convolutions, pools,
// resampling, padding and cropping; keys, names, traits, shapes, weights, flops. Their
// kernels are in worker/layers/window_layers.cpp. The other kinds are in layer_kinds_pixel.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "orchestrator/layer_kinds.hpp"

namespace ht {

void set_windows(LayerSpec& l, const LayerConfig& c, const char* kernel_key, int dilation_h, int dilation_w,
                 bool ceil_mode) {
  const std::array<int, 2> k = c.pair(kernel_key), s = c.pair("stride");
  const Padding& p = c.padding("padding");
  l.rows = make_window(l.in.h, k[0], s[0], dilation_h, p.mode, p.top, p.bottom, ceil_mode);
  l.cols = make_window(l.in.w, k[1], s[1], dilation_w, p.mode, p.left, p.right, ceil_mode);
  if (l.rows.out < 1 || l.cols.out < 1) {
    const int pad_h = p.mode == PaddingMode::Explicit ? p.top + p.bottom : 0;
    const int pad_w = p.mode == PaddingMode::Explicit ? p.left + p.right : 0;
    throw LayerShapeError(fmt::format(
        "window {}x{} (dilation {}x{}) with padding {} does not fit its {}x{} input; expected an input of at least "
        "{}x{} pixels",
        k[0], k[1], dilation_h, dilation_w, describe_value(p), l.in.h, l.in.w,
        std::max(l.rows.span() - pad_h, 1), std::max(l.cols.span() - pad_w, 1)));
  }
}

namespace kinds {

LayerKey required_int(const char* name) { return {name, KeyType::Int, std::nullopt, "", 1, {}}; }
LayerKey with_default(const char* name, KeyType type, LayerValue def) { return {name, type, def, "", 1, {}}; }
LayerKey added_key(const char* name, KeyType type, LayerValue def) {
  LayerKey k = with_default(name, type, std::move(def));
  k.hash_default = false;
  return k;
}
LayerKey choice_key(const char* name, std::vector<std::string> choices) {
  LayerKey k{name, KeyType::Choice, choices.at(0), "", 1, choices};
  return k;
}

void require_feature_map(const LayerSpec& l) {
  if (!l.spatial)
    throw LayerShapeError("needs a feature map input, but it reads a per-image channel vector (the output of a "
                          "global pool or a layer after it)");
}

namespace {

const Padding kValid{PaddingMode::Valid};

LayerKey window_key(const char* name, int64_t def) {
  return {name, KeyType::Size2, std::vector<int64_t>{def, def}, "", 1, {}};
}

// Checks a grouped conv's channels; returns cin / groups.
int group_channels(const LayerSpec& l, int groups, int cout) {
  if (l.in.c % groups != 0 || cout % groups != 0)
    throw LayerShapeError(fmt::format("groups {} must divide its {} input channels and its {} filters", groups,
                                      l.in.c, cout));
  return l.in.c / groups;
}

LayerTraits conv_traits() {
  LayerTraits t;
  t.input = LayerInput::FeatureMap;
  t.windowed = true;
  t.backward_window = WindowUse::WeightGradient;
  t.conv_workspace = true;
  t.backward_reads_output = false;
  return t;
}

// No windowed kind's backward reads its output; one that reads no window (an average pool,
// the resamplings, padding and cropping) reads only shapes.
LayerTraits window_traits(WindowUse backward) {
  LayerTraits t;
  t.input = LayerInput::FeatureMap;
  t.windowed = true;
  t.backward_window = backward;
  t.backward_reads_inputs = backward != WindowUse::None;
  t.backward_reads_output = false;
  return t;
}

LayerKind conv2d() {
  LayerKind k{"conv2d", "Conv2D", "conv2d", {}, {}, {}};
  k.keys = {required_int("filters"),
            window_key("kernel", 1),
            window_key("stride", 1),
            with_default("padding", KeyType::Padding, kValid),
            window_key("dilation", 1),
            with_default("bias", KeyType::Bool, true),
            added_key("groups", KeyType::Int, int64_t(1))};
  k.traits = conv_traits();
  k.traits.input = LayerInput::Either;  // 1x1 on a channel vector: squeeze-excitation, ASPP's pooling branch
  k.shape = [](LayerSpec& l) {
    const LayerConfig& c = l.config;
    const std::array<int, 2> kernel = c.pair("kernel"), dilation = c.pair("dilation");
    const int cout = c.integer("filters"), cin_g = group_channels(l, c.integer("groups"), cout);
    if (l.spatial) {
      set_windows(l, c, "kernel", dilation[0], dilation[1]);
    } else {
      const Padding& p = c.padding("padding");
      if (kernel != std::array<int, 2>{1, 1} || c.pair("stride") != std::array<int, 2>{1, 1} ||
          (p.mode == PaddingMode::Explicit && !(p.is_uniform() && p.top == 0)))
        throw LayerShapeError(fmt::format("on a per-image channel vector only a 1x1 conv with stride 1 and no "
                                          "padding applies; found kernel {}x{}, stride {}, padding {}",
                                          kernel[0], kernel[1], describe_value(*c.find("stride")),
                                          describe_value(p)));
    }
    l.out = {cout, l.rows.out, l.cols.out};
    l.weights.push_back({"kernel:0", {kernel[0], kernel[1], cin_g, cout}, true, WeightLayout::ConvKernel,
                         WeightInit::GlorotUniform});
    if (c.flag("bias")) l.weights.push_back({"bias:0", {cout}, true, WeightLayout::Keras, WeightInit::Zeros});
    l.flops_per_image = 2ll * kernel[0] * kernel[1] * cin_g * cout * l.out.h * l.out.w;
  };
  return k;
}

// depthwise_conv2d and separable_conv2d (SPEC section 7): output channel c * m + j of the
// depthwise part reads input channel c; separable follows it with a 1x1 conv to `filters`.
LayerKind depthwise(bool separable) {
  LayerKind k{separable ? "separable_conv2d" : "depthwise_conv2d", separable ? "SeparableConv2D" : "DepthwiseConv2D",
              separable ? "separable_conv2d" : "depthwise_conv2d", {}, {}, {}};
  if (separable) k.keys.push_back(required_int("filters"));
  for (LayerKey key : {window_key("kernel", 1), window_key("stride", 1), with_default("padding", KeyType::Padding, kValid),
                       window_key("dilation", 1), with_default("depth_multiplier", KeyType::Int, int64_t(1)),
                       with_default("bias", KeyType::Bool, true)})
    k.keys.push_back(key);
  k.traits = conv_traits();
  k.shape = [separable](LayerSpec& l) {
    const LayerConfig& c = l.config;
    require_feature_map(l);
    const std::array<int, 2> kernel = c.pair("kernel"), dilation = c.pair("dilation");
    const int m = c.integer("depth_multiplier"), inner = l.in.c * m;
    set_windows(l, c, "kernel", dilation[0], dilation[1]);
    const int cout = separable ? c.integer("filters") : inner;
    l.out = {cout, l.rows.out, l.cols.out};
    l.weights.push_back({"depthwise_kernel:0", {kernel[0], kernel[1], l.in.c, m}, true, WeightLayout::DepthwiseKernel,
                         WeightInit::GlorotUniform});
    const int64_t pixels = int64_t(l.out.h) * l.out.w;
    l.flops_per_image = 2ll * kernel[0] * kernel[1] * inner * pixels;
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

// Nearest or bilinear (half-pixel, align_corners=False) resampling of `in` to `out` along
// one axis; `scale` is torch's source pixels per output pixel (1/factor when a factor is
// given, in/out for a size).
Window1D resample_window(WindowKind kind, int in, int out, float scale, int factor) {
  Window1D w = axis_window(kind, in, out, 1, factor, 0, 0);
  w.scale = scale;
  return w;
}

WindowKind interpolation_of(const LayerConfig& c) {
  return c.choice("interpolation") == "bilinear" ? WindowKind::Bilinear : WindowKind::Nearest;
}

// The output of a resampling: a feature map, also from a channel vector (broadcast to every
// pixel: DeepLab's ASPP pooling branch).
void set_resampled(LayerSpec& l, int64_t h, int64_t w, const Window1D& rows, const Window1D& cols) {
  if (h > kMaxExtent || w > kMaxExtent)
    throw LayerShapeError(fmt::format("its output of {}x{} pixels is larger than {} per side", h, w, kMaxExtent));
  l.rows = rows;
  l.cols = cols;
  l.out = {l.in.c, l.rows.out, l.cols.out};
  l.out_spatial = true;
  l.flops_per_image = (rows.kind == WindowKind::Bilinear ? 8 : 1) * l.out.elements();
}

// upsampling2d (SPEC sections 7, 11): F.interpolate(scale_factor=size, mode=nearest or
// bilinear, align_corners=False); of a channel vector, the map of size [sh, sw].
LayerKind upsampling2d() {
  LayerKind k{"upsampling2d", "UpSampling2D", "up_sampling2d", {}, {}, {}};
  k.keys = {with_default("size", KeyType::Size2, std::vector<int64_t>{2, 2}),
            choice_key("interpolation", {"nearest", "bilinear"})};
  k.traits = window_traits(WindowUse::None);
  k.traits.input = LayerInput::Either;
  k.shape = [](LayerSpec& l) {
    const std::array<int, 2> f = l.config.pair("size");
    const WindowKind kind = interpolation_of(l.config);
    const int64_t h = int64_t(l.in.h) * f[0], w = int64_t(l.in.w) * f[1];
    set_resampled(l, h, w, resample_window(kind, l.in.h, int(h), float(1.0 / f[0]), f[0]),
                  resample_window(kind, l.in.w, int(w), float(1.0 / f[1]), f[1]));
  };
  return k;
}

// resize (SPEC section 11): F.interpolate(size=[H, W], mode=nearest or bilinear,
// align_corners=False), any ratio; of a channel vector, the map of that size.
LayerKind resize() {
  LayerKind k{"resize", "Resizing", "resizing", {}, {}, {}};
  k.keys = {{"size", KeyType::Size2, std::nullopt, "", 1, {}}, choice_key("interpolation", {"nearest", "bilinear"})};
  k.traits = window_traits(WindowUse::None);
  k.traits.input = LayerInput::Either;
  k.shape = [](LayerSpec& l) {
    const std::array<int, 2> size = l.config.pair("size");
    const WindowKind kind = interpolation_of(l.config);
    // torch: an integer upsampling factor where the size is one (the factor's layout in the plan).
    auto factor = [](int in, int out) { return out % in == 0 ? out / in : 1; };
    set_resampled(l, size[0], size[1],
                  resample_window(kind, l.in.h, size[0], float(l.in.h) / float(size[0]), factor(l.in.h, size[0])),
                  resample_window(kind, l.in.w, size[1], float(l.in.w) / float(size[1]), factor(l.in.w, size[1])));
  };
  return k;
}

// conv2d_transpose: F.conv_transpose2d; valid: out = (in - 1) * s + k; same: out = in * s,
// the k - s extra rows and cols of the full output cropped half at top/left (the smaller
// half), the rest at bottom/right.
LayerKind conv2d_transpose() {
  LayerKind k{"conv2d_transpose", "Conv2DTranspose", "conv2d_transpose", {}, {}, {}};
  k.keys = {required_int("filters"), window_key("kernel", 1), window_key("stride", 1),
            with_default("padding", KeyType::Padding, kValid), with_default("bias", KeyType::Bool, true)};
  k.traits = conv_traits();
  k.shape = [](LayerSpec& l) {
    const LayerConfig& c = l.config;
    require_feature_map(l);
    const std::array<int, 2> kernel = c.pair("kernel"), stride = c.pair("stride");
    const int cout = c.integer("filters");
    const Padding& padding = c.padding("padding");
    if (padding.mode == PaddingMode::Explicit)
      throw LayerShapeError(fmt::format("padding must be valid or same; found {}", describe_value(padding)));
    for (int a = 0; a < 2; ++a)
      if (kernel[a] < stride[a])
        throw LayerShapeError(fmt::format("kernel {} must be at least the stride {}", kernel[a], stride[a]));
    const bool same = padding.mode == PaddingMode::Same;
    auto window = [&](int in, int a) {
      const int crop = same ? kernel[a] - stride[a] : 0;
      return axis_window(WindowKind::Transpose, in, same ? in * stride[a] : (in - 1) * stride[a] + kernel[a],
                         kernel[a], stride[a], crop / 2, crop - crop / 2);
    };
    l.rows = window(l.in.h, 0);
    l.cols = window(l.in.w, 1);
    l.out = {cout, l.rows.out, l.cols.out};
    l.weights.push_back({"kernel:0", {kernel[0], kernel[1], cout, l.in.c}, true, WeightLayout::ConvKernel,
                         WeightInit::GlorotUniform});
    if (c.flag("bias")) l.weights.push_back({"bias:0", {cout}, true, WeightLayout::Keras, WeightInit::Zeros});
    l.flops_per_image = 2ll * kernel[0] * kernel[1] * l.in.c * cout * l.in.h * l.in.w;
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
  k.traits = window_traits(WindowUse::None);
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

// max_pool2d and avg_pool2d: floor mode by default, torch's ceil_mode on request; an
// average divides by the taps inside the image, or (count_include_pad) inside the padded
// image short of ceil mode's overhang, as torch.
LayerKind pool2d(const char* type, const char* keras_class, const char* keras_prefix, WindowUse backward) {
  LayerKind k{type, keras_class, keras_prefix, {}, {}, {}};
  const bool average = backward == WindowUse::None;
  k.keys = {window_key("pool", 2), {"stride", KeyType::Size2, std::nullopt, "pool", 1, {}},
            with_default("padding", KeyType::Padding, kValid), added_key("ceil_mode", KeyType::Bool, false)};
  if (average) k.keys.push_back(added_key("count_include_pad", KeyType::Bool, false));
  k.traits = window_traits(backward);
  k.shape = [](LayerSpec& l) {
    const LayerConfig& c = l.config;
    require_feature_map(l);
    const std::array<int, 2> pool = c.pair("pool");
    const Padding& p = c.padding("padding");
    set_windows(l, c, "pool", 1, 1, c.flag("ceil_mode"));
    if (p.mode == PaddingMode::Explicit &&
        (std::max(p.top, p.bottom) >= pool[0] || std::max(p.left, p.right) >= pool[1]))
      throw LayerShapeError(fmt::format("padding {} must be smaller than the pool window {}x{}", describe_value(p),
                                        pool[0], pool[1]));
    l.out = {l.in.c, l.rows.out, l.cols.out};
    l.flops_per_image = int64_t(pool[0]) * pool[1] * l.out.elements();
  };
  return k;
}

}  // namespace

std::vector<LayerKind> window_kinds() {
  std::vector<LayerKind> kinds;
  kinds.push_back(conv2d());
  kinds.push_back(pool2d("max_pool2d", "MaxPooling2D", "max_pooling2d", WindowUse::InputGradient));
  kinds.push_back(pool2d("avg_pool2d", "AveragePooling2D", "average_pooling2d", WindowUse::None));
  kinds.push_back(depthwise(false));
  kinds.push_back(depthwise(true));
  kinds.push_back(upsampling2d());
  kinds.push_back(conv2d_transpose());
  kinds.push_back(shift(false));
  kinds.push_back(shift(true));
  kinds.push_back(resize());
  return kinds;
}

}  // namespace kinds

std::vector<LayerKind> builtin_layer_kinds() {
  // The kinds of format 1 in their order (messages list them so), then the later ones.
  static const char* const kFirst[] = {
      "conv2d", "batch_norm", "relu", "max_pool2d", "avg_pool2d", "global_avg_pool", "dense", "leaky_relu",
      "sigmoid", "tanh", "global_max_pool", "dropout", "add", "concatenate", "depthwise_conv2d", "separable_conv2d",
      "upsampling2d", "conv2d_transpose", "zero_padding2d", "cropping2d"};
  std::vector<LayerKind> all = kinds::window_kinds(), pixel = kinds::pixel_kinds(), ordered;
  all.insert(all.end(), pixel.begin(), pixel.end());
  for (const char* type : kFirst)
    for (LayerKind& k : all)
      if (k.type == type) ordered.push_back(k);
  for (LayerKind& k : all)
    if (std::find(std::begin(kFirst), std::end(kFirst), k.type) == std::end(kFirst)) ordered.push_back(k);
  return ordered;
}

}  // namespace ht
