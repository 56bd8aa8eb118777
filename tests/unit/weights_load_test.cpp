// Loading weights streams one tensor at a time: `training.init_weights` and checkpoints land
// in the parameter arena (conv kernels transposed from Keras HWIO to OIHW), and every host
// byte staged on the way is counted, never more than the largest tensor of the file. Run
// on the CPU backend (host arena) and on a stand-in device (memory reached only through
// from_host/to_host), which takes the blocked path a GPU takes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>

#include "orchestrator/config.hpp"
#include "orchestrator/config_io.hpp"
#include "orchestrator/model_spec.hpp"
#include "worker/io/keras_h5.hpp"
#include "worker/layers/params.hpp"
#include "worker/run/checkpoint.hpp"
#include "worker/runtime/backend.hpp"

namespace fs = std::filesystem;
using namespace ht;

namespace {

// Kernels (kh, kw, cin, cout): 3x3x3x5 and 1x1x24x7 split unevenly into blocks of output
// channels on a device, 3x3x7x1 into runs of input channels, 3x3x1x1 needs no transpose;
// 3x3x5x24 is the largest tensor.
const char* kConfig = R"(name: weights-load
seed: 5
data: {train: unused.h5}
model:
  input: [12, 12, 3]
  layers:
    - {type: conv2d, filters: 5, kernel: 3, padding: same}
    - {type: batch_norm}
    - {type: relu}
    - {type: conv2d, filters: 24, kernel: 3, padding: same, bias: false}
    - {type: conv2d, filters: 7, kernel: 1, padding: same}
    - {type: conv2d, filters: 1, kernel: 3, padding: same, bias: false}
    - {type: conv2d, filters: 1, kernel: 3, padding: same}
    - {type: global_avg_pool}
    - {type: dense, units: 3}
  loss: softmax_cross_entropy
training: {batch_size: 1, steps: 1, optimizer: {type: adam, lr: 0.001}}
parallel: {grid: [1, 1]}
)";

// Every value in the file is distinct and exact in float32.
float keras_value(size_t layer, size_t weight, int64_t index) {
  return 2000.0f * float(layer) + float(index) + 0.25f * float(weight);
}
float slot_value(int slot, size_t index) { return -1.0f - float(index) - 0.5f * float(slot); }

// Memory reached only through from_host / to_host, as on a GPU; the kernels are the CPU
// backend's. kind() says CUDA, so ParamStore takes the device path.
class StandInDevice final : public ComputeBackend {
 public:
  StandInDevice() : cpu_(make_backend({})) {}
  Backend kind() const override { return Backend::CUDA; }
  Allocator& allocator() override { return cpu_->allocator(); }
  Allocator& host_pool() override { return cpu_->host_pool(); }
  std::string device_name() const override { return "stand-in device"; }
  void to_host(void* host_dst, const void* src, size_t bytes) override { std::memcpy(host_dst, src, bytes); }
  void from_host(void* dst, const void* host_src, size_t bytes) override { std::memcpy(dst, host_src, bytes); }
  void fill_zero(float* dst, size_t count) override { cpu_->fill_zero(dst, count); }
  void copy(float* dst, const float* src, size_t count) override { cpu_->copy(dst, src, count); }
  void add(float* dst, const float* src, size_t count) override { cpu_->add(dst, src, count); }
  void add_scaled(float* dst, const float* src, float alpha, size_t count) override {
    cpu_->add_scaled(dst, src, alpha, count);
  }
  void scale(float* dst, float factor, size_t count) override { cpu_->scale(dst, factor, count); }
  void pack_rect(const float* src, int n, int c, int h, int w, int row0, int col0, int rows, int cols,
                 float* dst) override {
    cpu_->pack_rect(src, n, c, h, w, row0, col0, rows, cols, dst);
  }
  void unpack_rect(const float* src, int n, int c, int h, int w, int row0, int col0, int rows, int cols,
                   float* dst, Unpack mode) override {
    cpu_->unpack_rect(src, n, c, h, w, row0, col0, rows, cols, dst, mode);
  }
  std::unique_ptr<ConvKernel> make_conv(const ConvGeom& geom) override { return cpu_->make_conv(geom); }
  void max_pool_forward(const PoolGeom& g, const float* x, float* y) override { cpu_->max_pool_forward(g, x, y); }
  void max_pool_backward(const PoolGeom& g, const float* x, const float* dy, float* dx) override {
    cpu_->max_pool_backward(g, x, dy, dx);
  }
  void avg_pool_forward(const PoolGeom& g, const float* x, float* y) override { cpu_->avg_pool_forward(g, x, y); }
  void avg_pool_backward(const PoolGeom& g, const float* dy, float* dx) override {
    cpu_->avg_pool_backward(g, dy, dx);
  }
  void channel_sum(int n, int c, int64_t hw, const float* x, double* s) override { cpu_->channel_sum(n, c, hw, x, s); }
  void channel_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* mean, double* out) override {
    cpu_->channel_sq_dev_sum(n, c, hw, x, mean, out);
  }
  void bn_forward_apply(int n, int c, int64_t hw, const float* x, const double* mean, const double* invstd,
                        const float* gamma, const float* beta, float* y) override {
    cpu_->bn_forward_apply(n, c, hw, x, mean, invstd, gamma, beta, y);
  }
  void bn_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                        const double* invstd, double* sum_dy, double* sum_dy_xhat) override {
    cpu_->bn_backward_sums(n, c, hw, dy, x, mean, invstd, sum_dy, sum_dy_xhat);
  }
  void bn_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                         const double* invstd, const float* gamma, const double* sum_dy,
                         const double* sum_dy_xhat, double count, float* dx) override {
    cpu_->bn_backward_apply(n, c, hw, dy, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, dx);
  }
  void plane_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* mean, double* out) override {
    cpu_->plane_sq_dev_sum(n, c, hw, x, mean, out);
  }
  void plane_affine(int n, int c, int64_t hw, const float* x, const double* mean, const double* scale,
                    const double* shift, float* y) override {
    cpu_->plane_affine(n, c, hw, x, mean, scale, shift, y);
  }
  void plane_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                           double* sum_dy, double* sum_dy_dev) override {
    cpu_->plane_backward_sums(n, c, hw, dy, x, mean, sum_dy, sum_dy_dev);
  }
  void plane_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                            const double* k, const double* a, const double* b, float* dx) override {
    cpu_->plane_backward_apply(n, c, hw, dy, x, mean, k, a, b, dx);
  }
  void relu_forward(size_t count, const float* x, float* y) override { cpu_->relu_forward(count, x, y); }
  void activation_forward(Activation f, ActivationArgs a, size_t count, const float* x, float* y) override {
    cpu_->activation_forward(f, a, count, x, y);
  }
  void activation_backward(Activation f, ActivationArgs a, size_t count, const float* x, const float* y,
                           const float* dy, float* dx) override {
    cpu_->activation_backward(f, a, count, x, y, dy, dx);
  }
  void multiply(size_t count, const float* a, const float* b, float* y) override { cpu_->multiply(count, a, b, y); }
  void multiply_planes(int n, int c, int64_t hw, const float* x, const float* v, PlaneFactor per,
                       float* y) override {
    cpu_->multiply_planes(n, c, hw, x, v, per, y);
  }
  void plane_dot(int n, int c, int64_t hw, const float* a, const float* b, double* out) override {
    cpu_->plane_dot(n, c, hw, a, b, out);
  }
  void scale_images(int n, int64_t image, const float* x, const double* f, float* y) override {
    cpu_->scale_images(n, image, x, f, y);
  }
  void layer_norm_forward(int n, int c, int64_t hw, const float* x, double eps, const float* gamma,
                          const float* beta, float* y) override {
    cpu_->layer_norm_forward(n, c, hw, x, eps, gamma, beta, y);
  }
  void layer_norm_backward(int n, int c, int64_t hw, const float* x, const float* dy, double eps,
                           const float* gamma, float* dx, double* dgamma, double* dbeta) override {
    cpu_->layer_norm_backward(n, c, hw, x, dy, eps, gamma, dx, dgamma, dbeta);
  }
  void to_channels_last(int n, int c, int64_t hw, const float* x, float* y) override {
    cpu_->to_channels_last(n, c, hw, x, y);
  }
  void from_channels_last(int n, int c, int64_t hw, const float* y, float* x) override {
    cpu_->from_channels_last(n, c, hw, y, x);
  }
  void relu_backward(size_t count, const float* y, const float* dy, float* dx) override {
    cpu_->relu_backward(count, y, dy, dx);
  }
  void global_avg_sum(int n, int c, int64_t hw, const float* x, double* sums) override {
    cpu_->global_avg_sum(n, c, hw, x, sums);
  }
  void global_avg_backward(int n, int c, int64_t hw, const float* dy, double scale, float* dx) override {
    cpu_->global_avg_backward(n, c, hw, dy, scale, dx);
  }
  void resample_forward(const ResampleGeom& g, const float* x, float* y) override { cpu_->resample_forward(g, x, y); }
  void resample_backward(const ResampleGeom& g, const float* dy, float* dx) override {
    cpu_->resample_backward(g, dy, dx);
  }
  void add_channel_bias(int n, int c, int64_t hw, const float* bias, float* y) override {
    cpu_->add_channel_bias(n, c, hw, bias, y);
  }
  void dropout_apply(const DropoutMask& m, int n, int c, int h, int w, const float* x, float* y) override {
    cpu_->dropout_apply(m, n, c, h, w, x, y);
  }
  void global_max(int n, int c, int64_t hw, const float* x, double* maxes) override {
    cpu_->global_max(n, c, hw, x, maxes);
  }
  void global_max_count(int n, int c, int64_t hw, const float* x, const double* maxes, double* counts) override {
    cpu_->global_max_count(n, c, hw, x, maxes, counts);
  }
  void global_max_backward(int n, int c, int64_t hw, const float* x, const double* maxes, const double* grads,
                           float* dx) override {
    cpu_->global_max_backward(n, c, hw, x, maxes, grads, dx);
  }
  void dense_forward(int n, int in, int out, const float* x, const float* w, const float* b, float* y) override {
    cpu_->dense_forward(n, in, out, x, w, b, y);
  }
  void dense_backward(int n, int in, int out, const float* x, const float* w, const float* dy, float* dx,
                      float* dw, float* db) override {
    cpu_->dense_backward(n, in, out, x, w, dy, dx, dw, db);
  }
  double softmax_xent(int n, int k, const float* logits, const int32_t* labels, double grad_scale, float* grad,
                      const LossWeights& w) override {
    return cpu_->softmax_xent(n, k, logits, labels, grad_scale, grad, w);
  }
  double softmax_xent_pixels(int n, int k, int64_t hw, const float* logits, const float* classes,
                             double grad_scale, float* grad, const LossWeights& w) override {
    return cpu_->softmax_xent_pixels(n, k, hw, logits, classes, grad_scale, grad, w);
  }
  double sigmoid_bce(size_t count, const float* logits, const float* targets, double grad_scale, float* grad,
                     const LossWeights& w) override {
    return cpu_->sigmoid_bce(count, logits, targets, grad_scale, grad, w);
  }
  double mse(size_t count, const float* pred, const float* targets, double grad_scale, float* grad) override {
    return cpu_->mse(count, pred, targets, grad_scale, grad);
  }
  void sgd_step(size_t n, float* w, const float* g, float* v, float lr, float momentum) override {
    cpu_->sgd_step(n, w, g, v, lr, momentum);
  }
  void adam_step(size_t n, float* w, const float* g, float* m, float* v, double lr, double beta1, double beta2,
                 double eps, int64_t step) override {
    cpu_->adam_step(n, w, g, m, v, lr, beta1, beta2, eps, step);
  }

 private:
  std::unique_ptr<ComputeBackend> cpu_;
};

enum class Arena { Host, Device };

class WeightsLoad : public ::testing::TestWithParam<Arena> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ht_weights_load_" + std::to_string(getpid()) + "_" + std::to_string(int(GetParam())));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    config_ = parse_config(kConfig, "weights_load_test.yaml");
    model_ = build_model_spec(config_);
    if (GetParam() == Arena::Host)
      backend_ = make_backend({});
    else
      backend_ = std::make_unique<StandInDevice>();
    params_ = std::make_unique<ParamStore>(model_, *backend_);
    for (const LayerSpec& l : model_.layers)
      for (const WeightSpec& w : l.weights) largest_bytes_ = std::max(largest_bytes_, uint64_t(w.elements()) * 4);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A Keras weights file of model_ (with /halotrain, so load_checkpoint takes it too):
  // every weight from keras_value in Keras layout, Adam slots from slot_value.
  std::string write_file() {
    std::vector<std::vector<float>> data;
    data.reserve(64);
    std::vector<KerasLayerWeights> layers;
    for (size_t l = 0; l < model_.layers.size(); ++l) {
      KerasLayerWeights kl;
      kl.layer = model_.layers[l].config.name;
      for (size_t w = 0; w < model_.layers[l].weights.size(); ++w) {
        const WeightSpec& spec = model_.layers[l].weights[w];
        data.emplace_back(size_t(spec.elements()));
        for (size_t k = 0; k < data.back().size(); ++k) data.back()[k] = keras_value(l, w, int64_t(k));
        kl.weight_names.push_back(spec.name);
        kl.shapes.push_back(spec.keras_shape);
        kl.data.push_back(data.back().data());
      }
      layers.push_back(kl);
    }
    HalotrainState state;
    state.step = 3;
    state.config_text = config_.text;
    state.model_hash = model_hash(model_);
    const int64_t n = int64_t(params_->trainable_count());
    for (int s = 0; s < 2; ++s) {
      data.emplace_back(size_t(n));
      for (size_t k = 0; k < data.back().size(); ++k) data.back()[k] = slot_value(s, k);
      state.slots.push_back({s == 0 ? "adam_m" : "adam_v", {n}, data.back().data()});
    }
    const std::string path = (dir_ / "weights.h5").string();
    write_checkpoint(path, layers, state);
    return path;
  }

  std::vector<float> arena_copy(const float* src, size_t count) {
    std::vector<float> host(count);
    backend_->to_host(host.data(), src, count * sizeof(float));
    return host;
  }

  // Every weight in the arena against keras_value; conv kernels are OIHW.
  void expect_weights() {
    int convs = 0;
    for (size_t l = 0; l < model_.layers.size(); ++l)
      for (size_t w = 0; w < model_.layers[l].weights.size(); ++w) {
        const ParamRef& r = *params_->find(int(l), model_.layers[l].weights[w].name);
        const std::vector<float> got = arena_copy(params_->value(r), r.count);
        const auto& s = r.keras_shape;
        if (r.weight != "kernel:0" || s.size() != 4) {
          for (size_t k = 0; k < r.count; ++k)
            ASSERT_EQ(got[k], keras_value(l, w, int64_t(k))) << r.layer_name << " " << r.weight;
          continue;
        }
        ++convs;
        const int64_t kh = s[0], kw = s[1], ci = s[2], co = s[3];
        size_t at = 0;  // walks the arena in OIHW order
        for (int64_t o = 0; o < co; ++o)
          for (int64_t i = 0; i < ci; ++i)
            for (int64_t y = 0; y < kh; ++y)
              for (int64_t x = 0; x < kw; ++x, ++at)
                ASSERT_EQ(got[at], keras_value(l, w, y * kw * ci * co + x * ci * co + i * co + o))
                    << r.layer_name << " o" << o << " i" << i << " y" << y << " x" << x;
      }
    EXPECT_EQ(convs, 5);
  }

  fs::path dir_;
  Config config_;
  ModelSpec model_;
  std::unique_ptr<ComputeBackend> backend_;
  std::unique_ptr<ParamStore> params_;
  uint64_t largest_bytes_ = 0;  // the largest weight (the Adam slots are larger still)
};

TEST_P(WeightsLoad, InitWeightsStagesAtMostTheLargestTensor) {
  config_.training.init_weights = write_file();
  params_->initialize(config_.seed);  // as the trainer does: then loading overwrites it
  Allocator& staging = params_->staging_allocator();
  staging.reset_peak();
  const uint64_t arena_before = backend_->allocator().in_use();

  load_init_weights(config_, model_, *params_);

  expect_weights();
  EXPECT_EQ(largest_bytes_, 3u * 3 * 5 * 24 * 4);
  EXPECT_GT(staging.peak(), 0u) << "staging is not counted";
  EXPECT_LE(staging.peak(), largest_bytes_);
  EXPECT_EQ(staging.in_use(), 0u);
  EXPECT_EQ(backend_->allocator().in_use(), arena_before);
  std::cout << "largest tensor " << largest_bytes_ << " bytes, staging peak " << staging.peak() << " bytes\n";
}

TEST_P(WeightsLoad, CheckpointStagesAtMostTheLargestTensor) {
  const std::string path = write_file();
  const size_t n = params_->trainable_count();
  OptimizerState optimizer;
  optimizer.m = Tensor(backend_->allocator(), 1, 1, 1, int(n), "adam m");
  optimizer.v = Tensor(backend_->allocator(), 1, 1, 1, int(n), "adam v");
  Allocator& staging = params_->staging_allocator();
  staging.reset_peak();

  const TrainingProgress p = load_checkpoint(path, config_, model_, *params_, optimizer, *backend_, false);

  EXPECT_EQ(p.step, 3);
  expect_weights();
  ASSERT_GT(n, largest_bytes_ / 4) << "the slots must be larger than any weight";
  const std::vector<float> m = arena_copy(optimizer.m.data(), n), v = arena_copy(optimizer.v.data(), n);
  for (size_t k = 0; k < n; ++k) {
    ASSERT_EQ(m[k], slot_value(0, k)) << k;
    ASSERT_EQ(v[k], slot_value(1, k)) << k;
  }
  EXPECT_GT(staging.peak(), 0u) << "staging is not counted";
  EXPECT_LE(staging.peak(), largest_bytes_);
  EXPECT_EQ(staging.in_use(), 0u);
  std::cout << "largest tensor " << largest_bytes_ << " bytes, staging peak " << staging.peak() << " bytes\n";
}

INSTANTIATE_TEST_SUITE_P(Arenas, WeightsLoad, ::testing::Values(Arena::Host, Arena::Device),
                         [](const auto& info) { return info.param == Arena::Host ? "Host" : "Device"; });

}  // namespace
