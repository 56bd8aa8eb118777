#include "worker/trainer.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "worker/log.hpp"

namespace ht {

namespace {
bool spatial_output(const ModelSpec& m) { return m.spatial_layers == int(m.layers.size()); }
int64_t total_steps(const Config& c, int64_t samples) {
  if (c.training.steps > 0) return c.training.steps;
  return (c.training.epochs * samples + c.training.batch_size - 1) / c.training.batch_size;
}
}  // namespace

// Rank 0's view for the user: a progress line on a terminal, plain log lines otherwise,
// and run_dir/metrics.csv.
struct Trainer::Reporter {
  bool tty = false;
  std::ofstream csv;
  int64_t total = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

Trainer::Trainer(const Config& config, const ShardPlan& plan, int rank, Comm& world,
                 const BackendOptions& backend_options)
    : config_(config), plan_(plan), rank_(rank), world_(world) {
  group_ = world.split(plan.group_of(rank));
  backend_ = make_backend(backend_options);
  params_ = std::make_unique<ParamStore>(plan.model, *backend_);
  params_->initialize(config.seed);
  if (!config.training.init_weights.empty()) load_init_weights(config, plan.model, *params_);
  const size_t n = params_->trainable_count();
  Allocator& a = backend_->allocator();
  const bool adam = config.training.optimizer.type == OptimizerType::Adam;
  if (adam || config.training.optimizer.momentum != 0) {
    optimizer_.m = Tensor(a, 1, 1, 1, int(n), "optimizer state");
    backend_->fill_zero(optimizer_.m.data(), n);
  }
  if (adam) {
    optimizer_.v = Tensor(a, 1, 1, 1, int(n), "optimizer state");
    backend_->fill_zero(optimizer_.v.data(), n);
  }
  data_ = std::make_unique<BatchSource>(config, plan, rank, *backend_);
  const int local_batch = config.training.batch_size / plan.groups;
  LayerContext ctx{plan, rank, world, *group_, *backend_, *params_, local_batch, config.training.batch_size};
  for (int l = 0; l < int(plan.model.layers.size()); ++l) layers_.push_back(make_layer(ctx, l));
  reporter_ = std::make_unique<Reporter>();
}

Trainer::~Trainer() = default;

double Trainer::loss_and_grad(const Tensor& y, const Batch& batch, Tensor& dy) {
  const ModelSpec& m = plan_.model;
  const double B = config_.training.batch_size;
  const bool spatial = spatial_output(m);
  // Spatial losses average over every pixel of every image: each shard adds its pixels.
  // Vector losses are replicated on the shards of a group: only the leader adds.
  const double elements = spatial ? B * m.output().elements() : B * (m.loss == LossType::SoftmaxCrossEntropy ? 1 : m.output().c);
  const double scale = 1.0 / elements;
  double local = 0;
  switch (m.loss) {
    case LossType::SoftmaxCrossEntropy:
      local = backend_->softmax_xent(y.n(), y.c(), y.data(), batch.labels.data(), scale, dy.data());
      break;
    case LossType::SigmoidBCE:
      local = backend_->sigmoid_bce(y.size(), y.data(), batch.targets.data(), scale, dy.data());
      break;
    case LossType::MSE:
      local = backend_->mse(y.size(), y.data(), batch.targets.data(), scale, dy.data());
      break;
  }
  double total = (spatial || plan_.shard_of(rank_) == 0) ? local : 0.0;
  world_.allreduce_sum_host(&total, 1);
  return total / elements;
}

double Trainer::train_step(int64_t step) {
  Batch batch = data_->load(step);
  const int L = int(layers_.size());
  std::vector<Tensor> acts(L + 1);
  acts[0] = std::move(batch.images);
  for (int l = 0; l < L; ++l) acts[l + 1] = layers_[l]->forward(acts[l]);
  const Tensor& y = acts[L];
  Tensor dy(backend_->allocator(), y.n(), y.c(), y.h(), y.w(), "loss gradient");
  const double loss = loss_and_grad(y, batch, dy);
  if (!std::isfinite(loss)) {
    for (auto& layer : layers_) layer->release_saved();
    throw TrainingDiverged(fmt::format(
        "step {}: the loss is {}; stopping without writing a checkpoint (samples {}; lower "
        "training.optimizer.lr or check data.scale)",
        step + 1, loss, fmt::join(batch.samples, ", ")));
  }
  for (int l = L - 1; l >= 0; --l) {
    Tensor dx = layers_[l]->backward(acts[l], acts[l + 1], dy, l > 0);
    layers_[l]->release_saved();
    acts[l + 1].release();
    dy = std::move(dx);
  }
  // One all-reduce of every weight gradient, summed in rank order.
  world_.allreduce_sum(params_->grads().data(), params_->trainable_count());
  optimizer_step(step);
  return loss;
}

void Trainer::optimizer_step(int64_t step) {
  const OptimizerConfig& o = config_.training.optimizer;
  const size_t n = params_->trainable_count();
  float* w = params_->values().data();
  const float* g = params_->grads().data();
  if (o.type == OptimizerType::Adam)
    backend_->adam_step(n, w, g, optimizer_.m.data(), optimizer_.v.data(), o.lr, o.beta1, o.beta2,
                        o.epsilon, step + 1);
  else
    backend_->sgd_step(n, w, g, optimizer_.m.empty() ? nullptr : optimizer_.m.data(), float(o.lr),
                       float(o.momentum));
}

uint64_t Trainer::max_peak_over_ranks() {
  std::vector<double> peaks(world_.size(), 0.0);
  peaks[rank_] = double(backend_->allocator().peak());
  world_.allreduce_sum_host(peaks.data(), peaks.size());
  double best = 0;
  for (double p : peaks) best = std::max(best, p);
  return uint64_t(best);
}

void Trainer::report(int64_t step, double loss, double seconds, uint64_t peak, bool logged) {
  Reporter& r = *reporter_;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
  const int64_t done = step + 1;
  const double ips = config_.training.batch_size / std::max(seconds, 1e-9);
  const int64_t epoch = data_->epoch_of_step(step);
  if (logged)
    r.csv << fmt::format("{},{},{:.8g},{:.8g},{:.6f},{:.4f},{}\n", done, epoch, loss,
                       config_.training.optimizer.lr, seconds, ips, peak);
  if (logged) r.csv.flush();
  const double eta = elapsed / double(done - start_step_) * double(r.total - done);
  const std::string line = fmt::format(
      "step {}/{}  loss {:.6f}  {:.2f} images/s  memory {:.1f}/{:.1f} MiB  ETA {:.0f}s", done, r.total, loss,
      ips, peak / 1048576.0, config_.parallel.device_memory / 1048576.0, std::max(eta, 0.0));
  if (r.tty) {
    std::fprintf(stdout, "\r%s\x1b[K", line.c_str());
    if (done == r.total) std::fprintf(stdout, "\n");
    std::fflush(stdout);
  } else if (logged) {
    log().info(line);
  }
}

TrainSummary Trainer::run() {
  TrainSummary summary;
  const int64_t total = total_steps(config_, data_->samples());
  Reporter& r = *reporter_;
  r.total = total;
  start_step_ = 0;
  if (rank_ == 0) {
    std::filesystem::create_directories(config_.run_dir);
    const std::string path = config_.run_dir + "/metrics.csv";
    const bool fresh = !std::filesystem::exists(path) || start_step_ == 0;
    r.csv.open(path, fresh ? std::ios::trunc : std::ios::app);
    if (!r.csv) throw ConfigError(fmt::format("run_dir {}: cannot write metrics.csv", config_.run_dir));
    if (fresh) r.csv << "step,epoch,loss,lr,seconds,images_per_s,peak_device_bytes\n";
    r.tty = isatty(fileno(stdout));
  }
  const int64_t every = config_.checkpoint.every_steps;
  for (int64_t step = start_step_; step < total; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    summary.final_loss = train_step(step);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool last = step + 1 == total;
    const bool logged = last || step == start_step_ || (step + 1) % config_.training.log_every == 0;
    uint64_t peak = 0;
    if (logged) peak = max_peak_over_ranks();
    if (rank_ == 0 && (logged || r.tty)) report(step, summary.final_loss, seconds, logged ? peak : backend_->allocator().peak(), logged);
    if ((every > 0 && (step + 1) % every == 0) || last) {
      TrainingProgress progress{step + 1, data_->epoch_of_step(step + 1), (step + 1) * config_.training.batch_size};
      if (rank_ == 0)
        summary.checkpoint = save_checkpoint(config_, plan_.model, *params_, optimizer_, *backend_, progress);
    }
    summary.steps = step + 1;
  }
  summary.peak_device_bytes = max_peak_over_ranks();
  return summary;
}

}  // namespace ht
