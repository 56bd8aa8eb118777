// Batch norm, ReLU and a max pool whose windows tile the plane, fused (the step schedule's
// pooled chain; the CPU's kernels/cpu/norm_relu_pool.hpp): the forward writes the pooled
// tensor and one argmax byte per window, the backward reads them and the chain's input.
// Each value is what the unfused CUDA kernels make: bn_forward_apply's (bn.cuh, shared with
// bn.cu), relu_forward's, max_pool_forward's rule (the first maximum in row-major order, NaN
// wins); the input gradient is bn_backward_apply's formula over the gradient that
// max_pool_backward and relu_backward pass down, so for the same sums it has their bits.
// The sums add the same terms in another order: equal within rounding.
#include "kernels/cuda/bn.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

__global__ void forward_kernel(NormPoolShape s, int ho, int wo, const float* x, const double* mean,
                               const double* invstd, const float* gamma, const float* beta, float* y,
                               uint8_t* argmax) {
  const int64_t total = int64_t(s.n) * s.c * ho * wo;
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / (int64_t(ho) * wo);
    const int ch = int(p % s.c), oh = int(i / wo % ho), ow = int(i % wo);
    const float* xp = x + p * int64_t(s.h) * s.w;
    float best = -INFINITY;
    int at = -1;
    for (int r = 0; r < s.kh; ++r)
      for (int q = 0; q < s.kw; ++q) {
        const float xv = xp[int64_t(oh * s.kh + r) * s.w + int64_t(ow) * s.kw + q];
        float v = bn_forward_value(xv, ch, mean, invstd, gamma, beta);
        v = v < 0.f ? 0.f : v;  // relu_forward: NaN passes
        if (at < 0 || v > best || isnan(v)) {
          best = v;
          at = r * s.kw + q;
        }
      }
    y[i] = best;
    argmax[i] = best <= 0.f ? kNoArgmax : uint8_t(at);
  }
}

// Per channel: the gradient's sum and its sum against xhat, over the windows' maxima (the
// only pixels the pool and the ReLU pass a gradient to).
struct BackwardSums {
  NormPoolShape s;
  int ho, wo;
  const float* dy;
  const uint8_t* argmax;
  const float* x;
  const double* mean;
  const double* invstd;
  __device__ void operator()(int ch, int64_t e, double* acc) const {
    const int64_t windows = int64_t(ho) * wo, image = e / windows, k = e % windows;
    const int64_t plane = image * s.c + ch, yi = plane * windows + k;
    const int a = argmax[yi];
    if (a == kNoArgmax) return;
    const int oh = int(k / wo), ow = int(k % wo);
    const int64_t xi = plane * int64_t(s.h) * s.w + int64_t(oh * s.kh + a / s.kw) * s.w + int64_t(ow) * s.kw + a % s.kw;
    const double d = double(0.f + dy[yi]);
    acc[0] += d;
    acc[1] += d * (double(x[xi]) - mean[ch]) * invstd[ch];
  }
};

__global__ void backward_apply_kernel(NormPoolShape s, int ho, int wo, const float* dy, const uint8_t* argmax,
                                      const float* x, const double* mean, const double* invstd, const float* gamma,
                                      const double* sum_dy, const double* sum_dy_xhat, double count, float* dx) {
  const int64_t total = int64_t(s.n) * s.c * s.h * s.w;
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / (int64_t(s.h) * s.w);
    const int ch = int(p % s.c), h = int(i / s.w % s.h), w = int(i % s.w);
    const int oh = h / s.kh, ow = w / s.kw;
    float grad = 0.f;  // what max_pool_backward, then relu_backward, write here
    if (oh < ho && ow < wo) {
      const int64_t yi = (p * ho + oh) * wo + ow;
      const int a = argmax[yi];
      if (a != kNoArgmax && a == (h - oh * s.kh) * s.kw + (w - ow * s.kw)) grad = 0.f + dy[yi];
    }
    dx[i] = bn_backward_value(grad, x[i], ch, mean, invstd, gamma, sum_dy, sum_dy_xhat, count);
  }
}

}  // namespace

void launch_bn_relu_max_pool_forward(const NormPoolShape& s, const float* x, const double* mean,
                                     const double* invstd, const float* gamma, const float* beta, float* y,
                                     uint8_t* argmax) {
  const size_t total = s.y_size();
  if (!total) return;
  forward_kernel<<<grid_for(total), kThreads>>>(s, s.ho(), s.wo(), x, mean, invstd, gamma, beta, y, argmax);
  CUDA_CHECK_LAUNCH();
}

void launch_bn_relu_max_pool_backward_sums(const NormPoolShape& s, const float* dy, const uint8_t* argmax,
                                           const float* x, const double* mean, const double* invstd, int blocks,
                                           double* partials) {
  segment_reduce<2>(s.c, int64_t(s.n) * s.ho() * s.wo(), blocks,
                    BackwardSums{s, s.ho(), s.wo(), dy, argmax, x, mean, invstd}, partials);
}

void launch_bn_relu_max_pool_backward_apply(const NormPoolShape& s, const float* dy, const uint8_t* argmax,
                                            const float* x, const double* mean, const double* invstd,
                                            const float* gamma, const double* sum_dy, const double* sum_dy_xhat,
                                            double count, float* dx) {
  const size_t total = s.x_size();
  if (!total) return;
  backward_apply_kernel<<<grid_for(total), kThreads>>>(s, s.ho(), s.wo(), dy, argmax, x, mean, invstd, gamma,
                                                       sum_dy, sum_dy_xhat, count, dx);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ht::cuda
