// Per-channel and per-plane sums in double for batch norm, bias gradients and global
// pooling. The host (or launch_finish_sums) adds the per-block partials in order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

// Element e of channel s in an NCHW tensor: image e / hw, pixel e % hw.
__device__ inline int64_t channel_index(int c, int64_t hw, int s, int64_t e) {
  return (e / hw * c + s) * hw + e % hw;
}

struct ChannelSum {
  int c;
  int64_t hw;
  const float* x;
  __device__ void operator()(int s, int64_t e, double* acc) const { acc[0] += x[channel_index(c, hw, s, e)]; }
};

struct ChannelSqDev {
  int c;
  int64_t hw;
  const float* x;
  const double* mean;
  __device__ void operator()(int s, int64_t e, double* acc) const {
    const double d = double(x[channel_index(c, hw, s, e)]) - mean[s];
    acc[0] += d * d;
  }
};

struct BnBackwardSums {
  int c;
  int64_t hw;
  const float* dy;
  const float* x;
  const double* mean;
  const double* invstd;
  __device__ void operator()(int s, int64_t e, double* acc) const {
    const int64_t i = channel_index(c, hw, s, e);
    const double g = dy[i];
    acc[0] += g;
    acc[1] += g * (double(x[i]) - mean[s]) * invstd[s];
  }
};

struct PlaneSum {
  int64_t hw;
  const float* x;
  __device__ void operator()(int s, int64_t e, double* acc) const { acc[0] += x[int64_t(s) * hw + e]; }
};

// a * b per plane: the float product is exact in double.
struct PlaneDot {
  int64_t hw;
  const float* a;
  const float* b;
  __device__ void operator()(int s, int64_t e, double* acc) const {
    const int64_t i = int64_t(s) * hw + e;
    acc[0] += double(a[i]) * double(b[i]);
  }
};

// The per-plane batch-norm pieces (instance and group norm): mean[s] is plane s's.
struct PlaneSqDev {
  int64_t hw;
  const float* x;
  const double* mean;
  __device__ void operator()(int s, int64_t e, double* acc) const {
    const double d = double(x[int64_t(s) * hw + e]) - mean[s];
    acc[0] += d * d;
  }
};

struct PlaneBackwardSums {
  int64_t hw;
  const float* dy;
  const float* x;
  const double* mean;
  __device__ void operator()(int s, int64_t e, double* acc) const {
    const int64_t i = int64_t(s) * hw + e;
    const double g = dy[i];
    acc[0] += g;
    acc[1] += g * (double(x[i]) - mean[s]);
  }
};

// One block per plane: a strided scan, then a tree in shared memory.
__global__ void plane_max_kernel(int64_t hw, const float* x, double* out) {
  __shared__ float best[kThreads];
  const float* xp = x + int64_t(blockIdx.x) * hw;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < hw; i += blockDim.x) m = xp[i] > m ? xp[i] : m;
  best[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s && best[threadIdx.x + s] > best[threadIdx.x]) best[threadIdx.x] = best[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = double(best[0]);
}

__global__ void plane_count_equal_kernel(int64_t hw, const float* x, const double* maxes, double* out) {
  __shared__ double count[kThreads];
  const float* xp = x + int64_t(blockIdx.x) * hw;
  const double m = maxes[blockIdx.x];
  double k = 0;
  for (int64_t i = threadIdx.x; i < hw; i += blockDim.x) k += double(xp[i]) == m ? 1.0 : 0.0;
  count[threadIdx.x] = k;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) count[threadIdx.x] += count[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = count[0];
}

__global__ void global_max_backward_kernel(int64_t total, int64_t hw, const float* x, const double* maxes,
                                           const double* grads, float* dx) {
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / hw;
    dx[i] = double(x[i]) == maxes[p] ? float(grads[p]) : 0.f;
  }
}

__global__ void finish_sums_kernel(int segments, int blocks, const double* partials, float* out) {
  HT_GRID_STRIDE(s, segments) {
    double sum = 0.0;
    for (int b = 0; b < blocks; ++b) sum += partials[s * blocks + b];
    out[s] = float(sum);
  }
}

}  // namespace

int reduce_blocks(int64_t length) {
  // About 16 Ki elements per block, at most 256 blocks per segment: enough blocks to fill
  // the device on one huge channel, few partials for the host to add.
  const int64_t blocks = (length + (int64_t(1) << 14) - 1) >> 14;
  return int(std::min<int64_t>(std::max<int64_t>(blocks, 1), 256));
}

void launch_channel_sum(int n, int c, int64_t hw, const float* x, int blocks, double* partials) {
  segment_reduce<1>(c, int64_t(n) * hw, blocks, ChannelSum{c, hw, x}, partials);
}

void launch_channel_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* mean, int blocks,
                               double* partials) {
  segment_reduce<1>(c, int64_t(n) * hw, blocks, ChannelSqDev{c, hw, x, mean}, partials);
}

void launch_bn_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                             const double* invstd, int blocks, double* partials) {
  segment_reduce<2>(c, int64_t(n) * hw, blocks, BnBackwardSums{c, hw, dy, x, mean, invstd}, partials);
}

void launch_plane_max(int planes, int64_t hw, const float* x, double* out) {
  if (planes <= 0) return;
  plane_max_kernel<<<planes, kThreads>>>(hw, x, out);
  CUDA_CHECK_LAUNCH();
}

void launch_plane_count_equal(int planes, int64_t hw, const float* x, const double* maxes, double* out) {
  if (planes <= 0) return;
  plane_count_equal_kernel<<<planes, kThreads>>>(hw, x, maxes, out);
  CUDA_CHECK_LAUNCH();
}

void launch_global_max_backward(int planes, int64_t hw, const float* x, const double* maxes, const double* grads,
                                float* dx) {
  const int64_t total = int64_t(planes) * hw;
  if (total <= 0) return;
  global_max_backward_kernel<<<grid_for(size_t(total)), kThreads>>>(total, hw, x, maxes, grads, dx);
  CUDA_CHECK_LAUNCH();
}

void launch_plane_sum(int planes, int64_t hw, const float* x, int blocks, double* partials) {
  segment_reduce<1>(planes, hw, blocks, PlaneSum{hw, x}, partials);
}

void launch_plane_dot(int planes, int64_t hw, const float* a, const float* b, int blocks, double* partials) {
  segment_reduce<1>(planes, hw, blocks, PlaneDot{hw, a, b}, partials);
}

void launch_plane_sq_dev_sum(int planes, int64_t hw, const float* x, const double* mean, int blocks,
                             double* partials) {
  segment_reduce<1>(planes, hw, blocks, PlaneSqDev{hw, x, mean}, partials);
}

void launch_plane_backward_sums(int planes, int64_t hw, const float* dy, const float* x, const double* mean,
                                int blocks, double* partials) {
  segment_reduce<2>(planes, hw, blocks, PlaneBackwardSums{hw, dy, x, mean}, partials);
}

void launch_finish_sums(int segments, int blocks, const double* partials, float* out) {
  if (!segments) return;
  finish_sums_kernel<<<grid_for(size_t(segments)), kThreads>>>(segments, blocks, partials, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ht::cuda
