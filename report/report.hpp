// report.html (SPEC section 10): one self-contained page with the run's curves, its memory
// against the plan and the budget, the plan's per-layer memory and step time, and the
// shard grid drawn over the first training image. Chart.js and the page's own script are
// inlined, the data too (one JSON document): the page needs no network.
//
// Pure: this library renders what it is given and parses the run's CSV files; reading the
// image (HDF5) and publishing the file are the caller's (worker/run/run_report.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "orchestrator/config.hpp"
#include "orchestrator/plan.hpp"
#include "orchestrator/shard_plan.hpp"

namespace ht {

// run_dir/metrics.csv as read: a header of column names, then one row of numbers per
// logged step (an empty cell is a value the step did not log, e.g. val_loss between
// validations).
struct MetricsTable {
  std::vector<std::string> columns;
  std::vector<std::vector<std::optional<double>>> rows;
};

// run_dir/memory.csv (written at the end of a run): per rank, the measured peaks beside
// the memory model's predictions.
struct RankMemory {
  int rank = 0;
  uint64_t peak_device = 0, predicted_device = 0;
  uint64_t peak_host_pool = 0, predicted_host_pool = 0;
};

// The first training image, box-averaged down to at most kThumbnailSide pixels on its
// longer side and stretched to 0..255 (the mean over channels). Empty `pixels` with a
// `missing` reason when it could not be read.
struct Thumbnail {
  static constexpr int kThumbnailSide = 512;
  int width = 0, height = 0;  // of the thumbnail
  int factor = 1;             // image pixels per thumbnail pixel, along each axis
  std::vector<uint8_t> pixels;  // row-major, height x width
  std::string source;           // "image 0 of data/demo.h5"
  std::string missing;
};

// The header of run_dir/metrics.csv as the trainer writes it (SPEC section 6).
constexpr const char* kMetricsHeader = "step,epoch,loss,lr,seconds,images_per_s,peak_device_bytes";

// Parse run_dir's files. Throw ConfigError naming the file, the line and what was
// expected: a missing header column, a field that is not a number, a row cut short (a file
// that ends mid-line is refused: it was truncated or is being written by another writer).
MetricsTable parse_metrics_csv(const std::string& text, const std::string& path);
std::vector<RankMemory> parse_memory_csv(const std::string& text, const std::string& path);

// What the page shows of a run beyond its plan.
struct RunRecord {
  std::string run_dir;
  MetricsTable metrics;
  std::vector<RankMemory> memory;  // empty until the run has ended once
  int64_t total_steps = 0;
  std::vector<std::string> notes;  // what the validation monitors decided: best.h5, an early stop
};

// run_dir/run.json, written by rank 0 when training starts: what the report needs to plan
// the run again (the config as given, the grid it ran on, the ranks, the steps it aims at).
struct RunInfo {
  std::string config_text, config_path;
  std::string working_directory;  // where relative paths of the config point from
  GridShape grid;
  int world = 1;
  int64_t total_steps = 0;
};
std::string run_info_json(const RunInfo& info);
// Throws ConfigError naming `path` and the key when a field is missing or of the wrong kind.
RunInfo parse_run_info(const std::string& text, const std::string& path);

// The whole page. `run` null: the plan part alone (`halotrain plan --html`).
std::string render_report_html(const Config& config, const Plan& plan, const RunRecord* run,
                               const Thumbnail& image);

}  // namespace ht
