// Launch geometry and the deterministic segmented reduction shared by the .cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/check.hpp"

namespace ht::cuda {

constexpr int kThreads = 256;

// Grid-stride loops cover any count; the cap keeps the grid legal on every architecture.
inline unsigned grid_for(size_t count) {
  size_t blocks = (count + kThreads - 1) / kThreads;
  return unsigned(std::min<size_t>(std::max<size_t>(blocks, 1), size_t(1) << 20));
}

#define HT_GRID_STRIDE(i, count)                                                       \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < int64_t(count); \
       i += int64_t(gridDim.x) * blockDim.x)

// Block b of segment s sums elements [b*chunk, (b+1)*chunk) of that segment; `f(s, e, acc)`
// adds element e's NV values into acc (and may write a gradient as a side effect). The
// tree below has a fixed shape, so every run adds in the same order.
template <int NV, class F>
__global__ void segment_reduce_kernel(int64_t length, int blocks, F f, double* partials) {
  __shared__ double shared[NV][kThreads];
  const int seg = blockIdx.x / blocks, b = blockIdx.x % blocks;
  const int64_t chunk = (length + blocks - 1) / blocks;
  const int64_t begin = b * chunk, end = min(length, begin + chunk);
  double acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = 0.0;
  for (int64_t e = begin + threadIdx.x; e < end; e += blockDim.x) f(seg, e, acc);
  for (int v = 0; v < NV; ++v) shared[v][threadIdx.x] = acc[v];
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half)
      for (int v = 0; v < NV; ++v) shared[v][threadIdx.x] += shared[v][threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int segments = gridDim.x / blocks;
    for (int v = 0; v < NV; ++v) partials[(int64_t(v) * segments + seg) * blocks + b] = shared[v][0];
  }
}

// partials layout: [NV][segments][blocks].
template <int NV, class F>
void segment_reduce(int segments, int64_t length, int blocks, F f, double* partials) {
  if (segments == 0) return;
  segment_reduce_kernel<NV><<<unsigned(segments) * blocks, kThreads>>>(length, blocks, f, partials);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ht::cuda
