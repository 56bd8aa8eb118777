// ONNX models (torch.onnx.export, tf2onnx) as halotrain layers, with Debian's libonnx
// protobuf classes: the graph, its values and the op table. Feature maps are NCHW; weights
// become Keras layouts. The ops are in onnx_ops.cpp, constant folding in
// onnx_constants.cpp and the subgraphs read as one layer in onnx_patterns.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>

#include "importer/onnx_ops.hpp"
#include "orchestrator/layer_kind.hpp"

namespace ht {

namespace onnx_import {

namespace {

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ? c : '_';
  while (!out.empty() && (out[0] == '_' || out[0] == '.')) out.erase(0, 1);
  return out;
}

// A node's name as a layer name: torch's module scopes ("/features/features.1/block/Conv")
// without the components the next one repeats ("features.1_block_Conv").
std::string layer_name(const std::string& node) {
  std::vector<std::string> parts;
  size_t at = 0;
  while (at <= node.size()) {
    const size_t slash = std::min(node.find('/', at), node.size());
    if (slash > at) parts.push_back(node.substr(at, slash - at));
    at = slash + 1;
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i + 1 < parts.size() && parts[i + 1].rfind(parts[i] + ".", 0) == 0) continue;
    out += (out.empty() ? "" : "_") + parts[i];
  }
  return sanitize(out);
}

}  // namespace

Translator::Translator(std::string source, const ImportOptions& options) : options_(options) {
  out_.source = std::move(source);
}

void Translator::fail(const std::string& why) const { throw ConfigError(fmt::format("{}: {}", out_.source, why)); }

void Translator::unsupported(const onnx::NodeProto& n, const std::string& what) const {
  fail(fmt::format("node '{}' ({}) {}; halotrain imports {}", n.name(), n.op_type(), what,
                   fmt::join(supported_ops(), ", ")));
}

const onnx::AttributeProto* Translator::attr(const onnx::NodeProto& n, const std::string& name) const {
  for (const onnx::AttributeProto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

std::vector<int64_t> Translator::ints(const onnx::NodeProto& n, const std::string& name,
                                      std::vector<int64_t> def) const {
  const onnx::AttributeProto* a = attr(n, name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : def;
}

int64_t Translator::integer(const onnx::NodeProto& n, const std::string& name, int64_t def) const {
  const onnx::AttributeProto* a = attr(n, name);
  return a ? a->i() : def;
}

double Translator::real(const onnx::NodeProto& n, const std::string& name, float def) const {
  // The shortest decimal that reads back as the float (0.9, not 0.8999999761).
  const onnx::AttributeProto* a = attr(n, name);
  return std::stod(fmt::format("{}", a ? a->f() : def));
}

std::string Translator::text(const onnx::NodeProto& n, const std::string& name, const std::string& def) const {
  const onnx::AttributeProto* a = attr(n, name);
  return a ? a->s() : def;
}

const Constant& Translator::constant(const onnx::NodeProto& n, int input) const {
  if (!has_input(n, input) || !is_constant(n.input(input)))
    unsupported(n, fmt::format("input {} is not a constant", input));
  return constants_.at(n.input(input));
}

const Value& Translator::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) fail(fmt::format("tensor '{}' is read before any node makes it", name));
  return it->second;
}

const Value& Translator::value_in(const onnx::NodeProto& n, int input) const {
  if (!has_input(n, input) || is_constant(n.input(input)))
    unsupported(n, fmt::format("input {} is a constant, where halotrain expects a feature map", input));
  return value(n.input(input));
}

std::vector<const Value*> Translator::values_in(const onnx::NodeProto& n) const {
  std::vector<const Value*> out;
  for (const std::string& in : n.input())
    if (!in.empty() && !is_constant(in)) out.push_back(&value(in));
  return out;
}

std::string Translator::name_for(const onnx::NodeProto& n) {
  std::string base = layer_name(n.name());
  if (base.empty()) base = sanitize(n.op_type()) + "_" + std::to_string(index_);
  std::string name = base;
  for (int k = 2; taken_.count(name) || name == kInputName; ++k) name = base + "_" + std::to_string(k);
  taken_.insert(name);
  return name;
}

Shape3 Translator::shape_of(const Value& v) const { return shapes_.at(v.layer).first; }

Value Translator::add_layer(const onnx::NodeProto& n, const std::string& type,
                            const std::vector<std::pair<std::string, LayerValue>>& keys,
                            const std::vector<const Value*>& inputs, const std::vector<Weight>& weights) {
  LayerConfig c = imported_layer(type, name_for(n), keys);
  std::vector<Shape3> ins;
  std::vector<bool> ins_spatial;
  std::vector<std::string> names;
  for (const Value* v : inputs) {
    names.push_back(v->layer);
    ins.push_back(shapes_.at(v->layer).first);
    ins_spatial.push_back(shapes_.at(v->layer).second);
  }
  LayerSpec spec;
  try {
    LayerConfig named = c;
    named.inputs = names;  // for the shape's messages; append_layer writes inputs only where needed
    spec = shape_layer(named, ins, ins_spatial);
  } catch (const LayerShapeError& e) {
    unsupported(n, fmt::format("cannot be a halotrain {} here: {}", type, e.what()));
  }
  for (size_t k = 0; k < spec.weights.size() && k < weights.size(); ++k)
    if (spec.weights[k].keras_shape != weights[k].shape)
      unsupported(n, fmt::format("has a {} of shape [{}] where halotrain's {} takes [{}]", weights[k].name,
                                 fmt::join(weights[k].shape, ", "), type, fmt::join(spec.weights[k].keras_shape, ", ")));
  const std::string name = append_layer(out_.model, std::move(c), names);
  shapes_[name] = {spec.out, spec.out_spatial};
  if (!weights.empty()) {
    ImportedWeights w;
    w.layer = name;
    for (const Weight& x : weights) {
      w.names.push_back(x.name);
      w.shapes.push_back(x.shape);
      w.values.push_back(x.values);
    }
    out_.weighted_layers.push_back(name);
    out_.weights.push_back(std::move(w));
  }
  Value v;
  v.layer = name;
  v.layout = spec.out_spatial ? Layout::NCHW : Layout::Vector;
  v.dims = spec.out_spatial ? std::vector<int64_t>{batch_, spec.out.c, spec.out.h, spec.out.w}
                            : std::vector<int64_t>{batch_, spec.out.c};
  return v;
}

ImportedWeights* Translator::weights_of(const Value& v) {
  for (ImportedWeights& w : out_.weights)
    if (w.layer == v.layer) return &w;
  return nullptr;
}

bool Translator::final_node(const onnx::NodeProto& n) const {
  return n.output_size() >= 1 && n.output(0) == output_;
}

Value Translator::fold(LossType loss, const onnx::NodeProto& n, const Value& from) {
  out_.model.loss = loss;
  loss_set_ = true;
  out_.notes.push_back(
      fmt::format("the final {} node '{}' is folded into model.loss {}", n.op_type(), n.name(), to_string(loss)));
  return from;
}

void Translator::input(const onnx::ValueInfoProto& in) {
  const auto& shape = in.type().tensor_type().shape();
  auto fixed = [&](int i) {
    if (i >= 2 && options_.input_height > 0) return int64_t(i == 2 ? options_.input_height : options_.input_width);
    return shape.dim(i).has_dim_value() ? shape.dim(i).dim_value() : int64_t(-1);
  };
  if (shape.dim_size() != 4 || fixed(1) < 1)
    fail(fmt::format("input '{}' must be [N, C, H, W] with C fixed", in.name()));
  if (fixed(2) < 1 || fixed(3) < 1)
    fail(fmt::format("input '{}' leaves the image size open; give it: halotrain import MODEL --input-size H,W",
                     in.name()));
  for (int i = 1; i < 4; ++i)
    if (fixed(i) > kMaxExtent)
      fail(fmt::format("input '{}' has {} along dimension {}; at most {} fit", in.name(), fixed(i), i, kMaxExtent));
  if (double(fixed(1)) * double(fixed(2)) * double(fixed(3)) > double(kMaxElements))
    fail(fmt::format("input '{}' of {}x{}x{} (C x H x W) holds more than {} values an image", in.name(), fixed(1),
                     fixed(2), fixed(3), kMaxElements));
  out_.model.channels = int(fixed(1));
  out_.model.height = int(fixed(2));
  out_.model.width = int(fixed(3));
  batch_ = std::max<int64_t>(fixed(0), 1);
  shapes_[kInputName] = {Shape3{out_.model.channels, out_.model.height, out_.model.width}, true};
  bind(in.name(), Value{kInputName, {batch_, fixed(1), fixed(2), fixed(3)}, Layout::NCHW, {}});
  has_input_ = true;
}

ImportedModel Translator::run(const onnx::ModelProto& model) {
  for (const onnx::OperatorSetIdProto& o : model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") opset_ = int(o.version());
  const onnx::GraphProto& g = model.graph();
  out_.name = sanitize(g.name());
  for (const onnx::TensorProto& t : g.initializer()) constants_[t.name()] = constant_of(t, out_.source);
  for (const onnx::ValueInfoProto& in : g.input()) {
    if (constants_.count(in.name())) continue;  // older exporters list initializers as inputs
    if (has_input_)
      fail(fmt::format("the graph has more than one input ('{}' too); halotrain trains one image", in.name()));
    input(in);
  }
  if (!has_input_) fail("the graph has no input");
  if (g.output_size() != 1)
    fail(fmt::format("the graph has {} outputs; halotrain trains models with one (export without auxiliary "
                     "outputs)",
                     g.output_size()));
  output_ = g.output(0).name();
  for (const onnx::NodeProto& n : g.node())
    for (const std::string& in : n.input()) ++readers_[in];
  try {
    patterns_ = find_patterns(g, constants_);
  } catch (const ConfigError& e) {  // a subgraph recognised to be refused
    fail(e.what());
  }
  for (index_ = 0; index_ < g.node_size(); ++index_) translate(g.node(index_), index_);
  const std::string last = value(output_).layer;
  if (last == kInputName) fail("the graph's output is its input");
  auto it = std::find_if(out_.model.layers.begin(), out_.model.layers.end(),
                         [&](const LayerConfig& c) { return c.name == last; });
  out_.model.layers.erase(it + 1, out_.model.layers.end());
  if (!loss_set_) default_loss();
  out_.has_weights = !out_.weights.empty();
  return std::move(out_);
}

void Translator::translate(const onnx::NodeProto& n, int index) {
  auto fused = patterns_.find(index);
  if (fused != patterns_.end()) return translate_fused(n, fused->second);
  for (const auto& [root, f] : patterns_)
    if (f.absorbed.count(index)) return;  // part of a subgraph read as one layer at its root
  if (fold_constants(n)) return;
  if (values_in(n).empty())
    unsupported(n, "reads only constants that halotrain cannot evaluate (a shape computation it does not know)");
  const OpHandler handle = op_handler(n.op_type());
  if (!handle) unsupported(n, "is not an op halotrain has");
  handle(*this, n);
}

void Translator::translate_fused(const onnx::NodeProto& n, const Fused& f) {
  const Value& x = value(f.source);
  if (f.type == "layer_norm" && x.layout == Layout::NCHW)
    unsupported(n, fmt::format("ends a LayerNorm over the last axis of an NCHW map of shape [{}] (halotrain's "
                               "layer_norm is over the channels of each pixel)",
                               fmt::join(x.dims, ", ")));
  if ((f.type == "group_norm" || f.type == "channel_shuffle") && x.layout != Layout::NCHW)
    unsupported(n, fmt::format("ends a {} of a tensor of shape [{}], not an NCHW map", f.type, fmt::join(x.dims, ", ")));
  std::vector<Weight> weights;
  if (f.type == "layer_norm" || f.type == "group_norm") {
    const int64_t c = shape_of(x).c;
    const char* names[2] = {"gamma:0", "beta:0"};
    for (int k = 0; k < 2; ++k) {
      if (f.gamma_beta[k].empty()) continue;
      std::vector<float> v(constants_.at(f.gamma_beta[k]).values.begin(), constants_.at(f.gamma_beta[k]).values.end());
      if (int64_t(v.size()) != c) unsupported(n, fmt::format("has a {} of {} values for {} channels", names[k], v.size(), c));
      weights.push_back({names[k], {c}, v});
    }
  }
  bind(n.output(0), same_layout(x, add_layer(n, f.type, f.keys, {&x}, weights)));
}

// PyTorch models end in raw scores: logits of a cross-entropy (several classes, per image
// or per pixel) or of a BCE (one).
void Translator::default_loss() {
  const int64_t outputs = shapes_.at(out_.model.layers.back().name).first.c;
  out_.model.loss = outputs >= 2 ? LossType::SoftmaxCrossEntropy : LossType::SigmoidBCE;
  out_.notes.push_back(fmt::format("the output '{}' has no Softmax or Sigmoid: model.loss {} on its raw values (edit "
                                   "it)",
                                   out_.model.layers.back().name, to_string(out_.model.loss)));
}

}  // namespace onnx_import

ImportedModel import_onnx_file(const std::string& path, const ImportOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot read the model file", path));
  onnx::ModelProto model;
  if (!model.ParseFromIstream(&in))
    throw ConfigError(fmt::format("{}: not an ONNX model (the protobuf does not parse)", path));
  onnx_import::Translator t(path, options);
  ImportedModel m = t.run(model);
  check_imported(m);
  return m;
}

}  // namespace ht
