// The run directory's report (SPEC section 10): reads what the renderer needs (run.json,
// metrics.csv, memory.csv, a thumbnail of the first training image) and publishes
// report.html atomically. Used by `halotrain report RUN_DIR`, `halotrain plan --html` and
// by the trainer, which refreshes the page at every checkpoint and at the end.
#pragma once

#include <string>

#include "orchestrator/config.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/plan.hpp"
#include "orchestrator/shard_plan.hpp"
#include "report/report.hpp"
#include "worker/io/publish.hpp"

namespace ht {

// Image 0 of data.train, read in bands of whole thumbnail rows (never the whole image at
// once). A missing or unreadable file gives a Thumbnail with the reason in `missing`.
Thumbnail read_thumbnail(const Config& config, const ModelSpec& model);

// Rank 0, when training starts (after it holds run_dir's lock): makes the run directory's
// files agree with `start_step`. metrics.csv keeps its header and its complete rows up to
// that step (a resumed run logs the later steps again; a fresh run has none), memory.csv
// (an earlier segment's peaks) and temporaries left by dead writers go, run.json is
// written. Returns the path of metrics.csv, ready to append to. Throws ConfigError when
// metrics.csv cannot be written; a failed run.json is only warned about.
std::string prepare_run_files(const Config& config, const ShardPlan& plan, int64_t start_step,
                              int64_t total_steps);

// run_dir/report.html from run_dir's files and `image`; returns its path. Throws
// ConfigError (naming the file) when metrics.csv or memory.csv is malformed; nothing is
// written then.
std::string write_run_report(const std::string& run_dir, const Config& config, const Plan& plan,
                             int64_t total_steps, const Thumbnail& image);

// `halotrain report RUN_DIR`: plans the run again from run.json, reads the image, writes
// the page. ConfigError for a directory that is not a run.
std::string report_run_dir(const std::string& run_dir);

}  // namespace ht
