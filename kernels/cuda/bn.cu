// The elementwise halves of batch norm, and of its per-plane form (instance and group
// norm), in double per element: the statistics arrive as doubles reduced over all shards,
// and double keeps x - mean exact for large means.
#include "kernels/cuda/bn.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

__global__ void bn_forward_apply_kernel(int64_t total, int c, int64_t hw, const float* x, const double* mean,
                                        const double* invstd, const float* gamma, const float* beta,
                                        float* y) {
  HT_GRID_STRIDE(i, total) y[i] = bn_forward_value(x[i], int(i / hw % c), mean, invstd, gamma, beta);
}

__global__ void bn_backward_apply_kernel(int64_t total, int c, int64_t hw, const float* dy, const float* x,
                                         const double* mean, const double* invstd, const float* gamma,
                                         const double* sum_dy, const double* sum_dy_xhat, double count,
                                         float* dx) {
  HT_GRID_STRIDE(i, total) {
    dx[i] = bn_backward_value(dy[i], x[i], int(i / hw % c), mean, invstd, gamma, sum_dy, sum_dy_xhat, count);
  }
}

// The per-plane halves (instance and group norm): the coefficients are plane p's.
__global__ void plane_affine_kernel(int64_t total, int64_t hw, const float* x, const double* mean,
                                    const double* scale, const double* shift, float* y) {
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / hw;
    y[i] = float((double(x[i]) - mean[p]) * scale[p] + shift[p]);
  }
}

__global__ void plane_backward_apply_kernel(int64_t total, int64_t hw, const float* dy, const float* x,
                                            const double* mean, const double* k, const double* a,
                                            const double* b, float* dx) {
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / hw;
    dx[i] = float(k[p] * double(dy[i]) + a[p] * (double(x[i]) - mean[p]) + b[p]);
  }
}

}  // namespace

void launch_bn_forward_apply(int n, int c, int64_t hw, const float* x, const double* mean,
                             const double* invstd, const float* gamma, const float* beta, float* y) {
  const size_t total = size_t(n) * c * hw;
  if (!total) return;
  bn_forward_apply_kernel<<<grid_for(total), kThreads>>>(int64_t(total), c, hw, x, mean, invstd, gamma, beta,
                                                         y);
  CUDA_CHECK_LAUNCH();
}

void launch_bn_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                              const double* invstd, const float* gamma, const double* sum_dy,
                              const double* sum_dy_xhat, double count, float* dx) {
  const size_t total = size_t(n) * c * hw;
  if (!total) return;
  bn_backward_apply_kernel<<<grid_for(total), kThreads>>>(int64_t(total), c, hw, dy, x, mean, invstd, gamma,
                                                          sum_dy, sum_dy_xhat, count, dx);
  CUDA_CHECK_LAUNCH();
}

void launch_plane_affine(int planes, int64_t hw, const float* x, const double* mean, const double* scale,
                         const double* shift, float* y) {
  const size_t total = size_t(planes) * hw;
  if (!total) return;
  plane_affine_kernel<<<grid_for(total), kThreads>>>(int64_t(total), hw, x, mean, scale, shift, y);
  CUDA_CHECK_LAUNCH();
}

void launch_plane_backward_apply(int planes, int64_t hw, const float* dy, const float* x, const double* mean,
                                 const double* k, const double* a, const double* b, float* dx) {
  const size_t total = size_t(planes) * hw;
  if (!total) return;
  plane_backward_apply_kernel<<<grid_for(total), kThreads>>>(int64_t(total), hw, dy, x, mean, k, a, b, dx);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ht::cuda
