// CudaBackend: argument checks, host <-> device staging of the double per-channel values,
// and dispatch to the .cu launchers. Convolutions live in cudnn_conv.cpp, the normalisations in
// cuda_backend_norm.cpp.
#include "worker/runtime/cuda/cuda_backend.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

// Also makes `device` current on this thread before anything is allocated on it.
std::string device_label(const BackendOptions& o, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::string label = "cuda:" + std::to_string(device) + " (" + prop.name + ")";
  return o.name.empty() ? label : o.name + " " + label;
}

void check_pool(const PoolGeom& g) {
  if (g.n <= 0 || g.c <= 0 || g.hin <= 0 || g.win <= 0 || g.kh <= 0 || g.kw <= 0 || g.stride_h <= 0 ||
      g.stride_w <= 0 || g.pad_top < 0 || g.pad_bottom < 0 || g.pad_left < 0 || g.pad_right < 0 ||
      g.hout() <= 0 || g.wout() <= 0)
    throw std::invalid_argument(
        "cuda pool: invalid geometry (sizes, window, stride > 0, padding >= 0, "
        "window within the padded input)");
}

void check_rect(int h, int w, int row0, int col0, int rows, int cols) {
  if (row0 < 0 || col0 < 0 || rows < 0 || cols < 0 || row0 + rows > h || col0 + cols > w)
    throw std::out_of_range("cuda rect rows [" + std::to_string(row0) + "," + std::to_string(row0 + rows) +
                            ") cols [" + std::to_string(col0) + "," + std::to_string(col0 + cols) +
                            ") outside " + std::to_string(h) + "x" + std::to_string(w));
}

}  // namespace

CudaBackend::CudaBackend(const BackendOptions& o)
    : device_(o.device_index),
      alloc_(device_label(o, o.device_index), o.device_index, o.memory_budget),
      host_pool_(device_label(o, o.device_index) + " offload pool"),
      params_(alloc_, "backend parameters"),
      partials_(alloc_, "reduction partials"),
      labels_(alloc_, "loss labels"),
      workspace_(alloc_, "cuDNN workspace"),
      padded_(alloc_, "conv padded copy") {}

CudaBackend::~CudaBackend() {
  // Finish queued work before buffers go back; errors cannot be reported from here.
  if (cudaSetDevice(device_) == cudaSuccess) {
    (void)cudaDeviceSynchronize();
    if (transfer_done_) (void)cudaEventDestroy(transfer_done_);
    if (compute_done_) (void)cudaEventDestroy(compute_done_);
    if (transfer_stream_) (void)cudaStreamDestroy(transfer_stream_);
  }
  (void)cudaGetLastError();
}

void CudaBackend::bind() const { CUDA_CHECK(cudaSetDevice(device_)); }

std::optional<uint64_t> CudaBackend::device_free_bytes() const {
  bind();
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return uint64_t(free);
}

CudnnContext& CudaBackend::cudnn() {
  bind();
  if (!cudnn_) cudnn_.reset(create_cudnn_context());
  return *cudnn_;
}

void CudaBackend::synchronize() {
  bind();
  CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaBackend::to_host(void* host_dst, const void* src, size_t bytes) {
  if (!bytes) return;
  bind();
  CUDA_CHECK(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
}

void CudaBackend::from_host(void* dst, const void* host_src, size_t bytes) {
  if (!bytes) return;
  bind();
  CUDA_CHECK(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
}

void CudaBackend::start_transfer(void* dst, const void* src, size_t bytes) {
  bind();
  if (!transfer_stream_) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&transfer_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&transfer_done_, cudaEventDisableTiming));
  }
  // The copy starts once the compute queued so far (which wrote its source) is done; the
  // transfer stream runs copies in order, so transfer_done_ covers every one begun.
  CUDA_CHECK(cudaEventRecord(compute_done_, 0));
  CUDA_CHECK(cudaStreamWaitEvent(transfer_stream_, compute_done_, 0));
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, transfer_stream_));
  CUDA_CHECK(cudaEventRecord(transfer_done_, transfer_stream_));
}

void CudaBackend::to_host_async(void* host_dst, const void* src, size_t bytes) {
  if (bytes) start_transfer(host_dst, src, bytes);
}

void CudaBackend::to_device_async(void* dst, const void* host_src, size_t bytes) {
  if (bytes) start_transfer(dst, host_src, bytes);
}

void CudaBackend::transfers_done_for_compute() {
  if (!transfer_done_) return;
  bind();
  CUDA_CHECK(cudaStreamWaitEvent(0, transfer_done_, 0));
}

void CudaBackend::wait_transfers() {
  if (!transfer_done_) return;
  bind();
  CUDA_CHECK(cudaEventSynchronize(transfer_done_));
}

void CudaBackend::fill_zero(float* dst, size_t count) {
  if (!count) return;
  bind();
  CUDA_CHECK(cudaMemsetAsync(dst, 0, count * sizeof(float), 0));
}

void CudaBackend::copy(float* dst, const float* src, size_t count) {
  if (!count || dst == src) return;
  bind();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDeviceToDevice, 0));
}

void CudaBackend::add(float* dst, const float* src, size_t count) {
  bind();
  launch_add(dst, src, count);
}

void CudaBackend::add_scaled(float* dst, const float* src, float alpha, size_t count) {
  bind();
  launch_add_scaled(dst, src, alpha, count);
}

void CudaBackend::scale(float* dst, float factor, size_t count) {
  bind();
  launch_scale(dst, factor, count);
}

void CudaBackend::pack_rect(const float* src, int n, int c, int h, int w, int row0, int col0, int rows,
                            int cols, float* dst) {
  check_rect(h, w, row0, col0, rows, cols);
  bind();
  launch_pack_rect(src, n * c, h, w, row0, col0, rows, cols, dst);
}

void CudaBackend::unpack_rect(const float* src, int n, int c, int h, int w, int row0, int col0, int rows,
                              int cols, float* dst, Unpack mode) {
  check_rect(h, w, row0, col0, rows, cols);
  bind();
  launch_unpack_rect(src, n * c, h, w, row0, col0, rows, cols, dst, mode == Unpack::Accumulate);
}

std::unique_ptr<ConvKernel> CudaBackend::make_conv(const ConvGeom& geom) {
  bind();
  return make_cudnn_conv(*this, geom);
}

void CudaBackend::max_pool_forward(const PoolGeom& g, const float* x, float* y) {
  check_pool(g);
  bind();
  launch_max_pool_forward(g, x, y);
}

void CudaBackend::max_pool_backward(const PoolGeom& g, const float* x, const float* dy, float* dx) {
  check_pool(g);
  bind();
  launch_max_pool_backward(g, x, dy, dx);
}

void CudaBackend::avg_pool_forward(const PoolGeom& g, const float* x, float* y) {
  check_pool(g);
  bind();
  launch_avg_pool_forward(g, x, y);
}

void CudaBackend::avg_pool_backward(const PoolGeom& g, const float* dy, float* dx) {
  check_pool(g);
  bind();
  launch_avg_pool_backward(g, dy, dx);
}

std::vector<const double*> CudaBackend::upload(
    std::initializer_list<std::pair<const double*, size_t>> arrays) {
  size_t total = 0;
  for (const auto& a : arrays) total += a.second;
  double* dev = params_.get_as<double>(total);
  std::vector<double> host;
  host.reserve(total);
  std::vector<const double*> out;
  for (const auto& a : arrays) {
    out.push_back(dev + host.size());
    host.insert(host.end(), a.first, a.first + a.second);
  }
  // Synchronous: a kernel still reading the previous parameters finishes first.
  if (total) CUDA_CHECK(cudaMemcpy(dev, host.data(), total * sizeof(double), cudaMemcpyHostToDevice));
  return out;
}

void CudaBackend::finish_on_host(const double* partials, int segments, int blocks, double* host_out) {
  std::vector<double> host(size_t(segments) * blocks);
  if (!host.empty())
    CUDA_CHECK(cudaMemcpy(host.data(), partials, host.size() * sizeof(double), cudaMemcpyDeviceToHost));
  for (int s = 0; s < segments; ++s) {
    double sum = 0.0;
    for (int b = 0; b < blocks; ++b) sum += host[size_t(s) * blocks + b];
    host_out[s] = sum;
  }
}

void CudaBackend::relu_forward(size_t count, const float* x, float* y) {
  bind();
  launch_relu_forward(count, x, y);
}

void CudaBackend::relu_backward(size_t count, const float* y, const float* dy, float* dx) {
  bind();
  launch_relu_backward(count, y, dy, dx);
}

void CudaBackend::activation_forward(Activation f, ActivationArgs a, size_t count, const float* x, float* y) {
  bind();
  launch_activation_forward(f, a, count, x, y);
}

void CudaBackend::activation_backward(Activation f, ActivationArgs a, size_t count, const float* x, const float* y,
                                      const float* dy, float* dx) {
  bind();
  launch_activation_backward(f, a, count, x, y, dy, dx);
}

void CudaBackend::multiply(size_t count, const float* a, const float* b, float* y) {
  bind();
  launch_multiply(count, a, b, y);
}

void CudaBackend::multiply_planes(int n, int c, int64_t hw, const float* x, const float* v, PlaneFactor per,
                                  float* y) {
  bind();
  launch_multiply_planes(n, c, hw, x, v, per, y);
}

void CudaBackend::plane_dot(int n, int c, int64_t hw, const float* a, const float* b, double* host_out) {
  bind();
  const int planes = n * c, blocks = reduce_blocks(hw);
  double* part = partials_.get_as<double>(size_t(planes) * blocks);
  launch_plane_dot(planes, hw, a, b, blocks, part);
  finish_on_host(part, planes, blocks, host_out);
}

void CudaBackend::scale_images(int n, int64_t image, const float* x, const double* host_factors, float* y) {
  bind();
  const auto dev = upload({{host_factors, size_t(n)}});
  launch_scale_images(n, image, x, dev[0], y);
}

void CudaBackend::layer_norm_forward(int n, int c, int64_t hw, const float* x, double eps, const float* gamma,
                                     const float* beta, float* y) {
  bind();
  launch_layer_norm_forward(n, c, hw, x, eps, gamma, beta, y);
}

void CudaBackend::layer_norm_backward(int n, int c, int64_t hw, const float* x, const float* dy, double eps,
                                      const float* gamma, float* dx, double* host_dgamma, double* host_dbeta) {
  bind();
  const int blocks = layer_norm_blocks(n, hw);
  double* part = partials_.get_as<double>(size_t(2) * c * blocks);
  launch_layer_norm_backward(n, c, hw, x, dy, eps, gamma, dx, part);
  finish_on_host(part, c, blocks, host_dgamma);
  finish_on_host(part + size_t(c) * blocks, c, blocks, host_dbeta);
}

void CudaBackend::to_channels_last(int n, int c, int64_t hw, const float* x, float* y) {
  bind();
  launch_transpose(n, c, hw, x, y);
}

void CudaBackend::from_channels_last(int n, int c, int64_t hw, const float* y, float* x) {
  bind();
  launch_transpose(n, hw, c, y, x);
}

void CudaBackend::global_avg_sum(int n, int c, int64_t hw, const float* x, double* host_sums) {
  bind();
  const int planes = n * c, blocks = reduce_blocks(hw);
  double* part = partials_.get_as<double>(size_t(planes) * blocks);
  launch_plane_sum(planes, hw, x, blocks, part);
  finish_on_host(part, planes, blocks, host_sums);
}

void CudaBackend::resample_forward(const ResampleGeom& g, const float* x, float* y) {
  bind();
  launch_resample_forward(g, x, y);
}

void CudaBackend::resample_backward(const ResampleGeom& g, const float* dy, float* dx) {
  bind();
  launch_resample_backward(g, dy, dx);
}

void CudaBackend::add_channel_bias(int n, int c, int64_t hw, const float* bias, float* y) {
  bind();
  launch_add_channel_bias(n, c, hw, bias, y);
}

void CudaBackend::dropout_apply(const DropoutMask& m, int n, int c, int h, int w, const float* x, float* y) {
  bind();
  launch_dropout_apply(m, n, c, h, w, x, y);
}

void CudaBackend::global_max(int n, int c, int64_t hw, const float* x, double* host_maxes) {
  bind();
  const int planes = n * c;
  double* part = partials_.get_as<double>(size_t(planes));
  launch_plane_max(planes, hw, x, part);
  finish_on_host(part, planes, 1, host_maxes);
}

void CudaBackend::global_max_count(int n, int c, int64_t hw, const float* x, const double* host_maxes,
                                   double* host_counts) {
  bind();
  const int planes = n * c;
  const auto dev = upload({{host_maxes, size_t(planes)}});
  double* part = partials_.get_as<double>(size_t(planes));
  launch_plane_count_equal(planes, hw, x, dev[0], part);
  finish_on_host(part, planes, 1, host_counts);
}

void CudaBackend::global_max_backward(int n, int c, int64_t hw, const float* x, const double* host_maxes,
                                      const double* host_grads, float* dx) {
  bind();
  const int planes = n * c;
  const auto dev = upload({{host_maxes, size_t(planes)}, {host_grads, size_t(planes)}});
  launch_global_max_backward(planes, hw, x, dev[0], dev[1], dx);
}

void CudaBackend::global_avg_backward(int n, int c, int64_t hw, const float* dy, double scale, float* dx) {
  bind();
  launch_broadcast_planes(n * c, hw, dy, scale, dx);
}

void CudaBackend::dense_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                                float* y) {
  bind();
  launch_dense_forward(n, in, out, x, w, b, y);
}

void CudaBackend::dense_backward(int n, int in, int out, const float* x, const float* w, const float* dy,
                                 float* dx, float* dw, float* db) {
  bind();
  launch_dense_backward(n, in, out, x, w, dy, dx, dw, db);
}

double CudaBackend::softmax_xent(int n, int k, const float* logits, const int32_t* host_labels,
                                 double grad_scale, float* grad, const LossWeights& w) {
  for (int i = 0; i < n; ++i)
    if (host_labels[i] < 0 || host_labels[i] >= k)
      throw std::out_of_range("softmax_xent: label " + std::to_string(host_labels[i]) + " of sample " +
                              std::to_string(i) + " outside [0, " + std::to_string(k) + ")");
  if (n <= 0) return 0.0;
  bind();
  int32_t* labels = labels_.get_as<int32_t>(size_t(n));
  CUDA_CHECK(cudaMemcpy(labels, host_labels, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice));
  double* rows = partials_.get_as<double>(size_t(n));
  launch_softmax_xent(n, k, logits, labels, grad_scale, grad, rows, w);
  double total = 0.0;
  finish_on_host(rows, 1, n, &total);
  return total;
}

double CudaBackend::loss_sum(size_t count, const std::function<void(int, double*)>& launch) {
  if (!count) return 0.0;
  bind();
  const int blocks = loss_blocks(count);
  double* part = partials_.get_as<double>(size_t(blocks));
  launch(blocks, part);
  double total = 0.0;
  finish_on_host(part, 1, blocks, &total);
  return total;
}

double CudaBackend::softmax_xent_pixels(int n, int k, int64_t hw, const float* logits, const float* classes,
                                        double grad_scale, float* grad, const LossWeights& w) {
  const size_t count = size_t(n) * size_t(hw);
  return loss_sum(count, [&](int blocks, double* part) {
    launch_softmax_xent_pixels(n, k, hw, logits, classes, grad_scale, grad, blocks, part, w);
  });
}

double CudaBackend::sigmoid_bce(size_t count, const float* logits, const float* targets, double grad_scale,
                                float* grad, const LossWeights& w) {
  return loss_sum(count, [&](int blocks, double* part) {
    launch_sigmoid_bce(count, logits, targets, grad_scale, grad, blocks, part, w);
  });
}

double CudaBackend::mse(size_t count, const float* pred, const float* targets, double grad_scale,
                        float* grad) {
  return loss_sum(count, [&](int blocks, double* part) { launch_mse(count, pred, targets, grad_scale, grad, blocks, part); });
}

void CudaBackend::sgd_step(size_t n, float* w, const float* g, float* v, float lr, float momentum) {
  // As the CPU reference: without momentum the velocity is neither needed nor touched.
  if (momentum != 0.0f && !v) throw std::invalid_argument("sgd_step: momentum needs a velocity buffer");
  bind();
  launch_sgd_step(n, w, g, momentum == 0.0f ? nullptr : v, lr, momentum);
}

void CudaBackend::adam_step(size_t n, float* w, const float* g, float* m, float* v, double lr, double beta1,
                            double beta2, double eps, int64_t step) {
  if (step < 1) throw std::invalid_argument("adam_step: step must be >= 1");
  bind();
  // Bias corrections in double (Python floats in torch), then cast for the float math.
  const double bc1 = 1.0 - std::pow(beta1, double(step));
  const double bc2 = 1.0 - std::pow(beta2, double(step));
  const AdamScalars s{float(beta1),    float(1.0 - beta1),  float(beta2),          float(1.0 - beta2),
                      float(eps),      float(lr / bc1),     float(std::sqrt(bc2))};
  launch_adam_step(n, w, g, m, v, s);
}

}  // namespace ht::cuda

namespace ht {

std::unique_ptr<ComputeBackend> make_cuda_backend(const BackendOptions& options) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    const std::string why = status != cudaSuccess ? cudaGetErrorString(status) : "no device visible";
    throw BackendUnavailable("no CUDA device (driver: " + why + "); use backend: cpu");
  }
  if (options.device_index < 0 || options.device_index >= count)
    throw BackendUnavailable("CUDA device " + std::to_string(options.device_index) + " requested, " +
                             std::to_string(count) + " visible (CUDA_VISIBLE_DEVICES, devices_per_node)");
  return std::make_unique<cuda::CudaBackend>(options);
}

namespace {
void cuda_copy_any(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  // Unified addressing tells host from device memory and which device. cudaMemcpy may
  // return before a host-to-device copy has landed; the receiver (another thread, a host
  // buffer about to be freed) needs it done, so wait for the calling thread's device.
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  CUDA_CHECK(cudaDeviceSynchronize());
}
}  // namespace

MemoryOps cuda_memory_ops() {
  MemoryOps ops;
  ops.copy = &cuda_copy_any;
  return ops;
}

}  // namespace ht
