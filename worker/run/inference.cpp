#include "worker/run/inference.hpp"

#include <fmt/format.h>
#include <hdf5.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "orchestrator/files.hpp"
#include "orchestrator/memory_model.hpp"
#include "worker/io/h5.hpp"
#include "worker/io/keras_h5.hpp"
#include "worker/io/prediction_output.hpp"
#include "worker/layers/layers.hpp"
#include "worker/run/checkpoint.hpp"
#include "worker/run/checkpoint_dir.hpp"
#include "worker/run/device_state.hpp"
#include "worker/run/launcher.hpp"
#include "worker/run/memory_trace.hpp"
#include "worker/run/run_report.hpp"
#include "worker/runtime/log.hpp"

namespace ht {

namespace {

// The weights to run: the checkpoint named (it must verify and be of this model) or a plain
// Keras weights file named (an import's init weights: loaded as training.init_weights
// would be), or the newest valid checkpoint in run_dir/checkpoints.
struct Weights {
  std::string path;
  bool plain = false;  // a Keras weights file without halotrain's state
};

Weights choose_checkpoint(const Config& config, const ModelSpec& model, const std::string& named) {
  std::string path = named;
  if (path.empty()) {
    const std::string dir = config.run_dir + "/checkpoints";
    for (const auto& [step, candidate] : list_checkpoints(dir))
      if (checkpoint_problem(candidate).empty()) {
        path = candidate;
        break;
      }
    if (path.empty())
      throw ConfigError(fmt::format("{}: no valid checkpoint to evaluate (train first, or pass --checkpoint FILE)",
                                    dir));
  } else {
    if (const std::string problem = input_file_problem(path); !problem.empty())
      throw ConfigError(fmt::format("--checkpoint {}: {}", path, problem));
    if (is_plain_keras_weights(path)) return {path, true};
    if (const std::string problem = checkpoint_problem(path); !problem.empty())
      throw ConfigError(fmt::format("--checkpoint {}: {}", path, problem));
  }
  const std::string hash = KerasWeightsFile(path).read_state().model_hash;
  if (hash != model_hash(model))
    throw ConfigError(fmt::format("--checkpoint {} was written for another model (model hash {}, {}'s is {}): its "
                                  "layers or model.input differ",
                                  path, hash, config.source_path, model_hash(model)));
  return {path, false};
}

// A FIFO, directory or device is refused before anything opens it (it could block); a
// missing file is named by the data reader, as data.train is.
void check_input_file(const std::string& path, const char* flag) {
  if (const std::string problem = input_file_problem(path); !problem.empty() && problem != "does not exist")
    throw ConfigError(fmt::format("{} {}: {}", flag, path, problem));
}

// One rank's device state for inference: backend, weights (no gradients), layers.
class InferenceWorker {
 public:
  InferenceWorker(const Config& config, const ShardPlan& plan, int rank, Comm& world, const BackendOptions& options,
                  const DeviceWorldFactory& device_world, const Weights& checkpoint, Inference kind)
      : config_(config),
        plan_(plan),
        rank_(rank),
        policies_(plan.model.layers.size(), ActivationPolicy::Keep),
        schedule_(inference_schedule(config, plan, rank, kind)) {
    device_ = std::make_unique<DeviceState>(options, device_world, world, plan, rank, Gradients::None);
    OptimizerState none;
    if (checkpoint.plain)
      load_keras_weights(checkpoint.path, "--checkpoint " + checkpoint.path, config.training.init_by_name, plan.model,
                         *device_->params);
    else
      step_ = load_checkpoint(checkpoint.path, config, plan.model, *device_->params, none, *device_->backend, false)
                  .step;
    const int micro = config.training.batch_size / config.training.accumulate;
    const LayerContext ctx{plan, rank, *device_->world, *device_->group, *device_->backend, *device_->params,
                           micro / plan.groups, micro, policies_};
    device_->make_layers(ctx, ConvUse::Inference);
  }

  int64_t step() const { return step_; }
  ComputeBackend& backend() { return *device_->backend; }
  Comm& world() { return *device_->world; }

  // The peak device bytes of every rank, on every rank (collective).
  std::vector<double> peaks() {
    std::vector<double> p(device_->world->size(), 0.0);
    p[rank_] = double(device_->backend->allocator().peak());
    device_->world->allreduce_sum_host(p.data(), p.size());
    return p;
  }

  MetricValues evaluate(BatchSource& data) {
    return evaluate_file(device_->layers, schedule_, *device_->backend, data, config_, plan_, rank_, *device_->world);
  }

  // `trace`: records the first batch (`predict --trace-memory`); null: none.
  void predict(BatchSource& data, PredictionSink* out, MemoryTrace* trace);

 private:
  const Config& config_;
  const ShardPlan& plan_;
  int rank_;
  LayerPolicies policies_;
  StepSchedule schedule_;  // a batch's operations
  int64_t step_ = 0;
  std::unique_ptr<DeviceState> device_;
};

// The operation of schedule_ that `action` names (one each of LoadBatch, SendOutput, EndMicroBatch).
const StepOp& op_of(const StepSchedule& schedule, StepAction action) {
  for (const StepOp& op : schedule.ops)
    if (op.action == action) return op;
  throw std::logic_error(std::string("the inference schedule has no ") + step_action_name(action));
}

void InferenceWorker::predict(BatchSource& data, PredictionSink* out, MemoryTrace* trace) {
  const ModelSpec& m = plan_.model;
  const int L = int(m.layers.size());
  const bool spatial = m.spatial_output();
  const int C = m.output().c;
  const int64_t N = data.samples();
  const int b = data.micro_batch();
  for (int64_t round = 0; round < data.rounds(); ++round) {
    MemoryTrace* traced = round == 0 ? trace : nullptr;
    auto begin = [traced](const StepOp& op) {
      if (traced) traced->begin(op);
    };
    if (traced) traced->start(device_->backend->allocator(), device_->backend->host_pool());
    begin(op_of(schedule_, StepAction::LoadBatch));
    Batch batch = data.load_round(round);
    Tensor y = forward_inference(device_->layers, schedule_, std::move(batch.images), begin);
    begin(op_of(schedule_, StepAction::SendOutput));
    // Every rank whose output counts sends it to rank 0 in bands of rows, in rank order;
    // rank 0 takes its own the same way, so one rule sizes every band.
    for (int r = 0; r < device_->world->size(); ++r) {
      if (!spatial && plan_.shard_of(r) != 0) continue;  // a classifier's output is its group's
      if (rank_ != 0 && rank_ != r) continue;
      const int64_t first = round * b * plan_.groups + int64_t(plan_.group_of(r)) * b;
      const int images = int(std::clamp<int64_t>(N - first, 0, b));
      if (!spatial) {
        if (images == 0) continue;
        Tensor band(device_->backend->allocator(), 1, 1, 1, b * C, "prediction rows");
        if (r == rank_) {
          device_->backend->copy(band.data(), y.data(), size_t(images) * C);
          device_->backend->synchronize();
        }
        if (r != 0 && rank_ == r) device_->world->exchange({{0, band.data(), size_t(images) * C}}, {});
        if (r != 0 && rank_ == 0) device_->world->exchange({}, {{r, band.data(), size_t(images) * C}});
        if (rank_ == 0) {
          std::vector<float> host(size_t(images) * C);
          device_->backend->to_host(host.data(), band.data(), host.size() * sizeof(float));
          out->write_rows(first, images, C, host.data());
        }
        continue;
      }
      const Rect tile = plan_.owned_output(L - 1, r);
      const int rows = tile.rows.size(), cols = tile.cols.size();
      const int per_band = std::min(rows, prediction_band_rows(C, cols));
      for (int i = 0; i < images; ++i)
        for (int r0 = 0; r0 < rows; r0 += per_band) {
          const int n = std::min(per_band, rows - r0);
          Tensor band(device_->backend->allocator(), 1, C, n, cols, "prediction band");
          const size_t count = size_t(C) * n * cols;
          if (r == rank_) {
            device_->backend->pack_rect(y.data() + size_t(i) * C * rows * cols, 1, C, rows, cols, r0, 0, n, cols,
                                        band.data());
            device_->backend->synchronize();  // the band is whole before a comm reads it
          }
          if (r != 0 && rank_ == r) device_->world->exchange({{0, band.data(), count}}, {});
          if (r != 0 && rank_ == 0) device_->world->exchange({}, {{r, band.data(), count}});
          if (rank_ == 0) {
            std::vector<float> host(count);
            device_->backend->to_host(host.data(), band.data(), count * sizeof(float));
            out->write_tile(first + i, tile.rows.lo + r0, tile.cols.lo, C, n, cols, host.data());
          }
        }
    }
    begin(op_of(schedule_, StepAction::EndMicroBatch));
    y.release();
    if (traced)
      traced->finish(fmt::format("{}/memory-trace-predict-{}.json", config_.run_dir, rank_), rank_);
  }
}

// What both commands share: the plan of this launch, checked to fit for inference.
ShardPlan inference_plan(const Config& config, const ModelSpec& model, Inference kind, const std::string& data) {
  check_layer_kernels(model);
  const ShardPlan plan = launch_shards(config, model);
  check_whole_decodes(config, plan,
                      data_whole_decodes(config, model, data,
                                         kind == Inference::Predict ? DataPurpose::Predict : DataPurpose::Evaluate));
  const MemoryEstimate e = estimate_inference_memory_max(config, plan, kind);
  if (e.total > config.parallel.device_memory)
    throw ConfigError(fmt::format("{}: parallel.grid [{}, {}] does not fit for inference: rank {} needs {} per device "
                                  "(params {}, activations {}) but parallel.device_memory is {}; use a larger grid "
                                  "(halotrain plan --mode predict shows the sizes)",
                                  config.source_path, plan.grid_rows, plan.grid_cols, e.rank, format_size(e.total),
                                  format_size(e.params), format_size(e.activations),
                                  format_size(config.parallel.device_memory)));
  return plan;
}

uint64_t max_of(const std::vector<double>& v) { return uint64_t(*std::max_element(v.begin(), v.end())); }

}  // namespace

EvaluationResult run_evaluation(const Config& config, const std::string& checkpoint, const std::string& data) {
  const ModelSpec model = build_model_spec(config);
  EvaluationResult result;
  result.data = data.empty() ? config.data.validation : data;
  if (result.data.empty())
    throw ConfigError(fmt::format("{}: nothing to evaluate on: set data.validation or pass --data FILE.h5",
                                  config.source_path));
  check_input_file(result.data, "--data");
  const Weights weights = choose_checkpoint(config, model, checkpoint);
  result.checkpoint = weights.path;
  const ShardPlan plan = inference_plan(config, model, Inference::Evaluate, result.data);
  result.predicted_peak_device_bytes = estimate_inference_memory_max(config, plan, Inference::Evaluate).total;
  bool root = false;  // this process holds rank 0 (under MPI, one process does)
  run_workers(config, plan, [&](int rank, Comm& world, const BackendOptions& backend, const DeviceWorldFactory& dw) {
    InferenceWorker worker(config, plan, rank, world, backend, dw, weights, Inference::Evaluate);
    BatchSource source(config, plan, rank, worker.backend(), DataPurpose::Evaluate, result.data);
    MetricValues values = worker.evaluate(source);
    const uint64_t peak = max_of(worker.peaks());
    if (rank != 0) return;
    root = true;
    result.values = std::move(values);
    result.step = worker.step();
    result.images = source.samples();
    result.peak_device_bytes = peak;
  });
  if (!root) return result;
  nlohmann::json j{{"checkpoint", result.checkpoint}, {"step", result.step},       {"data", result.data},
                   {"images", result.images},         {"grid", {plan.grid_rows, plan.grid_cols}},
                   {"peak_device_bytes", result.peak_device_bytes},
                   {"predicted_peak_device_bytes", result.predicted_peak_device_bytes}};
  for (const auto& [name, v] : result.values) j[name] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
  result.json = fmt::format("{}/eval-{}.json", config.run_dir, result.step);
  publish_page(result.json, j.dump(2) + "\n");
  return result;
}

PredictionResult run_prediction(const Config& config, const std::string& checkpoint, const std::string& input,
                                const std::string& output, bool float32, bool trace_memory) {
  const ModelSpec model = build_model_spec(config);
  check_input_file(input, "--input");
  const Weights ckpt = choose_checkpoint(config, model, checkpoint);
  const ShardPlan plan = inference_plan(config, model, Inference::Predict, input);
  PredictionResult result;
  result.predicted_peak_device_bytes = estimate_inference_memory_max(config, plan, Inference::Predict).total;
  run_workers(config, plan, [&](int rank, Comm& world, const BackendOptions& backend, const DeviceWorldFactory& dw) {
    InferenceWorker worker(config, plan, rank, world, backend, dw, ckpt, Inference::Predict);
    BatchSource source(config, plan, rank, worker.backend(), DataPurpose::Predict, input);
    const Shape3 o = model.output();
    const bool spatial = model.spatial_output();
    const std::vector<int64_t> shape = spatial ? std::vector<int64_t>{source.samples(), o.h, o.w, o.c}
                                               : std::vector<int64_t>{source.samples(), o.c};
    std::unique_ptr<PredictionSink> out;
    if (rank == 0) {
      PredictionLayout layout{shape, {}, {}, float32};
      const DataReader& reader = source.reader();
      for (int64_t i = 0; i < source.samples(); ++i) {
        layout.names.push_back(reader.image_name(i));
        // The output rows and columns of the image's own part (data.fit: pad), rounded up.
        const auto [h, w] = reader.image_extent(i);
        layout.extents.emplace_back(int((int64_t(h) * o.h + reader.height() - 1) / reader.height()),
                                    int((int64_t(w) * o.w + reader.width() - 1) / reader.width()));
      }
      out = open_prediction_output(output, input, layout);
    }
    std::optional<MemoryTrace> trace;
    if (trace_memory) trace.emplace(0);
    worker.predict(source, out.get(), trace ? &*trace : nullptr);
    const uint64_t peak = max_of(worker.peaks());
    if (rank != 0) return;
    out->commit();
    result.images = source.samples();
    result.shape = shape;
    result.peak_device_bytes = peak;
  });
  return result;
}

}  // namespace ht
