#include "orchestrator/config_yaml.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>

#include "orchestrator/config_error.hpp"

namespace ht::cfg {

namespace {

// True when `path` is `prefix` or lies under it ("a.b[1]" is under "a.b" and "a").
bool under(const std::string& path, const std::string& prefix) {
  if (path.size() < prefix.size() || path.compare(0, prefix.size(), prefix) != 0) return false;
  return path.size() == prefix.size() || path[prefix.size()] == '.' || path[prefix.size()] == '[';
}

int mark_line(const YAML::Node& node) {
  try {
    if (!node.IsDefined()) return -1;
    return node.Mark().line;
  } catch (const YAML::Exception&) {
    return -1;
  }
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

std::string Source::where(const std::string& path, const YAML::Node& anchor) const {
  for (auto o = overrides.rbegin(); o != overrides.rend(); ++o)
    if (under(path, o->path)) return "--set " + o->text;
  const int l = mark_line(anchor);
  if (l >= 0) return fmt::format("{}:{}", name, l + 1);
  // A node without a mark was created to hold an override below it.
  for (auto o = overrides.rbegin(); o != overrides.rend(); ++o)
    if (under(o->path, path)) return "--set " + o->text;
  return name;
}

int Source::line(const std::string& path, const YAML::Node& anchor) const {
  for (const auto& o : overrides)
    if (under(path, o.path)) return 0;
  return mark_line(anchor) + 1;
}

void Item::fail(const std::string& msg) const { throw ConfigError(fmt::format("{}: {}", where(), msg)); }

void Item::expected(const std::string& what) const {
  fail(fmt::format("{}: expected {}, found {}", path, what, present ? describe(node) : "nothing"));
}

void Item::missing(const std::string& what) const {
  fail(fmt::format("missing required key '{}': expected {}", path, what));
}

Item Item::element(size_t i) const {
  Item e;
  e.src = src;
  e.path = fmt::format("{}[{}]", path, i);
  e.node.reset(node[i]);
  e.anchor.reset(e.node);
  e.present = true;
  return e;
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "null (an empty value)";
    case YAML::NodeType::Sequence: return fmt::format("a list of {}", node.size());
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Scalar: {
      std::string s = node.Scalar();
      if (s.size() > 60) s = s.substr(0, 57) + "...";
      return "'" + s + "'";
    }
    default: return "nothing";
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment: a swap of two neighbours counts as one edit.
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

namespace {

// A prefix of three or more letters ("softmax") counts as near as a one-letter typo.
size_t distance(const std::string& word, const std::string& candidate) {
  const std::string w = lower(word), c = lower(candidate);
  const size_t n = std::min(w.size(), c.size());
  if (n >= 3 && w.compare(0, n, c, 0, n) == 0) return std::min<size_t>(1, edit_distance(w, c));
  return edit_distance(w, c);
}

}  // namespace

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    const size_t d = distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

bool is_near(const std::string& word, const std::string& candidate) {
  return !candidate.empty() && distance(word, candidate) <= std::max<size_t>(2, candidate.size() / 3);
}

std::string join(const std::vector<std::string>& words, const char* sep) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) out += (i ? sep : "") + words[i];
  return out;
}

namespace {

// The scalar text, or a failure naming what was expected.
std::string scalar(const Item& item, const std::string& what) {
  if (!item.present || !item.node.IsScalar()) item.expected(what);
  return item.node.Scalar();
}

}  // namespace

int64_t as_int(const Item& item, int64_t min, int64_t max) {
  const std::string what = max == std::numeric_limits<int>::max() || max == std::numeric_limits<int64_t>::max()
                               ? fmt::format("an integer >= {}", min)
                               : fmt::format("an integer in [{}, {}]", min, max);
  const std::string s = trim(scalar(item, what));
  const size_t sign = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  const bool digits = s.size() > sign && std::all_of(s.begin() + sign, s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
  if (!digits) item.expected(what);
  errno = 0;
  const long long v = std::strtoll(s.c_str(), nullptr, 10);
  if (errno == ERANGE || v > max) item.expected(fmt::format("an integer in [{}, {}]", min, max));  // too large
  if (v < min) item.expected(what);
  return v;
}

uint64_t as_uint64(const Item& item) {
  const char* what = "an integer >= 0";
  const std::string s = trim(scalar(item, what));
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    item.expected(what);
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE) item.expected(fmt::format("{} that fits in 64 bits", what));
  return v;
}

namespace {

double as_double(const Item& item, const std::string& what) {
  const std::string s = trim(scalar(item, what));
  // Plain decimal or exponent notation only: no hex floats, inf or nan.
  const bool chars = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
  });
  if (!chars) item.expected(what);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v)) item.expected(what);
  return v;
}

}  // namespace

double as_double_positive(const Item& item) {
  const char* what = "a number > 0";
  const double v = as_double(item, what);
  if (!(v > 0)) item.expected(what);
  return v;
}

double as_double_nonneg(const Item& item) {
  const char* what = "a number >= 0";
  const double v = as_double(item, what);
  if (!(v >= 0) || !std::isfinite(v)) item.expected(what);
  return v;
}

double as_double_finite(const Item& item) {
  const char* what = "a finite number";
  const double v = as_double(item, what);
  if (!std::isfinite(v)) item.expected(what);
  return v;
}

double as_double_unit(const Item& item) {
  const char* what = "a number in [0, 1)";
  const double v = as_double(item, what);
  if (!(v >= 0 && v < 1)) item.expected(what);
  return v;
}

bool as_bool(const Item& item) {
  const char* what = "true or false";
  const std::string s = lower(trim(scalar(item, what)));
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  item.expected(what);
}

std::string as_string(const Item& item) {
  const std::string s = scalar(item, "a non-empty string");
  if (s.empty()) item.expected("a non-empty string");
  return s;
}

std::optional<std::string> as_nullable_string(const Item& item) {
  if (!item.present || item.node.IsNull()) return std::nullopt;
  const std::string s = scalar(item, "a string or null");
  if (s.empty()) return std::nullopt;
  return s;
}

size_t as_choice(const Item& item, const std::vector<std::string>& choices) {
  const std::string what = "one of " + join(choices, " | ");
  const std::string s = scalar(item, what);
  for (size_t i = 0; i < choices.size(); ++i)
    if (s == choices[i]) return i;
  const std::string near = nearest(s, choices);
  if (is_near(s, near))
    item.fail(fmt::format("{}: expected {}, found {}; did you mean '{}'?", item.path, what, describe(item.node), near));
  item.expected(what);
}

MapReader::MapReader(const Item& item, std::vector<std::string> allowed, const ForeignKey& foreign,
                     bool null_is_empty)
    : self_(item), allowed_(std::move(allowed)) {
  if (!item.present || (null_is_empty && item.node.IsNull())) return;
  if (!item.node.IsMap()) item.expected("a map of settings");
  const std::string prefix = item.path.empty() ? "" : item.path + ".";
  for (auto it = item.node.begin(); it != item.node.end(); ++it) {
    Item key{item.src, prefix + "?", it->second, it->first, true};
    if (!it->first.IsScalar()) key.fail(fmt::format("{}: keys must be plain names, found {}", item.path.empty() ? "the config" : item.path,
                           describe(it->first)));
    const std::string k = it->first.Scalar();
    key.path = prefix + k;
    for (size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] == k)
        key.fail(fmt::format("duplicate key '{}' (first given at {})", key.path,
                             item.src->where(key.path, entries_[i].first)));
    if (std::find(allowed_.begin(), allowed_.end(), k) == allowed_.end()) {
      if (foreign)
        if (auto why = foreign(k)) key.fail(fmt::format("key '{}' {}", key.path, *why));
      const std::string near = nearest(k, allowed_);
      // When the nearest key is a poor guess, also list what is valid here.
      const std::string valid = is_near(k, near) ? "" : fmt::format(" (valid keys here: {})", join(allowed_, ", "));
      key.fail(fmt::format("unknown key '{}'; did you mean '{}{}'?{}", key.path, prefix, near, valid));
    }
    keys_.push_back(k);
    entries_.emplace_back(it->first, it->second);
  }
}

bool MapReader::has(const std::string& key) const {
  return std::find(keys_.begin(), keys_.end(), key) != keys_.end();
}

Item MapReader::operator[](const std::string& key) const {
  if (std::find(allowed_.begin(), allowed_.end(), key) == allowed_.end())
    throw std::logic_error("config schema: key '" + key + "' read but not declared");
  Item it;
  it.src = self_.src;
  it.path = self_.path.empty() ? key : self_.path + "." + key;
  it.anchor.reset(self_.anchor);
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i] == key) {
      it.anchor.reset(entries_[i].first);
      it.node.reset(entries_[i].second);
      it.present = true;
    }
  return it;
}

int64_t MapReader::get_int(const std::string& key, int64_t def, int64_t min, int64_t max) const {
  Item it = (*this)[key];
  return it.present ? as_int(it, min, max) : def;
}

bool MapReader::get_bool(const std::string& key, bool def) const {
  Item it = (*this)[key];
  return it.present ? as_bool(it) : def;
}

double MapReader::get_positive(const std::string& key, double def) const {
  Item it = (*this)[key];
  return it.present ? as_double_positive(it) : def;
}

double MapReader::get_nonneg(const std::string& key, double def) const {
  Item it = (*this)[key];
  return it.present ? as_double_nonneg(it) : def;
}

double MapReader::get_finite(const std::string& key, double def) const {
  Item it = (*this)[key];
  return it.present ? as_double_finite(it) : def;
}

double MapReader::get_unit(const std::string& key, double def) const {
  Item it = (*this)[key];
  return it.present ? as_double_unit(it) : def;
}

std::string MapReader::get_string(const std::string& key, const std::string& def) const {
  Item it = (*this)[key];
  return it.present ? as_string(it) : def;
}

std::vector<PathSegment> parse_key_path(const std::string& path) {
  std::vector<PathSegment> segs;
  size_t i = 0;
  auto bad = [&](const char* why) {
    throw std::invalid_argument(fmt::format("malformed key path '{}': {}", path, why));
  };
  while (true) {
    const size_t start = i;
    while (i < path.size() && (std::isalnum(static_cast<unsigned char>(path[i])) || path[i] == '_' || path[i] == '-')) ++i;
    if (i == start) bad("expected a key name such as training.steps");
    segs.push_back({path.substr(start, i - start), -1});
    while (i < path.size() && path[i] == '[') {
      const size_t close = path.find(']', i);
      const std::string num = close == std::string::npos ? "" : path.substr(i + 1, close - i - 1);
      if (num.empty() || num.size() > 9 || !std::all_of(num.begin(), num.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        bad("a list index must be [N] with N >= 0");
      segs.push_back({"", std::stol(num)});
      i = close + 1;
    }
    if (i == path.size()) break;
    if (path[i] != '.') bad("expected '.' or '[' between keys");
    ++i;
  }
  return segs;
}

std::string join_key_path(const std::vector<PathSegment>& segments) {
  std::string out;
  for (const auto& s : segments)
    out += s.index >= 0 ? fmt::format("[{}]", s.index) : (out.empty() ? "" : ".") + s.key;
  return out;
}

YAML::Node load_yaml(const std::string& text, const std::string& name) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(fmt::format("{}:{}:{}: malformed YAML at line {}, column {}: {}", name, e.mark.line + 1,
                                  e.mark.column + 1, e.mark.line + 1, e.mark.column + 1, e.msg));
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: malformed YAML: {}", name, e.msg));
  }
}

void apply_override(YAML::Node& root, const std::string& text, Source& src) {
  const std::string origin = "--set " + text;
  auto fail = [&](const std::string& msg) { throw ConfigError(fmt::format("{}: {}", origin, msg)); };
  const size_t eq = text.find('=');
  if (eq == std::string::npos) fail("expected key.path=value, e.g. --set training.steps=5");
  std::vector<PathSegment> segs;
  try {
    segs = parse_key_path(trim(text.substr(0, eq)));
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  const std::string value_text = text.substr(eq + 1);
  YAML::Node value;
  try {
    value.reset(trim(value_text).empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Load(value_text));
  } catch (const YAML::Exception& e) {
    fail(fmt::format("malformed YAML value '{}' at column {}: {}", value_text, e.mark.column + 1, e.msg));
  }
  if (!root.IsMap() && !root.IsNull()) fail("the config file is not a map of settings");

  // Walk with reset(): assigning one Node to another would overwrite the tree's nodes.
  YAML::Node cur;
  cur.reset(root);
  std::vector<PathSegment> walked;
  for (size_t i = 0; i < segs.size(); ++i) {
    const PathSegment& s = segs[i];
    const bool last = i + 1 == segs.size();
    const std::string here = walked.empty() ? "the config" : "'" + join_key_path(walked) + "'";
    if (s.index < 0) {
      if (cur.IsDefined() && !cur.IsMap() && !cur.IsNull())
        fail(fmt::format("cannot set key '{}': {} is {}, not a map", join_key_path({segs.begin(), segs.begin() + i + 1}),
                         here, describe(cur)));
      if (last) {
        cur[s.key] = value;
      } else {
        YAML::Node next = cur[s.key];
        cur.reset(next);
      }
    } else {
      if (!cur.IsSequence())
        fail(fmt::format("cannot index {} with [{}]: it is {}, not a list", here, s.index, describe(cur)));
      const size_t n = cur.size(), idx = size_t(s.index);
      if (idx > n)
        fail(fmt::format("index [{}] is out of range: {} has {} entries (use [{}] to append)", s.index, here, n, n));
      if (idx == n) cur.push_back(last ? value : YAML::Node(YAML::NodeType::Null));
      else if (last) cur[idx] = value;
      if (!last) {
        YAML::Node next = cur[idx];
        cur.reset(next);
      }
    }
    walked.push_back(s);
  }
  src.overrides.push_back({text, join_key_path(segs)});
}

Item peek(const Item& map, const std::string& key) {
  Item it;
  it.src = map.src;
  it.path = map.path + "." + key;
  it.anchor.reset(map.anchor);
  for (auto e = map.node.begin(); e != map.node.end(); ++e)
    if (e->first.IsScalar() && e->first.Scalar() == key) {
      it.node.reset(e->second);
      it.anchor.reset(e->first);
      it.present = true;
    }
  return it;
}

}  // namespace ht::cfg
