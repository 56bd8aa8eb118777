// Elementwise kernels, halo rectangles, bias and broadcast.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

__global__ void add_kernel(float* dst, const float* src, size_t count) {
  HT_GRID_STRIDE(i, count) dst[i] += src[i];
}

__global__ void add_scaled_kernel(float* dst, const float* src, float alpha, size_t count) {
  HT_GRID_STRIDE(i, count) dst[i] += alpha * src[i];
}

__global__ void scale_kernel(float* dst, float factor, size_t count) {
  HT_GRID_STRIDE(i, count) dst[i] *= factor;
}

__global__ void relu_forward_kernel(size_t count, const float* x, float* y) {
  // Not fmaxf, which would turn NaN into 0 and hide it: NaN passes, as in torch.
  HT_GRID_STRIDE(i, count) y[i] = x[i] < 0.f ? 0.f : x[i];
}

__global__ void relu_backward_kernel(size_t count, const float* y, const float* dy, float* dx) {
  HT_GRID_STRIDE(i, count) dx[i] = y[i] <= 0.f ? 0.f : dy[i];  // torch's threshold_backward
}

// kernels/activation.hpp in float, as the CPU reference; f is the same for every thread.
__global__ void activation_forward_kernel(Activation f, ActivationArgs a, size_t count, const float* x, float* y) {
  HT_GRID_STRIDE(i, count) y[i] = activation_value(f, a, x[i]);
}

// dx may alias dy: each element is read before it is written, by the same thread.
__global__ void activation_backward_kernel(Activation f, ActivationArgs a, size_t count, const float* x,
                                           const float* y, const float* dy, float* dx) {
  HT_GRID_STRIDE(i, count) dx[i] = activation_gradient(f, a, x[i], y[i], dy[i]);
}

__global__ void dropout_kernel(DropoutMask m, int c, int h, int w, size_t count, const float* x, float* y) {
  HT_GRID_STRIDE(i, count) {
    const int64_t col = int64_t(i % w), row = int64_t(i / w % h), plane = int64_t(i / (size_t(w) * h));
    y[i] = dropout_keeps(m, plane / c, int(plane % c), row, col) ? x[i] * m.scale : 0.f;
  }
}

__global__ void pack_rect_kernel(const float* src, int planes, int h, int w, int row0, int col0, int rows,
                                 int cols, float* dst) {
  const int64_t total = int64_t(planes) * rows * cols;
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / (int64_t(rows) * cols);
    const int r = int(i / cols % rows), c = int(i % cols);
    dst[i] = src[(p * h + row0 + r) * w + col0 + c];
  }
}

__global__ void unpack_rect_kernel(const float* src, int planes, int h, int w, int row0, int col0, int rows,
                                   int cols, float* dst, bool accumulate) {
  const int64_t total = int64_t(planes) * rows * cols;
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / (int64_t(rows) * cols);
    const int r = int(i / cols % rows), c = int(i % cols);
    float& out = dst[(p * h + row0 + r) * w + col0 + c];
    out = accumulate ? out + src[i] : src[i];
  }
}

__global__ void add_channel_bias_kernel(int64_t total, int c, int64_t hw, const float* bias, float* y) {
  HT_GRID_STRIDE(i, total) y[i] += bias[(i / hw) % c];
}

__global__ void broadcast_planes_kernel(int64_t total, int64_t hw, const float* dy, double scale, float* dx) {
  HT_GRID_STRIDE(i, total) dx[i] = float(double(dy[i / hw]) * scale);
}

}  // namespace

void launch_add(float* dst, const float* src, size_t count) {
  if (!count) return;
  add_kernel<<<grid_for(count), kThreads>>>(dst, src, count);
  CUDA_CHECK_LAUNCH();
}

void launch_add_scaled(float* dst, const float* src, float alpha, size_t count) {
  if (!count) return;
  add_scaled_kernel<<<grid_for(count), kThreads>>>(dst, src, alpha, count);
  CUDA_CHECK_LAUNCH();
}

void launch_scale(float* dst, float factor, size_t count) {
  if (!count) return;
  scale_kernel<<<grid_for(count), kThreads>>>(dst, factor, count);
  CUDA_CHECK_LAUNCH();
}

void launch_relu_forward(size_t count, const float* x, float* y) {
  if (!count) return;
  relu_forward_kernel<<<grid_for(count), kThreads>>>(count, x, y);
  CUDA_CHECK_LAUNCH();
}

void launch_relu_backward(size_t count, const float* y, const float* dy, float* dx) {
  if (!count) return;
  relu_backward_kernel<<<grid_for(count), kThreads>>>(count, y, dy, dx);
  CUDA_CHECK_LAUNCH();
}

void launch_dropout_apply(const DropoutMask& m, int n, int c, int h, int w, const float* x, float* y) {
  const size_t count = size_t(n) * c * h * w;
  if (!count) return;
  dropout_kernel<<<grid_for(count), kThreads>>>(m, c, h, w, count, x, y);
  CUDA_CHECK_LAUNCH();
}

void launch_activation_forward(Activation f, ActivationArgs a, size_t count, const float* x, float* y) {
  if (!count) return;
  activation_forward_kernel<<<grid_for(count), kThreads>>>(f, a, count, x, y);
  CUDA_CHECK_LAUNCH();
}

void launch_activation_backward(Activation f, ActivationArgs a, size_t count, const float* x, const float* y,
                                const float* dy, float* dx) {
  if (!count) return;
  activation_backward_kernel<<<grid_for(count), kThreads>>>(f, a, count, x, y, dy, dx);
  CUDA_CHECK_LAUNCH();
}

void launch_pack_rect(const float* src, int planes, int h, int w, int row0, int col0, int rows, int cols,
                      float* dst) {
  const size_t total = size_t(planes) * rows * cols;
  if (!total) return;
  pack_rect_kernel<<<grid_for(total), kThreads>>>(src, planes, h, w, row0, col0, rows, cols, dst);
  CUDA_CHECK_LAUNCH();
}

void launch_unpack_rect(const float* src, int planes, int h, int w, int row0, int col0, int rows, int cols,
                        float* dst, bool accumulate) {
  const size_t total = size_t(planes) * rows * cols;
  if (!total) return;
  unpack_rect_kernel<<<grid_for(total), kThreads>>>(src, planes, h, w, row0, col0, rows, cols, dst,
                                                    accumulate);
  CUDA_CHECK_LAUNCH();
}

void launch_add_channel_bias(int n, int c, int64_t hw, const float* bias, float* y) {
  const size_t total = size_t(n) * c * hw;
  if (!total) return;
  add_channel_bias_kernel<<<grid_for(total), kThreads>>>(int64_t(total), c, hw, bias, y);
  CUDA_CHECK_LAUNCH();
}

void launch_broadcast_planes(int planes, int64_t hw, const float* dy, double scale, float* dx) {
  const size_t total = size_t(planes) * hw;
  if (!total) return;
  broadcast_planes_kernel<<<grid_for(total), kThreads>>>(int64_t(total), hw, dy, scale, dx);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ht::cuda
