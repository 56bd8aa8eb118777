#include "worker/run/trainer.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "worker/io/manifest.hpp"
#include "worker/run/optimizer.hpp"
#include "worker/run/run_report.hpp"
#include "worker/run/signals.hpp"
#include "worker/runtime/log.hpp"

namespace ht {

namespace {
int64_t total_steps(const Config& c, int64_t samples) {
  if (c.training.steps > 0) return c.training.steps;
  return (c.training.epochs * samples + c.training.batch_size - 1) / c.training.batch_size;
}
std::string format_values(const MetricValues& values, const char* prefix) {
  std::string out;
  for (const auto& [name, v] : values) out += fmt::format("  {}{} {:.6f}", prefix, name, v);
  return out;
}
}  // namespace

// Rank 0's view for the user: a progress line on a terminal, plain log lines otherwise,
// and run_dir/metrics.csv.
struct Trainer::Reporter {
  bool tty = false;
  std::ofstream csv;
  int64_t total = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::optional<Thumbnail> image;  // read once, for every refresh of report.html
  bool report_failed = false;      // warned once
  size_t validation_columns = 0;   // of metrics.csv, after the training ones
};

// What survives a recycle: weights, BN statistics and optimizer state, on the host.
struct Trainer::HostSnapshot {
  std::vector<float> values, buffers, m, v;
};

Trainer::Trainer(const Config& config, const Plan& plan, int rank, Comm& world,
                 const BackendOptions& backend_options, DeviceWorldFactory device_world, const TrainOptions& options)
    : config_(config),
      job_(plan),
      plan_(plan.shards),
      rank_(rank),
      host_world_(world),
      backend_options_(backend_options),
      make_device_world_(std::move(device_world)),
      policies_(plan.policies),
      monitors_(config),
      frozen_(frozen_layers(config, plan.shards.model, 0)) {
  const std::vector<double>& weights = config.training.class_weights;
  loss_weights_.classes = int(weights.size());  // at most LossWeights::kMaxClasses (config.cpp)
  std::copy(weights.begin(), weights.end(), loss_weights_.class_weight);
  loss_weights_.pos_weight = float(config.training.pos_weight);
  build_device_state(nullptr);
  device_->params->initialize(config.seed);
  if (!config.training.init_weights.empty()) load_init_weights(config, plan_.model, *device_->params);
  const std::string resume = find_resume_checkpoint(config, rank == 0);
  if (!resume.empty()) {
    const TrainingProgress p =
        load_checkpoint(resume, config, plan_.model, *device_->params, optimizer_, *device_->backend, rank == 0);
    start_step_ = p.step;
    resumed_data_ = p.data_identity;
    monitors_.load(p.monitors, resume);
    if (rank == 0) log().info("resuming from {} at step {} (epoch {})", resume, p.step, p.epoch);
  }
  data_ = std::make_unique<BatchSource>(config, plan_, rank, *device_->backend);
  // A manifest edited since the checkpoint would resume into other data (SPEC section 13).
  data_identity_ = data_->reader().identity();
  if (!resume.empty() && (!resumed_data_.empty() || !data_identity_.empty()))
    if (const std::string changed = manifest_changes(resumed_data_, data_identity_); !changed.empty())
      throw ConfigError(fmt::format("resume: data.train {} is not the data {} was trained on ({}); restore it, or "
                                    "start a new run (a new run_dir, or checkpoint.resume: never)",
                                    config.data.train, resume, changed));
  if (!config.data.validation.empty()) {
    validation_ = std::make_unique<BatchSource>(config, plan_, rank, *device_->backend, DataPurpose::Evaluate,
                                                config.data.validation);
    validation_schedule_ = inference_schedule(config, plan_, rank, Inference::Evaluate);
  }
  // Rank 0 writes the checkpoints. It claims the run directory once every input checked
  // out, so a run refused for its device, weights or data leaves nothing behind.
  if (rank == 0) {
    checkpoints_ = std::make_unique<CheckpointDir>(config);
    checkpoints_->check_start(start_step_, resume);
  }
  reporter_ = std::make_unique<Reporter>();
  if (options.trace_memory) {
    trace_ = std::make_unique<MemoryTrace>(start_step_ + 1);
  }
}

void Trainer::build_device_state(const HostSnapshot* restore) {
  device_ = std::make_unique<DeviceState>(backend_options_, make_device_world_, host_world_, plan_, rank_,
                                          Gradients::Kept, &halo_sent_);
  ComputeBackend& backend = *device_->backend;
  ParamStore& params = *device_->params;
  const size_t n = params.trainable_count();
  Allocator& a = backend.allocator();
  const OptimizerConfig& o = config_.training.optimizer;
  const bool adam = o.type == OptimizerType::Adam;
  optimizer_ = OptimizerState{};
  if (adam || o.momentum != 0) {
    optimizer_.m = Tensor(a, 1, 1, 1, int(n), "optimizer state");
    backend.fill_zero(optimizer_.m.data(), n);
  }
  if (adam) {
    optimizer_.v = Tensor(a, 1, 1, 1, int(n), "optimizer state");
    backend.fill_zero(optimizer_.v.data(), n);
  }
  if (restore) {
    auto put = [&](Tensor& t, const std::vector<float>& host) {
      if (!t.empty()) backend.from_host(t.data(), host.data(), t.bytes());
    };
    put(params.values(), restore->values);
    put(params.buffers(), restore->buffers);
    put(optimizer_.m, restore->m);
    put(optimizer_.v, restore->v);
  }
  const int micro = config_.training.batch_size / config_.training.accumulate;
  if (config_.training.accumulate > 1) {
    grad_sum_ = Tensor(a, 1, 1, 1, int(n), "accumulated gradients");
    backend.fill_zero(grad_sum_.data(), n);
  }
  const LayerContext ctx{plan_, rank_, *device_->world, *device_->group, backend, params, micro / plan_.groups,
                         micro, policies_, &position_, &frozen_};
  device_->make_layers(ctx, ConvUse::Training);
}

Trainer::HostSnapshot Trainer::take_snapshot() {
  HostSnapshot s;
  auto get = [&](Tensor& t, std::vector<float>& host) {
    host.resize(t.size());
    if (!t.empty()) device_->backend->to_host(host.data(), t.data(), t.bytes());
  };
  get(device_->params->values(), s.values);
  get(device_->params->buffers(), s.buffers);
  get(optimizer_.m, s.m);
  get(optimizer_.v, s.v);
  return s;
}

void Trainer::recycle_in_process() {
  // Everything the device holds is destroyed, in reverse order of creation, then rebuilt;
  // the data reader holds no device state and stays.
  const HostSnapshot snapshot = take_snapshot();
  bank_collective_seconds();
  const std::string device = device_->backend->device_name();
  data_->rebind(nullptr);
  if (validation_) validation_->rebind(nullptr);
  // What the step holds beside the device state goes first; the device state then goes in
  // reverse order of creation (its comms before the backend they stage in).
  optimizer_ = OptimizerState{};
  grad_sum_.release();
  device_.reset();
  build_device_state(&snapshot);
  data_->rebind(device_->backend.get());
  if (validation_) validation_->rebind(device_->backend.get());
  if (rank_ == 0) {
    const std::optional<uint64_t> free = device_->backend->device_free_bytes();
    log().info("recycled the device state of {} (and of every other rank){}", device,
               free ? fmt::format("; device free memory {} B", *free) : "");
  }
}

Trainer::~Trainer() = default;

double Trainer::loss_and_grad(const Tensor& y, const Batch& batch, Tensor& dy) {
  const ModelSpec& m = plan_.model;
  const double B = config_.training.batch_size;
  const bool spatial = m.spatial_output();
  // Spatial losses average over every pixel of every image: each shard adds its pixels.
  // Vector losses are replicated on the shards of a group: only the leader adds.
  // A per-pixel softmax averages over pixels, not channels (torch's cross_entropy on [N, K, H, W]).
  const bool softmax = m.loss == LossType::SoftmaxCrossEntropy;
  const double per_image = spatial ? double(m.output().h) * m.output().w * (softmax ? 1 : m.output().c)
                                   : (softmax ? 1 : m.output().c);
  const double elements = B * per_image;
  const double scale = 1.0 / elements;
  double local = 0;
  switch (m.loss) {
    case LossType::SoftmaxCrossEntropy:
      local = spatial ? device_->backend->softmax_xent_pixels(y.n(), y.c(), int64_t(y.h()) * y.w(), y.data(),
                                                      batch.targets.data(), scale, dy.data(), loss_weights_)
                      : device_->backend->softmax_xent(y.n(), y.c(), y.data(), batch.labels.data(), scale, dy.data(),
                                               loss_weights_);
      break;
    case LossType::SigmoidBCE:
      local = device_->backend->sigmoid_bce(y.size(), y.data(), batch.targets.data(), scale, dy.data(), loss_weights_);
      break;
    case LossType::MSE:
      local = device_->backend->mse(y.size(), y.data(), batch.targets.data(), scale, dy.data());
      break;
  }
  // A split output: each shard adds its pixels; a replicated one counts its group leader's.
  double total = (plan_.layers.back().sharded || plan_.shard_of(rank_) == 0) ? local : 0.0;
  device_->world->allreduce_sum_host(&total, 1);
  return total / elements;
}

double Trainer::learning_rate(int64_t step) const {
  return monitors_.plateau_lr(scheduled_lr(config_.training.lr_schedule, config_.training.optimizer.lr, step,
                                           total_steps(config_, data_->samples())));
}

MetricValues Trainer::validate() {
  device_->counting->set_counting(false);  // the halo figures are of training steps
  MetricValues values =
      evaluate_file(device_->layers, validation_schedule_, *device_->backend, *validation_, config_, plan_, rank_,
                    *device_->world);
  device_->counting->set_counting(true);
  return values;
}

void Trainer::report(int64_t step, double loss, double seconds, uint64_t peak, bool logged,
                     const MetricValues& val) {
  Reporter& r = *reporter_;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
  const int64_t done = step + 1;
  const double ips = config_.training.batch_size / std::max(seconds, 1e-9);
  const int64_t epoch = data_->epoch_of_step(step);
  if (logged) {
    r.csv << fmt::format("{},{},{:.8g},{:.8g},{:.6f},{:.4f},{}", done, epoch, loss, learning_rate(step), seconds,
                         ips, peak);
    // The validation columns, empty on the rows where it did not run.
    for (size_t i = 0; i < r.validation_columns; ++i)
      r.csv << "," << (i < val.size() ? fmt::format("{:.8g}", val[i].second) : "");
    r.csv << "\n";
    r.csv.flush();
  }
  const double eta = elapsed / double(done - start_step_) * double(r.total - done);
  const std::string line = fmt::format(
      "step {}/{}  loss {:.6f}{}  {:.2f} images/s  memory {:.1f}/{:.1f} MiB  ETA {:.0f}s", done, r.total, loss,
      format_values(val, "val_"), ips, peak / 1048576.0, config_.parallel.device_memory / 1048576.0,
      std::max(eta, 0.0));
  if (r.tty) {
    std::fprintf(stdout, "\r%s\x1b[K", line.c_str());
    // A validation's figures stay on the screen: the line after it starts anew.
    if (done == r.total || !val.empty()) std::fprintf(stdout, "\n");
    std::fflush(stdout);
  } else if (logged) {
    log().info(line);
  }
}

TrainingProgress Trainer::progress(int64_t steps_done) const {
  return {steps_done, data_->epoch_of_step(steps_done), steps_done * config_.training.batch_size,
          monitors_.save(), data_identity_};
}

bool Trainer::after_validation(const MetricValues& val, int64_t steps_done) {
  const Monitors::Verdict v = monitors_.observe(val, steps_done);
  if (v.best) {
    note_progress();
    if (rank_ == 0) {
      const std::string path =
          save_checkpoint(config_, plan_.model, *device_->params, optimizer_, *device_->backend, progress(steps_done),
                          "best.h5");
      log().info("{} {:.6g} is the best so far: wrote {}", config_.checkpoint.best->name, monitors_.best_value(),
                 path);
    }
    device_->world->barrier();  // a failed write aborts every rank here
    note_progress();
  }
  if (v.lowered && rank_ == 0)
    log().info("{} has not improved for {} validations: learning rate lowered to {:.6g}",
               config_.training.lr_schedule.monitor.name, config_.training.lr_schedule.patience,
               monitors_.plateau_lr(config_.training.optimizer.lr));
  return v.stop;
}

std::string Trainer::checkpoint(int64_t steps_done) {
  std::string path;
  note_progress();
  if (rank_ == 0) {
    path = save_checkpoint(config_, plan_.model, *device_->params, optimizer_, *device_->backend,
                           progress(steps_done));
    note_progress();
    checkpoints_->prune_after(steps_done);
    refresh_report();
  }
  // Nobody runs ahead of a checkpoint that is not on disk yet (a failed write aborts all).
  device_->world->barrier();
  note_progress();
  return path;
}

std::string Trainer::refresh_report() {
  Reporter& r = *reporter_;
  try {
    if (!r.image) r.image = read_thumbnail(config_, plan_.model);
    return write_run_report(config_.run_dir, config_, job_, r.total, *r.image);
  } catch (const std::exception& e) {
    // The page is for looking at: it never stops a run.
    if (!r.report_failed) log().warn("report.html not written: {}", e.what());
    r.report_failed = true;
    return "";
  }
}

void Trainer::stop_if_requested(int64_t steps_done, bool checkpoint_written, TrainSummary& summary) {
  // Every rank agrees at the same step boundary: one all-reduce of the local requests.
  const StopRequest local = pending_stop();
  double flags[2] = {local == StopRequest::Requeue ? 1.0 : 0.0, local == StopRequest::Terminate ? 1.0 : 0.0};
  device_->world->allreduce_sum_host(flags, 2);
  if (flags[0] == 0 && flags[1] == 0) return;
  stop_request_taken();  // every rank reached this boundary: the watchdog stands down
  if (!checkpoint_written) summary.checkpoint = checkpoint(steps_done);
  std::string why = "SIGTERM or SIGINT";
  if (flags[0] > 0) {
    why = "the Slurm warning signal";
    std::string error;
    if (rank_ == 0 && !request_requeue(config_.run_dir, &error))
      log().warn("could not requeue the job: {}; resubmit it to resume from {}", error, summary.checkpoint);
  }
  throw StopRequested(fmt::format("stopped after step {} on {}; checkpoint {}", steps_done, why,
                                  summary.checkpoint.empty() ? "written by rank 0" : summary.checkpoint));
}

TrainSummary Trainer::run() {
  TrainSummary summary;
  const int64_t total = total_steps(config_, data_->samples());
  Reporter& r = *reporter_;
  r.total = total;
  r.validation_columns = validation_columns(config_).size();
  if (rank_ == 0) {
    r.csv.open(prepare_run_files(config_, plan_, start_step_, total), std::ios::app);
    if (!r.csv) throw ConfigError(fmt::format("run_dir {}: cannot write metrics.csv", config_.run_dir));
    r.tty = isatty(fileno(stdout));
    // The image is read now, while every rank is starting anyway, not at the first checkpoint.
    refresh_report();
  }
  if (monitors_.stopped_at() > 0) {
    // A resubmitted run that early stopping ended: it is done.
    summary.steps = start_step_;
    summary.stopped_early = monitors_.stop_reason();
    if (rank_ == 0)
      log().info("nothing to train: the run stopped early at step {} ({}); raise its patience to go on",
                 monitors_.stopped_at(), summary.stopped_early);
    return summary;
  }
  if (start_step_ >= total && rank_ == 0)
    log().info("nothing to train: the checkpoint is at step {} of {} (raise training.steps to go on)",
               start_step_, total);
  const int64_t every = config_.checkpoint.every_steps;
  const int64_t recycle_every = config_.recycle.every_steps;
  summary.steps = start_step_;
  double step_seconds = 0;  // the training steps' wall time, for the collectives' share
  for (int64_t step = start_step_; step < total; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    summary.final_loss = train_step(step);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    step_seconds += seconds;
    const int64_t done = step + 1;
    const bool last = done == total;
    const int64_t every_val = config_.training.validate_every;
    MetricValues val;
    if (validation_ && (last || (every_val > 0 && done % every_val == 0))) {
      val = validate();
      summary.validation = val;
    }
    const bool logged = last || step == start_step_ || done % config_.training.log_every == 0 || !val.empty();
    uint64_t peak = 0;
    if (logged) peak = max_peak_over_ranks();
    if (rank_ == 0 && (logged || r.tty))
      report(step, summary.final_loss, seconds, logged ? peak : device_->backend->allocator().peak(), logged, val);
    const bool stop_early = !val.empty() && after_validation(val, done);
    if (stop_early) {
      summary.stopped_early = monitors_.stop_reason();
      if (rank_ == 0) log().info("stopping after step {} of {}: {}", done, total, summary.stopped_early);
    }
    const bool recycle_now = recycle_every > 0 && done % recycle_every == 0 && !last && !stop_early;
    const bool restart_now = recycle_now && config_.recycle.mode == RecycleMode::Restart;
    bool written = false;
    if ((every > 0 && done % every == 0) || last || restart_now || stop_early) {
      summary.checkpoint = checkpoint(done);
      written = true;
    }
    summary.steps = done;
    if (stop_early) break;
    stop_if_requested(done, written, summary);
    if (restart_now)
      throw StopRequested(fmt::format("recycle.mode restart: stopped after step {} to be relaunched; checkpoint {}",
                                      done, summary.checkpoint.empty() ? "written by rank 0" : summary.checkpoint));
    if (recycle_now) recycle_in_process();
  }
  summary.peak_device_bytes = max_peak_over_ranks();
  if (summary.steps > start_step_) {
    write_memory_report();
    log_halo_traffic(summary.steps - start_step_);
    log_collectives(summary.steps - start_step_, step_seconds);
  }
  if (rank_ == 0) {
    const std::string page = refresh_report();
    if (!page.empty()) log().info("report {} (open it in a browser; it needs no network)", page);
  }
  return summary;
}

TrainSummary run_training(const Config& config, const TrainOptions& options) {
  const ModelSpec model = build_model_spec(config);
  const Plan plan = launch_plan(config, model);
  ensure_data(config);
  TrainSummary summary;  // this process's first rank's
  const bool mpi = mpi_world_size() > 1;
  run_workers(config, plan.shards, [&](int rank, Comm& world, const BackendOptions& backend,
                                const DeviceWorldFactory& device_world) {
    Trainer trainer(config, plan, rank, world, backend, device_world, options);
    TrainSummary s = trainer.run();
    if (mpi || rank == 0) summary = std::move(s);
  });
  return summary;
}

}  // namespace ht
