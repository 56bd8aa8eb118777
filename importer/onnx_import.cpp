// ONNX models (torch.onnx.export, tf2onnx) as halotrain layers, with Debian's libonnx
// protobuf classes. NCHW tensors throughout; weights become Keras layouts.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include <onnx/onnx_pb.h>

#include "importer/keras_import.hpp"
#include "orchestrator/layer_kind.hpp"

namespace ht {

namespace {

const std::vector<std::string> kOps = {
    "Conv (group 1 or depthwise)", "ConvTranspose", "BatchNormalization", "Relu", "LeakyRelu", "Sigmoid", "Tanh",
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Flatten + Gemm or MatMul + Add", "Add",
    "Concat (axis 1)", "Resize / Upsample (nearest, linear half-pixel)", "Pad (constant zero)", "Dropout",
    "Identity", "Softmax / Sigmoid at the output"};

// A tensor's values as float, from raw_data or the typed fields.
std::vector<float> values_of(const onnx::TensorProto& t) {
  std::vector<float> out;
  const std::string& raw = t.raw_data();
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      if (!raw.empty()) {
        out.resize(raw.size() / 4);
        std::memcpy(out.data(), raw.data(), out.size() * 4);
      } else {
        out.assign(t.float_data().begin(), t.float_data().end());
      }
      break;
    case onnx::TensorProto::DOUBLE:
      if (!raw.empty()) {
        std::vector<double> d(raw.size() / 8);
        std::memcpy(d.data(), raw.data(), d.size() * 8);
        out.assign(d.begin(), d.end());
      } else {
        out.assign(t.double_data().begin(), t.double_data().end());
      }
      break;
    case onnx::TensorProto::INT64:
      if (!raw.empty()) {
        std::vector<int64_t> d(raw.size() / 8);
        std::memcpy(d.data(), raw.data(), d.size() * 8);
        out.assign(d.begin(), d.end());
      } else {
        out.assign(t.int64_data().begin(), t.int64_data().end());
      }
      break;
    default:
      throw ConfigError(fmt::format("initializer '{}' has data type {}; expected float, double or int64", t.name(),
                                    t.data_type()));
  }
  return out;
}

struct Constant {
  std::vector<int64_t> dims;
  std::vector<float> values;
};

class OnnxTranslator {
 public:
  explicit OnnxTranslator(std::string source) { out_.source = std::move(source); }

  ImportedModel run(const onnx::ModelProto& model) {
    const onnx::GraphProto& g = model.graph();
    out_.name = sanitize(g.name());
    for (const onnx::TensorProto& t : g.initializer())
      constants_[t.name()] = {{t.dims().begin(), t.dims().end()}, values_of(t)};
    for (const onnx::ValueInfoProto& in : g.input()) {
      if (constants_.count(in.name())) continue;  // older exporters list initializers as inputs
      if (has_input_) fail(fmt::format("the graph has more than one input ('{}' too); halotrain trains one image", in.name()));
      input(in);
    }
    if (!has_input_) fail("the graph has no input");
    if (g.output_size() != 1) fail(fmt::format("the graph has {} outputs; halotrain trains models with one", g.output_size()));
    output_ = g.output(0).name();
    int index = 0;
    for (const onnx::NodeProto& n : g.node()) translate(n, index++);
    const std::string last = tensor(output_);
    if (last == kInputName) fail("the graph's output is its input");
    auto it = std::find_if(out_.model.layers.begin(), out_.model.layers.end(),
                           [&](const LayerConfig& c) { return c.name == last; });
    out_.model.layers.erase(it + 1, out_.model.layers.end());
    if (!loss_set_) default_loss();
    out_.has_weights = !out_.weights.empty();
    return std::move(out_);
  }
  const std::vector<std::string>& flattens() const { return flattens_; }

 private:
  // PyTorch models end in raw scores: logits of a cross-entropy (several classes, per
  // image or per pixel) or of a BCE (one); anything else trains with mse.
  void default_loss() {
    const LayerConfig& last = out_.model.layers.back();
    const LayerValue* v = last.find(last.type() == "dense" ? "units" : "filters");
    const int64_t outputs = v && std::holds_alternative<int64_t>(*v) ? std::get<int64_t>(*v) : 0;
    out_.model.loss = outputs >= 2 ? LossType::SoftmaxCrossEntropy : outputs == 1 ? LossType::SigmoidBCE : LossType::MSE;
    out_.notes.push_back(fmt::format("the output '{}' has no Softmax or Sigmoid: model.loss {} on its raw values (edit "
                                     "it)",
                                     last.name, to_string(out_.model.loss)));
  }

  [[noreturn]] void fail(const std::string& why) const { throw ConfigError(fmt::format("{}: {}", out_.source, why)); }
  [[noreturn]] void unsupported(const onnx::NodeProto& n, const std::string& what) const {
    fail(fmt::format("{} node '{}' {}; halotrain imports {}", n.op_type(), n.name(), what, fmt::join(kOps, ", ")));
  }

  static std::string sanitize(const std::string& s) {
    std::string out;
    for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ? c : '_';
    while (!out.empty() && (out[0] == '_' || out[0] == '.')) out.erase(0, 1);
    return out;
  }

  void input(const onnx::ValueInfoProto& in) {
    const auto& shape = in.type().tensor_type().shape();
    auto fixed = [&](int i) { return shape.dim(i).has_dim_value() ? shape.dim(i).dim_value() : int64_t(-1); };
    if (shape.dim_size() != 4 || fixed(1) < 1 || fixed(2) < 1 || fixed(3) < 1)
      fail(fmt::format("input '{}' must be [N, C, H, W] with C, H and W fixed", in.name()));
    out_.model.channels = int(fixed(1));
    out_.model.height = int(fixed(2));
    out_.model.width = int(fixed(3));
    tensors_[in.name()] = kInputName;
    has_input_ = true;
  }

  std::string tensor(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) fail(fmt::format("tensor '{}' is read before any node makes it", name));
    return it->second;
  }
  bool is_constant(const std::string& name) const { return constants_.count(name) > 0; }
  const Constant& constant(const onnx::NodeProto& n, size_t input) const {
    if (int(input) >= n.input_size() || !is_constant(n.input(int(input))))
      unsupported(n, fmt::format("input {} is not a constant", input));
    return constants_.at(n.input(int(input)));
  }

  const onnx::AttributeProto* attr(const onnx::NodeProto& n, const std::string& name) const {
    for (const onnx::AttributeProto& a : n.attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  std::vector<int64_t> ints(const onnx::NodeProto& n, const std::string& name, std::vector<int64_t> def = {}) const {
    const onnx::AttributeProto* a = attr(n, name);
    return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : def;
  }
  int64_t integer(const onnx::NodeProto& n, const std::string& name, int64_t def) const {
    const onnx::AttributeProto* a = attr(n, name);
    return a ? a->i() : def;
  }
  // A float attribute as the shortest decimal that reads back as it (0.9, not 0.8999999761).
  double real(const onnx::NodeProto& n, const std::string& name, float def) const {
    const onnx::AttributeProto* a = attr(n, name);
    return std::stod(fmt::format("{}", a ? a->f() : def));
  }
  std::string text(const onnx::NodeProto& n, const std::string& name, const std::string& def) const {
    const onnx::AttributeProto* a = attr(n, name);
    return a ? a->s() : def;
  }
  static std::string show(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }

  // A square pair [a, a] (or empty: `def`).
  int64_t square(const onnx::NodeProto& n, const std::string& name, int64_t def) const {
    const std::vector<int64_t> v = ints(n, name);
    if (v.empty()) return def;
    if (v.size() != 2 || v[0] != v[1]) unsupported(n, fmt::format("{} {}: halotrain's windows are square", name, show(v)));
    return v[0];
  }
  // Symmetric pads [t, l, b, r] with t == b == l == r, as halotrain's explicit padding.
  int64_t symmetric_pad(const onnx::NodeProto& n) const {
    const std::vector<int64_t> p = ints(n, "pads", {0, 0, 0, 0});
    const std::string auto_pad = text(n, "auto_pad", "NOTSET");
    if (auto_pad != "NOTSET" && auto_pad != "VALID") unsupported(n, fmt::format("auto_pad {}", auto_pad));
    if (p.size() != 4 || p[0] != p[1] || p[0] != p[2] || p[0] != p[3])
      unsupported(n, fmt::format("pads {} (the same on every side)", show(p)));
    return p[0];
  }

  std::string name_for(const onnx::NodeProto& n, int index) {
    std::string base = sanitize(n.name());
    if (base.empty()) base = sanitize(n.op_type()) + "_" + std::to_string(index);
    std::string name = base;
    for (int k = 2; taken_.count(name) || name == kInputName; ++k) name = base + "_" + std::to_string(k);
    taken_.insert(name);
    return name;
  }
  std::string add(LayerConfig c, const std::vector<std::string>& inputs) {
    return append_layer(out_.model, std::move(c), inputs);
  }
  static LayerConfig layer(const std::string& type, const std::string& name,
                           const std::vector<std::pair<std::string, LayerValue>>& values = {}) {
    return imported_layer(type, name, values);
  }
  void weights(const std::string& layer, std::vector<std::string> names, std::vector<std::vector<int64_t>> shapes,
               std::vector<std::vector<float>> values) {
    out_.weighted_layers.push_back(layer);
    out_.weights.push_back({layer, std::move(names), std::move(shapes), std::move(values)});
  }
  // OIHW [o][i][kh][kw] -> Keras (kh, kw, i, o).
  static std::vector<float> oihw_to_keras(const std::vector<float>& w, int64_t o, int64_t i, int64_t kh, int64_t kw) {
    std::vector<float> k(w.size());
    for (int64_t a = 0; a < o; ++a)
      for (int64_t b = 0; b < i; ++b)
        for (int64_t y = 0; y < kh; ++y)
          for (int64_t x = 0; x < kw; ++x) k[((y * kw + x) * i + b) * o + a] = w[((a * i + b) * kh + y) * kw + x];
    return k;
  }

  bool final_node(const onnx::NodeProto& n) const { return n.output_size() == 1 && n.output(0) == output_; }
  std::string fold(LossType loss, const onnx::NodeProto& n, const std::string& from) {
    out_.model.loss = loss;
    loss_set_ = true;
    out_.notes.push_back(fmt::format("the final {} node '{}' is folded into model.loss {}", n.op_type(), n.name(),
                                     to_string(loss)));
    return from;
  }

  static int64_t count(const std::vector<int64_t>& dims) {
    int64_t c = 1;
    for (int64_t d : dims) c *= d;
    return c;
  }
  static std::vector<int64_t> strides_of(const std::vector<int64_t>& dims) {
    std::vector<int64_t> s(dims.size(), 1);
    for (int i = int(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
    return s;
  }
  // Calls f(multi-index) for every element of `dims` in row-major order.
  template <class F>
  static void each_index(const std::vector<int64_t>& dims, F f) {
    std::vector<int64_t> at(dims.size(), 0);
    for (int64_t e = 0, n = count(dims); e < n; ++e) {
      f(at);
      for (int d = int(dims.size()) - 1; d >= 0; --d) {
        if (++at[d] < dims[d]) break;
        at[d] = 0;
      }
    }
  }
  static int64_t axis_of(int64_t axis, size_t rank) { return axis < 0 ? axis + int64_t(rank) : axis; }

  // Exporters compute operands (Pad's pads, Resize's scales) in small subgraphs of
  // constants: evaluates the ops those use. Returns false for any other node.
  bool evaluate_constant(const onnx::NodeProto& n) {
    const std::string& op = n.op_type();
    static const std::set<std::string> kEvaluable = {"Constant", "ConstantOfShape", "Concat", "Reshape", "Slice",
                                                     "Transpose", "Cast", "Unsqueeze", "Squeeze", "Gather",
                                                     "Mul", "Add", "Sub", "Div"};
    if (!kEvaluable.count(op)) return false;
    for (const std::string& in : n.input())
      if (!in.empty() && !is_constant(in)) return false;
    auto in = [&](int i) -> const Constant& { return constants_.at(n.input(i)); };
    Constant out;
    if (op == "Constant") {
      const onnx::AttributeProto* v = attr(n, "value");
      if (!v) unsupported(n, "has no tensor value");
      out = {{v->t().dims().begin(), v->t().dims().end()}, values_of(v->t())};
    } else if (op == "ConstantOfShape") {
      const onnx::AttributeProto* v = attr(n, "value");
      out.dims.assign(in(0).values.begin(), in(0).values.end());
      out.values.assign(size_t(count(out.dims)), v ? values_of(v->t()).at(0) : 0.f);
    } else if (op == "Cast") {
      out = in(0);
    } else if (op == "Concat") {
      const size_t rank = in(0).dims.size();
      const int64_t axis = axis_of(integer(n, "axis", 0), rank);
      out.dims = in(0).dims;
      out.dims[axis] = 0;
      for (int i = 0; i < n.input_size(); ++i) out.dims[axis] += in(i).dims[axis];
      out.values.resize(size_t(count(out.dims)));
      const std::vector<int64_t> so = strides_of(out.dims);
      int64_t offset = 0;
      for (int i = 0; i < n.input_size(); ++i) {
        const Constant& c = in(i);
        size_t e = 0;
        each_index(c.dims, [&](const std::vector<int64_t>& at) {
          int64_t o = 0;
          for (size_t d = 0; d < rank; ++d) o += (at[d] + (int64_t(d) == axis ? offset : 0)) * so[d];
          out.values[size_t(o)] = c.values[e++];
        });
        offset += c.dims[axis];
      }
    } else if (op == "Reshape") {
      out.values = in(0).values;
      const int64_t total = int64_t(out.values.size());
      int64_t known = 1, infer = -1;
      for (size_t d = 0; d < in(1).values.size(); ++d) {
        int64_t v = int64_t(in(1).values[d]);
        if (v == 0) v = in(0).dims.at(d);
        if (v == -1) infer = int64_t(d);
        else known *= v;
        out.dims.push_back(v);
      }
      if (infer >= 0) out.dims[infer] = known ? total / known : 0;
    } else if (op == "Transpose") {
      const Constant& c = in(0);
      std::vector<int64_t> perm = ints(n, "perm");
      if (perm.empty())
        for (int64_t d = int64_t(c.dims.size()) - 1; d >= 0; --d) perm.push_back(d);
      for (int64_t p : perm) out.dims.push_back(c.dims[p]);
      out.values.resize(c.values.size());
      const std::vector<int64_t> sc = strides_of(c.dims);
      size_t e = 0;
      each_index(out.dims, [&](const std::vector<int64_t>& at) {
        int64_t o = 0;
        for (size_t d = 0; d < perm.size(); ++d) o += at[d] * sc[perm[d]];
        out.values[e++] = c.values[size_t(o)];
      });
    } else if (op == "Slice") {
      const Constant& c = in(0);
      const size_t rank = c.dims.size();
      std::vector<int64_t> lo(rank, 0), step(rank, 1), hi = c.dims;
      const std::vector<float>& starts = in(1).values;
      for (size_t k = 0; k < starts.size(); ++k) {
        const int64_t axis = n.input_size() > 3 && !n.input(3).empty() ? axis_of(int64_t(in(3).values[k]), rank) : int64_t(k);
        const int64_t dim = c.dims[axis];
        int64_t s = n.input_size() > 4 && !n.input(4).empty() ? int64_t(in(4).values[k]) : 1;
        // ONNX's clamping: a start in [0, dim] ([0, dim - 1] stepping back), an end in
        // [0, dim] ([-1, dim - 1] stepping back); INT64 extremes mean "to the end".
        auto index = [&](double v) {
          const int64_t x = v <= -9.2e18 ? -dim - 1 : v >= 9.2e18 ? dim : int64_t(v);
          return x < 0 ? x + dim : x;
        };
        lo[axis] = std::clamp<int64_t>(index(double(starts[k])), 0, s > 0 ? dim : dim - 1);
        hi[axis] = std::clamp<int64_t>(index(double(in(2).values[k])), s > 0 ? 0 : -1, s > 0 ? dim : dim - 1);
        step[axis] = s;
      }
      for (size_t d = 0; d < rank; ++d) {
        const int64_t len = step[d] > 0 ? (hi[d] - lo[d] + step[d] - 1) / step[d] : (lo[d] - hi[d] - step[d] - 1) / -step[d];
        out.dims.push_back(std::max<int64_t>(len, 0));
      }
      const std::vector<int64_t> sc = strides_of(c.dims);
      each_index(out.dims, [&](const std::vector<int64_t>& at) {
        int64_t o = 0;
        for (size_t d = 0; d < rank; ++d) o += (lo[d] + at[d] * step[d]) * sc[d];
        out.values.push_back(c.values[size_t(o)]);
      });
    } else if (op == "Unsqueeze" || op == "Squeeze") {
      out = in(0);
      std::vector<int64_t> axes = ints(n, "axes");
      if (axes.empty() && n.input_size() > 1) axes.assign(in(1).values.begin(), in(1).values.end());
      if (op == "Unsqueeze") {
        const size_t rank = out.dims.size() + axes.size();
        for (int64_t& a : axes) a = axis_of(a, rank);
        std::sort(axes.begin(), axes.end());
        for (int64_t a : axes) out.dims.insert(out.dims.begin() + a, 1);
      } else {
        std::vector<int64_t> kept;
        for (size_t d = 0; d < out.dims.size(); ++d) {
          const bool named = std::find(axes.begin(), axes.end(), int64_t(d)) != axes.end() ||
                             std::find(axes.begin(), axes.end(), int64_t(d) - int64_t(out.dims.size())) != axes.end();
          if (!(axes.empty() ? out.dims[d] == 1 : named)) kept.push_back(out.dims[d]);
        }
        out.dims = kept;
      }
    } else if (op == "Gather") {
      const Constant &c = in(0), &idx = in(1);
      if (c.dims.size() != 1 || axis_of(integer(n, "axis", 0), 1) != 0) return false;
      out.dims = idx.dims;
      for (float i : idx.values) out.values.push_back(c.values.at(size_t(i < 0 ? i + float(c.dims[0]) : i)));
    } else {  // Mul, Add, Sub, Div: equal shapes or a scalar
      const Constant &a = in(0), &b = in(1);
      if (a.values.size() != b.values.size() && a.values.size() != 1 && b.values.size() != 1) return false;
      out.dims = a.values.size() >= b.values.size() ? a.dims : b.dims;
      const size_t len = std::max(a.values.size(), b.values.size());
      for (size_t i = 0; i < len; ++i) {
        const float x = a.values[a.values.size() == 1 ? 0 : i], y = b.values[b.values.size() == 1 ? 0 : i];
        out.values.push_back(op == "Mul" ? x * y : op == "Add" ? x + y : op == "Sub" ? x - y : x / y);
      }
    }
    constants_[n.output(0)] = std::move(out);
    return true;
  }

  void translate(const onnx::NodeProto& n, int index) {
    const std::string& op = n.op_type();
    if (evaluate_constant(n)) return;
    std::vector<std::string> ins;  // the non-constant inputs, as halotrain names
    for (const std::string& in : n.input())
      if (!in.empty() && !is_constant(in)) ins.push_back(tensor(in));
    if (ins.empty())
      unsupported(n, "reads only constants (a shape computation: export with do_constant_folding=True)");
    const std::string& from = ins[0];
    const std::string name = name_for(n, index);
    std::string result;
    if (op == "Conv") {
      const Constant& w = constant(n, 1);
      if (w.dims.size() != 4) unsupported(n, "has a weight that is not 4-D");
      const int64_t group = integer(n, "group", 1), cout = w.dims[0], cin_g = w.dims[1], kh = w.dims[2];
      const int64_t kernel = square(n, "kernel_shape", kh), stride = square(n, "strides", 1),
                    dilation = square(n, "dilations", 1), pad = symmetric_pad(n);
      if (stride > 1 && dilation > 1)
        unsupported(n, fmt::format("dilations {} with strides {}", show(ints(n, "dilations")), show(ints(n, "strides"))));
      const bool bias = n.input_size() > 2 && !n.input(2).empty();
      const int64_t cin = cin_g * group;
      const bool depthwise = group > 1 && cin_g == 1;
      if (group > 1 && !depthwise) unsupported(n, fmt::format("group {} (1, or one group per input channel)", group));
      std::vector<std::pair<std::string, LayerValue>> v = {{"kernel", kernel},
                                                           {"stride", stride},
                                                           {"padding", Padding::uniform(int(pad))},
                                                           {"dilation", dilation},
                                                           {"bias", bias}};
      if (depthwise) v.push_back({"depth_multiplier", cout / cin});
      else v.insert(v.begin(), {"filters", cout});
      result = add(layer(depthwise ? "depthwise_conv2d" : "conv2d", name, v), {from});
      // Depthwise [cin * m][1][k][k] is the conv layout of (k, k, 1, cin * m) = Keras (k, k, cin, m).
      std::vector<float> kernel_values = oihw_to_keras(w.values, cout, cin_g, kernel, kernel);
      std::vector<std::vector<int64_t>> shapes = {depthwise ? std::vector<int64_t>{kernel, kernel, cin, cout / cin}
                                                            : std::vector<int64_t>{kernel, kernel, cin, cout}};
      std::vector<std::string> names = {depthwise ? "depthwise_kernel:0" : "kernel:0"};
      std::vector<std::vector<float>> values = {std::move(kernel_values)};
      if (bias) {
        names.push_back("bias:0");
        shapes.push_back({cout});
        values.push_back(constant(n, 2).values);
      }
      weights(result, names, shapes, values);
    } else if (op == "ConvTranspose") {
      const Constant& w = constant(n, 1);  // [in][out][kh][kw]
      if (integer(n, "group", 1) != 1) unsupported(n, fmt::format("group {}", integer(n, "group", 1)));
      if (square(n, "dilations", 1) != 1) unsupported(n, fmt::format("dilations {}", show(ints(n, "dilations"))));
      const int64_t cin = w.dims[0], cout = w.dims[1], kernel = square(n, "kernel_shape", w.dims[2]),
                    stride = square(n, "strides", 1);
      const std::vector<int64_t> pads = ints(n, "pads", {0, 0, 0, 0}), extra = ints(n, "output_padding", {0, 0});
      if (kernel < stride) unsupported(n, fmt::format("kernel_shape {} smaller than strides {}", kernel, stride));
      const bool bias = n.input_size() > 2 && !n.input(2).empty();
      result = add(layer("conv2d_transpose", name,
                         {{"filters", cout}, {"kernel", kernel}, {"stride", stride}, {"bias", bias}}),
                   {from});
      std::vector<std::string> names = {"kernel:0"};
      std::vector<std::vector<int64_t>> shapes = {{kernel, kernel, cout, cin}};
      std::vector<std::vector<float>> values = {oihw_to_keras(w.values, cin, cout, kernel, kernel)};
      if (bias) {
        names.push_back("bias:0");
        shapes.push_back({cout});
        values.push_back(constant(n, 2).values);
      }
      weights(result, names, shapes, values);
      // ONNX's pads crop the full output; output_padding adds rows at its end.
      const std::vector<int64_t> crop = {pads[0], pads[2] - extra[0], pads[1], pads[3] - extra[1]};
      if (std::any_of(crop.begin(), crop.end(), [](int64_t c) { return c < 0; }))
        unsupported(n, fmt::format("output_padding {} larger than pads {}", show(extra), show(pads)));
      if (std::any_of(crop.begin(), crop.end(), [](int64_t c) { return c > 0; }))
        result = add(layer("cropping2d", name_for(n, index) , {{"cropping", crop}}), {result});
    } else if (op == "BatchNormalization") {
      const Constant &scale = constant(n, 1), &b = constant(n, 2), &mean = constant(n, 3), &var = constant(n, 4);
      const int64_t c = int64_t(scale.values.size());
      result = add(layer("batch_norm", name,
                         {{"momentum", double(real(n, "momentum", 0.9f))}, {"epsilon", double(real(n, "epsilon", 1e-5f))}}),
                   {from});
      weights(result, {"gamma:0", "beta:0", "moving_mean:0", "moving_variance:0"}, {{c}, {c}, {c}, {c}},
              {scale.values, b.values, mean.values, var.values});
    } else if (op == "Relu" || op == "Tanh") {
      result = add(layer(op == "Relu" ? "relu" : "tanh", name), {from});
    } else if (op == "Sigmoid") {
      result = final_node(n) ? fold(LossType::SigmoidBCE, n, from) : add(layer("sigmoid", name), {from});
    } else if (op == "Softmax") {
      if (!final_node(n)) unsupported(n, "before the output (a Softmax is folded into the loss only at the output)");
      result = fold(LossType::SoftmaxCrossEntropy, n, from);
    } else if (op == "LeakyRelu") {
      result = add(layer("leaky_relu", name, {{"alpha", double(real(n, "alpha", 0.01f))}}), {from});
    } else if (op == "MaxPool" || op == "AveragePool") {
      if (integer(n, "ceil_mode", 0) != 0) unsupported(n, "ceil_mode 1 (floor only)");
      if (square(n, "dilations", 1) != 1) unsupported(n, fmt::format("dilations {}", show(ints(n, "dilations"))));
      const int64_t pad = symmetric_pad(n);
      if (op == "AveragePool" && pad > 0 && integer(n, "count_include_pad", 0) != 0)
        unsupported(n, "count_include_pad 1 (halotrain's average excludes the padding)");
      const int64_t pool = square(n, "kernel_shape", 1), stride = square(n, "strides", 1);
      result = add(layer(op == "MaxPool" ? "max_pool2d" : "avg_pool2d", name,
                         {{"pool", pool}, {"stride", stride}, {"padding", Padding::uniform(int(pad))}}),
                   {from});
    } else if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
      result = add(layer(op == "GlobalAveragePool" ? "global_avg_pool" : "global_max_pool", name), {from});
      pooled_.insert(result);
    } else if (op == "Flatten") {
      if (integer(n, "axis", 1) != 1) unsupported(n, fmt::format("axis {}", integer(n, "axis", 1)));
      if (pooled_.count(from)) {
        result = from;  // [N, C, 1, 1] -> [N, C]: nothing to do after a global pool
      } else {
        flattens_.push_back(name);
        result = add(layer("global_avg_pool", name), {from});
        pooled_.insert(result);
      }
    } else if (op == "Gemm" || op == "MatMul") {
      const Constant& w = constant(n, 1);
      if (op == "Gemm" && (real(n, "alpha", 1) != 1 || real(n, "beta", 1) != 1 || integer(n, "transA", 0) != 0))
        unsupported(n, "alpha, beta or transA other than 1, 1, 0");
      const bool trans = op == "Gemm" && integer(n, "transB", 0) != 0;
      if (w.dims.size() != 2) unsupported(n, "has a weight that is not 2-D");
      const int64_t in = trans ? w.dims[1] : w.dims[0], units = trans ? w.dims[0] : w.dims[1];
      std::vector<float> kernel(w.values.size());  // Keras (in, units)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t u = 0; u < units; ++u) kernel[i * units + u] = trans ? w.values[u * in + i] : w.values[i * units + u];
      std::vector<float> bias(size_t(units), 0.f);
      if (op == "Gemm" && n.input_size() > 2 && !n.input(2).empty()) bias = constant(n, 2).values;
      if (bias.size() != size_t(units)) unsupported(n, "has a bias that is not one per unit");
      result = add(layer("dense", name, {{"units", units}}), {from});
      weights(result, {"kernel:0", "bias:0"}, {{in, units}, {units}}, {kernel, bias});
      dense_bias_[result] = out_.weights.size() - 1;
    } else if (op == "Add" && n.input_size() == 2 && (is_constant(n.input(0)) || is_constant(n.input(1)))) {
      // MatMul + Add: the bias of the dense layer before it.
      const Constant& b = constant(n, is_constant(n.input(1)) ? 1 : 0);
      auto it = dense_bias_.find(from);
      std::vector<float>* bias = it == dense_bias_.end() ? nullptr : &out_.weights[it->second].values[1];
      if (!bias || b.values.size() != bias->size())
        unsupported(n, "adds a constant to something other than a MatMul's output");
      for (size_t i = 0; i < b.values.size(); ++i) (*bias)[i] += b.values[i];
      result = from;
    } else if (op == "Add" || op == "Sum") {
      if (ins.size() < 2) unsupported(n, "adds fewer than two tensors");
      result = add(layer("add", name), ins);
    } else if (op == "Concat") {
      if (integer(n, "axis", 1) != 1) unsupported(n, fmt::format("axis {} (channels, 1)", integer(n, "axis", 1)));
      result = add(layer("concatenate", name), ins);
    } else if (op == "Resize" || op == "Upsample") {
      const std::string mode = text(n, "mode", "nearest");
      const std::string coords = text(n, "coordinate_transformation_mode", op == "Upsample" ? "asymmetric" : "half_pixel");
      if (mode != "nearest" && mode != "linear") unsupported(n, fmt::format("mode {}", mode));
      if (mode == "linear" && coords != "half_pixel" && coords != "pytorch_half_pixel")
        unsupported(n, fmt::format("mode linear with coordinate_transformation_mode {} (half_pixel)", coords));
      if (mode == "nearest" && (coords != "asymmetric" || text(n, "nearest_mode", "floor") != "floor"))
        unsupported(n, fmt::format("mode nearest with coordinate_transformation_mode {} and nearest_mode {} (asymmetric, "
                                   "floor)",
                                   coords, text(n, "nearest_mode", "round_prefer_floor")));
      const Constant* scales = nullptr;
      for (int i = 1; i < n.input_size(); ++i)
        if (is_constant(n.input(i)) && constants_.at(n.input(i)).values.size() == 4 && (op == "Upsample" || i == 2))
          scales = &constants_.at(n.input(i));
      if (!scales) unsupported(n, "has no constant scales (sizes are not read)");
      const std::vector<float>& s = scales->values;
      if (s[0] != 1 || s[1] != 1 || s[2] != float(int64_t(s[2])) || s[3] != float(int64_t(s[3])) || s[2] < 1 || s[3] < 1)
        unsupported(n, fmt::format("scales [{}] (integers >= 1 on H and W)", fmt::join(s, ", ")));
      result = add(layer("upsampling2d", name,
                         {{"size", std::vector<int64_t>{int64_t(s[2]), int64_t(s[3])}},
                          {"interpolation", std::string(mode == "linear" ? "bilinear" : "nearest")}}),
                   {from});
    } else if (op == "Pad") {
      const std::string mode = text(n, "mode", "constant");
      if (mode != "constant") unsupported(n, fmt::format("mode {} (constant zero)", mode));
      std::vector<int64_t> p = ints(n, "pads");
      if (p.empty()) {
        const Constant& c = constant(n, 1);
        p.assign(c.values.begin(), c.values.end());
      }
      if (n.input_size() > 2 && !n.input(2).empty() && constant(n, 2).values != std::vector<float>{0.f})
        unsupported(n, "a constant value other than 0");
      if (p.size() != 8 || p[0] || p[1] || p[4] || p[5])
        unsupported(n, fmt::format("pads {} (H and W only)", show(p)));
      result = add(layer("zero_padding2d", name, {{"padding", std::vector<int64_t>{p[2], p[6], p[3], p[7]}}}), {from});
    } else if (op == "Dropout") {
      float ratio = real(n, "ratio", 0.5f);
      if (n.input_size() > 1 && !n.input(1).empty()) ratio = constant(n, 1).values.at(0);
      result = ratio > 0 ? add(layer("dropout", name, {{"rate", double(ratio)}}), {from}) : from;
    } else if (op == "Identity") {
      result = from;
    } else {
      unsupported(n, "is not an op halotrain has");
    }
    tensors_[n.output(0)] = result;
  }

  ImportedModel out_;
  std::map<std::string, Constant> constants_;
  std::map<std::string, std::string> tensors_;  // ONNX tensor -> the halotrain layer (or input) holding it
  std::map<std::string, size_t> dense_bias_;  // dense layer -> its entry of out_.weights
  std::set<std::string> taken_, pooled_;
  std::vector<std::string> flattens_;
  std::string output_;
  bool has_input_ = false, loss_set_ = false;
};

}  // namespace

ImportedModel import_onnx_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot read the model file", path));
  onnx::ModelProto model;
  if (!model.ParseFromIstream(&in)) throw ConfigError(fmt::format("{}: not an ONNX model (the protobuf does not parse)", path));
  OnnxTranslator t(path);
  ImportedModel m = t.run(model);
  check_imported(m, t.flattens());
  return m;
}

}  // namespace ht
