// Keras 2 models (model.to_json(), or a model.save() file's model_config) as halotrain
// layers: a handler per Keras class, shapes followed layer by layer (shape_layer), so that
// a map and a per-image channel vector are told apart (a Flatten of a 1x1 map, a Reshape
// of a pooled vector, a Dense on a map).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "importer/keras_import.hpp"
#include "orchestrator/layer_kind.hpp"
#include "orchestrator/model_spec.hpp"

namespace ht {

namespace {

using json = nlohmann::json;

// One layer as the Keras JSON lists it, with the names of the layers it reads.
struct KerasLayer {
  std::string class_name, name;
  json config;
  std::vector<std::string> inbound;
};

class Translator;
using Handler = void (*)(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins);
const std::map<std::string, Handler>& handlers();

std::vector<std::string> class_names() {
  std::vector<std::string> names;
  for (const auto& [name, h] : handlers()) names.push_back(name);
  return names;
}

class Translator {
 public:
  Translator(std::string source, const ImportOptions& options) : options_(options) { out_.source = std::move(source); }

  ImportedModel run(const json& model) {
    if (!model.is_object() || !model.contains("class_name") || !model.contains("config"))
      fail("expected a Keras model (an object with class_name and config, as model.to_json() writes)");
    const std::string kind = model["class_name"].get<std::string>();
    std::vector<KerasLayer> layers;
    std::vector<std::string> outputs;
    if (kind == "Sequential") {
      layers = sequential(model["config"]);
      outputs = {layers.back().name};
    } else if (kind == "Model" || kind == "Functional") {
      layers = functional(model["config"], &outputs);
    } else {
      fail(fmt::format("the model is a {}; expected Sequential, Model or Functional", kind));
    }
    if (outputs.size() != 1)
      fail(fmt::format("the model has {} outputs ({}); halotrain trains models with one", outputs.size(),
                       fmt::join(outputs, ", ")));
    output_ = outputs[0];
    final_ = final_layer(layers, output_);
    for (const KerasLayer& l : layers) translate(l);
    if (!has_input_) fail("found no input shape (an InputLayer or a first layer with batch_input_shape)");
    const std::string last = output_of(output_);
    if (last == kInputName) fail("the model's output is its input: it has no layers halotrain can train");
    auto it = std::find_if(out_.model.layers.begin(), out_.model.layers.end(),
                           [&](const LayerConfig& c) { return c.name == last; });
    out_.model.layers.erase(it + 1, out_.model.layers.end());
    if (!loss_set_) {
      out_.model.loss = LossType::MSE;
      out_.notes.push_back("the output has no softmax or sigmoid: model.loss mse (edit it)");
    }
    return std::move(out_);
  }

  // --- for the handlers -----------------------------------------------------------------
  [[noreturn]] void fail(const std::string& why) const { throw ConfigError(fmt::format("{}: {}", out_.source, why)); }
  [[noreturn]] void unsupported(const KerasLayer& l, const std::string& what) const {
    fail(fmt::format("{} '{}' {}; halotrain imports {}", l.class_name, l.name, what, fmt::join(class_names(), ", ")));
  }
  static std::string show(const json& v) { return v.dump(); }

  // Appends a halotrain layer reading `inputs` (halotrain names); returns its name.
  std::string add(const KerasLayer& l, const std::string& type, const std::string& name,
                  const std::vector<std::pair<std::string, LayerValue>>& keys, const std::vector<std::string>& inputs) {
    std::string clean = name;
    std::replace(clean.begin(), clean.end(), '/', '_');
    LayerConfig c = imported_layer(type, clean, keys);
    // Keras's `trainable: false` is kept (SPEC section 14): the layers a model froze stay frozen.
    c.trainable = !(l.config.is_object() && l.config.contains("trainable") && l.config["trainable"] == false);
    while (taken_.count(c.name)) c.name += "_";
    if (c.name != name && name == l.name) out_.keras_names[c.name] = name;
    taken_.insert(c.name);
    std::vector<Shape3> ins;
    std::vector<bool> spatial;
    for (const std::string& in : inputs) {
      ins.push_back(shapes_.at(in).first);
      spatial.push_back(shapes_.at(in).second);
    }
    LayerSpec spec;
    try {
      LayerConfig named = c;
      named.inputs = inputs;
      spec = shape_layer(named, ins, spatial);
    } catch (const LayerShapeError& e) {
      unsupported(l, fmt::format("cannot be a halotrain {} here: {}", type, e.what()));
    }
    const std::string result = append_layer(out_.model, std::move(c), inputs);
    shapes_[result] = {spec.out, spec.out_spatial};
    return result;
  }
  std::string weighted(const std::string& name) {
    out_.weighted_layers.push_back(name);
    return name;
  }
  const Shape3& shape(const std::string& tensor) const { return shapes_.at(tensor).first; }
  bool is_map(const std::string& tensor) const { return shapes_.at(tensor).second; }
  void alias(const KerasLayer& l, const std::string& tensor) { outputs_[l.name] = tensor; }
  void note(const std::string& text) { out_.notes.push_back(text); }
  bool is_final(const KerasLayer& l) const { return l.name == final_; }
  std::string fold(LossType loss, const KerasLayer& l, const std::string& from) {
    out_.model.loss = loss;
    loss_set_ = true;
    note(fmt::format("the final {} of {} '{}' is folded into model.loss {}",
                     loss == LossType::SigmoidBCE ? "sigmoid" : "softmax", l.class_name, l.name, to_string(loss)));
    return from;
  }
  void input(const KerasLayer& l, const json& shape);

 private:
  std::vector<KerasLayer> sequential(const json& config) {
    // Keras 2.1 writes the layers as the config itself; later versions under "layers".
    const json& list = config.is_array() ? config : config.value("layers", json::array());
    if (config.is_object()) out_.name = config.value("name", "");
    std::vector<KerasLayer> layers;
    std::string previous;
    for (const json& l : list) {
      KerasLayer k{l.value("class_name", ""), l["config"].value("name", ""), l["config"], {}};
      if (previous.empty() && k.class_name != "InputLayer") {
        if (!k.config.contains("batch_input_shape"))
          fail(fmt::format("{} '{}', the first layer, has no batch_input_shape", k.class_name, k.name));
        layers.push_back({"InputLayer", "input", {{"batch_input_shape", k.config["batch_input_shape"]}}, {}});
        previous = "input";
      }
      if (!previous.empty()) k.inbound = {previous};
      previous = k.name;
      layers.push_back(std::move(k));
    }
    if (layers.empty()) fail("the Sequential model has no layers");
    return layers;
  }

  std::vector<KerasLayer> functional(const json& config, std::vector<std::string>* outputs) {
    out_.name = config.value("name", "");
    std::vector<KerasLayer> layers;
    for (const json& l : config.value("layers", json::array())) {
      KerasLayer k{l.value("class_name", ""), l.value("name", ""), l["config"], {}};
      const json nodes = l.value("inbound_nodes", json::array());
      if (nodes.size() > 1) unsupported(k, fmt::format("is called {} times (a shared layer)", nodes.size()));
      if (nodes.size() == 1) {
        if (!nodes[0].is_array())
          unsupported(k, "has inbound_nodes in a form other than Keras 2's lists [[name, node, tensor, {}]]");
        for (const json& in : nodes[0]) k.inbound.push_back(in.at(0).get<std::string>());
      }
      layers.push_back(std::move(k));
    }
    for (const json& o : config.value("output_layers", json::array())) outputs->push_back(o.at(0).get<std::string>());
    return layers;
  }

  // The layer whose activation is the model's: the output, or the layer before the
  // reshapes that end MobileNet (Activation softmax, then Reshape((classes,))).
  static std::string final_layer(const std::vector<KerasLayer>& layers, const std::string& output) {
    std::string name = output;
    for (bool moved = true; moved;) {
      moved = false;
      for (const KerasLayer& l : layers)
        if (l.name == name && (l.class_name == "Reshape" || l.class_name == "Flatten") && l.inbound.size() == 1) {
          name = l.inbound[0];
          moved = true;
        }
    }
    return name;
  }

  std::string output_of(const std::string& keras_name) const {
    auto it = outputs_.find(keras_name);
    if (it == outputs_.end()) fail(fmt::format("a layer reads '{}', which comes later or is no layer", keras_name));
    return it->second;
  }

  void translate(const KerasLayer& l) {
    auto h = handlers().find(l.class_name);
    if (h == handlers().end()) unsupported(l, "is not a layer halotrain has");
    std::vector<std::string> ins;
    for (const std::string& k : l.inbound) ins.push_back(output_of(k));
    if (l.class_name != "InputLayer" && ins.empty()) unsupported(l, "reads no layer");
    h->second(*this, l, ins);
  }

 public:
  ImportedModel out_;
  const ImportOptions& options_;
  std::map<std::string, std::string> outputs_;  // Keras layer -> the halotrain tensor holding its output
  std::map<std::string, std::pair<Shape3, bool>> shapes_;  // halotrain tensor -> shape, whether a map
  std::set<std::string> taken_;
  std::string output_, final_;
  bool has_input_ = false, loss_set_ = false;
};

void Translator::input(const KerasLayer& l, const json& shape) {
  if (!shape.is_array() || shape.size() != 4 || !shape[3].is_number_integer())
    unsupported(l, fmt::format("batch_input_shape {}: halotrain needs [None, H, W, C] with C fixed", show(shape)));
  int h = shape[1].is_number_integer() ? shape[1].get<int>() : -1, w = shape[2].is_number_integer() ? shape[2].get<int>() : -1;
  if (options_.input_height > 0) {
    h = options_.input_height;
    w = options_.input_width;
  } else if (h < 1 || w < 1) {
    unsupported(l, fmt::format("batch_input_shape {} leaves the image size open; give it: halotrain import MODEL "
                               "--input-size H,W",
                               show(shape)));
  }
  out_.model.height = h;
  out_.model.width = w;
  out_.model.channels = shape[3].get<int>();
  if (out_.model.channels < 1 || int64_t(h) * w * out_.model.channels > kMaxElements)
    unsupported(l, fmt::format("batch_input_shape {}: expected 1 or more channels and at most {} values an image",
                               show(shape), kMaxElements));
  has_input_ = true;
  shapes_[kInputName] = {Shape3{out_.model.channels, h, w}, true};
  outputs_[l.name] = kInputName;
}

// --- Keras attributes ----------------------------------------------------------------------
// A window attribute: [a, b] or one number.
std::vector<int64_t> pair_of(Translator& t, const KerasLayer& l, const std::string& key, int64_t def) {
  if (!l.config.contains(key) || l.config[key].is_null()) return {def, def};
  const json& v = l.config[key];
  if (v.is_number_integer()) return {v.get<int64_t>(), v.get<int64_t>()};
  if (v.is_array() && v.size() == 2 && v[0].is_number_integer() && v[1].is_number_integer() && v[0] >= 1 && v[1] >= 1)
    return {v[0].get<int64_t>(), v[1].get<int64_t>()};
  t.unsupported(l, fmt::format("{} {} (two integers >= 1)", key, Translator::show(v)));
}

Padding padding_of(Translator& t, const KerasLayer& l) {
  const std::string p = l.config.value("padding", "valid");
  if (p == "valid") return {PaddingMode::Valid};
  if (p == "same") return {PaddingMode::Same};
  t.unsupported(l, fmt::format("padding '{}' (valid or same)", p));
}

void channels_last(Translator& t, const KerasLayer& l) {
  const std::string f = l.config.value("data_format", "channels_last");
  if (f != "channels_last") t.unsupported(l, fmt::format("data_format {} (channels_last only)", f));
}

// The kind of a layer whose Keras class names exactly one (orchestrator/layer_kind.hpp);
// Keras 1's Convolution2D is Conv2D.
std::string keras_type(const KerasLayer& l) {
  const LayerKind* k = find_keras_kind(l.class_name == "Convolution2D" ? "Conv2D" : l.class_name);
  if (!k) throw std::logic_error("no layer kind is Keras's " + l.class_name);
  return k->type;
}

bool last_axis(const json& axis) {
  return axis == json(-1) || axis == json(3) || axis == json::array({3}) || axis == json::array({-1});
}

// The activations by name (Keras's `activation` attribute and Activation layers; relu6 is
// Keras 2.1 MobileNet's custom object).
const std::map<std::string, std::pair<std::string, std::vector<std::pair<std::string, LayerValue>>>>& activations() {
  static const std::map<std::string, std::pair<std::string, std::vector<std::pair<std::string, LayerValue>>>> table = {
      {"relu", {"relu", {}}},
      {"relu6", {"relu6", {}}},
      {"sigmoid", {"sigmoid", {}}},
      {"tanh", {"tanh", {}}},
      {"swish", {"silu", {}}},
      {"silu", {"silu", {}}},
      {"hard_sigmoid", {"hard_sigmoid", {{"alpha", 0.2}, {"beta", 0.5}}}},
      {"gelu", {"gelu", {}}},
  };
  return table;
}

// The layer's activation after it; a final softmax or sigmoid becomes the loss.
std::string activation(Translator& t, const KerasLayer& l, const std::string& from) {
  const std::string act = l.config.value("activation", "linear");
  if (act.empty() || act == "linear") return from;
  if (t.is_final(l) && act == "softmax") return t.fold(LossType::SoftmaxCrossEntropy, l, from);
  if (t.is_final(l) && act == "sigmoid") return t.fold(LossType::SigmoidBCE, l, from);
  auto it = activations().find(act);
  if (it == activations().end())
    t.unsupported(l, fmt::format("activation '{}'{} (linear, relu, relu6, sigmoid, tanh, swish, hard_sigmoid, gelu; "
                                 "softmax and sigmoid at the output)",
                                 act, act == "softmax" ? " before the output" : ""));
  const std::string name = l.class_name == "Activation" ? l.name : l.name + "_" + act;
  return t.add(l, it->second.first, name, it->second.second, {from});
}

// --- the handlers ------------------------------------------------------------------------
void input_layer(Translator& t, const KerasLayer& l, const std::vector<std::string>&) {
  t.input(l, l.config.value("batch_input_shape", json::array()));
}

void conv(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  const std::string& cls = l.class_name;
  const json& c = l.config;
  channels_last(t, l);
  const std::vector<int64_t> kernel = pair_of(t, l, "kernel_size", 1), stride = pair_of(t, l, "strides", 1),
                             dilation = pair_of(t, l, "dilation_rate", 1);
  const bool bias = c.value("use_bias", true);
  std::vector<std::pair<std::string, LayerValue>> keys = {
      {"kernel", kernel}, {"stride", stride}, {"padding", padding_of(t, l)}};
  const std::string type = keras_type(l);
  if (cls == "Conv2DTranspose") {
    if (dilation != std::vector<int64_t>{1, 1}) t.unsupported(l, fmt::format("dilation_rate {}", Translator::show(c["dilation_rate"])));
    if (c.contains("output_padding") && !c["output_padding"].is_null())
      t.unsupported(l, fmt::format("output_padding {}", Translator::show(c["output_padding"])));
    keys.insert(keys.begin(), {"filters", c.at("filters").get<int64_t>()});
  } else {
    keys.push_back({"dilation", dilation});
    if (cls != "DepthwiseConv2D") keys.insert(keys.begin(), {"filters", c.at("filters").get<int64_t>()});
    if (cls != "Conv2D") keys.push_back({"depth_multiplier", c.value("depth_multiplier", int64_t(1))});
    if (cls == "Conv2D") keys.push_back({"groups", c.value("groups", int64_t(1))});
  }
  keys.push_back({"bias", bias});
  t.alias(l, activation(t, l, t.weighted(t.add(l, type, l.name, keys, {ins[0]}))));
}

void batch_norm(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  const json& c = l.config;
  if (!last_axis(c.value("axis", json(-1))))
    t.unsupported(l, fmt::format("axis {} (the channel axis, -1 or 3)", Translator::show(c.value("axis", json(-1)))));
  t.alias(l, t.weighted(t.add(l, "batch_norm", l.name,
                              {{"momentum", c.value("momentum", 0.99)}, {"epsilon", c.value("epsilon", 1e-3)},
                               {"center", c.value("center", true)}, {"scale", c.value("scale", true)}},
                              {ins[0]})));
}

// LayerNormalization, keras_contrib's and tf-addons' InstanceNormalization, GroupNormalization
// (groups -1: one per channel, an instance norm), over the channel axis.
void norm(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  const json& c = l.config;
  const std::string& cls = l.class_name;
  const json axis = c.value("axis", json(-1));
  if (!last_axis(axis)) t.unsupported(l, fmt::format("axis {} (the channel axis, -1 or 3)", Translator::show(axis)));
  std::vector<std::pair<std::string, LayerValue>> keys = {
      {"epsilon", c.value("epsilon", 1e-3)}, {"center", c.value("center", true)}, {"scale", c.value("scale", true)}};
  std::string type = "layer_norm";
  if (cls.find("InstanceNormalization") != std::string::npos) type = "instance_norm";
  if (cls.find("GroupNormalization") != std::string::npos) {
    const int64_t groups = c.value("groups", int64_t(32));
    type = groups == -1 || groups == t.shape(ins[0]).c ? "instance_norm" : "group_norm";
    if (type == "group_norm") keys.insert(keys.begin(), {"groups", groups});
  }
  t.alias(l, t.weighted(t.add(l, type, l.name, keys, {ins[0]})));
}

void activation_layer(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  t.alias(l, activation(t, l, ins[0]));
}

// ReLU(max_value, negative_slope, threshold): relu, relu6, a clip or a leaky ReLU.
void relu(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  const json& c = l.config;
  const json max = c.value("max_value", json());
  const double slope = c.value("negative_slope", 0.0), threshold = c.value("threshold", 0.0);
  if (threshold != 0 || (slope != 0 && !max.is_null()))
    t.unsupported(l, fmt::format("max_value {} negative_slope {} threshold {} (a ReLU, ReLU(6), a clip at max_value "
                                 "or a leaky ReLU)",
                                 Translator::show(max), slope, threshold));
  if (slope != 0) return t.alias(l, t.add(l, "leaky_relu", l.name, {{"alpha", slope}}, {ins[0]}));
  if (max.is_null()) return t.alias(l, t.add(l, "relu", l.name, {}, {ins[0]}));
  const double m = max.get<double>();
  if (m == 6) return t.alias(l, t.add(l, "relu6", l.name, {}, {ins[0]}));
  t.alias(l, t.add(l, "clip", l.name, {{"min", 0.0}, {"max", m}}, {ins[0]}));
}

void leaky_relu(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  t.alias(l, t.add(l, "leaky_relu", l.name, {{"alpha", l.config.value("alpha", 0.3)}}, {ins[0]}));
}

void pool(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  channels_last(t, l);
  const std::vector<int64_t> pool = pair_of(t, l, "pool_size", 2);
  const std::vector<int64_t> stride = l.config.contains("strides") && !l.config["strides"].is_null()
                                          ? pair_of(t, l, "strides", 1)
                                          : pool;
  t.alias(l, t.add(l, keras_type(l), l.name, {{"pool", pool}, {"stride", stride}, {"padding", padding_of(t, l)}},
                   {ins[0]}));
}

void global_pool(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  channels_last(t, l);  // keepdims or not: halotrain's channel vector either way
  t.alias(l, t.add(l, keras_type(l), l.name, {}, {ins[0]}));
}

// Flatten: nothing of a vector; a 1x1 map's global average (the config says so); a larger
// map gathered as a vector in Keras's own (h, w, c) order.
void flatten(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  if (!t.is_map(ins[0])) return t.alias(l, ins[0]);
  const Shape3& s = t.shape(ins[0]);
  if (s.h == 1 && s.w == 1) {
    t.note(fmt::format("Flatten '{}' of a 1x1 map became a global_avg_pool (the same at this input size; at a larger "
                       "one it averages the map instead of refusing its size)",
                       l.name));
    return t.alias(l, t.add(l, "global_avg_pool", l.name, {}, {ins[0]}));
  }
  t.alias(l, t.add(l, "flatten", l.name, {}, {ins[0]}));
}

// Reshape of a channel vector to (1, 1, C) or (C,): the same vector.
void reshape(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  const json target = l.config.value("target_shape", json::array());
  const int64_t c = t.shape(ins[0]).c;
  const bool same = target == json::array({1, 1, c}) || target == json::array({c});
  if (t.is_map(ins[0]) || !same)
    t.unsupported(l, fmt::format("target_shape {} of a {} (halotrain reshapes a channel vector to (1, 1, C) or (C,))",
                                 Translator::show(target), t.is_map(ins[0]) ? "feature map" : "channel vector"));
  t.alias(l, ins[0]);
}

// Dense on a vector, or on the last axis of a map (a 1x1 conv).
void dense(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  const json& c = l.config;
  const int64_t units = c.at("units").get<int64_t>();
  const bool bias = c.value("use_bias", true);
  const std::string name = t.is_map(ins[0])
                               ? t.add(l, "conv2d", l.name, {{"filters", units}, {"kernel", int64_t(1)}, {"bias", bias}},
                                       {ins[0]})
                               : t.add(l, "dense", l.name, {{"units", units}, {"bias", bias}}, {ins[0]});
  t.alias(l, activation(t, l, t.weighted(name)));
}

// Dropout; with noise_shape (None, 1, 1, 1) one draw per image: stochastic depth.
void dropout(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  const double rate = l.config.value("rate", 0.0);
  const json noise = l.config.value("noise_shape", json());
  const bool per_image = noise == json::array({nullptr, 1, 1, 1});
  if (!noise.is_null() && !per_image)
    t.unsupported(l, fmt::format("noise_shape {} (none, or (None, 1, 1, 1): stochastic depth)", Translator::show(noise)));
  if (rate <= 0) return t.alias(l, ins[0]);
  t.alias(l, t.add(l, per_image ? "drop_path" : "dropout", l.name, {{"rate", rate}}, {ins[0]}));
}

void join(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  const std::string& cls = l.class_name;
  if (cls == "Concatenate" && !last_axis(l.config.value("axis", json(-1))))
    t.unsupported(l, fmt::format("axis {} (the channel axis, -1 or 3)", Translator::show(l.config.value("axis", json(-1)))));
  if (ins.size() < 2) t.unsupported(l, fmt::format("reads {} layer (at least 2)", ins.size()));
  t.alias(l, t.add(l, keras_type(l), l.name, {}, ins));
}

void upsampling(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  channels_last(t, l);
  const std::string interpolation = l.config.value("interpolation", "nearest");
  if (interpolation != "nearest" && interpolation != "bilinear")
    t.unsupported(l, fmt::format("interpolation '{}' (nearest or bilinear)", interpolation));
  t.alias(l, t.add(l, "upsampling2d", l.name, {{"size", pair_of(t, l, "size", 2)}, {"interpolation", interpolation}},
                   {ins[0]}));
}

void shift(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  channels_last(t, l);
  const bool pad = l.class_name == "ZeroPadding2D";
  const char* key = pad ? "padding" : "cropping";
  const json v = l.config.value(key, json(1));
  std::vector<int64_t> m;
  if (v.is_number_integer()) m.assign(4, v.get<int64_t>());
  if (v.is_array() && v.size() == 2)
    for (const json& a : v) {
      if (a.is_number_integer()) m.insert(m.end(), {a.get<int64_t>(), a.get<int64_t>()});
      else if (a.is_array() && a.size() == 2) m.insert(m.end(), {a[0].get<int64_t>(), a[1].get<int64_t>()});
    }
  if (m.size() != 4)
    t.unsupported(l, fmt::format("{} {} (an integer, [rows, cols] or [[top, bottom], [left, right]])", key,
                                 Translator::show(v)));
  t.alias(l, t.add(l, keras_type(l), l.name, {{key, m}}, {ins[0]}));
}

void softmax(Translator& t, const KerasLayer& l, const std::vector<std::string>& ins) {
  if (!t.is_final(l)) t.unsupported(l, "before the output (a softmax is folded into the loss only at the output)");
  t.alias(l, t.fold(LossType::SoftmaxCrossEntropy, l, ins[0]));
}

}  // namespace

namespace {
const std::map<std::string, Handler>& handlers() {
  static const std::map<std::string, Handler> table = {
      {"InputLayer", input_layer},
      {"Conv2D", conv},
      {"Convolution2D", conv},
      {"DepthwiseConv2D", conv},
      {"SeparableConv2D", conv},
      {"Conv2DTranspose", conv},
      {"BatchNormalization", batch_norm},
      {"LayerNormalization", norm},
      {"InstanceNormalization", norm},
      {"Addons>InstanceNormalization", norm},
      {"GroupNormalization", norm},
      {"Addons>GroupNormalization", norm},
      {"Activation", activation_layer},
      {"ReLU", relu},
      {"LeakyReLU", leaky_relu},
      {"MaxPooling2D", pool},
      {"AveragePooling2D", pool},
      {"GlobalAveragePooling2D", global_pool},
      {"GlobalMaxPooling2D", global_pool},
      {"Flatten", flatten},
      {"Reshape", reshape},
      {"Dense", dense},
      {"Dropout", dropout},
      {"Add", join},
      {"Concatenate", join},
      {"Multiply", join},
      {"UpSampling2D", upsampling},
      {"ZeroPadding2D", shift},
      {"Cropping2D", shift},
      {"Softmax", softmax},
  };
  return table;
}
}  // namespace

ImportedModel import_keras_json(const std::string& json_text, const std::string& source, const ImportOptions& options) {
  json model;
  try {
    model = json::parse(json_text);
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: not a Keras JSON model: {}", source, e.what()));
  }
  Translator t(source, options);
  ImportedModel m;
  try {
    m = t.run(model);
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: a Keras JSON model with an unexpected layout: {}", source, e.what()));
  }
  check_imported(m);
  return m;
}

}  // namespace ht
