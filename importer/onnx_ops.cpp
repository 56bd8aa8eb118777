// The ONNX ops halotrain reads with a window: convolutions, pools, resizing and padding,
// in every opset form from 11 to 18, non-square windows and per-side pads included. The
// table of every op is at the end of onnx_ops_pixel.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "importer/onnx_ops.hpp"

namespace ht::onnx_import {

std::string show(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }

// OIHW [o][i][kh][kw] -> Keras (kh, kw, i, o).
std::vector<float> oihw_to_keras(const Constant& w) {
  const int64_t o = w.dims[0], i = w.dims[1], kh = w.dims[2], kw = w.dims[3];
  std::vector<float> k(w.values.size());
  for (int64_t a = 0; a < o; ++a)
    for (int64_t b = 0; b < i; ++b)
      for (int64_t y = 0; y < kh; ++y)
        for (int64_t x = 0; x < kw; ++x) k[((y * kw + x) * i + b) * o + a] = float(w.values[((a * i + b) * kh + y) * kw + x]);
  return k;
}

std::vector<float> floats(const Constant& c) { return {c.values.begin(), c.values.end()}; }

Value same_layout(const Value& x, Value y) {
  const int64_t c = y.dims[1];
  if (x.layout == Layout::Vector && y.layout == Layout::Vector && x.dims.size() == 4)
    y.dims = {y.dims[0], c, 1, 1};  // [N, C, 1, 1] as it came
  if (x.layout == Layout::NHWC) {
    y.layout = Layout::NHWC;
    y.dims = {x.dims[0], x.dims[1], x.dims[2], c};
  }
  y.flattened = x.flattened;
  return y;
}

namespace {

// A window attribute of two values (an absent one: `def`).
std::vector<int64_t> pair_attr(Translator& t, const onnx::NodeProto& n, const std::string& name,
                               std::vector<int64_t> def) {
  const std::vector<int64_t> v = t.ints(n, name, def);
  if (v.size() != 2)
    t.unsupported(n, fmt::format("{} {}: halotrain's windows are 2-D (two values)", name, show(v)));
  for (int64_t x : v)
    if (x < 1 || x > kMaxExtent) t.unsupported(n, fmt::format("{} {}: expected values >= 1", name, show(v)));
  return v;
}

// pads [top, left, bottom, right] or auto_pad, as a halotrain padding.
Padding padding_of(Translator& t, const onnx::NodeProto& n, const Value& x, const std::vector<int64_t>& kernel,
                   const std::vector<int64_t>& stride, const std::vector<int64_t>& dilation) {
  const std::string auto_pad = t.text(n, "auto_pad", "NOTSET");
  if (auto_pad == "VALID") return {PaddingMode::Valid};
  if (auto_pad == "SAME_UPPER") return {PaddingMode::Same};  // TensorFlow's rule: the extra pixel at the end
  if (auto_pad == "SAME_LOWER") {  // the extra pixel at the start
    int side[4];
    for (int a = 0; a < 2; ++a) {
      const int64_t in = x.dims[2 + a], out = (in + stride[a] - 1) / stride[a];
      const int64_t total = std::max<int64_t>((out - 1) * stride[a] + dilation[a] * (kernel[a] - 1) + 1 - in, 0);
      side[2 * a] = int(total - total / 2);
      side[2 * a + 1] = int(total / 2);
    }
    return {PaddingMode::Explicit, side[0], side[1], side[2], side[3]};
  }
  if (auto_pad != "NOTSET") t.unsupported(n, fmt::format("auto_pad {}", auto_pad));
  const std::vector<int64_t> p = t.ints(n, "pads", {0, 0, 0, 0});
  if (p.size() != 4 || std::any_of(p.begin(), p.end(), [](int64_t v) { return v < 0 || v > kMaxExtent; }))
    t.unsupported(n, fmt::format("pads {} (four values >= 0: top, left, bottom, right)", show(p)));
  return {PaddingMode::Explicit, int(p[0]), int(p[2]), int(p[1]), int(p[3])};
}

void require_map(Translator& t, const onnx::NodeProto& n, const Value& x) {
  if (x.layout != Layout::NCHW)
    t.unsupported(n, fmt::format("reads a {} tensor of shape {}, where halotrain expects an NCHW feature map",
                                 x.layout == Layout::NHWC ? "channels-last" : "channel-vector", show(x.dims)));
}

void conv(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  const Constant& w = t.constant(n, 1);
  if (w.dims.size() != 4) t.unsupported(n, fmt::format("has a weight of shape {}; expected [O, I, kH, kW]", show(w.dims)));
  const int64_t group = t.integer(n, "group", 1), cout = w.dims[0], cin_g = w.dims[1];
  const std::vector<int64_t> kernel = pair_attr(t, n, "kernel_shape", {w.dims[2], w.dims[3]});
  const std::vector<int64_t> stride = pair_attr(t, n, "strides", {1, 1}), dilation = pair_attr(t, n, "dilations", {1, 1});
  if (kernel != std::vector<int64_t>{w.dims[2], w.dims[3]})
    t.unsupported(n, fmt::format("kernel_shape {} differs from its weight's {}", show(kernel), show(w.dims)));
  const bool bias = t.has_input(n, 2);
  const int64_t cin = t.shape_of(x).c;
  if (group < 1 || cin_g * group != cin)
    t.unsupported(n, fmt::format("group {} with a weight of {} input channels does not match its {} input channels",
                                 group, cin_g, cin));
  const bool depthwise = group > 1 && group == cin && cin_g == 1 && cout % cin == 0;
  const Padding pad = x.layout == Layout::Vector ? Padding{PaddingMode::Valid} : padding_of(t, n, x, kernel, stride, dilation);
  std::vector<std::pair<std::string, LayerValue>> keys = {
      {"kernel", kernel}, {"stride", stride}, {"padding", pad}, {"dilation", dilation}, {"bias", bias}};
  std::vector<Translator::Weight> weights;
  if (depthwise) {
    keys.push_back({"depth_multiplier", cout / cin});
    // [cin * m][1][kh][kw] is the conv layout of (kh, kw, 1, cin * m) = Keras (kh, kw, cin, m).
    weights.push_back({"depthwise_kernel:0", {kernel[0], kernel[1], cin, cout / cin}, oihw_to_keras(w)});
  } else {
    keys.insert(keys.begin(), {"filters", cout});
    keys.push_back({"groups", group});
    weights.push_back({"kernel:0", {kernel[0], kernel[1], cin_g, cout}, oihw_to_keras(w)});
  }
  if (bias) weights.push_back({"bias:0", {cout}, floats(t.constant(n, 2))});
  const Value y = t.add_layer(n, depthwise ? "depthwise_conv2d" : "conv2d", keys, {&x}, weights);
  t.bind(n.output(0), same_layout(x, y));
}

void conv_transpose(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  require_map(t, n, x);
  const Constant& w = t.constant(n, 1);  // [in][out][kh][kw]
  if (w.dims.size() != 4) t.unsupported(n, fmt::format("has a weight of shape {}", show(w.dims)));
  if (t.integer(n, "group", 1) != 1) t.unsupported(n, fmt::format("group {} (1 only)", t.integer(n, "group", 1)));
  if (t.ints(n, "dilations", {1, 1}) != std::vector<int64_t>{1, 1})
    t.unsupported(n, fmt::format("dilations {} (1 only)", show(t.ints(n, "dilations"))));
  if (t.attr(n, "output_shape")) t.unsupported(n, "output_shape (give pads and output_padding)");
  const int64_t cin = w.dims[0], cout = w.dims[1];
  const std::vector<int64_t> kernel = pair_attr(t, n, "kernel_shape", {w.dims[2], w.dims[3]});
  const std::vector<int64_t> stride = pair_attr(t, n, "strides", {1, 1});
  const std::vector<int64_t> pads = t.ints(n, "pads", {0, 0, 0, 0}), extra = t.ints(n, "output_padding", {0, 0});
  if (pads.size() != 4 || extra.size() != 2) t.unsupported(n, fmt::format("pads {} output_padding {}", show(pads), show(extra)));
  for (int a = 0; a < 2; ++a)
    if (kernel[a] < stride[a]) t.unsupported(n, fmt::format("kernel_shape {} smaller than strides {}", show(kernel), show(stride)));
  const bool bias = t.has_input(n, 2);
  std::vector<Translator::Weight> weights = {{"kernel:0", {kernel[0], kernel[1], cout, cin}, oihw_to_keras(w)}};
  if (bias) weights.push_back({"bias:0", {cout}, floats(t.constant(n, 2))});
  Value y = t.add_layer(n, "conv2d_transpose", {{"filters", cout}, {"kernel", kernel}, {"stride", stride}, {"bias", bias}},
                        {&x}, weights);
  // ONNX's pads crop the full output; output_padding adds rows at its end.
  const std::vector<int64_t> crop = {pads[0], pads[2] - extra[0], pads[1], pads[3] - extra[1]};
  if (std::any_of(crop.begin(), crop.end(), [](int64_t c) { return c < 0; }))
    t.unsupported(n, fmt::format("output_padding {} larger than pads {}", show(extra), show(pads)));
  if (std::any_of(crop.begin(), crop.end(), [](int64_t c) { return c > 0; })) y = t.add_layer(n, "cropping2d", {{"cropping", crop}}, {&y});
  t.bind(n.output(0), y);
}

void pool(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  require_map(t, n, x);
  const bool max = n.op_type() == "MaxPool";
  if (t.ints(n, "dilations", {1, 1}) != std::vector<int64_t>{1, 1})
    t.unsupported(n, fmt::format("dilations {} (1 only)", show(t.ints(n, "dilations"))));
  if (n.output_size() > 1 && !n.output(1).empty()) t.unsupported(n, "its Indices output (halotrain keeps none)");
  const std::vector<int64_t> pool = pair_attr(t, n, "kernel_shape", {});
  const std::vector<int64_t> stride = pair_attr(t, n, "strides", {1, 1});
  const Padding pad = padding_of(t, n, x, pool, stride, {1, 1});
  std::vector<std::pair<std::string, LayerValue>> keys = {
      {"pool", pool}, {"stride", stride}, {"padding", pad}, {"ceil_mode", t.integer(n, "ceil_mode", 0) != 0}};
  if (!max) keys.push_back({"count_include_pad", t.integer(n, "count_include_pad", 0) != 0});
  t.bind(n.output(0), t.add_layer(n, max ? "max_pool2d" : "avg_pool2d", keys, {&x}));
}

void global_pool(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  require_map(t, n, x);
  Value y = t.add_layer(n, n.op_type() == "GlobalMaxPool" ? "global_max_pool" : "global_avg_pool", {}, {&x});
  y.dims = {x.dims[0], x.dims[1], 1, 1};
  t.bind(n.output(0), y);
}

// ReduceMean / ReduceMax over the spatial axes: a global pool (axes from the attribute up
// to opset 17, from an input at 18).
void reduce(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  std::vector<int64_t> axes = t.ints(n, "axes");
  if (axes.empty() && t.has_input(n, 1))
    for (double a : t.constant(n, 1).values) axes.push_back(int64_t(a));
  for (int64_t& a : axes) a = a < 0 ? a + int64_t(x.dims.size()) : a;
  std::sort(axes.begin(), axes.end());
  const std::vector<int64_t> spatial = x.layout == Layout::NHWC ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 3};
  if (x.layout == Layout::Vector || axes != spatial)
    t.unsupported(n, fmt::format("reduces axes {} of a tensor of shape {} (only H and W: a global pool)", show(axes),
                                 show(x.dims)));
  Value y = t.add_layer(n, n.op_type() == "ReduceMax" ? "global_max_pool" : "global_avg_pool", {}, {&x});
  const int64_t c = t.shape_of(x).c;
  y.dims = t.integer(n, "keepdims", 1) ? (x.layout == Layout::NHWC ? std::vector<int64_t>{x.dims[0], 1, 1, c}
                                                                   : std::vector<int64_t>{x.dims[0], c, 1, 1})
                                       : std::vector<int64_t>{x.dims[0], c};
  t.bind(n.output(0), y);
}

// Resize / Upsample: nearest (torch's asymmetric floor) or linear (half-pixel), to sizes or
// by scales; an integer factor is an upsampling2d, any other ratio a resize; a channel
// vector is broadcast to the map of that size.
void resize(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  if (x.layout == Layout::NHWC) t.unsupported(n, "on a channels-last tensor");
  const bool upsample = n.op_type() == "Upsample";
  const std::string mode = t.text(n, "mode", "nearest");
  const std::string coords = t.text(n, "coordinate_transformation_mode", upsample ? "asymmetric" : "half_pixel");
  if (mode != "nearest" && mode != "linear" && mode != "bilinear") t.unsupported(n, fmt::format("mode {}", mode));
  const bool linear = mode != "nearest";
  if (linear && coords != "half_pixel" && coords != "pytorch_half_pixel")
    t.unsupported(n, fmt::format("mode linear with coordinate_transformation_mode {} (half_pixel: align_corners "
                                 "False)",
                                 coords));
  if (!linear && (coords != "asymmetric" || t.text(n, "nearest_mode", upsample ? "floor" : "round_prefer_floor") != "floor"))
    t.unsupported(n, fmt::format("mode nearest with coordinate_transformation_mode {} and nearest_mode {} (asymmetric, "
                                 "floor: torch's nearest)",
                                 coords, t.text(n, "nearest_mode", "round_prefer_floor")));
  const int64_t h = x.layout == Layout::Vector ? 1 : x.dims[2], w = x.layout == Layout::Vector ? 1 : x.dims[3];
  int64_t oh = 0, ow = 0;
  const int sizes_at = 3, scales_at = upsample ? 1 : (t.opset() <= 10 ? 1 : 2);
  if (t.has_input(n, sizes_at) && !t.constant(n, sizes_at).values.empty()) {
    const Constant& s = t.constant(n, sizes_at);
    if (s.values.size() != 4) t.unsupported(n, fmt::format("sizes of {} values", s.values.size()));
    oh = int64_t(s.values[2]);
    ow = int64_t(s.values[3]);
  } else if (t.has_input(n, scales_at)) {
    const Constant& s = t.constant(n, scales_at);
    if (s.values.size() != 4 || s.values[0] != 1 || s.values[1] != 1)
      t.unsupported(n, fmt::format("scales [{}] (1 on N and C)", fmt::join(s.values, ", ")));
    oh = int64_t(std::floor(double(h) * s.values[2]));
    ow = int64_t(std::floor(double(w) * s.values[3]));
  } else {
    t.unsupported(n, "has neither constant scales nor sizes");
  }
  if (oh < 1 || ow < 1 || oh > kMaxExtent || ow > kMaxExtent)
    t.unsupported(n, fmt::format("resizes {}x{} to {}x{}", h, w, oh, ow));
  const std::string interpolation = linear ? "bilinear" : "nearest";
  Value y = oh % h == 0 && ow % w == 0
                ? t.add_layer(n, "upsampling2d",
                              {{"size", std::vector<int64_t>{oh / h, ow / w}}, {"interpolation", interpolation}}, {&x})
                : t.add_layer(n, "resize", {{"size", std::vector<int64_t>{oh, ow}}, {"interpolation", interpolation}},
                              {&x});
  t.bind(n.output(0), y);
}

// Pad of zeros: zero_padding2d (negative pads crop); pads [n0, c0, h0, w0, n1, c1, h1, w1].
void pad(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  const std::string mode = t.text(n, "mode", "constant");
  if (mode != "constant") t.unsupported(n, fmt::format("mode {} (constant zero)", mode));
  std::vector<int64_t> p = t.ints(n, "pads");
  if (p.empty())
    for (double v : t.constant(n, 1).values) p.push_back(int64_t(v));
  if (t.has_input(n, 2) && std::any_of(t.constant(n, 2).values.begin(), t.constant(n, 2).values.end(),
                                       [](double v) { return v != 0; }))
    t.unsupported(n, "a constant value other than 0");
  if (t.has_input(n, 3)) t.unsupported(n, "axes (pads of all four dimensions)");
  if (std::all_of(p.begin(), p.end(), [](int64_t v) { return v == 0; })) return t.bind(n.output(0), x);
  require_map(t, n, x);
  if (p.size() != 8 || p[0] || p[1] || p[4] || p[5]) t.unsupported(n, fmt::format("pads {} (H and W only)", show(p)));
  const std::vector<int64_t> margins = {p[2], p[6], p[3], p[7]};
  std::vector<int64_t> grow(4), shrink(4);
  for (int i = 0; i < 4; ++i) {
    grow[i] = std::max<int64_t>(margins[i], 0);
    shrink[i] = std::max<int64_t>(-margins[i], 0);
  }
  Value y = x;
  if (std::any_of(grow.begin(), grow.end(), [](int64_t v) { return v > 0; }))
    y = t.add_layer(n, "zero_padding2d", {{"padding", grow}}, {&y});
  if (std::any_of(shrink.begin(), shrink.end(), [](int64_t v) { return v > 0; }))
    y = t.add_layer(n, "cropping2d", {{"cropping", shrink}}, {&y});
  t.bind(n.output(0), y);
}

}  // namespace

void add_window_ops(std::map<std::string, OpHandler>& table) {
  table.insert({{"Conv", conv},
                {"ConvTranspose", conv_transpose},
                {"MaxPool", pool},
                {"AveragePool", pool},
                {"GlobalAveragePool", global_pool},
                {"GlobalMaxPool", global_pool},
                {"ReduceMean", reduce},
                {"ReduceMax", reduce},
                {"Resize", resize},
                {"Upsample", resize},
                {"Pad", pad}});
}

}  // namespace ht::onnx_import
