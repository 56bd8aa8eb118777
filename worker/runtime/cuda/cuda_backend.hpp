// The CUDA ComputeBackend: cuDNN (legacy API, cuDNN 8 and 9) for convolutions, .cu
// kernels for everything else. All work goes to the device's legacy default stream, so
// calls are ordered among themselves and with the NCCL comm's blocking stream, and every
// method that returns host data is synchronous. Deterministic: no atomics, fixed
// reduction shapes, deterministic cuDNN algorithms where one exists.
#pragma once

#include <cuda_runtime.h>

#include <initializer_list>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device_memory.hpp"
#include "worker/runtime/backend.hpp"
#include "worker/runtime/cuda/cuda_allocator.hpp"

namespace ht::cuda {

// cuDNN state lives in cudnn_conv.cpp only, so this header and the backend's other
// sources build without cuDNN headers.
class CudaBackend;
struct CudnnContext;
CudnnContext* create_cudnn_context();
void destroy_cudnn_context(CudnnContext* ctx);
std::unique_ptr<ConvKernel> make_cudnn_conv(CudaBackend& backend, const ConvGeom& geom);


class CudaBackend final : public ComputeBackend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;

  Backend kind() const override { return Backend::CUDA; }
  Allocator& allocator() override { return alloc_; }
  Allocator& host_pool() override { return host_pool_; }
  std::string device_name() const override { return alloc_.device(); }
  std::optional<uint64_t> device_free_bytes() const override;
  int device() const { return device_; }

  void to_host(void* host_dst, const void* src, size_t bytes) override;
  void to_host_async(void* host_dst, const void* src, size_t bytes) override;
  void to_device_async(void* dst, const void* host_src, size_t bytes) override;
  void transfers_done_for_compute() override;
  void wait_transfers() override;
  void from_host(void* dst, const void* host_src, size_t bytes) override;
  void fill_zero(float* dst, size_t count) override;
  void copy(float* dst, const float* src, size_t count) override;
  void add(float* dst, const float* src, size_t count) override;
  void add_scaled(float* dst, const float* src, float alpha, size_t count) override;
  void scale(float* dst, float factor, size_t count) override;
  void pack_rect(const float* src, int n, int c, int h, int w, int row0, int col0, int rows, int cols,
                 float* dst) override;
  void unpack_rect(const float* src, int n, int c, int h, int w, int row0, int col0, int rows, int cols,
                   float* dst, Unpack mode) override;

  std::unique_ptr<ConvKernel> make_conv(const ConvGeom& geom) override;
  void max_pool_forward(const PoolGeom& g, const float* x, float* y) override;
  void max_pool_backward(const PoolGeom& g, const float* x, const float* dy, float* dx) override;
  void avg_pool_forward(const PoolGeom& g, const float* x, float* y) override;
  void avg_pool_backward(const PoolGeom& g, const float* dy, float* dx) override;

  void channel_sum(int n, int c, int64_t hw, const float* x, double* host_sum) override;
  void channel_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* host_mean,
                          double* host_out) override;
  void bn_forward_apply(int n, int c, int64_t hw, const float* x, const double* host_mean,
                        const double* host_invstd, const float* gamma, const float* beta, float* y) override;
  void bn_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x, const double* host_mean,
                        const double* host_invstd, double* host_sum_dy, double* host_sum_dy_xhat) override;
  void bn_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x, const double* host_mean,
                         const double* host_invstd, const float* gamma, const double* host_sum_dy,
                         const double* host_sum_dy_xhat, double count, float* dx) override;
  void bn_relu_max_pool_forward(const NormPoolShape& s, const float* x, const double* host_mean,
                                const double* host_invstd, const float* gamma, const float* beta, float* y,
                                uint8_t* argmax) override;
  void bn_relu_max_pool_backward_sums(const NormPoolShape& s, const float* dy, const uint8_t* argmax, const float* x,
                                      const double* host_mean, const double* host_invstd, double* host_sum_dy,
                                      double* host_sum_dy_xhat) override;
  void bn_relu_max_pool_backward_apply(const NormPoolShape& s, const float* dy, const uint8_t* argmax,
                                       const float* x, const double* host_mean, const double* host_invstd,
                                       const float* gamma, const double* host_sum_dy,
                                       const double* host_sum_dy_xhat, double count, float* dx) override;
  void plane_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* host_mean,
                        double* host_out) override;
  void plane_affine(int n, int c, int64_t hw, const float* x, const double* host_mean, const double* host_scale,
                    const double* host_shift, float* y) override;
  void plane_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x, const double* host_mean,
                           double* host_sum_dy, double* host_sum_dy_dev) override;
  void plane_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x, const double* host_mean,
                            const double* host_k, const double* host_a, const double* host_b, float* dx) override;

  void relu_forward(size_t count, const float* x, float* y) override;
  void relu_backward(size_t count, const float* y, const float* dy, float* dx) override;
  void activation_forward(Activation f, ActivationArgs a, size_t count, const float* x, float* y) override;
  void activation_backward(Activation f, ActivationArgs a, size_t count, const float* x, const float* y,
                           const float* dy, float* dx) override;
  void multiply(size_t count, const float* a, const float* b, float* y) override;
  void multiply_planes(int n, int c, int64_t hw, const float* x, const float* v, PlaneFactor per,
                       float* y) override;
  void plane_dot(int n, int c, int64_t hw, const float* a, const float* b, double* host_out) override;
  void scale_images(int n, int64_t image, const float* x, const double* host_factors, float* y) override;
  void layer_norm_forward(int n, int c, int64_t hw, const float* x, double eps, const float* gamma,
                          const float* beta, float* y) override;
  void layer_norm_backward(int n, int c, int64_t hw, const float* x, const float* dy, double eps,
                           const float* gamma, float* dx, double* host_dgamma, double* host_dbeta) override;
  void to_channels_last(int n, int c, int64_t hw, const float* x, float* y) override;
  void from_channels_last(int n, int c, int64_t hw, const float* y, float* x) override;
  void global_avg_sum(int n, int c, int64_t hw, const float* x, double* host_sums) override;
  void global_avg_backward(int n, int c, int64_t hw, const float* dy, double scale, float* dx) override;
  void resample_forward(const ResampleGeom& g, const float* x, float* y) override;
  void resample_backward(const ResampleGeom& g, const float* dy, float* dx) override;
  void add_channel_bias(int n, int c, int64_t hw, const float* bias, float* y) override;
  void dropout_apply(const DropoutMask& m, int n, int c, int h, int w, const float* x, float* y) override;
  void global_max(int n, int c, int64_t hw, const float* x, double* host_maxes) override;
  void global_max_count(int n, int c, int64_t hw, const float* x, const double* host_maxes,
                        double* host_counts) override;
  void global_max_backward(int n, int c, int64_t hw, const float* x, const double* host_maxes,
                           const double* host_grads, float* dx) override;
  void dense_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                     float* y) override;
  void dense_backward(int n, int in, int out, const float* x, const float* w, const float* dy, float* dx,
                      float* dw, float* db) override;

  double softmax_xent(int n, int k, const float* logits, const int32_t* host_labels, double grad_scale,
                      float* grad, const LossWeights& w) override;
  double softmax_xent_pixels(int n, int k, int64_t hw, const float* logits, const float* classes,
                             double grad_scale, float* grad, const LossWeights& w) override;
  double sigmoid_bce(size_t count, const float* logits, const float* targets, double grad_scale,
                     float* grad, const LossWeights& w) override;
  double mse(size_t count, const float* pred, const float* targets, double grad_scale, float* grad) override;

  void sgd_step(size_t n, float* w, const float* g, float* v, float lr, float momentum) override;
  void adam_step(size_t n, float* w, const float* g, float* m, float* v, double lr, double beta1,
                 double beta2, double eps, int64_t step) override;

  void synchronize() override;

  // For the conv kernels: the shared workspace and padded-copy buffers, the cuDNN context
  // (created on first use) and a device that is current on the calling thread.
  void bind() const;
  DeviceScratch& conv_workspace() { return workspace_; }
  DeviceScratch& conv_padded() { return padded_; }
  DeviceScratch& partials() { return partials_; }
  CudnnContext& cudnn();

 private:
  // Copies per-channel host doubles into the parameter scratch; returns device pointers.
  std::vector<const double*> upload(std::initializer_list<std::pair<const double*, size_t>> arrays);
  // Adds segments x blocks partials (copied to the host) in order into host_out[segments].
  void finish_on_host(const double* partials, int segments, int blocks, double* host_out);
  // A loss over `count` elements: `launch(blocks, partials)` writes per-block sums, summed
  // here in a fixed order.
  double loss_sum(size_t count, const std::function<void(int blocks, double* partials)>& launch);

  int device_;
  CudaAllocator alloc_;
  PinnedHostAllocator host_pool_;
  // Offload copies: a non-blocking stream beside the default (compute) stream, and the
  // events that order one after the other. Created on first use.
  void start_transfer(void* dst, const void* src, size_t bytes);
  cudaStream_t transfer_stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr, transfer_done_ = nullptr;
  DeviceScratch params_, partials_, labels_, workspace_, padded_;
  std::unique_ptr<CudnnContext, void (*)(CudnnContext*)> cudnn_{nullptr, destroy_cudnn_context};
};

}  // namespace ht::cuda
