// Generic, schema-agnostic helpers for reading a validated YAML config: where a node came
// from (file line or --set override), typed scalar readers with uniform messages, a map
// reader that rejects unknown keys up front, and --set application. Internal to config*.cpp.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace ht::cfg {

struct Override {
  std::string text;  // as the user wrote it: "model.layers[0].filters=8"
  std::string path;  // canonical key path: "model.layers[0].filters"
};

// Names the origin of a node in messages. Overrides replace whole subtrees, so anything at
// or under an override's path came from it; nodes created to hold an override have no mark.
struct Source {
  std::string name;
  std::vector<Override> overrides;

  std::string where(const std::string& path, const YAML::Node& anchor) const;
  int line(const std::string& path, const YAML::Node& anchor) const;  // 1-based; 0 if not from the file
};

// One value in the tree, with its key path and the node that locates messages about it.
struct Item {
  const Source* src = nullptr;
  std::string path;
  YAML::Node node;    // the value; meaningless when !present
  YAML::Node anchor;  // the key of a map entry, the element of a list; the parent when absent
  bool present = false;

  Item() = default;
  Item(const Item&) = default;
  // yaml-cpp's Node::operator= overwrites the node referred to, so rebind instead.
  Item& operator=(const Item& o) {
    src = o.src, path = o.path, present = o.present;
    node.reset(o.node), anchor.reset(o.anchor);
    return *this;
  }
  std::string where() const { return src->where(path, anchor); }
  int line() const { return src->line(path, anchor); }
  bool is_null() const { return present && node.IsNull(); }
  [[noreturn]] void fail(const std::string& msg) const;          // "{where}: {msg}"
  [[noreturn]] void expected(const std::string& what) const;     // "{where}: {path}: expected .., found .."
  [[noreturn]] void missing(const std::string& what) const;      // "missing required key '{path}'"
  Item element(size_t i) const;                                  // list element i
};

std::string describe(const YAML::Node& node);  // "'abc'", "a list", "a map", "null"
size_t edit_distance(const std::string& a, const std::string& b);
// The candidate nearest to `word` (case-insensitive edit distance); empty if none.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);
bool is_near(const std::string& word, const std::string& candidate);  // close enough to suggest
std::string join(const std::vector<std::string>& words, const char* sep);

// Typed readers; each fails with "expected <what>, found <value>".
int64_t as_int(const Item& item, int64_t min, int64_t max);
uint64_t as_uint64(const Item& item);
double as_double_positive(const Item& item);  // > 0
double as_double_unit(const Item& item);      // in [0, 1)
double as_double_nonneg(const Item& item);    // >= 0, finite
double as_double_finite(const Item& item);    // any finite number
bool as_bool(const Item& item);
std::string as_string(const Item& item);  // a non-empty scalar
std::optional<std::string> as_nullable_string(const Item& item);  // null or "" -> none
// Index of the value in `choices`, with a suggestion for a near miss.
size_t as_choice(const Item& item, const std::vector<std::string>& choices);

// The scalar value of `key` in a map without the full key check (for `type`, which decides
// the map's other keys); not present when the map has no such key.
Item peek(const Item& map, const std::string& key);

// The largest value an int-typed config field takes.
inline constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// Explains why a key is not allowed here when it is valid elsewhere ("it belongs to dense").
using ForeignKey = std::function<std::optional<std::string>(const std::string& key)>;

// A YAML map whose keys are checked against `allowed` on construction: duplicates, non-scalar
// keys and unknown keys (with the nearest allowed key suggested) fail at once. A null node
// reads as an empty map when `null_is_empty`.
class MapReader {
 public:
  MapReader(const Item& item, std::vector<std::string> allowed, const ForeignKey& foreign = {},
            bool null_is_empty = true);

  const Item& self() const { return self_; }
  bool has(const std::string& key) const;  // present, null or not
  Item operator[](const std::string& key) const;

  int64_t get_int(const std::string& key, int64_t def, int64_t min, int64_t max) const;
  bool get_bool(const std::string& key, bool def) const;
  double get_positive(const std::string& key, double def) const;
  double get_unit(const std::string& key, double def) const;
  double get_nonneg(const std::string& key, double def) const;
  double get_finite(const std::string& key, double def) const;
  std::string get_string(const std::string& key, const std::string& def) const;
  // `choices[i]` for the value, `def` when absent.
  template <class E>
  E get_choice(const std::string& key, E def, const std::vector<std::string>& choices,
               const std::vector<E>& values) const {
    Item it = (*this)[key];
    if (!it.present) return def;
    return values.at(as_choice(it, choices));
  }

 private:
  Item self_;
  std::vector<std::string> allowed_;
  std::vector<std::pair<YAML::Node, YAML::Node>> entries_;  // (key, value) in file order
  std::vector<std::string> keys_;
};

// Splits "model.layers[0].filters" into segments; an index segment has key empty.
struct PathSegment {
  std::string key;
  long index = -1;
};
std::vector<PathSegment> parse_key_path(const std::string& path);  // throws std::invalid_argument
std::string join_key_path(const std::vector<PathSegment>& segments);

// Parses YAML text; malformed input fails naming `name`, the 1-based line and column.
YAML::Node load_yaml(const std::string& text, const std::string& name);

// Applies one `key.path=value` override to `root` and records it in `src`.
void apply_override(YAML::Node& root, const std::string& text, Source& src);

}  // namespace ht::cfg
