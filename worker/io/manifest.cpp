#include "worker/io/manifest.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "orchestrator/config.hpp"

namespace ht {

namespace fs = std::filesystem;

bool is_manifest(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return ext == ".csv";
}

namespace {

// One CSV record (RFC 4180: fields in double quotes may hold commas, "" is a quote).
// False when a quoted field is not closed on the line.
bool split_record(const std::string& line, std::vector<std::string>& fields) {
  fields.assign(1, "");
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  for (std::string& f : fields) {
    while (!f.empty() && std::isspace(static_cast<unsigned char>(f.back()))) f.pop_back();
    size_t start = 0;
    while (start < f.size() && std::isspace(static_cast<unsigned char>(f[start]))) ++start;
    f.erase(0, start);
  }
  return !quoted;
}

}  // namespace

namespace {

nlohmann::json file_identity(const std::string& path) {
  std::error_code ec;
  const auto bytes = fs::file_size(path, ec);
  const auto time = fs::last_write_time(path, ec);
  return {{"path", path},
          {"bytes", ec ? -1 : int64_t(bytes)},
          {"mtime_ns", ec ? 0 : int64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(time.time_since_epoch()).count())}};
}

}  // namespace

std::string manifest_identity(const Manifest& m) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ManifestRow& r : m.rows) {
    nlohmann::json row = {{"line", r.line}, {"image", file_identity(r.image)}};
    if (m.targets == Manifest::Targets::Labels) row["label"] = r.label;
    if (!r.target.empty()) row["target"] = file_identity(r.target);
    rows.push_back(std::move(row));
  }
  return nlohmann::json{{"manifest", m.path}, {"rows", rows}}.dump();
}

std::string manifest_changes(const std::string& before_text, const std::string& now_text) {
  if (before_text == now_text) return "";
  const nlohmann::json before = nlohmann::json::parse(before_text, nullptr, false);
  const nlohmann::json now = nlohmann::json::parse(now_text, nullptr, false);
  if (!before.is_object() || !now.is_object() || !before.contains("rows") || !now.contains("rows"))
    return before_text.empty() ? "the checkpoint's data was an HDF5 file" : "the data is no longer a manifest";
  std::vector<std::string> changes;
  const auto& a = before["rows"];
  const auto& b = now["rows"];
  auto file_change = [](const nlohmann::json& x, const nlohmann::json& y) -> std::string {
    if (x.value("path", "") != y.value("path", ""))
      return fmt::format("{} is now {}", x.value("path", "?"), y.value("path", "?"));
    if (x.value("bytes", int64_t(0)) != y.value("bytes", int64_t(0)))
      return fmt::format("{}: {} -> {} bytes", y.value("path", "?"), x.value("bytes", int64_t(0)),
                         y.value("bytes", int64_t(0)));
    if (x.value("mtime_ns", int64_t(0)) != y.value("mtime_ns", int64_t(0)))
      return fmt::format("{}: modified since", y.value("path", "?"));
    return "";
  };
  for (size_t i = 0; i < std::min(a.size(), b.size()) && changes.size() < 3; ++i) {
    const int line = b[i].value("line", 0);
    if (std::string c = file_change(a[i]["image"], b[i]["image"]); !c.empty())
      changes.push_back(fmt::format("line {}: {}", line, c));
    else if (a[i].value("label", int64_t(-1)) != b[i].value("label", int64_t(-1)))
      changes.push_back(fmt::format("line {}: label {} -> {}", line, a[i].value("label", int64_t(-1)),
                                    b[i].value("label", int64_t(-1))));
    else if (a[i].contains("target") && b[i].contains("target"))
      if (std::string t = file_change(a[i]["target"], b[i]["target"]); !t.empty())
        changes.push_back(fmt::format("line {}: {}", line, t));
  }
  if (b.size() > a.size()) changes.push_back(fmt::format("{} rows added", b.size() - a.size()));
  if (b.size() < a.size()) changes.push_back(fmt::format("{} rows removed", a.size() - b.size()));
  if (changes.empty()) changes.push_back("its rows differ");
  return fmt::format("{}", fmt::join(changes, "; "));
}

Manifest read_manifest(const std::string& path, const std::string& key) {
  Manifest m;
  m.path = path;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw ConfigError(fmt::format("{}: the manifest does not exist ({}; working directory {})", path, key,
                                  fs::current_path(ec).string()));
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("{}: the manifest cannot be read ({})", path, key));
  const fs::path dir = fs::path(path).parent_path();
  auto fail = [&](int line, const std::string& why) {
    throw ConfigError(fmt::format("{}:{}: {}", path, line, why));
  };
  std::string line;
  std::vector<std::string> header, fields;
  int number = 0, image_col = -1, target_col = -1;
  std::string target_name;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (number == 1 && line.size() >= 3 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // a BOM
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (!split_record(line, fields)) fail(number, "a quoted field is not closed on this line");
    if (header.empty()) {
      header = fields;
      for (int i = 0; i < int(header.size()); ++i) {
        const std::string& h = header[size_t(i)];
        if (h == "image") image_col = i;
        if (h == "label" || h == "mask" || h == "class_map") {
          if (target_col >= 0)
            fail(number, fmt::format("columns '{}' and '{}': a manifest has one target column (label, mask or "
                                     "class_map)",
                                     target_name, h));
          target_col = i;
          target_name = h;
        }
      }
      if (image_col < 0)
        fail(number, fmt::format("the header ({}) has no 'image' column; expected image and one of label, mask, "
                                 "class_map",
                                 fmt::join(header, ", ")));
      m.targets = target_name == "label"       ? Manifest::Targets::Labels
                  : target_name == "mask"      ? Manifest::Targets::Masks
                  : target_name == "class_map" ? Manifest::Targets::ClassMaps
                                               : Manifest::Targets::None;
      continue;
    }
    if (fields.size() < header.size())
      fail(number, fmt::format("{} fields; the header has {} ({})", fields.size(), header.size(),
                               fmt::join(header, ", ")));
    ManifestRow row;
    row.line = number;
    const std::string& image = fields[size_t(image_col)];
    if (image.empty()) fail(number, "the image path is empty");
    row.image = (dir / image).lexically_normal().string();
    if (target_col >= 0) {
      const std::string& t = fields[size_t(target_col)];
      if (t.empty()) fail(number, fmt::format("the {} is empty", target_name));
      if (m.targets == Manifest::Targets::Labels) {
        size_t used = 0;
        try {
          row.label = std::stoll(t, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != t.size() || row.label < 0)
          fail(number, fmt::format("label '{}' is not a class id (an integer >= 0)", t));
      } else {
        row.target = (dir / t).lexically_normal().string();
      }
    }
    m.rows.push_back(std::move(row));
  }
  if (header.empty()) throw ConfigError(fmt::format("{}: the manifest is empty: expected a header row (image,label)", path));
  if (m.rows.empty()) throw ConfigError(fmt::format("{}: the manifest lists no images (only its header)", path));
  return m;
}

}  // namespace ht
