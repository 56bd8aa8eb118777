// The `model:` section of SPEC section 3 (input, layers, loss): every layer kind's keys come
// from its LayerKind (orchestrator/layer_kind.hpp); default names follow Keras 2 and
// `inputs` is resolved to earlier layers. The rest of the schema is in config.cpp.
#include "orchestrator/config_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "orchestrator/layer_kind.hpp"

namespace ht {

using cfg::Item;
using cfg::kIntMax;
using cfg::MapReader;
using cfg::peek;

namespace {

std::vector<std::string> layer_type_names() {
  std::vector<std::string> names;
  for (const LayerKind* k : layer_kinds()) names.push_back(k->type);
  return names;
}

std::vector<std::string> layer_keys(const LayerKind& kind) {
  std::vector<std::string> keys = {"type", "name", "inputs", "trainable"};
  for (const LayerKey& k : kind.keys) keys.push_back(k.name);
  return keys;
}

// An integer (every side), [h, w], [[top, bottom], [left, right]], same or valid.
Padding read_padding(const Item& it) {
  const char* what = "an integer >= 0, [h, w], [[top, bottom], [left, right]], same or valid";
  if (it.node.IsSequence()) {
    if (it.node.size() != 2) it.expected(what);
    int sides[4];
    for (int axis = 0; axis < 2; ++axis) {
      const Item a = it.element(size_t(axis));
      if (a.node.IsScalar()) {
        sides[2 * axis] = sides[2 * axis + 1] = int(cfg::as_int(a, 0, kIntMax));
      } else if (a.node.IsSequence() && a.node.size() == 2) {
        sides[2 * axis] = int(cfg::as_int(a.element(0), 0, kIntMax));
        sides[2 * axis + 1] = int(cfg::as_int(a.element(1), 0, kIntMax));
      } else {
        a.expected("an integer >= 0 or a list [before, after]");
      }
    }
    return {PaddingMode::Explicit, sides[0], sides[1], sides[2], sides[3]};
  }
  if (!it.node.IsScalar()) it.expected(what);
  const std::string s = it.node.Scalar();
  if (s == "same") return {PaddingMode::Same};
  if (s == "valid") return {PaddingMode::Valid};
  if (!s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '+'))
    return Padding::uniform(int(cfg::as_int(it, 0, kIntMax)));
  const std::string near = cfg::nearest(s, {"same", "valid"});
  if (cfg::is_near(s, near))
    it.fail(fmt::format("{}: expected {}, found {}; did you mean '{}'?", it.path, what, cfg::describe(it.node), near));
  it.expected(what);
}

std::string expected_value(const LayerKey& key);

// Size2: n or [rows, cols] (each >= 1). Margins: n, [rows, cols] or [[top, bottom], [left,
// right]] (each >= 0), as Keras's ZeroPadding2D and Cropping2D take them.
std::vector<int64_t> read_ints(const Item& it, const LayerKey& key) {
  const bool margins = key.type == KeyType::Margins;
  const int64_t min = margins ? 0 : 1;
  if (it.node.IsScalar()) {
    const int64_t v = cfg::as_int(it, min, kIntMax);
    return margins ? std::vector<int64_t>{v, v, v, v} : std::vector<int64_t>{v, v};
  }
  if (!it.node.IsSequence() || it.node.size() != 2) it.expected(expected_value(key));
  const Item rows = it.element(0), cols = it.element(1);
  if (!margins) return {cfg::as_int(rows, 1, kIntMax), cfg::as_int(cols, 1, kIntMax)};
  std::vector<int64_t> out;
  for (const Item& axis : {rows, cols}) {
    if (axis.node.IsScalar()) {
      const int64_t v = cfg::as_int(axis, 0, kIntMax);
      out.insert(out.end(), {v, v});
    } else if (axis.node.IsSequence() && axis.node.size() == 2) {
      out.insert(out.end(), {cfg::as_int(axis.element(0), 0, kIntMax), cfg::as_int(axis.element(1), 0, kIntMax)});
    } else {
      axis.expected("an integer >= 0 or a list [before, after]");
    }
  }
  return out;
}

std::string expected_value(const LayerKey& key) {
  switch (key.type) {
    case KeyType::Int: return fmt::format("an integer >= {}", key.min);
    case KeyType::Unit: return "a number in [0, 1)";
    case KeyType::Positive: return "a number > 0";
    case KeyType::NonNegative: return "a number >= 0";
    case KeyType::Real: return "a finite number";
    case KeyType::Bool: return "true or false";
    case KeyType::Padding: return "an integer >= 0, [h, w], [[top, bottom], [left, right]], same or valid";
    case KeyType::Choice: return "one of " + cfg::join(key.choices, " | ");
    case KeyType::Size2: return "an integer >= 1 or a list [rows, cols] of them";
    case KeyType::Margins: return "an integer >= 0, [rows, cols] or [[top, bottom], [left, right]]";
  }
  return "a value";
}

LayerValue read_layer_value(const MapReader& r, const LayerKey& key, const LayerConfig& so_far) {
  const std::string& name = key.name;
  if (!r.has(name)) {
    if (key.default_value) return *key.default_value;
    if (!key.default_key.empty()) return *so_far.find(key.default_key);
    r[name].missing(expected_value(key));
  }
  switch (key.type) {
    case KeyType::Int: return r.get_int(name, 0, key.min, kIntMax);
    case KeyType::Unit: return r.get_unit(name, 0);
    case KeyType::Positive: return r.get_positive(name, 1);
    case KeyType::NonNegative: return r.get_nonneg(name, 0);
    case KeyType::Real: return r.get_finite(name, 0);
    case KeyType::Bool: return r.get_bool(name, false);
    case KeyType::Padding: return read_padding(r[name]);
    case KeyType::Choice: return key.choices.at(cfg::as_choice(r[name], key.choices));
    case KeyType::Size2: return read_ints(r[name], key);
    case KeyType::Margins: return read_ints(r[name], key);
  }
  throw std::logic_error("unknown key type");
}

LayerConfig read_layer(const Item& it) {
  const char* shape = "a map such as {type: conv2d, filters: 16}";
  if (!it.node.IsMap()) it.expected(shape);
  const Item type_item = peek(it, "type");
  const std::vector<std::string> type_names = layer_type_names();
  if (!type_item.present) type_item.missing("one of " + cfg::join(type_names, " | "));
  LayerConfig l;
  l.kind = find_layer_kind(type_names.at(cfg::as_choice(type_item, type_names)));
  l.line = it.line();
  const std::vector<std::string> allowed = layer_keys(*l.kind);
  auto foreign = [&](const std::string& key) -> std::optional<std::string> {
    std::vector<std::string> owners;
    for (const LayerKind* kind : layer_kinds()) {
      const auto keys = layer_keys(*kind);
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) owners.push_back(kind->type);
    }
    if (owners.empty()) return std::nullopt;
    return fmt::format("is not allowed for a {} layer (it is a setting of {}); allowed keys: {}", l.type(),
                       cfg::join(owners, ", "), cfg::join(allowed, ", "));
  };
  MapReader r(it, allowed, foreign, /*null_is_empty=*/false);
  if (Item n = r["name"]; n.present) {
    l.name = cfg::as_string(n);
    // The name becomes an HDF5 group in checkpoints.
    if (l.name.find('/') != std::string::npos) n.expected("a layer name without '/'");
    if (l.name == kInputName) n.fail(fmt::format("{}: 'input' names the model's input; choose another name", n.path));
  }
  if (Item in = r["inputs"]; in.present) {
    const char* what = "a list of names of earlier layers (or input), such as [conv2d_1, add_1]";
    if (!in.node.IsSequence() || in.node.size() == 0) in.expected(what);
    for (size_t i = 0; i < in.node.size(); ++i) l.inputs.push_back(cfg::as_string(in.element(i)));
  }
  if (Item t = r["trainable"]; t.present) l.trainable = cfg::as_bool(t);
  for (const LayerKey& key : l.kind->keys) l.values.emplace_back(key.name, read_layer_value(r, key, l));
  return l;
}

// Keras default names for unnamed layers; no two layers may share a name.
void name_layers(const Item& layers_item, std::vector<LayerConfig>& layers) {
  std::map<std::string, size_t> explicit_names;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].name.empty()) continue;
    auto [pos, fresh] = explicit_names.emplace(layers[i].name, i);
    if (!fresh) {
      const Item first = layers_item.element(pos->second), second = layers_item.element(i);
      second.fail(fmt::format("{}.name: duplicate layer name '{}'; model.layers[{}] at {} already uses it",
                              second.path, layers[i].name, pos->second, first.where()));
    }
  }
  // Keras counts per name prefix: kinds that share one (relu, sigmoid, tanh are all
  // Activation layers) share its numbers.
  std::map<std::string, int> counters;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i].name.empty()) continue;
    const std::string& prefix = layers[i].kind->keras_prefix;
    layers[i].name = fmt::format("{}_{}", prefix, ++counters[prefix]);
    auto clash = explicit_names.find(layers[i].name);
    if (clash != explicit_names.end()) {
      const Item named = layers_item.element(clash->second), unnamed = layers_item.element(i);
      named.fail(fmt::format("{}.name: '{}' is also the default name of model.layers[{}] at {}; choose another name",
                             named.path, layers[i].name, i, unnamed.where()));
    }
  }
}

// The graph (SPEC section 7): every name in `inputs` is an earlier layer or the input, a
// layer takes as many inputs as its kind does, and every layer leads to the output.
void link_layers(const Item& layers_item, const std::vector<LayerConfig>& layers) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < layers.size(); ++i) index.emplace(layers[i].name, i);
  std::vector<bool> read(layers.size(), false);
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerConfig& l = layers[i];
    const Item item = layers_item.element(i);
    const std::string self = fmt::format("model.layers[{}] ({} '{}')", i, l.type(), l.name);
    for (size_t k = 0; k < l.inputs.size(); ++k) {
      const std::string& name = l.inputs[k];
      if (name == kInputName) continue;
      auto it = index.find(name);
      if (it == index.end()) {
        std::vector<std::string> earlier = {kInputName};
        for (size_t j = 0; j < i; ++j) earlier.push_back(layers[j].name);
        const std::string near = cfg::nearest(name, earlier);
        item.fail(fmt::format("{}.inputs[{}]: {} reads '{}', which is no layer of the model{}", item.path, k, self,
                              name, cfg::is_near(name, near) ? fmt::format("; did you mean '{}'?", near) : ""));
      }
      if (it->second >= i)
        item.fail(fmt::format("{}.inputs[{}]: {} reads '{}', which is {} (model.layers[{}]); a layer may only read "
                              "earlier layers",
                              item.path, k, self, name, it->second == i ? "itself" : "a later layer", it->second));
      read[it->second] = true;
    }
    if (l.inputs.empty() && i > 0) read[i - 1] = true;
    const LayerTraits& t = l.kind->traits;
    const size_t count = l.inputs.empty() ? 1 : l.inputs.size();
    if (t.min_inputs > 1 && l.inputs.empty())
      item.fail(fmt::format("{}: {} needs inputs: a list of at least {} layer names", item.path, self, t.min_inputs));
    if (int(count) < t.min_inputs || (t.max_inputs > 0 && int(count) > t.max_inputs))
      item.fail(fmt::format("{}.inputs: {} takes {} input{}; found {}", item.path, self,
                            t.max_inputs == t.min_inputs ? std::to_string(t.min_inputs)
                                                         : fmt::format("at least {}", t.min_inputs),
                            t.max_inputs == 1 ? "" : "s", count));
  }
  // A layer no later layer reads (the last excepted) leads nowhere: its work would be lost.
  for (size_t i = 0; i + 1 < layers.size(); ++i)
    if (!read[i]) {
      const Item item = layers_item.element(i);
      item.fail(fmt::format("{}: model.layers[{}] ({} '{}') is read by no later layer, so it does not lead to the "
                            "model's output (the last layer, '{}'); remove it or name it in a later layer's inputs",
                            item.path, i, layers[i].type(), layers[i].name, layers.back().name));
    }
}

}  // namespace

void read_model(const MapReader& root, ModelConfig& m) {
  Item model_item = root["model"];
  if (!model_item.present) model_item.missing("a map with input, layers and loss");
  MapReader r(model_item, {"input", "layers", "loss"});
  const char* input_what = "a list [height, width, channels] of integers >= 1";
  Item input = r["input"];
  if (!input.present) input.missing(input_what);
  if (!input.node.IsSequence() || input.node.size() != 3) input.expected(input_what);
  m.height = int(cfg::as_int(input.element(0), 1, kIntMax));
  m.width = int(cfg::as_int(input.element(1), 1, kIntMax));
  m.channels = int(cfg::as_int(input.element(2), 1, kIntMax));

  const char* layers_what = "a list of layers such as [{type: conv2d, filters: 16}, {type: relu}]";
  Item layers = r["layers"];
  if (!layers.present) layers.missing(layers_what);
  if (!layers.node.IsSequence() || layers.node.size() == 0) layers.expected(layers_what);
  for (size_t i = 0; i < layers.node.size(); ++i) m.layers.push_back(read_layer(layers.element(i)));
  name_layers(layers, m.layers);
  link_layers(layers, m.layers);

  m.loss = r.get_choice("loss", LossType::SoftmaxCrossEntropy, {"softmax_cross_entropy", "sigmoid_bce", "mse"},
                        {LossType::SoftmaxCrossEntropy, LossType::SigmoidBCE, LossType::MSE});
}

}  // namespace ht
