// The ONNX ops halotrain reads pixel by pixel: normalisations, activations, joins,
// products, dense layers (Gemm, MatMul, also on channels-last maps as 1x1 convs), the
// shape ops that only relabel a tensor, channel slices; and the table of every op.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "importer/onnx_ops.hpp"

namespace ht::onnx_import {

namespace {

Value layer_on(Translator& t, const onnx::NodeProto& n, const std::string& type, const Value& x,
               const std::vector<std::pair<std::string, LayerValue>>& keys = {},
               const std::vector<Translator::Weight>& weights = {}) {
  return same_layout(x, t.add_layer(n, type, keys, {&x}, weights));
}

void batch_norm(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  const Constant &scale = t.constant(n, 1), &b = t.constant(n, 2), &mean = t.constant(n, 3), &var = t.constant(n, 4);
  const int64_t c = int64_t(scale.values.size());
  // Training-mode exports add the running statistics (and before opset 14 the saved ones)
  // as outputs; only Y is read.
  t.bind(n.output(0), layer_on(t, n, "batch_norm", x,
                               {{"momentum", t.real(n, "momentum", 0.9f)}, {"epsilon", t.real(n, "epsilon", 1e-5f)}},
                               {{"gamma:0", {c}, floats(scale)},
                                {"beta:0", {c}, floats(b)},
                                {"moving_mean:0", {c}, floats(mean)},
                                {"moving_variance:0", {c}, floats(var)}}));
}

// torch's InstanceNorm2d(affine=False) and GroupNorm exports write fixed ones and zeros
// that are no parameters: a Constant node or an unnamed initializer.
bool fixed_affine(const onnx::NodeProto& n, const Constant& scale, const Constant& bias) {
  const bool ones = std::all_of(scale.values.begin(), scale.values.end(), [](double v) { return v == 1; });
  const bool zeros = std::all_of(bias.values.begin(), bias.values.end(), [](double v) { return v == 0; });
  auto unnamed = [](const std::string& s) { return s.rfind("onnx::", 0) == 0 || s.find("Constant") != std::string::npos; };
  return ones && zeros && unnamed(n.input(1)) && unnamed(n.input(2));
}

void instance_norm(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  const Constant &scale = t.constant(n, 1), &bias = t.constant(n, 2);
  const int64_t c = int64_t(scale.values.size());
  const bool affine = !fixed_affine(n, scale, bias);
  std::vector<Translator::Weight> w;
  if (affine) w = {{"gamma:0", {c}, floats(scale)}, {"beta:0", {c}, floats(bias)}};
  t.bind(n.output(0), layer_on(t, n, "instance_norm", x,
                               {{"epsilon", t.real(n, "epsilon", 1e-5f)}, {"center", affine}, {"scale", affine}}, w));
}

// GroupNormalization: opset 18's scale and bias are per group, 21's per channel.
void group_norm(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  const int64_t groups = t.integer(n, "num_groups", 0), c = t.shape_of(x).c;
  if (groups < 1 || c % groups) t.unsupported(n, fmt::format("num_groups {} for {} channels", groups, c));
  std::vector<Translator::Weight> w;
  const char* names[2] = {"gamma:0", "beta:0"};
  for (int k = 0; k < 2; ++k) {
    const Constant& v = t.constant(n, 1 + k);
    std::vector<float> per_channel(static_cast<size_t>(c));
    if (int64_t(v.values.size()) == c)
      per_channel = floats(v);
    else if (int64_t(v.values.size()) == groups)
      for (int64_t ch = 0; ch < c; ++ch) per_channel[size_t(ch)] = float(v.values[size_t(ch / (c / groups))]);
    else
      t.unsupported(n, fmt::format("input {} of {} values (one per group or per channel)", 1 + k, v.values.size()));
    w.push_back({names[k], {c}, per_channel});
  }
  t.bind(n.output(0), layer_on(t, n, "group_norm", x, {{"groups", groups}, {"epsilon", t.real(n, "epsilon", 1e-5f)}}, w));
}

// LayerNormalization (opset 17) over the channels of each pixel: a channels-last map or a
// vector, normalised along its last axis.
void layer_norm(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  const int64_t axis = t.integer(n, "axis", -1), rank = int64_t(x.dims.size());
  const bool channels = x.layout == Layout::NHWC ? (axis == -1 || axis == 3) : (x.layout == Layout::Vector && (axis == -1 || axis == 1) && rank == 2);
  if (!channels)
    t.unsupported(n, fmt::format("axis {} of a tensor of shape {} (only over the channels of each pixel)", axis,
                                 show(x.dims)));
  const int64_t c = t.shape_of(x).c;
  std::vector<Translator::Weight> w = {{"gamma:0", {c}, floats(t.constant(n, 1))}};
  if (t.has_input(n, 2)) w.push_back({"beta:0", {c}, floats(t.constant(n, 2))});
  t.bind(n.output(0), layer_on(t, n, "layer_norm", x,
                               {{"epsilon", t.real(n, "epsilon", 1e-5f)}, {"center", t.has_input(n, 2)}}, w));
}

void activation(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  const std::string& op = n.op_type();
  if (op == "Sigmoid" && t.final_node(n)) return t.bind(n.output(0), t.fold(LossType::SigmoidBCE, n, x));
  if (op == "Relu") return t.bind(n.output(0), layer_on(t, n, "relu", x));
  if (op == "Tanh") return t.bind(n.output(0), layer_on(t, n, "tanh", x));
  if (op == "Sigmoid") return t.bind(n.output(0), layer_on(t, n, "sigmoid", x));
  if (op == "HardSwish") return t.bind(n.output(0), layer_on(t, n, "hard_swish", x));
  if (op == "LeakyRelu") return t.bind(n.output(0), layer_on(t, n, "leaky_relu", x, {{"alpha", t.real(n, "alpha", 0.01f)}}));
  // HardSigmoid's defaults are ONNX's (alpha 0.2, beta 0.5); torch exports 1/6.
  t.bind(n.output(0), layer_on(t, n, "hard_sigmoid", x,
                               {{"alpha", t.real(n, "alpha", 0.2f)}, {"beta", t.real(n, "beta", 0.5f)}}));
}

// Clip: bounds as attributes before opset 11, as (optional) inputs from 11 on.
void clip(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  double lo = -INFINITY, hi = INFINITY;
  if (t.attr(n, "min")) lo = t.real(n, "min", 0);
  if (t.attr(n, "max")) hi = t.real(n, "max", 0);
  if (t.has_input(n, 1)) lo = t.constant(n, 1).values.at(0);
  if (t.has_input(n, 2)) hi = t.constant(n, 2).values.at(0);
  if (lo == 0 && hi == 6) return t.bind(n.output(0), layer_on(t, n, "relu6", x));
  if (lo == 0 && std::isinf(hi)) return t.bind(n.output(0), layer_on(t, n, "relu", x));
  if (std::isinf(lo) || std::isinf(hi)) t.unsupported(n, "with one bound only (halotrain's clip takes min and max)");
  t.bind(n.output(0), layer_on(t, n, "clip", x, {{"min", std::stod(fmt::format("{}", float(lo)))},
                                                 {"max", std::stod(fmt::format("{}", float(hi)))}}));
}

void softmax(Translator& t, const onnx::NodeProto& n) {
  if (!t.final_node(n)) t.unsupported(n, "before the output (a Softmax is folded into the loss only at the output)");
  t.bind(n.output(0), t.fold(LossType::SoftmaxCrossEntropy, n, t.value_in(n, 0)));
}

void dropout(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  double ratio = t.real(n, "ratio", 0.5f);
  if (t.has_input(n, 1)) ratio = t.constant(n, 1).values.at(0);
  if (ratio < 0 || ratio >= 1) t.unsupported(n, fmt::format("ratio {} (in [0, 1))", ratio));
  t.bind(n.output(0), ratio > 0 ? layer_on(t, n, "dropout", x, {{"rate", std::stod(fmt::format("{}", float(ratio)))}}) : x);
}

void identity(Translator& t, const onnx::NodeProto& n) { t.bind(n.output(0), t.value_in(n, 0)); }

// A constant per channel times a map: layer scale (ConvNeXt's gamma, [C, 1, 1] or, channels
// last, [C]).
bool channel_constant(Translator& t, const Value& x, const Constant& k) {
  const int64_t c = t.shape_of(x).c;
  if (int64_t(k.values.size()) != c || c == 1) return false;
  if (x.layout == Layout::NHWC) return k.dims.back() == c;
  return k.dims.size() >= 3 && k.dims[k.dims.size() - 3] == c;
}

void mul(Translator& t, const onnx::NodeProto& n) {
  const std::vector<const Value*> xs = t.values_in(n);
  if (xs.size() == 2) {
    const bool a_vector = xs[0]->layout == Layout::Vector, b_vector = xs[1]->layout == Layout::Vector;
    Value y = t.add_layer(n, "multiply", {}, xs);
    return t.bind(n.output(0), same_layout(a_vector && !b_vector ? *xs[1] : *xs[0], y));
  }
  const int k = t.is_constant(n.input(0)) ? 0 : 1;
  const Constant& c = t.constant(n, k);
  const Value& x = *xs[0];
  if (!channel_constant(t, x, c))
    t.unsupported(n, fmt::format("multiplies a tensor of shape {} by a constant of shape {} (halotrain's scale takes "
                                 "one factor per channel)",
                                 show(x.dims), show(c.dims)));
  t.bind(n.output(0), layer_on(t, n, "scale", x, {}, {{"gamma:0", {t.shape_of(x).c}, floats(c)}}));
}

void add(Translator& t, const onnx::NodeProto& n) {
  const std::vector<const Value*> xs = t.values_in(n);
  if (xs.size() >= 2) return t.bind(n.output(0), same_layout(*xs[0], t.add_layer(n, "add", {}, xs)));
  // A constant added to a MatMul's (or Gemm's) output: its bias, when nothing else reads it.
  const Value& x = *xs[0];
  const Constant& b = t.constant(n, t.is_constant(n.input(0)) ? 0 : 1);
  const std::string& from = t.is_constant(n.input(0)) ? n.input(1) : n.input(0);
  ImportedWeights* w = t.weights_of(x);
  auto bias = w ? std::find(w->names.begin(), w->names.end(), "bias:0") : std::vector<std::string>::iterator{};
  if (!w || bias == w->names.end() || t.readers(from) != 1 || !t.from_matmul(x.layer) ||
      w->values[size_t(bias - w->names.begin())].size() != b.values.size())
    t.unsupported(n, fmt::format("adds a constant of shape {} to something other than the output of a MatMul or "
                                 "Gemm with as many units",
                                 show(b.dims)));
  std::vector<float>& v = w->values[size_t(bias - w->names.begin())];
  for (size_t i = 0; i < v.size(); ++i) v[i] += float(b.values[i]);
  t.bind(n.output(0), x);
}

void concat(Translator& t, const onnx::NodeProto& n) {
  const std::vector<const Value*> xs = t.values_in(n);
  if (int(xs.size()) != n.input_size()) t.unsupported(n, "joins a constant to a feature map");
  if (xs.size() == 1) return t.bind(n.output(0), *xs[0]);  // DenseNet's first layer: a Concat of one input
  const int64_t axis = t.integer(n, "axis", 1), rank = int64_t(xs[0]->dims.size());
  const bool channels = xs[0]->layout == Layout::NHWC ? (axis == 3 || axis == -1) : (axis == 1 || axis == 1 - rank);
  if (!channels) t.unsupported(n, fmt::format("axis {} (the channels)", axis));
  t.bind(n.output(0), same_layout(*xs[0], t.add_layer(n, "concatenate", {}, xs)));
}

// Keras (in, units) rows of a (units, in) or (in, units) ONNX weight, for an input whose
// features ONNX orders (c, h, w) and halotrain (h, w, c) after a flatten.
std::vector<float> dense_kernel(const Constant& w, bool transposed, const Shape3& flattened) {
  const int64_t in = transposed ? w.dims[1] : w.dims[0], units = transposed ? w.dims[0] : w.dims[1];
  std::vector<float> k(w.values.size());
  const int64_t hw = int64_t(flattened.h) * flattened.w;
  for (int64_t i = 0; i < in; ++i) {
    // halotrain's feature i = (h * W + w) * C + c is ONNX's feature c * H * W + h * W + w.
    const int64_t j = flattened.c > 0 ? (i % flattened.c) * hw + i / flattened.c : i;
    for (int64_t u = 0; u < units; ++u)
      k[size_t(i * units + u)] = float(transposed ? w.values[size_t(u * in + j)] : w.values[size_t(j * units + u)]);
  }
  return k;
}

// Gemm and MatMul with a constant weight: a dense layer on a vector, a 1x1 conv on a
// channels-last map (ConvNeXt's Linear layers). The bias is Gemm's C or the next Add.
void matmul(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  const Constant& w = t.constant(n, 1);
  const bool gemm = n.op_type() == "Gemm";
  if (gemm && (t.real(n, "alpha", 1) != 1 || t.real(n, "beta", 1) != 1 || t.integer(n, "transA", 0) != 0))
    t.unsupported(n, "alpha, beta or transA other than 1, 1, 0");
  const bool transposed = gemm && t.integer(n, "transB", 0) != 0;
  if (w.dims.size() != 2) t.unsupported(n, fmt::format("has a weight of shape {}; expected 2-D", show(w.dims)));
  const int64_t in = transposed ? w.dims[1] : w.dims[0], units = transposed ? w.dims[0] : w.dims[1];
  if (in != t.shape_of(x).c) t.unsupported(n, fmt::format("has a weight of {} inputs for {} features", in, t.shape_of(x).c));
  std::vector<float> bias(size_t(units), 0.f);
  if (gemm && t.has_input(n, 2)) bias = floats(t.constant(n, 2));
  if (int64_t(bias.size()) != units) t.unsupported(n, fmt::format("has a bias of {} values for {} units", bias.size(), units));
  const std::vector<float> kernel = dense_kernel(w, transposed, x.flattened);
  Value y;
  if (x.layout == Layout::NHWC)
    y = same_layout(x, t.add_layer(n, "conv2d", {{"filters", units}, {"kernel", int64_t(1)}},
                                   {&x}, {{"kernel:0", {1, 1, in, units}, kernel}, {"bias:0", {units}, bias}}));
  else if (x.layout == Layout::Vector)
    y = t.add_layer(n, "dense", {{"units", units}}, {&x}, {{"kernel:0", {in, units}, kernel}, {"bias:0", {units}, bias}});
  else
    t.unsupported(n, fmt::format("on an NCHW map of shape {} (a dense layer reads a vector or a channels-last map)",
                                 show(x.dims)));
  t.note_matmul(y.layer);
  t.bind(n.output(0), y);
}

// Flatten (axis 1): nothing after a global pool; a 1x1 map's global average (said in the
// config); a larger map gathered as a vector in Keras's order, which the dense layer after
// it reads in ONNX's by permuting its rows.
void flatten(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  if (t.integer(n, "axis", 1) != 1) t.unsupported(n, fmt::format("axis {} (1)", t.integer(n, "axis", 1)));
  if (x.layout == Layout::Vector) {
    Value y = x;
    y.dims = {x.dims[0], t.shape_of(x).c};
    return t.bind(n.output(0), y);
  }
  if (x.layout != Layout::NCHW) t.unsupported(n, "of a channels-last tensor");
  const Shape3 s = t.shape_of(x);
  if (s.h == 1 && s.w == 1) {
    Value y = t.add_layer(n, "global_avg_pool", {}, {&x});
    t.note(fmt::format("Flatten '{}' of a 1x1 map became a global_avg_pool (the same at this input size; at a "
                       "larger one it averages the map instead of refusing its size)",
                       n.name()));
    return t.bind(n.output(0), y);
  }
  Value y = t.add_layer(n, "flatten", {}, {&x});
  y.flattened = s;
  t.bind(n.output(0), y);
}

// Reshape, Squeeze, Unsqueeze: a vector in another rank ([N, C] <-> [N, C, 1, 1]), or a map
// flattened ([N, -1]).
void reshape(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  std::vector<int64_t> to;
  const std::string& op = n.op_type();
  if (op == "Reshape") {
    const Constant& shape = t.constant(n, 1);
    for (size_t d = 0; d < shape.values.size(); ++d) to.push_back(shape.values[d] == 0 ? x.dims.at(d) : int64_t(shape.values[d]));
  }
  const int64_t c = t.shape_of(x).c;
  const bool vector_form = op != "Reshape" || to == std::vector<int64_t>{x.dims[0], c} ||
                           to == std::vector<int64_t>{x.dims[0], -1} || to == std::vector<int64_t>{x.dims[0], c, 1, 1};
  if (x.layout == Layout::Vector && vector_form) {
    Value y = x;
    if (op == "Reshape") y.dims = {x.dims[0], c};
    if (op == "Reshape" && to.size() == 4) y.dims = {x.dims[0], c, 1, 1};
    if (op == "Squeeze") y.dims = {x.dims[0], c};
    if (op == "Unsqueeze") y.dims = {x.dims[0], c, 1, 1};
    return t.bind(n.output(0), y);
  }
  if (op == "Reshape" && x.layout == Layout::NCHW && to.size() == 2 && to[0] == x.dims[0]) return flatten(t, n);
  t.unsupported(n, fmt::format("turns a tensor of shape {} into {} (halotrain reshapes channel vectors, flattens maps "
                               "and shuffles channels)",
                               show(x.dims), show(to)));
}

// Transpose between NCHW and channels-last: the same halotrain tensor, read the other way
// (a [N, C, 1, 1] channel vector too: ConvNeXt's head normalises it channels-last).
void transpose(Translator& t, const onnx::NodeProto& n) {
  Value y = t.value_in(n, 0);
  const std::vector<int64_t> perm = t.ints(n, "perm");
  const bool nchw = y.layout == Layout::NCHW || (y.layout == Layout::Vector && y.dims.size() == 4);
  if (nchw && perm == std::vector<int64_t>{0, 2, 3, 1}) {
    y.layout = Layout::NHWC;
    y.dims = {y.dims[0], y.dims[2], y.dims[3], y.dims[1]};
  } else if (y.layout == Layout::NHWC && perm == std::vector<int64_t>{0, 3, 1, 2}) {
    y.layout = t.is_map(y) ? Layout::NCHW : Layout::Vector;
    y.dims = {y.dims[0], y.dims[3], y.dims[1], y.dims[2]};
  } else {
    t.unsupported(n, fmt::format("perm {} of a tensor of shape {} (NCHW <-> NHWC only)", show(perm), show(y.dims)));
  }
  t.bind(n.output(0), y);
}

void slice_channels(Translator& t, const onnx::NodeProto& n, const Value& x, int64_t start, int64_t count,
                    const std::string& output) {
  Value y = t.add_layer(n, "channel_slice", {{"start", start}, {"channels", count}}, {&x});
  t.bind(output, same_layout(x, y));
}

// Slice along the channels (a ShuffleNet split), starts and ends constant, step 1.
void slice(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  const Constant &starts = t.constant(n, 1), &ends = t.constant(n, 2);
  const int64_t rank = int64_t(x.dims.size()), c = t.shape_of(x).c;
  const int64_t channel_axis = x.layout == Layout::NHWC ? 3 : 1;
  int64_t axis = t.has_input(n, 3) ? int64_t(t.constant(n, 3).values.at(0)) : 0;
  if (axis < 0) axis += rank;
  if (starts.values.size() != 1 || axis != channel_axis || (t.has_input(n, 4) && t.constant(n, 4).values.at(0) != 1))
    t.unsupported(n, "other than one slice of the channels with step 1");
  const int64_t lo = std::clamp<int64_t>(int64_t(starts.values[0]) < 0 ? int64_t(starts.values[0]) + c : int64_t(starts.values[0]), 0, c);
  const double e = ends.values[0];
  const int64_t hi = std::clamp<int64_t>(e >= 9.2e18 ? c : (e < 0 ? int64_t(e) + c : int64_t(e)), 0, c);
  if (hi <= lo) t.unsupported(n, fmt::format("slices channels [{}, {}) of {}", lo, hi, c));
  slice_channels(t, n, x, lo, hi - lo, n.output(0));
}

// Split along the channels: one channel_slice per output (sizes from the attribute before
// opset 13, the input from 13, equal parts otherwise).
void split(Translator& t, const onnx::NodeProto& n) {
  const Value& x = t.value_in(n, 0);
  const int64_t rank = int64_t(x.dims.size()), c = t.shape_of(x).c;
  int64_t axis = t.integer(n, "axis", 0);
  if (axis < 0) axis += rank;
  if (axis != (x.layout == Layout::NHWC ? 3 : 1)) t.unsupported(n, fmt::format("axis {} (the channels)", axis));
  std::vector<int64_t> sizes = t.ints(n, "split");
  if (sizes.empty() && t.has_input(n, 1))
    for (double v : t.constant(n, 1).values) sizes.push_back(int64_t(v));
  if (sizes.empty()) sizes.assign(size_t(n.output_size()), (c + n.output_size() - 1) / n.output_size());
  int64_t start = 0;
  for (int k = 0; k < n.output_size(); ++k) {
    const int64_t count = std::min(sizes.at(size_t(k)), c - start);
    if (count < 1) t.unsupported(n, fmt::format("splits {} channels into {}", c, show(sizes)));
    slice_channels(t, n, x, start, count, n.output(k));
    start += count;
  }
}

}  // namespace

void add_pixel_ops(std::map<std::string, OpHandler>& table) {
  table.insert({{"BatchNormalization", batch_norm},
                {"InstanceNormalization", instance_norm},
                {"GroupNormalization", group_norm},
                {"LayerNormalization", layer_norm},
                {"Relu", activation},
                {"Tanh", activation},
                {"Sigmoid", activation},
                {"LeakyRelu", activation},
                {"HardSigmoid", activation},
                {"HardSwish", activation},
                {"Clip", clip},
                {"Softmax", softmax},
                {"LogSoftmax", softmax},
                {"Dropout", dropout},
                {"Identity", identity},
                {"Cast", identity},
                {"Mul", mul},
                {"Add", add},
                {"Sum", add},
                {"Concat", concat},
                {"Gemm", matmul},
                {"MatMul", matmul},
                {"Flatten", flatten},
                {"Reshape", reshape},
                {"Squeeze", reshape},
                {"Unsqueeze", reshape},
                {"Transpose", transpose},
                {"Slice", slice},
                {"Split", split}});
}

OpHandler op_handler(const std::string& op) {
  static const std::map<std::string, OpHandler> table = [] {
    std::map<std::string, OpHandler> t;
    add_window_ops(t);
    add_pixel_ops(t);
    return t;
  }();
  auto it = table.find(op);
  return it == table.end() ? nullptr : it->second;
}

const std::vector<std::string>& supported_ops() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    std::map<std::string, OpHandler> t;
    add_window_ops(t);
    add_pixel_ops(t);
    for (const auto& [name, handler] : t) v.push_back(name);
    v.push_back("the subgraphs of SiLU, HardSwish, GELU, LayerNorm, GroupNorm and channel shuffle");
    return v;
  }();
  return names;
}

}  // namespace ht::onnx_import
