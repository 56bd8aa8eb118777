// The CPU backend: the numerical reference. Float kernels from kernels/cpu, oneDNN for
// convolution; memory from the counting host allocator.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/conv.hpp"
#include "kernels/cpu/dense.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/loss.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/norm_relu_pool.hpp"
#include "kernels/cpu/optim.hpp"
#include "kernels/cpu/pixel.hpp"
#include "kernels/cpu/pool.hpp"
#include "kernels/cpu/resample.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {
namespace {

class CpuConv : public ConvKernel {
 public:
  CpuConv(const ConvGeom& g, cpu::ScratchArena& scratch) : conv_(g, &scratch) {}
  void forward(const float* x, const float* w, const float* b, float* y) override {
    conv_.forward(x, w, b, y);
  }
  bool forward_relu(const float* x, const float* w, const float* b, float* y) override {
    conv_.forward_relu(x, w, b, y);
    return true;
  }
  bool forward_with_moments(const float* x, const float* w, const float* b, float* y, double* mean,
                            double* m2) override {
    return conv_.forward_with_moments(x, w, b, y, mean, m2);
  }
  void backward_data(const float* dy, const float* w, float* dx) override {
    conv_.backward_data(dy, w, dx);
  }
  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    conv_.backward_weights(x, dy, dw, db);
  }
  void backward(const float* x, const float* dy, const float* w, float* dw, float* db,
                const std::function<float*()>& dx_buffer) override {
    conv_.backward(x, dy, w, dw, db, dx_buffer);
  }

 private:
  cpu::DnnlConv2d conv_;
};

// oneDNN's scratch for every conv of one worker, from its counting allocator: reserved at
// the memory model's size before the first step, and grown (still counted) should a call
// ask for more; a slot's contents stay until it grows (cpu::ScratchArena).
class CountedScratch : public cpu::ScratchArena {
 public:
  explicit CountedScratch(Allocator& alloc) : alloc_(alloc) {}
  ~CountedScratch() override {
    for (Slot& s : slots_)
      if (s.ptr) alloc_.deallocate(s.ptr, s.bytes);
  }
  CountedScratch(const CountedScratch&) = delete;
  CountedScratch& operator=(const CountedScratch&) = delete;

  void reserve(const cpu::ConvScratch& need) {
    for (int i = 0; i < cpu::kScratchSlots; ++i) grow(slots_[i], need.slot[i]);
  }
  void* get(int slot, size_t bytes) override {
    Slot& s = slots_[slot];
    grow(s, bytes);
    alignas(64) static char empty[64];
    return s.ptr ? s.ptr : empty;  // a zero-byte request
  }

 private:
  struct Slot {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  void grow(Slot& s, size_t bytes) {
    if (bytes <= s.bytes) return;
    if (s.ptr) alloc_.deallocate(s.ptr, s.bytes);
    s.ptr = nullptr;
    s.ptr = alloc_.allocate(bytes, "oneDNN scratch");
    s.bytes = bytes;
  }
  Allocator& alloc_;
  Slot slots_[cpu::kScratchSlots];
};

class CpuBackend : public ComputeBackend {
 public:
  // Freed tensors are cached for the next step (BlockCache::Reuse): a step allocates the
  // same sizes every time. The thread count is parallel.threads, or for auto
  // cpu::worker_threads, capped by the CPUs this worker may use, so an MPI rank bound to one
  // core does not run a team of cores/ranks threads on it (the launcher warns when a set
  // value is more than it may use).
  explicit CpuBackend(const BackendOptions& o)
      : alloc_(o.name.empty() ? "cpu" : o.name, o.memory_budget, BlockCache::Reuse),
        host_pool_((o.name.empty() ? "cpu" : o.name) + " offload pool", 0, BlockCache::Reuse),
        scratch_(alloc_) {
    if (o.threads > 0) omp_set_num_threads(o.threads);
  }
  Backend kind() const override { return Backend::CPU; }
  Allocator& allocator() override { return alloc_; }
  Allocator& host_pool() override { return host_pool_; }
  std::string device_name() const override { return alloc_.device(); }

  void to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void from_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void fill_zero(float* dst, size_t count) override { std::memset(dst, 0, count * sizeof(float)); }
  void copy(float* dst, const float* src, size_t count) override {
    std::memcpy(dst, src, count * sizeof(float));
  }
  void add(float* dst, const float* src, size_t count) override {
    for (size_t i = 0; i < count; ++i) dst[i] += src[i];
  }
  void add_scaled(float* dst, const float* src, float alpha, size_t count) override {
    for (size_t i = 0; i < count; ++i) dst[i] += alpha * src[i];
  }
  void scale(float* dst, float factor, size_t count) override {
    for (size_t i = 0; i < count; ++i) dst[i] *= factor;
  }
  void pack_rect(const float* src, int n, int c, int h, int w, int row0, int col0, int rows, int cols,
                 float* dst) override {
    cpu::pack_rect(src, n, c, h, w, row0, col0, rows, cols, dst);
  }
  void unpack_rect(const float* src, int n, int c, int h, int w, int row0, int col0, int rows, int cols,
                   float* dst, Unpack mode) override {
    if (mode == Unpack::Accumulate)
      cpu::unpack_add_rect(src, n, c, h, w, row0, col0, rows, cols, dst);
    else
      cpu::unpack_rect(src, n, c, h, w, row0, col0, rows, cols, dst);
  }

  std::unique_ptr<ConvKernel> make_conv(const ConvGeom& g) override { return std::make_unique<CpuConv>(g, scratch_); }
  void reserve_conv_scratch(const std::vector<ShardConv>& convs) override {
    cpu::ConvScratch need;
    for (const ShardConv& c : convs) need.include(cpu::dnnl_conv_scratch(c.geom, c.passes, omp_get_max_threads()));
    scratch_.reserve(need);
  }
  void max_pool_forward(const PoolGeom& g, const float* x, float* y) override {
    cpu::max_pool_forward(g, x, y);
  }
  void max_pool_backward(const PoolGeom& g, const float* x, const float* dy, float* dx) override {
    cpu::max_pool_backward(g, x, dy, dx);
  }
  void avg_pool_forward(const PoolGeom& g, const float* x, float* y) override {
    cpu::avg_pool_forward(g, x, y);
  }
  void avg_pool_backward(const PoolGeom& g, const float* dy, float* dx) override {
    cpu::avg_pool_backward(g, dy, dx);
  }

  void channel_moments(int n, int c, int64_t hw, const float* x, double* mean, double* m2) override {
    cpu::channel_moments(n, c, hw, x, mean, m2);
  }
  void channel_sum(int n, int c, int64_t hw, const float* x, double* sum) override {
    std::fill(sum, sum + c, 0.0);
    cpu::channel_sum(n, c, hw, x, sum);
  }
  void channel_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* mean,
                          double* out) override {
    std::fill(out, out + c, 0.0);
    cpu::channel_sq_dev_sum(n, c, hw, x, mean, out);
  }
  void bn_forward_apply(int n, int c, int64_t hw, const float* x, const double* mean,
                        const double* invstd, const float* gamma, const float* beta, float* y) override {
    cpu::bn_forward_apply(n, c, hw, x, mean, invstd, gamma, beta, y);
  }
  void bn_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                        const double* invstd, double* sum_dy, double* sum_dy_xhat) override {
    std::fill(sum_dy, sum_dy + c, 0.0);
    std::fill(sum_dy_xhat, sum_dy_xhat + c, 0.0);
    cpu::bn_backward_sums(n, c, hw, dy, x, mean, invstd, sum_dy, sum_dy_xhat);
  }
  void bn_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                         const double* invstd, const float* gamma, const double* sum_dy,
                         const double* sum_dy_xhat, double count, float* dx) override {
    cpu::bn_backward_apply(n, c, hw, dy, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, dx);
  }

  void bn_relu_forward(int n, int c, int64_t hw, const float* x, const double* mean, const double* invstd,
                       const float* gamma, const float* beta, float* y) override {
    cpu::bn_relu_forward(n, c, hw, x, mean, invstd, gamma, beta, y);
  }
  void bn_relu_backward_sums(int n, int c, int64_t hw, float* dy, const float* y, const float* x,
                             const double* mean, const double* invstd, double* sum_dy, double* sum_dy_xhat) override {
    std::fill(sum_dy, sum_dy + c, 0.0);
    std::fill(sum_dy_xhat, sum_dy_xhat + c, 0.0);
    cpu::bn_relu_backward_sums(n, c, hw, dy, y, x, mean, invstd, sum_dy, sum_dy_xhat);
  }
  void bn_relu_backward_apply(int n, int c, int64_t hw, float* dy, const float* y, const float* x,
                              const double* mean, const double* invstd, const float* gamma, const double* sum_dy,
                              const double* sum_dy_xhat, double count, float* dx) override {
    cpu::bn_relu_backward_apply(n, c, hw, dy, y, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, dx);
  }
  void bn_relu_max_pool_forward(const NormPoolShape& s, const float* x, const double* mean, const double* invstd,
                                const float* gamma, const float* beta, float* y, uint8_t* argmax) override {
    cpu::bn_relu_max_pool_forward(s, x, mean, invstd, gamma, beta, y, argmax);
  }
  void bn_relu_max_pool_backward_sums(const NormPoolShape& s, const float* dy, const uint8_t* argmax,
                                      const float* x, const double* mean, const double* invstd, double* sum_dy,
                                      double* sum_dy_xhat) override {
    std::fill(sum_dy, sum_dy + s.c, 0.0);
    std::fill(sum_dy_xhat, sum_dy_xhat + s.c, 0.0);
    cpu::bn_relu_max_pool_backward_sums(s, dy, argmax, x, mean, invstd, sum_dy, sum_dy_xhat);
  }
  void bn_relu_max_pool_backward_apply(const NormPoolShape& s, const float* dy, const uint8_t* argmax,
                                       const float* x, const double* mean, const double* invstd,
                                       const float* gamma, const double* sum_dy, const double* sum_dy_xhat,
                                       double count, float* dx) override {
    cpu::bn_relu_max_pool_backward_apply(s, dy, argmax, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, dx);
  }

  void plane_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* mean, double* out) override {
    cpu::plane_sq_dev_sum(n, c, hw, x, mean, out);
  }
  void plane_affine(int n, int c, int64_t hw, const float* x, const double* mean, const double* scale,
                    const double* shift, float* y) override {
    cpu::plane_affine(n, c, hw, x, mean, scale, shift, y);
  }
  void plane_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                           double* sum_dy, double* sum_dy_dev) override {
    cpu::plane_backward_sums(n, c, hw, dy, x, mean, sum_dy, sum_dy_dev);
  }
  void plane_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                            const double* k, const double* a, const double* b, float* dx) override {
    cpu::plane_backward_apply(n, c, hw, dy, x, mean, k, a, b, dx);
  }
  void relu_forward(size_t count, const float* x, float* y) override { cpu::relu_forward(count, x, y); }
  void activation_forward(Activation f, ActivationArgs a, size_t count, const float* x, float* y) override {
    cpu::activation_forward(f, a, count, x, y);
  }
  void activation_backward(Activation f, ActivationArgs a, size_t count, const float* x, const float* y,
                           const float* dy, float* dx) override {
    cpu::activation_backward(f, a, count, x, y, dy, dx);
  }
  void multiply(size_t count, const float* a, const float* b, float* y) override { cpu::multiply(count, a, b, y); }
  void multiply_planes(int n, int c, int64_t hw, const float* x, const float* v, PlaneFactor per,
                       float* y) override {
    cpu::multiply_planes(n, c, hw, x, v, per, y);
  }
  void plane_dot(int n, int c, int64_t hw, const float* a, const float* b, double* out) override {
    cpu::plane_dot(n, c, hw, a, b, out);
  }
  void scale_images(int n, int64_t image, const float* x, const double* factors, float* y) override {
    cpu::scale_images(n, image, x, factors, y);
  }
  void layer_norm_forward(int n, int c, int64_t hw, const float* x, double eps, const float* gamma,
                          const float* beta, float* y) override {
    cpu::layer_norm_forward(n, c, hw, x, eps, gamma, beta, y);
  }
  void layer_norm_backward(int n, int c, int64_t hw, const float* x, const float* dy, double eps,
                           const float* gamma, float* dx, double* dgamma, double* dbeta) override {
    std::fill(dgamma, dgamma + c, 0.0);
    std::fill(dbeta, dbeta + c, 0.0);
    cpu::layer_norm_backward(n, c, hw, x, dy, eps, gamma, dx, dgamma, dbeta);
  }
  void to_channels_last(int n, int c, int64_t hw, const float* x, float* y) override {
    cpu::to_channels_last(n, c, hw, x, y);
  }
  void from_channels_last(int n, int c, int64_t hw, const float* y, float* x) override {
    cpu::from_channels_last(n, c, hw, y, x);
  }
  void relu_backward(size_t count, const float* y, const float* dy, float* dx) override {
    cpu::relu_backward(count, y, dy, dx);
  }
  void global_avg_sum(int n, int c, int64_t hw, const float* x, double* sums) override {
    std::fill(sums, sums + size_t(n) * c, 0.0);
    cpu::global_avg_sum(n, c, hw, x, sums);
  }
  void global_avg_backward(int n, int c, int64_t hw, const float* dy, double scale, float* dx) override {
    cpu::global_avg_backward(n, c, hw, dy, scale, dx);
  }
  void resample_forward(const ResampleGeom& g, const float* x, float* y) override { cpu::resample_forward(g, x, y); }
  void resample_backward(const ResampleGeom& g, const float* dy, float* dx) override {
    cpu::resample_backward(g, dy, dx);
  }
  void add_channel_bias(int n, int c, int64_t hw, const float* bias, float* y) override {
    for (int64_t p = 0; p < int64_t(n) * c; ++p) {
      const float b = bias[p % c];
      float* plane = y + p * hw;
      for (int64_t i = 0; i < hw; ++i) plane[i] += b;
    }
  }
  void dropout_apply(const DropoutMask& m, int n, int c, int h, int w, const float* x, float* y) override {
    cpu::dropout_apply(m, n, c, h, w, x, y);
  }
  void global_max(int n, int c, int64_t hw, const float* x, double* maxes) override {
    cpu::global_max(n, c, hw, x, maxes);
  }
  void global_max_count(int n, int c, int64_t hw, const float* x, const double* maxes, double* counts) override {
    cpu::global_max_count(n, c, hw, x, maxes, counts);
  }
  void global_max_backward(int n, int c, int64_t hw, const float* x, const double* maxes, const double* grads,
                           float* dx) override {
    cpu::global_max_backward(n, c, hw, x, maxes, grads, dx);
  }
  void dense_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                     float* y) override {
    cpu::dense_forward(n, in, out, x, w, b, y);
  }
  void dense_backward(int n, int in, int out, const float* x, const float* w, const float* dy,
                      float* dx, float* dw, float* db) override {
    cpu::dense_backward(n, in, out, x, w, dy, dx, dw, db);
  }

  double softmax_xent(int n, int k, const float* logits, const int32_t* labels, double scale, float* grad,
                      const LossWeights& w) override {
    return cpu::softmax_xent(n, k, logits, labels, scale, grad, w);
  }
  double softmax_xent_pixels(int n, int k, int64_t hw, const float* logits, const float* classes, double scale,
                             float* grad, const LossWeights& w) override {
    return cpu::softmax_xent_pixels(n, k, hw, logits, classes, scale, grad, w);
  }
  double sigmoid_bce(size_t count, const float* logits, const float* targets, double scale, float* grad,
                     const LossWeights& w) override {
    return cpu::sigmoid_bce(count, logits, targets, scale, grad, w);
  }
  double mse(size_t count, const float* pred, const float* targets, double scale, float* grad) override {
    return cpu::mse(count, pred, targets, scale, grad);
  }

  void sgd_step(size_t n, float* w, const float* g, float* v, float lr, float momentum) override {
    cpu::sgd_step(n, w, g, v, lr, momentum);
  }
  void adam_step(size_t n, float* w, const float* g, float* m, float* v, double lr, double beta1,
                 double beta2, double eps, int64_t step) override {
    cpu::adam_step(n, w, g, m, v, lr, beta1, beta2, eps, step);
  }

 private:
  Allocator alloc_;
  Allocator host_pool_;
  CountedScratch scratch_;  // after alloc_: freed before it
};

}  // namespace

std::unique_ptr<ComputeBackend> make_backend(const BackendOptions& options) {
  if (options.kind == Backend::CUDA) return make_cuda_backend(options);
  return std::make_unique<CpuBackend>(options);
}

}  // namespace ht
