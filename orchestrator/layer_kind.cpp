#include "orchestrator/layer_kind.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>

namespace ht {

namespace {

bool holds_type(const LayerValue& v, KeyType t) {
  switch (t) {
    case KeyType::Int: return std::holds_alternative<int64_t>(v);
    case KeyType::Bool: return std::holds_alternative<bool>(v);
    case KeyType::Padding: return std::holds_alternative<Padding>(v);
    case KeyType::Choice: return std::holds_alternative<std::string>(v);
    case KeyType::Size2: return std::holds_alternative<std::vector<int64_t>>(v) && std::get<std::vector<int64_t>>(v).size() == 2;
    case KeyType::Margins:
      return std::holds_alternative<std::vector<int64_t>>(v) && std::get<std::vector<int64_t>>(v).size() == 4;
    default: return std::holds_alternative<double>(v);
  }
}

// A description the readers can rely on: a shape function, unique keys other than type
// and name, defaults of the key's type, a default_key naming an earlier key of that type.
void check_kind(const LayerKind& k) {
  auto fail = [&](const std::string& why) { throw std::logic_error("layer kind '" + k.type + "': " + why); };
  if (k.type.empty() || k.keras_prefix.empty()) fail("needs a type and a Keras name prefix");
  if (!k.shape) fail("has no shape function");
  for (size_t i = 0; i < k.keys.size(); ++i) {
    const LayerKey& key = k.keys[i];
    if (key.name == "type" || key.name == "name" || key.name == "inputs") fail("key '" + key.name + "' is every layer's");
    size_t earlier = i;
    for (size_t j = 0; j < i; ++j) {
      if (k.keys[j].name == key.name) fail("key '" + key.name + "' is listed twice");
      if (k.keys[j].name == key.default_key) earlier = j;
    }
    if (key.default_value && !holds_type(*key.default_value, key.type))
      fail("the default of '" + key.name + "' is not of its type");
    if (!key.default_key.empty() && (earlier == i || k.keys[earlier].type != key.type))
      fail("'" + key.name + "' defaults to '" + key.default_key + "', which is not an earlier key of its type");
  }
}

// Kinds live here for the whole process: LayerConfig points at them.
std::deque<LayerKind>& table() {
  static std::deque<LayerKind> kinds = [] {
    std::deque<LayerKind> d;
    for (LayerKind& k : builtin_layer_kinds()) {
      check_kind(k);
      d.push_back(std::move(k));
    }
    return d;
  }();
  return kinds;
}

template <class T>
const T& value_of(const LayerConfig& l, std::string_view key) {
  const LayerValue* v = l.find(key);
  if (!v || !std::holds_alternative<T>(*v))
    throw std::logic_error(fmt::format("layer '{}' ({}) has no {} key '{}'", l.name, l.kind ? l.type() : "?",
                                       std::is_same_v<T, Padding> ? "padding" : "such", key));
  return std::get<T>(*v);
}

}  // namespace

std::string describe_value(const LayerValue& v) {
  struct Text {
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return fmt::format("{}", d); }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(const Padding& p) const {
      if (p.mode != PaddingMode::Explicit) return to_string(p.mode);
      return p.is_uniform() ? std::to_string(p.top) : fmt::format("{},{},{},{}", p.top, p.bottom, p.left, p.right);
    }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const std::vector<int64_t>& v) const {
      if (v.size() == 2 && v[0] == v[1]) return std::to_string(v[0]);  // a square window, as before [h, w] forms
      return fmt::format("{}", fmt::join(v, ","));
    }
  };
  return std::visit(Text{}, v);
}

const std::string& LayerConfig::type() const { return kind->type; }

const LayerValue* LayerConfig::find(std::string_view key) const {
  for (const auto& [k, v] : values)
    if (k == key) return &v;
  return nullptr;
}

int LayerConfig::integer(std::string_view key) const {
  // A square [h, w] (kernel, stride, ...) reads as its one integer.
  const LayerValue* v = find(key);
  if (const auto* pair = v ? std::get_if<std::vector<int64_t>>(v) : nullptr; pair && pair->size() == 2) {
    if ((*pair)[0] != (*pair)[1])
      throw std::logic_error(fmt::format("layer '{}': '{}' is [{}, {}], not one integer", name, key, (*pair)[0],
                                         (*pair)[1]));
    return int((*pair)[0]);
  }
  return int(value_of<int64_t>(*this, key));
}
std::array<int, 2> LayerConfig::pair(std::string_view key) const {
  const std::vector<int64_t>& v = value_of<std::vector<int64_t>>(*this, key);
  if (v.size() != 2) throw std::logic_error(fmt::format("layer '{}': '{}' is not a pair", name, key));
  return {int(v[0]), int(v[1])};
}
double LayerConfig::number(std::string_view key) const { return value_of<double>(*this, key); }
bool LayerConfig::flag(std::string_view key) const { return value_of<bool>(*this, key); }
const Padding& LayerConfig::padding(std::string_view key) const { return value_of<Padding>(*this, key); }
const std::string& LayerConfig::choice(std::string_view key) const { return value_of<std::string>(*this, key); }
const std::vector<int64_t>& LayerConfig::ints(std::string_view key) const {
  return value_of<std::vector<int64_t>>(*this, key);
}

void LayerConfig::set(const std::string& key, LayerValue value) {
  for (auto& [k, v] : values)
    if (k == key) {
      v = std::move(value);
      return;
    }
  throw std::logic_error(fmt::format("layer '{}' ({}) has no key '{}'", name, kind ? type() : "?", key));
}

std::vector<const LayerKind*> layer_kinds() {
  std::vector<const LayerKind*> all;
  for (const LayerKind& k : table()) all.push_back(&k);
  return all;
}

const LayerKind* find_layer_kind(const std::string& type) {
  for (const LayerKind& k : table())
    if (k.type == type) return &k;
  return nullptr;
}

const LayerKind* find_keras_kind(const std::string& keras_class) {
  const LayerKind* found = nullptr;
  for (const LayerKind& k : table()) {
    if (k.keras_class != keras_class) continue;
    if (found) return nullptr;  // several kinds share it (Activation, Dropout): the importer decides
    found = &k;
  }
  return found;
}

const LayerKind& register_layer_kind(LayerKind kind) {
  if (find_layer_kind(kind.type)) throw std::logic_error("layer kind '" + kind.type + "' is registered twice");
  check_kind(kind);
  table().push_back(std::move(kind));
  return table().back();
}

LayerConfig make_layer_config(const std::string& type, const std::vector<std::pair<std::string, LayerValue>>& values) {
  LayerConfig l;
  l.kind = find_layer_kind(type);
  if (!l.kind) throw std::logic_error("no layer kind '" + type + "'");
  for (const auto& [key, value] : values) {
    bool known = false;
    for (const LayerKey& k : l.kind->keys) known = known || k.name == key;
    if (!known) throw std::logic_error(fmt::format("layer kind '{}' has no key '{}'", type, key));
  }
  for (const LayerKey& k : l.kind->keys) {
    LayerValue v;
    bool given = false;
    for (const auto& [key, value] : values)
      if (key == k.name) v = value, given = true;
    if (!given && k.default_value) v = *k.default_value, given = true;
    if (!given && !k.default_key.empty() && l.find(k.default_key)) v = *l.find(k.default_key), given = true;
    if (!given) throw std::logic_error(fmt::format("layer kind '{}': key '{}' is required", type, k.name));
    if (const int64_t* i = std::get_if<int64_t>(&v); i && k.type == KeyType::Size2) v = std::vector<int64_t>{*i, *i};
    l.values.emplace_back(k.name, v);
  }
  return l;
}


}  // namespace ht
