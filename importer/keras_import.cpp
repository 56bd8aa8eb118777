#include "importer/keras_import.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>

#include "orchestrator/layer_kind.hpp"
#include "orchestrator/model_spec.hpp"
#include "worker/h5.hpp"
#include "worker/keras_h5.hpp"

namespace ht {

namespace {

using json = nlohmann::json;

const std::vector<std::string> kClasses = {
    "InputLayer", "Conv2D", "Conv2DTranspose", "DepthwiseConv2D", "SeparableConv2D", "BatchNormalization",
    "Activation", "ReLU", "LeakyReLU", "MaxPooling2D", "AveragePooling2D", "GlobalAveragePooling2D",
    "GlobalMaxPooling2D", "Dense", "Dropout", "Add", "Concatenate", "UpSampling2D", "ZeroPadding2D", "Cropping2D",
    "Flatten (of a 1x1 map)"};

// One layer as the Keras JSON lists it, with the names of the layers it reads.
struct KerasLayer {
  std::string class_name, name;
  json config;
  std::vector<std::string> inbound;
};

class Translator {
 public:
  explicit Translator(std::string source) { out_.source = std::move(source); }

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
    for (const KerasLayer& l : layers) translate(l);
    if (!has_input_) fail("found no input shape (an InputLayer or a first layer with batch_input_shape)");
    const std::string last = output_of(output_);
    if (last == kInputName) fail("the model's output is its input: it has no layers halotrain can train");
    // The model's output is the last halotrain layer: drop what comes after it (an unused
    // branch would be refused by the config reader anyway).
    auto it = std::find_if(out_.model.layers.begin(), out_.model.layers.end(),
                           [&](const LayerConfig& c) { return c.name == last; });
    out_.model.layers.erase(it + 1, out_.model.layers.end());
    if (!loss_set_) {
      out_.model.loss = LossType::MSE;
      out_.notes.push_back("the output has no softmax or sigmoid: model.loss mse (edit it)");
    }
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { throw ConfigError(fmt::format("{}: {}", out_.source, why)); }

  [[noreturn]] void unsupported(const KerasLayer& l, const std::string& what) const {
    fail(fmt::format("{} '{}' {}; halotrain imports {}", l.class_name, l.name, what, fmt::join(kClasses, ", ")));
  }

  static std::string show(const json& v) { return v.dump(); }

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

  std::string output_of(const std::string& keras_name) const {
    auto it = outputs_.find(keras_name);
    if (it == outputs_.end()) fail(fmt::format("a layer reads '{}', which comes later or is no layer", keras_name));
    return it->second;
  }

  // Appends a halotrain layer reading `inputs` (halotrain names); returns its name.
  std::string add(LayerConfig c, const std::vector<std::string>& inputs) {
    while (taken_.count(c.name)) c.name += "_";
    taken_.insert(c.name);
    return append_layer(out_.model, std::move(c), inputs);
  }
  static LayerConfig layer(const std::string& type, const std::string& name,
                           const std::vector<std::pair<std::string, LayerValue>>& values = {}) {
    return imported_layer(type, name, values);
  }

  // Square sizes only: `key` as [a, a] (or a number).
  int64_t square(const KerasLayer& l, const std::string& key, int64_t def) const {
    if (!l.config.contains(key) || l.config[key].is_null()) return def;
    const json& v = l.config[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_array() && v.size() == 2 && v[0] == v[1] && v[0].is_number_integer()) return v[0].get<int64_t>();
    unsupported(l, fmt::format("{} {}: halotrain's windows are square", key, show(v)));
  }
  Padding padding(const KerasLayer& l) const {
    const std::string p = l.config.value("padding", "valid");
    if (p == "valid") return {PaddingMode::Valid, 0};
    if (p == "same") return {PaddingMode::Same, 0};
    unsupported(l, fmt::format("padding '{}' (valid or same)", p));
  }
  void channels_last(const KerasLayer& l) const {
    const std::string f = l.config.value("data_format", "channels_last");
    if (f != "channels_last") unsupported(l, fmt::format("data_format {} (channels_last only)", f));
  }
  void window_checks(const KerasLayer& l, int64_t stride, int64_t dilation) const {
    channels_last(l);
    if (stride > 1 && dilation > 1)
      unsupported(l, fmt::format("dilation_rate {} with strides {}", show(l.config["dilation_rate"]),
                                 show(l.config["strides"])));
  }

  // The layer's `activation` after it; a final softmax or sigmoid becomes the loss.
  std::string activation(const KerasLayer& l, const std::string& act, const std::string& from) {
    if (act.empty() || act == "linear") return from;
    const bool final = l.name == output_;
    if (final && act == "softmax") return fold(LossType::SoftmaxCrossEntropy, l, from);
    if (final && act == "sigmoid") return fold(LossType::SigmoidBCE, l, from);
    if (act == "relu" || act == "sigmoid" || act == "tanh")
      return add(layer(act, l.class_name == "Activation" ? l.name : l.name + "_" + act), {from});
    unsupported(l, fmt::format("activation '{}'{} (relu, sigmoid, tanh, linear; softmax and sigmoid at the output)",
                               act, act == "softmax" ? " before the output" : ""));
  }
  std::string fold(LossType loss, const KerasLayer& l, const std::string& from) {
    out_.model.loss = loss;
    loss_set_ = true;
    out_.notes.push_back(fmt::format("the final {} of {} '{}' is folded into model.loss {}",
                                     loss == LossType::SigmoidBCE ? "sigmoid" : "softmax", l.class_name, l.name,
                                     to_string(loss)));
    return from;
  }

  void translate(const KerasLayer& l) {
    const json& c = l.config;
    if (l.class_name == "InputLayer") {
      const json shape = c.value("batch_input_shape", json::array());
      if (shape.size() != 4 || !shape[1].is_number_integer() || !shape[2].is_number_integer() ||
          !shape[3].is_number_integer())
        unsupported(l, fmt::format("batch_input_shape {}: halotrain needs [None, H, W, C] with H, W, C fixed",
                                   show(shape)));
      out_.model.height = shape[1].get<int>();
      out_.model.width = shape[2].get<int>();
      out_.model.channels = shape[3].get<int>();
      has_input_ = true;
      outputs_[l.name] = kInputName;
      return;
    }
    std::vector<std::string> ins;
    for (const std::string& k : l.inbound) ins.push_back(output_of(k));
    if (ins.empty()) unsupported(l, "reads no layer");
    const std::string& from = ins[0];
    std::string result;
    const std::string& cls = l.class_name;
    const bool bias = c.value("use_bias", true);
    if (ins.size() > 1 && cls != "Add" && cls != "Concatenate") unsupported(l, "reads several layers");
    if (cls == "Conv2D" || cls == "DepthwiseConv2D" || cls == "SeparableConv2D") {
      const int64_t kernel = square(l, "kernel_size", 1), stride = square(l, "strides", 1),
                    dilation = square(l, "dilation_rate", 1);
      window_checks(l, stride, dilation);
      if (c.value("groups", 1) != 1) unsupported(l, fmt::format("groups {}", show(c["groups"])));
      std::vector<std::pair<std::string, LayerValue>> v = {{"kernel", kernel},
                                                           {"stride", stride},
                                                           {"padding", padding(l)},
                                                           {"dilation", dilation},
                                                           {"bias", bias}};
      if (cls != "DepthwiseConv2D") v.insert(v.begin(), {"filters", c.at("filters").get<int64_t>()});
      if (cls != "Conv2D") v.push_back({"depth_multiplier", c.value("depth_multiplier", int64_t(1))});
      const char* type = cls == "Conv2D" ? "conv2d" : cls == "DepthwiseConv2D" ? "depthwise_conv2d" : "separable_conv2d";
      result = activation(l, c.value("activation", "linear"), weighted(add(layer(type, l.name, v), {from})));
    } else if (cls == "Conv2DTranspose") {
      const int64_t kernel = square(l, "kernel_size", 1), stride = square(l, "strides", 1);
      window_checks(l, stride, square(l, "dilation_rate", 1));
      if (square(l, "dilation_rate", 1) != 1) unsupported(l, fmt::format("dilation_rate {}", show(c["dilation_rate"])));
      if (c.contains("output_padding") && !c["output_padding"].is_null())
        unsupported(l, fmt::format("output_padding {}", show(c["output_padding"])));
      if (kernel < stride) unsupported(l, fmt::format("kernel_size {} smaller than strides {}", kernel, stride));
      result = activation(l, c.value("activation", "linear"),
                          weighted(add(layer("conv2d_transpose", l.name,
                                             {{"filters", c.at("filters").get<int64_t>()},
                                              {"kernel", kernel},
                                              {"stride", stride},
                                              {"padding", padding(l)},
                                              {"bias", bias}}),
                                       {from})));
    } else if (cls == "BatchNormalization") {
      const json axis = c.value("axis", json(-1));
      const bool last_axis = axis == json(-1) || axis == json(3) || axis == json::array({3}) || axis == json::array({-1});
      if (!last_axis) unsupported(l, fmt::format("axis {} (the channel axis, -1 or 3)", show(axis)));
      result = weighted(add(layer("batch_norm", l.name,
                                  {{"momentum", c.value("momentum", 0.99)},
                                   {"epsilon", c.value("epsilon", 1e-3)},
                                   {"center", c.value("center", true)},
                                   {"scale", c.value("scale", true)}}),
                            {from}));
    } else if (cls == "Activation") {
      result = activation(l, c.value("activation", "linear"), from);
    } else if (cls == "ReLU") {
      const bool plain = (c.value("max_value", json()).is_null()) && c.value("negative_slope", 0.0) == 0.0 &&
                         c.value("threshold", 0.0) == 0.0;
      if (!plain)
        unsupported(l, fmt::format("max_value {} negative_slope {} threshold {} (a plain ReLU only)",
                                   show(c.value("max_value", json())), show(c.value("negative_slope", 0.0)),
                                   show(c.value("threshold", 0.0))));
      result = add(layer("relu", l.name), {from});
    } else if (cls == "LeakyReLU") {
      result = add(layer("leaky_relu", l.name, {{"alpha", c.value("alpha", 0.3)}}), {from});
    } else if (cls == "MaxPooling2D" || cls == "AveragePooling2D") {
      channels_last(l);
      const int64_t pool = square(l, "pool_size", 2), stride = square(l, "strides", pool);
      result = add(layer(cls == "MaxPooling2D" ? "max_pool2d" : "avg_pool2d", l.name,
                         {{"pool", pool}, {"stride", stride}, {"padding", padding(l)}}),
                   {from});
    } else if (cls == "GlobalAveragePooling2D" || cls == "GlobalMaxPooling2D") {
      channels_last(l);
      if (c.value("keepdims", false)) unsupported(l, "keepdims true");
      result = add(layer(cls == "GlobalAveragePooling2D" ? "global_avg_pool" : "global_max_pool", l.name), {from});
    } else if (cls == "Flatten") {
      // A 1x1 map flattened is its global average; checked against the shapes later.
      flattens_.push_back(l.name);
      result = add(layer("global_avg_pool", l.name), {from});
    } else if (cls == "Dense") {
      result = activation(l, c.value("activation", "linear"),
                          weighted(add(layer("dense", l.name, {{"units", c.at("units").get<int64_t>()}, {"bias", bias}}),
                                       {from})));
    } else if (cls == "Dropout") {
      const double rate = c.value("rate", 0.0);
      if (c.contains("noise_shape") && !c["noise_shape"].is_null())
        unsupported(l, fmt::format("noise_shape {}", show(c["noise_shape"])));
      result = rate > 0 ? add(layer("dropout", l.name, {{"rate", rate}}), {from}) : from;
    } else if (cls == "Add" || cls == "Concatenate") {
      if (cls == "Concatenate") {
        const json axis = c.value("axis", json(-1));
        if (axis != json(-1) && axis != json(3)) unsupported(l, fmt::format("axis {} (the channel axis, -1 or 3)", show(axis)));
      }
      if (ins.size() < 2) unsupported(l, fmt::format("reads {} layer (at least 2)", ins.size()));
      result = add(layer(cls == "Add" ? "add" : "concatenate", l.name), ins);
    } else if (cls == "UpSampling2D") {
      channels_last(l);
      const json size = c.value("size", json::array({2, 2}));
      const std::vector<int64_t> s =
          size.is_array() ? size.get<std::vector<int64_t>>() : std::vector<int64_t>(2, size.get<int64_t>());
      const std::string interpolation = c.value("interpolation", "nearest");
      if (interpolation != "nearest" && interpolation != "bilinear")
        unsupported(l, fmt::format("interpolation '{}' (nearest or bilinear)", interpolation));
      result = add(layer("upsampling2d", l.name, {{"size", s}, {"interpolation", interpolation}}), {from});
    } else if (cls == "ZeroPadding2D" || cls == "Cropping2D") {
      channels_last(l);
      const char* key = cls == "ZeroPadding2D" ? "padding" : "cropping";
      result = add(layer(cls == "ZeroPadding2D" ? "zero_padding2d" : "cropping2d", l.name, {{key, margins(l, key)}}),
                   {from});
    } else if (cls == "Softmax" && l.name == output_) {
      result = fold(LossType::SoftmaxCrossEntropy, l, from);
    } else {
      unsupported(l, "is not a layer halotrain has");
    }
    outputs_[l.name] = result;
  }

  std::vector<int64_t> margins(const KerasLayer& l, const char* key) const {
    const json v = l.config.value(key, json(1));
    if (v.is_number_integer()) {
      const int64_t m = v.get<int64_t>();
      return {m, m, m, m};
    }
    std::vector<int64_t> out;
    if (v.is_array() && v.size() == 2) {
      for (const json& a : v) {
        if (a.is_number_integer()) {
          out.insert(out.end(), {a.get<int64_t>(), a.get<int64_t>()});
        } else if (a.is_array() && a.size() == 2) {
          out.insert(out.end(), {a[0].get<int64_t>(), a[1].get<int64_t>()});
        }
      }
    }
    if (out.size() != 4) unsupported(l, fmt::format("{} {} (an integer, [rows, cols] or [[top, bottom], [left, right]])", key, show(v)));
    return out;
  }

  std::string weighted(const std::string& name) {
    out_.weighted_layers.push_back(name);
    return name;
  }

 public:
  const std::vector<std::string>& flattens() const { return flattens_; }

 private:
  ImportedModel out_;
  std::map<std::string, std::string> outputs_;  // Keras layer -> the halotrain name holding its output
  std::set<std::string> taken_;
  std::vector<std::string> flattens_;
  std::string output_;
  bool has_input_ = false, loss_set_ = false;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot read the model file", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool is_hdf5(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  return in.gcount() == 8 && std::string(sig, 8) == std::string("\x89HDF\r\n\x1a\n", 8);
}

std::string stem(const std::string& path) {
  const std::filesystem::path p(path);
  return (p.parent_path() / p.stem()).string();
}

// The imported model as a Config, built and checked as `plan` would.
Config imported_config(const ImportedModel& m, const std::string& init_weights) {
  Config c;
  c.name = m.name.empty() ? "imported" : m.name;
  c.run_dir = "runs/" + c.name;
  c.source_path = m.source;
  c.model = m.model;
  c.data.train = "data/" + c.name + ".h5";
  // Per-pixel outputs train on masks (or class maps), classifiers on labels.
  const ModelSpec spec = build_model_spec(c);
  const bool masks = spec.spatial_output();
  c.data.targets = masks ? "masks" : "labels";
  SynthesizeConfig s;
  s.count = 8;
  s.height = m.model.height;
  s.width = m.model.width;
  s.channels = m.model.channels;
  s.masks = masks;
  s.classes = masks ? 2 : std::max(spec.output().c, 2);
  c.data.synthesize = s;
  c.training.steps = 100;
  c.training.init_weights = init_weights;
  c.parallel.grid_auto = true;
  return c;
}

}  // namespace

LayerConfig imported_layer(const std::string& type, const std::string& name,
                           const std::vector<std::pair<std::string, LayerValue>>& values) {
  LayerConfig c = make_layer_config(type, values);
  c.name = name;
  return c;
}

std::string append_layer(ModelConfig& model, LayerConfig layer, const std::vector<std::string>& inputs) {
  const std::string before = model.layers.empty() ? kInputName : model.layers.back().name;
  if (inputs != std::vector<std::string>{before}) layer.inputs = inputs;
  model.layers.push_back(std::move(layer));
  return model.layers.back().name;
}

ImportedModel import_keras_json(const std::string& json_text, const std::string& source) {
  json model;
  try {
    model = json::parse(json_text);
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: not a Keras JSON model: {}", source, e.what()));
  }
  Translator t(source);
  ImportedModel m;
  try {
    m = t.run(model);
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: a Keras JSON model with an unexpected layout: {}", source, e.what()));
  }
  // The shapes: the model spec of a config of this model.
  check_imported(m, t.flattens());
  return m;
}

void check_imported(const ImportedModel& m, const std::vector<std::string>& flattens) {
  ModelSpec spec;
  try {
    spec = build_model_spec(imported_config(m, ""));
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}: imported, the model does not work in halotrain: {}", m.source, e.what()));
  }
  for (const LayerSpec& l : spec.layers)
    if (std::find(flattens.begin(), flattens.end(), l.config.name) != flattens.end() && (l.in.h != 1 || l.in.w != 1))
      throw ConfigError(fmt::format("{}: Flatten '{}' of a {}x{}x{} map: halotrain flattens only 1x1 maps (use a "
                                    "global average pool); halotrain imports {}",
                                    m.source, l.config.name, l.in.h, l.in.w, l.in.c, fmt::join(kClasses, ", ")));
}

ImportedModel import_keras_file(const std::string& path) {
  if (!is_hdf5(path)) return import_keras_json(read_text(path), path);
  h5::quiet();
  std::string text;
  try {
    h5::Hid f = h5::open_file(path);
    if (!h5::has_attr(f, "model_config"))
      throw ConfigError(fmt::format("{}: an HDF5 file without a model_config attribute; expected a Keras "
                                    "model.save() file (a weights-only file holds no model)",
                                    path));
    text = h5::read_attr_string(f, "model_config");
  } catch (const h5::H5Error& e) {
    throw ConfigError(fmt::format("{}: cannot read it as a Keras model file: {}", path, e.reason()));
  }
  ImportedModel m = import_keras_json(text, path);
  m.has_weights = KerasWeightsFile(path).is_model_file();
  return m;
}

std::string imported_config_yaml(const ImportedModel& m, const std::string& init_weights) {
  const Config c = imported_config(m, init_weights);
  std::string head = fmt::format(
      "# Imported from {} by `halotrain import`: {} halotrain layers, Keras names kept.\n", m.source,
      m.model.layers.size());
  for (const std::string& n : m.notes) head += "# Note: " + n + ".\n";
  head +=
      "# The model section is the imported model. data (synthetic images of the model's input\n"
      "# size: replace data.train and data.targets with your file and remove data.synthesize),\n"
      "# training and parallel are defaults to edit; `halotrain plan` checks the result.\n";
  const std::string text = head + to_yaml(c);
  // What is written must read back and plan.
  build_model_spec(parse_config(text, m.source + " (imported config)"));
  return text;
}

namespace {

// The weights of a model.save() file's model_weights, for the model's weighted layers.
std::vector<ImportedWeights> keras_file_weights(const ImportedModel& m) {
  const KerasWeightsFile in(m.source);
  const std::vector<std::string>& stored = in.layer_names();
  std::vector<ImportedWeights> out;
  for (const std::string& name : m.weighted_layers) {
    if (std::find(stored.begin(), stored.end(), name) == stored.end())
      throw ConfigError(fmt::format("{}: the model_weights hold no weights of layer '{}'", m.source, name));
    ImportedWeights w;
    w.layer = name;
    for (const std::string& stored_name : in.weight_names(name)) {
      w.names.push_back(stored_name.substr(stored_name.rfind('/') + 1));
      w.shapes.push_back(in.shape(name, stored_name));
      w.values.emplace_back(size_t(h5::element_count(w.shapes.back())));
      in.read(name, stored_name, w.values.back().data());
    }
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace

void write_imported_weights(const ImportedModel& m, const std::string& path) {
  const std::vector<ImportedWeights> weights = m.weights.empty() ? keras_file_weights(m) : m.weights;
  std::vector<std::string> names;
  for (const LayerConfig& l : m.model.layers) names.push_back(l.name);
  const std::string temp = h5::temp_path(path);
  try {
    {
      h5::Hid f = h5::create_file(temp);
      h5::write_attr_strings(f, "layer_names", names);
      h5::write_attr_string(f, "backend", "tensorflow");
      h5::write_attr_string(f, "keras_version", "2.1.6");
      for (const std::string& name : names) {
        h5::Hid g = h5::create_group(f, name);
        std::vector<std::string> weight_names;
        for (const ImportedWeights& w : weights) {
          if (w.layer != name) continue;
          for (size_t i = 0; i < w.names.size(); ++i) {
            h5::write_dataset(g, name + "/" + w.names[i], w.shapes[i], w.values[i].data());
            weight_names.push_back(name + "/" + w.names[i]);
          }
        }
        h5::write_attr_strings(g, "weight_names", weight_names);
      }
    }
    h5::commit_file(temp, path);
  } catch (const h5::H5Error& e) {
    std::remove(temp.c_str());
    throw ConfigError(fmt::format("{}: writing the weights failed: {}", path, e.reason()));
  } catch (...) {
    std::remove(temp.c_str());
    throw;
  }
}

int run_import(const std::string& model_path, std::string config_path, std::string weights_path, std::ostream& out) {
  const bool onnx = std::filesystem::path(model_path).extension() == ".onnx";
  const ImportedModel m = onnx ? import_onnx_file(model_path) : import_keras_file(model_path);
  if (config_path.empty()) config_path = stem(model_path) + ".yaml";
  if (m.has_weights && weights_path.empty()) weights_path = stem(model_path) + "-init.h5";
  if (!m.has_weights) weights_path.clear();
  const std::string text = imported_config_yaml(m, weights_path);
  if (!weights_path.empty()) write_imported_weights(m, weights_path);
  const std::string temp = config_path + ".tmp";
  {
    std::ofstream f(temp, std::ios::trunc);
    f << text;
    if (!f.flush()) throw ConfigError(fmt::format("{}: cannot write the config", config_path));
  }
  std::filesystem::rename(temp, config_path);
  out << fmt::format("imported {} ({} layers) into {}{}\n", model_path, m.model.layers.size(), config_path,
                     weights_path.empty() ? "" : " and its weights into " + weights_path);
  for (const std::string& n : m.notes) out << "note: " << n << "\n";
  return 0;
}

}  // namespace ht
