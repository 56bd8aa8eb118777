// Batch norm's per-element formulas, in double rounded to float (the statistics arrive as
// doubles reduced over all shards, and double keeps x - mean exact for large means). Its
// kernels (bn.cu) and the fused chain's (norm_relu_pool.cu) both use these, so that a
// fused chain makes the bits of the kernels run apart.
#pragma once

#include <cuda_runtime.h>

namespace ht::cuda {

// y = (x - mean) * invstd * gamma + beta in channel ch; null gamma is 1, null beta 0.
__device__ inline float bn_forward_value(float x, int ch, const double* mean, const double* invstd,
                                         const float* gamma, const float* beta) {
  const double g = gamma ? double(gamma[ch]) : 1.0, b = beta ? double(beta[ch]) : 0.0;
  return float((double(x) - mean[ch]) * invstd[ch] * g + b);
}

// dx = gamma * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count), the training-
// mode gradient through the batch statistics; sums and count cover every shard.
__device__ inline float bn_backward_value(float dy, float x, int ch, const double* mean, const double* invstd,
                                          const float* gamma, const double* sum_dy, const double* sum_dy_xhat,
                                          double count) {
  const double g = gamma ? double(gamma[ch]) : 1.0;
  const double xhat = (double(x) - mean[ch]) * invstd[ch];
  return float(g * invstd[ch] * (double(dy) - sum_dy[ch] / count - xhat * sum_dy_xhat[ch] / count));
}

}  // namespace ht::cuda
