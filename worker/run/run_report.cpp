#include "worker/run/run_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "orchestrator/config_io.hpp"
#include "orchestrator/files.hpp"
#include "worker/io/data_reader.hpp"
#include "worker/io/h5.hpp"
#include "worker/io/keras_h5.hpp"
#include "worker/io/manifest.hpp"
#include "worker/run/checkpoint_dir.hpp"
#include "worker/run/evaluation.hpp"
#include "worker/run/monitors.hpp"
#include "worker/runtime/log.hpp"

namespace ht {

namespace fs = std::filesystem;

namespace {

// True if `path` is a readable file, false if it does not exist; ConfigError for anything else
// (a directory, a FIFO, no permission): never opened when it could block.
bool optional_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec) && !ec) return false;
  const std::string problem = input_file_problem(path);
  if (!problem.empty()) throw ConfigError(fmt::format("{}: {}", path, problem));
  return true;
}

}  // namespace

Thumbnail read_thumbnail(const Config& config, const ModelSpec& model) {
  Thumbnail t;
  const std::string& path = config.data.train;
  t.source = fmt::format("image 0 of {}", path);
  const std::string why = is_manifest(path) ? "" : h5::why_not_readable(path);
  if (!why.empty()) {
    t.missing = fmt::format("{} {}", path, why);
    return t;
  }
  try {
    DataReader reader(path, data_reader_options(config, model));
    if (reader.count() == 0) {
      t.missing = fmt::format("{} holds no images", path);
      return t;
    }
    const int H = reader.height(), W = reader.width(), C = reader.channels();
    const int side = Thumbnail::kThumbnailSide;
    const int f = std::max(1, (std::max(H, W) + side - 1) / side);
    const int th = (H + f - 1) / f, tw = (W + f - 1) / f;
    std::vector<float> band(size_t(f) * size_t(W) * size_t(C));
    std::vector<double> mean(size_t(th) * size_t(tw));
    for (int ty = 0; ty < th; ++ty) {
      const int y0 = ty * f, rows = std::min(H, y0 + f) - y0;
      reader.read_image_tile(0, Rect{{y0, y0 + rows}, {0, W}}, config.data.scale, band.data());  // [C][rows][W]
      for (int tx = 0; tx < tw; ++tx) {
        const int x0 = tx * f, x1 = std::min(W, x0 + f);
        double sum = 0;
        for (int c = 0; c < C; ++c)
          for (int y = 0; y < rows; ++y)
            for (int x = x0; x < x1; ++x) sum += band[(size_t(c) * rows + y) * W + x];
        mean[size_t(ty) * tw + tx] = sum / (double(C) * rows * (x1 - x0));
      }
    }
    const auto [lo, hi] = std::minmax_element(mean.begin(), mean.end());
    const double span = *hi > *lo ? *hi - *lo : 1.0;
    t.width = tw;
    t.height = th;
    t.factor = f;
    t.pixels.resize(mean.size());
    for (size_t i = 0; i < mean.size(); ++i) t.pixels[i] = uint8_t(std::lround(255.0 * (mean[i] - *lo) / span));
  } catch (const std::exception& e) {  // the page is still worth having without its image
    t.pixels.clear();
    t.missing = e.what();
  }
  return t;
}

namespace {
// The fields of one line of metrics.csv (numbers and names: no quoting).
std::vector<std::string> split_csv_row(const std::string& line) {
  std::vector<std::string> fields;
  size_t from = 0;
  for (;;) {
    const size_t comma = line.find(',', from);
    fields.push_back(line.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
    if (comma == std::string::npos) return fields;
    from = comma + 1;
  }
}
}  // namespace

std::string prepare_run_files(const Config& config, const ShardPlan& plan, int64_t start_step,
                              int64_t total_steps) {
  const fs::path dir(config.run_dir);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    for (const char* prefix : {"report.html.tmp-", "run.json.tmp-", "metrics.csv.tmp-"})
      if (name.rfind(prefix, 0) == 0) fs::remove(entry.path(), ec);
  }
  fs::remove(dir / "memory.csv", ec);

  const std::string metrics = (dir / "metrics.csv").string();
  std::vector<std::string> columns = split_csv_row(kMetricsHeader);
  for (const std::string& column : validation_columns(config)) columns.push_back(column);
  std::string kept = fmt::format("{}\n", fmt::join(columns, ","));
  if (start_step > 0 && fs::is_regular_file(metrics, ec)) {
    // Rows of the steps before the resume point, under this run's header, each value under
    // the column of its name in the header it was written with (validation columns that
    // were not there stay empty; ones no longer asked for are dropped).
    const std::string text = read_text_file(metrics);
    size_t at = text.find('\n');
    const std::vector<std::string> old = split_csv_row(text.substr(0, at));
    while (at != std::string::npos) {
      const size_t begin = at + 1, end = text.find('\n', begin);
      if (end == std::string::npos) break;  // a row cut short by a crash
      const std::string row = text.substr(begin, end - begin);
      char* stop = nullptr;
      const long long step = std::strtoll(row.c_str(), &stop, 10);
      if (stop != row.c_str() && *stop == ',' && step <= start_step) {
        const std::vector<std::string> values = split_csv_row(row);
        std::vector<std::string> out;
        for (const std::string& column : columns) {
          const auto it = std::find(old.begin(), old.end(), column);
          const size_t i = size_t(it - old.begin());
          out.push_back(it != old.end() && i < values.size() ? values[i] : "");
        }
        kept += fmt::format("{}\n", fmt::join(out, ","));
      }
      at = end;
    }
  }
  publish_page(metrics, kept);

  try {
    const RunInfo info{config.text, config.source_path, fs::current_path(ec).string(),
                       {plan.grid_rows, plan.grid_cols}, plan.world(), total_steps};
    publish_page((dir / "run.json").string(), run_info_json(info));
  } catch (const std::exception& e) {
    log().warn("{}/run.json not written ({}): halotrain report cannot plan this run again", config.run_dir,
               e.what());
  }
  return metrics;
}

std::string write_run_report(const std::string& run_dir, const Config& config, const Plan& plan,
                             int64_t total_steps, const Thumbnail& image) {
  RunRecord run;
  run.run_dir = run_dir;
  run.total_steps = total_steps;
  const std::string metrics = run_dir + "/metrics.csv";
  if (!optional_file(metrics))
    throw ConfigError(fmt::format("{}: no metrics.csv: this run has not logged a step yet", run_dir));
  run.metrics = parse_metrics_csv(read_text_file(metrics), metrics);
  const std::string memory = run_dir + "/memory.csv";
  if (optional_file(memory)) run.memory = parse_memory_csv(read_text_file(memory), memory);
  // What the validation monitors decided, from the checkpoints' state (a file being replaced
  // or damaged only leaves its line out).
  auto monitors_of = [](const std::string& file) -> std::string {
    try {
      return optional_file(file) ? KerasWeightsFile(file).read_state().monitors : "";
    } catch (const std::exception&) {
      return "";
    }
  };
  const auto newest = list_checkpoints(run_dir + "/checkpoints");
  run.notes = monitor_notes(monitors_of(run_dir + "/checkpoints/best.h5"),
                            newest.empty() ? "" : monitors_of(newest.front().second));
  const std::string path = run_dir + "/report.html";
  publish_page(path, render_report_html(config, plan, &run, image));
  return path;
}

std::string report_run_dir(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    throw ConfigError(fmt::format("{}: {}", run_dir,
                                  ec && ec != std::errc::no_such_file_or_directory
                                      ? "cannot be read: " + ec.message()
                                      : fs::exists(run_dir, ec) ? "is not a directory; expected a run_dir"
                                                                : "does not exist; expected a run_dir"));
  const std::string info_path = run_dir + "/run.json";
  if (!optional_file(info_path))
    throw ConfigError(fmt::format(
        "{}: not a halotrain run directory: it has no run.json (halotrain train writes it when a run starts)",
        run_dir));
  const RunInfo info = parse_run_info(read_text_file(info_path), info_path);
  Config config;
  ModelSpec model;
  Plan plan;
  try {
    config = parse_config(info.config_text, info.config_path);
    model = build_model_spec(config);
    plan = make_plan(config, make_shard_plan(model, info.grid, info.world));
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}: the run it describes no longer plans: {}", info_path, e.what()));
  }
  // Relative data paths are the training's working directory's.
  if (!config.data.train.empty() && fs::path(config.data.train).is_relative() && !info.working_directory.empty())
    config.data.train = (fs::path(info.working_directory) / config.data.train).string();
  return write_run_report(run_dir, config, plan, info.total_steps, read_thumbnail(config, model));
}

}  // namespace ht
