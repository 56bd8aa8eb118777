#include "report/report.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "orchestrator/memory_model.hpp"
#include "orchestrator/plan_report.hpp"

namespace ht {

// The page's parts, embedded at build time (report/CMakeLists.txt).
namespace report_assets {
extern const char page_html[];
extern const char page_css[];
extern const char page_js[];
extern const char chart_js[];
}  // namespace report_assets

namespace {

using nlohmann::json;

// The lines of a CSV file: every one must end with '\n' (the last one too).
std::vector<std::string> csv_lines(const std::string& text, const std::string& path) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    if (end == std::string::npos)
      throw ConfigError(fmt::format("{}: line {} is cut short: the file ends mid-line (truncated, or still "
                                    "being written by another program)",
                                    path, lines.size() + 1));
    lines.push_back(text.substr(at, end - at));
    if (!lines.back().empty() && lines.back().back() == '\r') lines.back().pop_back();
    at = end + 1;
  }
  if (lines.empty()) throw ConfigError(fmt::format("{}: the file is empty; expected a header line", path));
  return lines;
}

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) fields.push_back(field);
  if (!line.empty() && line.back() == ',') fields.emplace_back();
  return fields;
}

std::optional<double> parse_number(const std::string& field, const std::string& path, size_t line,
                                   const std::string& column) {
  if (field.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(field.c_str(), &end);
  if (end != field.c_str() + field.size() || errno == ERANGE)
    throw ConfigError(fmt::format("{}: line {}, column '{}': '{}' is not a number", path, line, column, field));
  return v;
}

// Every row as numbers, checked against the header; `required` columns must be present.
MetricsTable parse_table(const std::string& text, const std::string& path,
                         const std::vector<std::string>& required) {
  const std::vector<std::string> lines = csv_lines(text, path);
  MetricsTable t;
  t.columns = split_fields(lines[0]);
  for (const std::string& name : required)
    if (std::find(t.columns.begin(), t.columns.end(), name) == t.columns.end())
      throw ConfigError(fmt::format("{}: the header has no column '{}'; found: {}", path, name, lines[0]));
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> fields = split_fields(lines[i]);
    if (fields.size() != t.columns.size())
      throw ConfigError(fmt::format("{}: line {} has {} fields; the header has {} ({})", path, i + 1,
                                    fields.size(), t.columns.size(), lines[0]));
    std::vector<std::optional<double>> row;
    for (size_t c = 0; c < fields.size(); ++c) row.push_back(parse_number(fields[c], path, i + 1, t.columns[c]));
    t.rows.push_back(std::move(row));
  }
  return t;
}

size_t column_of(const MetricsTable& t, const std::string& name) {
  return size_t(std::find(t.columns.begin(), t.columns.end(), name) - t.columns.begin());
}

std::string base64(const std::vector<uint8_t>& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = uint32_t(bytes[i]) << 16 | (i + 1 < bytes.size() ? uint32_t(bytes[i + 1]) << 8 : 0) |
                       (i + 2 < bytes.size() ? uint32_t(bytes[i + 2]) : 0);
    out += abc[n >> 18 & 63];
    out += abc[n >> 12 & 63];
    out += i + 1 < bytes.size() ? abc[n >> 6 & 63] : '=';
    out += i + 2 < bytes.size() ? abc[n & 63] : '=';
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

json rect_json(const Rect& r) { return json::array({r.rows.lo, r.rows.hi, r.cols.lo, r.cols.hi}); }

// The busiest rank's memory per layer, and the rectangles the shard map draws: every
// shard's tile of the image, and per windowed layer its owned and needed input.
// `text` with every byte that is not part of valid UTF-8 replaced by U+FFFD (a config or
// path in Latin-1 must not stop the page).
std::string valid_utf8(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n > 0 && i + n <= text.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(text[i + k]) >> 6) == 0x2;
    if (ok) {
      out.append(text, i, n);
      i += n;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

json plan_part(const Config& config, const Plan& job) {
  json part = json::parse(valid_utf8(render_plan_json(config, job)));
  const ShardPlan& plan = job.shards;
  const LayerPolicies& policies = job.policies;
  const std::vector<LayerMemory> per_layer = layer_memory(config, plan, job.busiest.rank, policies);
  json layers = json::array();
  for (size_t l = 0; l < per_layer.size(); ++l) {
    const LayerMemory& x = per_layer[l];
    layers.push_back({{"name", plan.model.layers[l].config.name},
                      {"type", plan.model.layers[l].config.type()},
                      {"policy", to_string(policies[l])},
                      {"params", x.params},
                      {"grads", x.grads},
                      {"optimizer", x.optimizer},
                      {"activations", x.activations},
                      {"offloaded", x.offloaded},
                      {"halo", x.halo},
                      {"transient", x.transient}});
  }
  part["layer_memory"] = {{"rank", job.busiest.rank}, {"layers", layers}};

  json tiles = json::array(), windowed = json::array();
  for (int r = 0; r < plan.shards(); ++r)
    tiles.push_back({{"rank", r}, {"owned", rect_json(plan.owned_image(r))}});
  for (int l = 0; l < int(plan.model.layers.size()); ++l) {
    const LayerSpec& L = plan.model.layers[l];
    if (!L.windowed()) continue;
    json ranks = json::array();
    for (int r = 0; r < plan.shards(); ++r)
      ranks.push_back({{"owned", rect_json(plan.owned_input(l, r))}, {"needed", rect_json(plan.needed_input(l, r))}});
    windowed.push_back({{"index", l}, {"name", L.config.name}, {"height", L.in.h}, {"width", L.in.w},
                        {"ranks", ranks}});
  }
  part["shard_map"] = {{"height", plan.model.input.h}, {"width", plan.model.input.w}, {"tiles", tiles},
                       {"layers", windowed}};
  return part;
}

json run_part(const RunRecord& run) {
  json columns = json::object();
  for (size_t c = 0; c < run.metrics.columns.size(); ++c) {
    json values = json::array();
    for (const auto& row : run.metrics.rows) values.push_back(row[c] ? json(*row[c]) : json(nullptr));
    columns[run.metrics.columns[c]] = values;
  }
  json memory = json::array();
  for (const RankMemory& m : run.memory)
    memory.push_back({{"rank", m.rank},
                      {"peak_device_bytes", m.peak_device},
                      {"predicted_peak_device_bytes", m.predicted_device},
                      {"host_pool_peak_bytes", m.peak_host_pool},
                      {"predicted_host_pool_bytes", m.predicted_host_pool}});
  return {{"run_dir", run.run_dir},
          {"rows", run.metrics.rows.size()},
          {"total_steps", run.total_steps},
          {"notes", run.notes},
          {"columns", columns},
          {"memory", memory}};
}

json image_part(const Thumbnail& image) {
  if (image.pixels.empty()) return {{"missing", image.missing}, {"source", image.source}};
  return {{"width", image.width}, {"height", image.height}, {"factor", image.factor},
          {"source", image.source}, {"pixels", base64(image.pixels)}};
}

// The template with each marker replaced, markers in the order they appear; only the
// template is searched, never what was put in.
std::string fill(const std::string& page, const std::vector<std::pair<std::string, std::string>>& parts) {
  std::string out;
  size_t at = 0;
  for (const auto& [marker, with] : parts) {
    const size_t found = page.find(marker, at);
    if (found == std::string::npos) throw std::logic_error("the report page template lacks " + marker);
    out.append(page, at, found - at);
    out += with;
    at = found + marker.size();
  }
  return out.append(page, at, std::string::npos);
}

}  // namespace

MetricsTable parse_metrics_csv(const std::string& text, const std::string& path) {
  return parse_table(text, path, {"step", "loss"});
}

std::vector<RankMemory> parse_memory_csv(const std::string& text, const std::string& path) {
  const std::vector<std::string> names = {"rank", "peak_device_bytes", "predicted_peak_device_bytes",
                                          "host_pool_peak_bytes", "predicted_host_pool_bytes"};
  const MetricsTable t = parse_table(text, path, names);
  std::vector<RankMemory> out;
  for (size_t i = 0; i < t.rows.size(); ++i) {
    auto get = [&](const std::string& name) {
      const auto& v = t.rows[i][column_of(t, name)];
      if (!v) throw ConfigError(fmt::format("{}: line {}: column '{}' is empty", path, i + 2, name));
      return *v;
    };
    out.push_back({int(get("rank")), uint64_t(get("peak_device_bytes")), uint64_t(get("predicted_peak_device_bytes")),
                   uint64_t(get("host_pool_peak_bytes")), uint64_t(get("predicted_host_pool_bytes"))});
  }
  return out;
}

std::string run_info_json(const RunInfo& info) {
  return json({{"format", 1},
               {"config_path", info.config_path},
               {"config_text", info.config_text},
               {"working_directory", info.working_directory},
               {"grid", {info.grid.rows, info.grid.cols}},
               {"world", info.world},
               {"total_steps", info.total_steps}})
             .dump(2, ' ', false, json::error_handler_t::replace) +
         "\n";
}

RunInfo parse_run_info(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
  auto field = [&](const char* key) -> const json& {
    if (!j.is_object() || !j.contains(key)) throw ConfigError(fmt::format("{}: no key '{}'", path, key));
    return j[key];
  };
  try {
    RunInfo info;
    info.config_path = field("config_path").get<std::string>();
    info.config_text = field("config_text").get<std::string>();
    if (j.contains("working_directory")) info.working_directory = j["working_directory"].get<std::string>();
    const json& grid = field("grid");
    if (!grid.is_array() || grid.size() != 2) throw ConfigError(fmt::format("{}: 'grid' is not [rows, cols]", path));
    info.grid = {grid[0].get<int>(), grid[1].get<int>()};
    info.world = field("world").get<int>();
    info.total_steps = field("total_steps").get<int64_t>();
    if (info.total_steps < 0) throw ConfigError(fmt::format("{}: 'total_steps' is {}", path, info.total_steps));
    if (info.grid.rows < 1 || info.grid.cols < 1 || info.world < info.grid.rows * info.grid.cols)
      throw ConfigError(fmt::format("{}: grid [{}, {}] with world {} is not a plan", path, info.grid.rows,
                                    info.grid.cols, info.world));
    return info;
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: a field has the wrong type ({})", path, e.what()));
  }
}

std::string render_report_html(const Config& config, const Plan& plan, const RunRecord* run,
                               const Thumbnail& image) {
  const auto now = std::chrono::system_clock::now();
  json doc = {{"kind", run ? "run" : "plan"},
              {"name", config.name},
              {"config", config.source_path},
              {"generated", fmt::format("{:%Y-%m-%d %H:%M:%S} UTC", fmt::gmtime(std::chrono::system_clock::to_time_t(now)))},
              {"plan", plan_part(config, plan)},
              {"image", image_part(image)}};
  if (run) doc["run"] = run_part(*run);
  // Inside <script type="application/json"> only "</script" and "<!--" could end or confuse
  // the block: no '<' survives (\u003c is the same string to JSON.parse).
  std::string data = doc.dump(-1, ' ', false, json::error_handler_t::replace);
  for (size_t at = data.find('<'); at != std::string::npos; at = data.find('<', at)) data.replace(at, 1, "\\u003c");

  return fill(report_assets::page_html,
              {{"{{TITLE}}", html_escape(fmt::format("halotrain {}: {}", run ? "report" : "plan", config.name))},
               {"/*{{STYLE}}*/", report_assets::page_css},
               {"/*{{CHARTJS}}*/", report_assets::chart_js},
               {"{{DATA}}", data},
               {"/*{{SCRIPT}}*/", report_assets::page_js}});
}

}  // namespace ht
