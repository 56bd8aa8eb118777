// Optimizer updates with PyTorch's semantics (torch.optim.SGD without dampening or
// nesterov, torch.optim.Adam without weight decay or amsgrad), in float like PyTorch.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

// v = momentum * v + g; w -= lr * v. Without a velocity buffer: w -= lr * g.
__global__ void sgd_kernel(size_t n, float* w, const float* g, float* v, float lr, float momentum) {
  HT_GRID_STRIDE(i, n) {
    float step = g[i];
    if (v) {
      v[i] = momentum * v[i] + g[i];
      step = v[i];
    }
    w[i] -= lr * step;
  }
}

// m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// w -= step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps), step_size = lr / (1 - beta1^t),
// in the operation order of the CPU reference (torch 1.13's single-tensor Adam).
__global__ void adam_kernel(size_t n, float* w, const float* g, float* m, float* v, AdamScalars s) {
  const float beta1 = s.beta1, beta2 = s.beta2, eps = s.eps, step_size = s.step_size;
  const float bias_correction2_sqrt = s.bias_correction2_sqrt;
  HT_GRID_STRIDE(i, n) {
    const float grad = g[i];
    m[i] = m[i] * beta1 + s.one_minus_beta1 * grad;
    v[i] = v[i] * beta2 + s.one_minus_beta2 * grad * grad;
    const float denom = sqrtf(v[i]) / bias_correction2_sqrt + eps;
    w[i] += -step_size * (m[i] / denom);
  }
}

}  // namespace

void launch_sgd_step(size_t n, float* w, const float* g, float* v, float lr, float momentum) {
  if (!n) return;
  sgd_kernel<<<grid_for(n), kThreads>>>(n, w, g, v, lr, momentum);
  CUDA_CHECK_LAUNCH();
}

void launch_adam_step(size_t n, float* w, const float* g, float* m, float* v, const AdamScalars& s) {
  if (!n) return;
  adam_kernel<<<grid_for(n), kThreads>>>(n, w, g, m, v, s);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ht::cuda
