// Upsampling and shifts by image coordinates (kernels/geometry.hpp's ResampleGeom). The
// backward gathers: each input element sums the outputs whose taps name it, in a fixed
// order, so it needs no atomics and every run gives the same bits.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

__device__ float tap_weight(const ResampleTaps& t, int i) {
  return (t.i0 == i ? t.w0 : 0.f) + (t.i1 == i ? t.w1 : 0.f);
}

// The local outputs [lo, hi) whose taps may name local input i along one axis.
__device__ void candidates(Resample mode, const ResampleAxis& a, int i, int* lo, int* hi) {
  const int I = a.i0 + i;
  int first, last;  // image outputs
  if (mode == Resample::Shift) {
    first = last = I + a.shift;
  } else {
    // A superset of the outputs whose source lies within a pixel or two of I (tap_weight
    // picks the ones that read it): O * scale near I means O near I / scale.
    const float inv = 1.f / a.scale;
    const int reach = mode == Resample::Nearest ? 1 : 2;
    first = int(floorf(float(I - reach) * inv)) - 2;
    last = int(ceilf(float(I + reach + 1) * inv)) + 2;
    if (I == a.size - 1) last = a.o0 + a.out;  // nearest clamps every output past the end to the last input
  }
  *lo = max(first - a.o0, 0);
  *hi = min(last - a.o0 + 1, a.out);
}

__global__ void resample_forward_kernel(ResampleGeom g, size_t count, const float* x, float* y) {
  const int wo = g.cols.out, ho = g.rows.out, wi = g.cols.in, hi = g.rows.in;
  HT_GRID_STRIDE(e, count) {
    const int q = int(e % wo), r = int((e / wo) % ho);
    const int64_t p = e / (int64_t(wo) * ho);
    const float* xp = x + p * hi * wi;
    const ResampleTaps a = resample_taps(g.mode, g.rows, r), b = resample_taps(g.mode, g.cols, q);
    float v = 0.f;
    if (a.i0 >= 0 && b.i0 >= 0) v += a.w0 * b.w0 * xp[int64_t(a.i0) * wi + b.i0];
    if (a.i0 >= 0 && b.i1 >= 0) v += a.w0 * b.w1 * xp[int64_t(a.i0) * wi + b.i1];
    if (a.i1 >= 0 && b.i0 >= 0) v += a.w1 * b.w0 * xp[int64_t(a.i1) * wi + b.i0];
    if (a.i1 >= 0 && b.i1 >= 0) v += a.w1 * b.w1 * xp[int64_t(a.i1) * wi + b.i1];
    y[e] = v;
  }
}

__global__ void resample_backward_kernel(ResampleGeom g, size_t count, const float* dy, float* dx) {
  const int wo = g.cols.out, ho = g.rows.out, wi = g.cols.in, hi = g.rows.in;
  HT_GRID_STRIDE(e, count) {
    const int j = int(e % wi), i = int((e / wi) % hi);
    const int64_t p = e / (int64_t(wi) * hi);
    const float* yp = dy + p * ho * wo;
    int r0, r1, q0, q1;
    candidates(g.mode, g.rows, i, &r0, &r1);
    candidates(g.mode, g.cols, j, &q0, &q1);
    float v = 0.f;
    for (int r = r0; r < r1; ++r) {
      const float wr = tap_weight(resample_taps(g.mode, g.rows, r), i);
      if (wr == 0.f) continue;
      for (int q = q0; q < q1; ++q) {
        const float wc = tap_weight(resample_taps(g.mode, g.cols, q), j);
        if (wc != 0.f) v += wr * wc * yp[int64_t(r) * wo + q];
      }
    }
    dx[e] = v;
  }
}

}  // namespace

void launch_resample_forward(const ResampleGeom& g, const float* x, float* y) {
  resample_forward_kernel<<<grid_for(g.y_size()), kThreads>>>(g, g.y_size(), x, y);
  CUDA_CHECK_LAUNCH();
}

void launch_resample_backward(const ResampleGeom& g, const float* dy, float* dx) {
  resample_backward_kernel<<<grid_for(g.x_size()), kThreads>>>(g, g.x_size(), dy, dx);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ht::cuda
