// The compute seam between layers and kernels. A Backend owns one device's allocator and
// runs every kernel a layer needs on memory from that allocator. It is chosen once, by
// make_backend(); layers never ask which one they have. Every value of ht::Backend exists
// in every build: asking for CUDA in a build without it fails at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/activation.hpp"
#include "kernels/dropout.hpp"
#include "kernels/geometry.hpp"
#include "kernels/loss_weights.hpp"
#include "orchestrator/config.hpp"
#include "orchestrator/conv_geometry.hpp"
#include "worker/runtime/tensor.hpp"

namespace ht {

// A convolution with fixed geometry; implementations cache primitives / algorithms.
class ConvKernel {
 public:
  virtual ~ConvKernel() = default;
  virtual void forward(const float* x, const float* w, const float* bias, float* y) = 0;
  // forward, and where this kernel can as it writes y, y's channel moments as this
  // backend's channel_moments makes them, to the bit (a batch norm reading y then need not
  // read it for them): returns whether it made them.
  virtual bool forward_with_moments(const float* x, const float* w, const float* bias, float* y,
                                    double* host_mean, double* host_m2) {
    forward(x, w, bias, y);
    return false;
  }
  // forward, and where this kernel can in the pass that writes y, a ReLU over y with
  // relu_forward's bits: returns whether it did (else the caller runs relu_forward).
  virtual bool forward_relu(const float* x, const float* w, const float* bias, float* y) {
    forward(x, w, bias, y);
    return false;
  }
  virtual void backward_data(const float* dy, const float* w, float* dx) = 0;             // dx =
  virtual void backward_weights(const float* x, const float* dy, float* dw, float* db) = 0;  // dw, db =
  // Both: backward_weights when dw is not null, then backward_data into dx_buffer() (null:
  // no dx), called in between so that the caller can free what only the weight gradient
  // reads first. A backend may carry work on dy from one pass to the other.
  virtual void backward(const float* x, const float* dy, const float* w, float* dw, float* db,
                        const std::function<float*()>& dx_buffer) {
    if (dw) backward_weights(x, dy, dw, db);
    if (float* dx = dx_buffer()) backward_data(dy, w, dx);
  }
};

// All pointers are device memory of this backend unless named host_*. Per-channel and
// per-image reductions come back to the host in double: they are reduced across shards
// by the caller, and double keeps the sharded sum equal to the unsharded one.
class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  virtual Backend kind() const = 0;
  virtual Allocator& allocator() = 0;
  // Host memory for activations offloaded between forward and backward
  // (parallel.activations: offload), counted apart from the device: pinned on CUDA.
  virtual Allocator& host_pool() = 0;
  // Copies between this device and host_pool() memory that run beside compute (CUDA: on a
  // transfer stream, ordered after the work queued before the call). `to_device_async`
  // targets device memory, `to_host_async` host memory. transfers_done_for_compute()
  // orders later compute after every transfer begun (the host does not wait);
  // wait_transfers() returns once they are done (before freeing a source). The CPU
  // backend copies at once.
  virtual void to_host_async(void* host_dst, const void* src, size_t bytes) { to_host(host_dst, src, bytes); }
  virtual void to_device_async(void* dst, const void* host_src, size_t bytes) { from_host(dst, host_src, bytes); }
  virtual void transfers_done_for_compute() {}
  virtual void wait_transfers() {}
  virtual std::string device_name() const = 0;
  // Free memory of the whole device as its driver reports it (CUDA: cudaMemGetInfo), for
  // watching what recycling gives back; nullopt where there is no such figure (CPU).
  virtual std::optional<uint64_t> device_free_bytes() const { return std::nullopt; }

  // Memory movement.
  virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void fill_zero(float* dst, size_t count) = 0;
  virtual void copy(float* dst, const float* src, size_t count) = 0;
  virtual void add(float* dst, const float* src, size_t count) = 0;  // dst += src
  virtual void add_scaled(float* dst, const float* src, float alpha, size_t count) = 0;  // dst += alpha*src
  virtual void scale(float* dst, float factor, size_t count) = 0;
  // Rectangles of all n*c planes of an NCHW tensor [n, c, h, w] <-> a packed buffer
  // [n, c, rows, cols]: halo packing. Unpacking writes (forward halos) or adds (their
  // gradients, backward).
  virtual void pack_rect(const float* src, int n, int c, int h, int w, int row0, int col0, int rows,
                         int cols, float* dst) = 0;
  enum class Unpack { Overwrite, Accumulate };
  virtual void unpack_rect(const float* src, int n, int c, int h, int w, int row0, int col0, int rows,
                           int cols, float* dst, Unpack mode) = 0;

  // Scratch for the convolutions this worker will run (orchestrator/conv_geometry.hpp),
  // taken now from the counting allocator so that the step's peak is the memory model's.
  // The CPU backend keeps oneDNN's reorder buffers and scratchpad there; CUDA sizes its
  // workspace on first use.
  virtual void reserve_conv_scratch(const std::vector<ShardConv>& convs) { (void)convs; }
  virtual std::unique_ptr<ConvKernel> make_conv(const ConvGeom& geom) = 0;
  virtual void max_pool_forward(const PoolGeom& g, const float* x, float* y) = 0;
  virtual void max_pool_backward(const PoolGeom& g, const float* x, const float* dy, float* dx) = 0;
  virtual void avg_pool_forward(const PoolGeom& g, const float* x, float* y) = 0;
  virtual void avg_pool_backward(const PoolGeom& g, const float* dy, float* dx) = 0;

  // Batch norm in pieces: statistics are summed over shards between the calls.
  // channel_moments: each channel's mean and sum of squared deviations about it on this
  // shard (kernels/cpu/norm.hpp), by default in two passes (channel_sum, then
  // channel_sq_dev_sum); the CPU backend makes them in one.
  virtual void channel_moments(int n, int c, int64_t hw, const float* x, double* host_mean, double* host_m2) {
    channel_sum(n, c, hw, x, host_mean);
    const double count = double(n) * double(hw);
    for (int i = 0; i < c; ++i) host_mean[i] = count > 0 ? host_mean[i] / count : 0.0;
    channel_sq_dev_sum(n, c, hw, x, host_mean, host_m2);
  }
  virtual void channel_sum(int n, int c, int64_t hw, const float* x, double* host_sum) = 0;
  virtual void channel_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* host_mean,
                                  double* host_out) = 0;
  virtual void bn_forward_apply(int n, int c, int64_t hw, const float* x, const double* host_mean,
                                const double* host_invstd, const float* gamma, const float* beta,
                                float* y) = 0;
  virtual void bn_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x,
                                const double* host_mean, const double* host_invstd,
                                double* host_sum_dy, double* host_sum_dy_xhat) = 0;
  virtual void bn_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x,
                                 const double* host_mean, const double* host_invstd,
                                 const float* gamma, const double* host_sum_dy,
                                 const double* host_sum_dy_xhat, double count, float* dx) = 0;

  // Batch norm and ReLU as one fused chain (orchestrator/step_schedule.hpp fused_chains):
  // y = relu(bn_forward_apply(x)); the backward's sums (overwritten) and input gradient
  // (dx may be dy) for the gradient relu_backward(y, dy) passes down. By default the
  // kernels of the layers apart, in place (the sums and the input gradient may write that
  // gradient over dy); the CPU backend has one-pass kernels with the same bits.
  virtual void bn_relu_forward(int n, int c, int64_t hw, const float* x, const double* host_mean,
                               const double* host_invstd, const float* gamma, const float* beta, float* y) {
    bn_forward_apply(n, c, hw, x, host_mean, host_invstd, gamma, beta, y);
    relu_forward(size_t(n) * c * size_t(hw), y, y);
  }
  virtual void bn_relu_backward_sums(int n, int c, int64_t hw, float* dy, const float* y, const float* x,
                                     const double* host_mean, const double* host_invstd, double* host_sum_dy,
                                     double* host_sum_dy_xhat) {
    relu_backward(size_t(n) * c * size_t(hw), y, dy, dy);
    bn_backward_sums(n, c, hw, dy, x, host_mean, host_invstd, host_sum_dy, host_sum_dy_xhat);
  }
  virtual void bn_relu_backward_apply(int n, int c, int64_t hw, float* dy, const float* y, const float* x,
                                      const double* host_mean, const double* host_invstd, const float* gamma,
                                      const double* host_sum_dy, const double* host_sum_dy_xhat, double count,
                                      float* dx) {
    relu_backward(size_t(n) * c * size_t(hw), y, dy, dy);  // again: a frozen batch norm takes no sums
    bn_backward_apply(n, c, hw, dy, x, host_mean, host_invstd, gamma, host_sum_dy, host_sum_dy_xhat, count, dx);
  }
  // Batch norm, ReLU and a tiling max pool as one fused chain (kernels/geometry.hpp
  // NormPoolShape; orchestrator/step_schedule.hpp fused_chains): the forward writes the
  // pooled tensor and one argmax byte per window; the backward's sums (overwritten) and its
  // input gradient read the pooled gradient and the argmax bytes. The CPU and CUDA backends
  // have them; by default they throw std::logic_error.
  virtual void bn_relu_max_pool_forward(const NormPoolShape& s, const float* x, const double* host_mean,
                                        const double* host_invstd, const float* gamma, const float* beta,
                                        float* y, uint8_t* argmax) {
    (void)s, (void)x, (void)host_mean, (void)host_invstd, (void)gamma, (void)beta, (void)y, (void)argmax;
    not_fused();
  }
  virtual void bn_relu_max_pool_backward_sums(const NormPoolShape& s, const float* dy, const uint8_t* argmax,
                                              const float* x, const double* host_mean,
                                              const double* host_invstd, double* host_sum_dy,
                                              double* host_sum_dy_xhat) {
    (void)s, (void)dy, (void)argmax, (void)x, (void)host_mean, (void)host_invstd, (void)host_sum_dy,
        (void)host_sum_dy_xhat;
    not_fused();
  }
  virtual void bn_relu_max_pool_backward_apply(const NormPoolShape& s, const float* dy, const uint8_t* argmax,
                                               const float* x, const double* host_mean,
                                               const double* host_invstd, const float* gamma,
                                               const double* host_sum_dy, const double* host_sum_dy_xhat,
                                               double count, float* dx) {
    (void)s, (void)dy, (void)argmax, (void)x, (void)host_mean, (void)host_invstd, (void)gamma, (void)host_sum_dy,
        (void)host_sum_dy_xhat, (void)count, (void)dx;
    not_fused();
  }

  // The same per (image, channel) plane p < n * c (instance and group norm; kernels/cpu/
  // norm.hpp): host arrays of n * c, sums overwritten.
  virtual void plane_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* host_mean,
                                double* host_out) = 0;
  virtual void plane_affine(int n, int c, int64_t hw, const float* x, const double* host_mean,
                            const double* host_scale, const double* host_shift, float* y) = 0;
  virtual void plane_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x,
                                   const double* host_mean, double* host_sum_dy, double* host_sum_dy_dev) = 0;
  virtual void plane_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x,
                                    const double* host_mean, const double* host_k, const double* host_a,
                                    const double* host_b, float* dx) = 0;

  virtual void relu_forward(size_t count, const float* x, float* y) = 0;
  virtual void relu_backward(size_t count, const float* y, const float* dy, float* dx) = 0;
  // The activations of kernels/activation.hpp: y = f(x); dx = dy * f'(x) from x and y.
  virtual void activation_forward(Activation f, ActivationArgs a, size_t count, const float* x, float* y) = 0;
  virtual void activation_backward(Activation f, ActivationArgs a, size_t count, const float* x, const float* y,
                                   const float* dy, float* dx) = 0;
  // Products (kernels/cpu/pixel.hpp): y = a * b; y = x times a factor per plane of [n, c,
  // hw] (PerPlane: a channel vector v[n * c]; PerChannel: v[c]); host_out[p] = the sum of
  // a * b over plane p < n * c (double), the gradient of such a factor; y = x times a
  // factor per image of `image` elements.
  virtual void multiply(size_t count, const float* a, const float* b, float* y) = 0;
  virtual void multiply_planes(int n, int c, int64_t hw, const float* x, const float* v, PlaneFactor per,
                               float* y) = 0;
  virtual void plane_dot(int n, int c, int64_t hw, const float* a, const float* b, double* host_out) = 0;
  virtual void scale_images(int n, int64_t image, const float* x, const double* host_factors, float* y) = 0;
  // Layer norm over the channels of each pixel; the backward makes dx (unless null) and
  // the per-channel sums of dy * xhat and dy (host doubles, overwritten).
  virtual void layer_norm_forward(int n, int c, int64_t hw, const float* x, double eps, const float* gamma,
                                  const float* beta, float* y) = 0;
  virtual void layer_norm_backward(int n, int c, int64_t hw, const float* x, const float* dy, double eps,
                                   const float* gamma, float* dx, double* host_dgamma, double* host_dbeta) = 0;
  // [n, c, hw] <-> [n, hw, c]: a flatten in Keras's (h, w, c) order, and its gradient.
  virtual void to_channels_last(int n, int c, int64_t hw, const float* x, float* y) = 0;
  virtual void from_channels_last(int n, int c, int64_t hw, const float* y, float* x) = 0;
  virtual void global_avg_sum(int n, int c, int64_t hw, const float* x, double* host_sums) = 0;
  virtual void global_avg_backward(int n, int c, int64_t hw, const float* dy, double scale,
                                   float* dx) = 0;
  // Upsampling and shifts by image coordinates (kernels/geometry.hpp); the backward
  // overwrites dx with the adjoint.
  virtual void resample_forward(const ResampleGeom& g, const float* x, float* y) = 0;
  virtual void resample_backward(const ResampleGeom& g, const float* dy, float* dx) = 0;
  // y[b, c, :] += bias[c] for [n, c, hw].
  virtual void add_channel_bias(int n, int c, int64_t hw, const float* bias, float* y) = 0;
  // Dropout's mask applied to [n, c, h, w] (kernels/dropout.hpp).
  virtual void dropout_apply(const DropoutMask& m, int n, int c, int h, int w, const float* x, float* y) = 0;
  // Global max pooling of this shard (kernels/cpu/elementwise.hpp): host arrays of n*c.
  virtual void global_max(int n, int c, int64_t hw, const float* x, double* host_maxes) = 0;
  virtual void global_max_count(int n, int c, int64_t hw, const float* x, const double* host_maxes,
                                double* host_counts) = 0;
  virtual void global_max_backward(int n, int c, int64_t hw, const float* x, const double* host_maxes,
                                   const double* host_grads, float* dx) = 0;
  virtual void dense_forward(int n, int in, int out, const float* x, const float* w,
                             const float* b, float* y) = 0;
  virtual void dense_backward(int n, int in, int out, const float* x, const float* w,
                              const float* dy, float* dx, float* dw, float* db) = 0;

  // Losses return the sum of per-element losses and write grad = d(sum)/dx * grad_scale,
  // each element weighted by w (kernels/loss_weights.hpp; LossWeights() weighs nothing).
  virtual double softmax_xent(int n, int k, const float* logits, const int32_t* host_labels,
                              double grad_scale, float* grad, const LossWeights& w) = 0;
  // Per pixel of [n, k, hw] logits; class maps [n, hw] of class ids (device floats).
  virtual double softmax_xent_pixels(int n, int k, int64_t hw, const float* logits, const float* classes,
                                     double grad_scale, float* grad, const LossWeights& w) = 0;
  virtual double sigmoid_bce(size_t count, const float* logits, const float* targets,
                             double grad_scale, float* grad, const LossWeights& w) = 0;
  virtual double mse(size_t count, const float* pred, const float* targets, double grad_scale,
                     float* grad) = 0;

  virtual void sgd_step(size_t n, float* w, const float* g, float* v, float lr, float momentum) = 0;
  // Hyper-parameters stay double, as PyTorch keeps them (float 1 - 0.999 is off by 1e-5).
  virtual void adam_step(size_t n, float* w, const float* g, float* m, float* v, double lr,
                         double beta1, double beta2, double eps, int64_t step) = 0;

  virtual void synchronize() {}

 private:
  [[noreturn]] static void not_fused() {
    throw std::logic_error("this backend has no fused batch norm + ReLU + max pool");
  }
};

struct BackendOptions {
  Backend kind = Backend::CPU;
  int device_index = 0;            // CUDA: which local GPU
  uint64_t memory_budget = 0;      // parallel.device_memory; 0: unlimited
  int threads = 0;                 // CPU: OpenMP threads for this worker (0: all)
  std::string name;                // for messages, e.g. "rank 1 cpu"
};

// The config asks for a backend this build or this machine cannot run ("built without
// CUDA", "no CUDA device (driver: ...); use backend: cpu"): a user error, exit 1.
class BackendUnavailable : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// Creates the backend; throws BackendUnavailable when the CUDA backend cannot run here.
std::unique_ptr<ComputeBackend> make_backend(const BackendOptions& options);

// Defined in worker/runtime/cuda when built with CUDA; the worker's stub throws otherwise.
std::unique_ptr<ComputeBackend> make_cuda_backend(const BackendOptions& options);

// How code outside a backend (the threads comm) moves its memory: `copy` goes between host
// memory and memory of any backend of one kind, in any direction and on any device of this
// process, and returns once the bytes have landed. The default is host memory.
inline void host_memory_copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
struct MemoryOps {
  void (*copy)(void* dst, const void* src, size_t bytes) = &host_memory_copy;
};
// worker/runtime/cuda: cudaMemcpy with cudaMemcpyDefault (unified addressing). The stub throws
// BackendUnavailable "built without CUDA".
MemoryOps cuda_memory_ops();
inline MemoryOps memory_ops(Backend kind) { return kind == Backend::CUDA ? cuda_memory_ops() : MemoryOps{}; }

}  // namespace ht
