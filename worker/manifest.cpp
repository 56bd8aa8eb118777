#include "worker/manifest.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
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
