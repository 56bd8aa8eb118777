// Max and average pooling with floor mode and asymmetric padding (a shard pads only where
// it meets the image border), which cuDNN's symmetric pooling cannot express. Backward
// passes gather per input element instead of scattering with atomics: deterministic.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

// Output windows [first, last] along one axis that contain input index i.
__device__ inline void covering(int i, int pad, int k, int stride, int out, int& first, int& last) {
  const int hi = i + pad;  // window o covers [o*stride, o*stride + k) in padded coordinates
  first = hi - k + 1 <= 0 ? 0 : (hi - k + 1 + stride - 1) / stride;
  last = min(hi / stride, out - 1);
}

// Index within the plane of the window's maximum: the first in scan order, NaN wins
// (PyTorch's rule), so forward and backward agree on ties.
__device__ inline int64_t window_argmax(const PoolGeom& g, const float* plane, int oh, int ow, float* value) {
  const int h0 = oh * g.stride_h - g.pad_top, w0 = ow * g.stride_w - g.pad_left;
  float best = -INFINITY;
  int64_t at = -1;
  for (int i = max(h0, 0); i < min(h0 + g.kh, g.hin); ++i)
    for (int j = max(w0, 0); j < min(w0 + g.kw, g.win); ++j) {
      const float v = plane[int64_t(i) * g.win + j];
      if (at < 0 || v > best || isnan(v)) {
        best = v;
        at = int64_t(i) * g.win + j;
      }
    }
  *value = best;
  return at;
}

__device__ inline int window_count(const PoolGeom& g, int oh, int ow) { return pool_divisor(g, oh, ow); }

__global__ void max_pool_forward_kernel(PoolGeom g, int ho, int wo, const float* x, float* y) {
  const int64_t total = int64_t(g.n) * g.c * ho * wo;
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / (int64_t(ho) * wo);
    const int oh = int(i / wo % ho), ow = int(i % wo);
    float v;
    window_argmax(g, x + p * g.hin * g.win, oh, ow, &v);
    y[i] = v;
  }
}

__global__ void max_pool_backward_kernel(PoolGeom g, int ho, int wo, const float* x, const float* dy,
                                         float* dx) {
  const int64_t total = int64_t(g.n) * g.c * g.hin * g.win;
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / (int64_t(g.hin) * g.win);
    const int ih = int(i / g.win % g.hin), iw = int(i % g.win);
    const int64_t here = int64_t(ih) * g.win + iw;
    int oh0, oh1, ow0, ow1;
    covering(ih, g.pad_top, g.kh, g.stride_h, ho, oh0, oh1);
    covering(iw, g.pad_left, g.kw, g.stride_w, wo, ow0, ow1);
    float acc = 0.f;
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        float v;
        if (window_argmax(g, x + p * g.hin * g.win, oh, ow, &v) == here) acc += dy[(p * ho + oh) * wo + ow];
      }
    dx[i] = acc;
  }
}

__global__ void avg_pool_forward_kernel(PoolGeom g, int ho, int wo, const float* x, float* y) {
  const int64_t total = int64_t(g.n) * g.c * ho * wo;
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / (int64_t(ho) * wo);
    const int oh = int(i / wo % ho), ow = int(i % wo);
    const int h0 = oh * g.stride_h - g.pad_top, w0 = ow * g.stride_w - g.pad_left;
    const float* plane = x + p * g.hin * g.win;
    float acc = 0.f;
    for (int a = max(h0, 0); a < min(h0 + g.kh, g.hin); ++a)
      for (int b = max(w0, 0); b < min(w0 + g.kw, g.win); ++b) acc += plane[int64_t(a) * g.win + b];
    const int count = window_count(g, oh, ow);
    y[i] = count > 0 ? acc / float(count) : 0.f;
  }
}

__global__ void avg_pool_backward_kernel(PoolGeom g, int ho, int wo, const float* dy, float* dx) {
  const int64_t total = int64_t(g.n) * g.c * g.hin * g.win;
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / (int64_t(g.hin) * g.win);
    const int ih = int(i / g.win % g.hin), iw = int(i % g.win);
    int oh0, oh1, ow0, ow1;
    covering(ih, g.pad_top, g.kh, g.stride_h, ho, oh0, oh1);
    covering(iw, g.pad_left, g.kw, g.stride_w, wo, ow0, ow1);
    float acc = 0.f;
    // Every window listed contains this in-image element, so its count is at least 1.
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) acc += dy[(p * ho + oh) * wo + ow] / float(window_count(g, oh, ow));
    dx[i] = acc;
  }
}

size_t out_count(const PoolGeom& g) { return size_t(g.n) * g.c * g.hout() * g.wout(); }
size_t in_count(const PoolGeom& g) { return size_t(g.n) * g.c * g.hin * g.win; }

}  // namespace

void launch_max_pool_forward(const PoolGeom& g, const float* x, float* y) {
  if (!out_count(g)) return;
  max_pool_forward_kernel<<<grid_for(out_count(g)), kThreads>>>(g, g.hout(), g.wout(), x, y);
  CUDA_CHECK_LAUNCH();
}

void launch_max_pool_backward(const PoolGeom& g, const float* x, const float* dy, float* dx) {
  if (!in_count(g)) return;
  max_pool_backward_kernel<<<grid_for(in_count(g)), kThreads>>>(g, g.hout(), g.wout(), x, dy, dx);
  CUDA_CHECK_LAUNCH();
}

void launch_avg_pool_forward(const PoolGeom& g, const float* x, float* y) {
  if (!out_count(g)) return;
  avg_pool_forward_kernel<<<grid_for(out_count(g)), kThreads>>>(g, g.hout(), g.wout(), x, y);
  CUDA_CHECK_LAUNCH();
}

void launch_avg_pool_backward(const PoolGeom& g, const float* dy, float* dx) {
  if (!in_count(g)) return;
  avg_pool_backward_kernel<<<grid_for(in_count(g)), kThreads>>>(g, g.hout(), g.wout(), dy, dx);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ht::cuda
