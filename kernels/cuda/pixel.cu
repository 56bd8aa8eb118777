// Kernels of the layers that work pixel by pixel beyond the activations (kernels/cpu/
// pixel.hpp is the reference): products, layer norm over the channels of each pixel, and
// the channels-last order of a flatten. Layer norm's statistics are double, in the
// reference's order; its weight gradients are per-block partials the host adds in order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;
constexpr int kChunk = 32;     // channels whose block sums one shared-memory round holds
constexpr int kTile = 32;      // the transpose's square tile ...
constexpr int kTileRows = 8;   // ... and the thread rows that walk down it

__global__ void multiply_kernel(size_t count, const float* a, const float* b, float* y) {
  HT_GRID_STRIDE(i, count) y[i] = a[i] * b[i];
}

__global__ void multiply_planes_kernel(int64_t total, int c, int64_t hw, const float* x, const float* v,
                                       PlaneFactor per, float* y) {
  HT_GRID_STRIDE(i, total) {
    const int64_t p = i / hw;
    y[i] = x[i] * v[per == PlaneFactor::PerPlane ? p : p % c];
  }
}

// As the reference: the factor is rounded to float, the product taken in float.
__global__ void scale_images_kernel(int64_t total, int64_t image, const float* x, const double* factors,
                                    float* y) {
  HT_GRID_STRIDE(i, total) y[i] = x[i] * float(factors[i / image]);
}

// Images of [rows, cols] -> [cols, rows] through a shared tile, so that reads and writes
// are both coalesced. Blocks stride over the tiles of all images.
__global__ void transpose_kernel(int64_t tiles, int64_t rows, int64_t cols, const float* in, float* out) {
  __shared__ float tile[kTile][kTile + 1];  // +1: no bank conflicts down a column
  const int64_t tile_rows = (rows + kTile - 1) / kTile, tile_cols = (cols + kTile - 1) / kTile;
  const int tx = int(threadIdx.x);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t image = t / (tile_rows * tile_cols);
    const int64_t r0 = t / tile_cols % tile_rows * kTile, c0 = t % tile_cols * kTile;
    const float* src = in + image * rows * cols;
    float* dst = out + image * rows * cols;
    for (int k = int(threadIdx.y); k < kTile; k += kTileRows)
      if (r0 + k < rows && c0 + tx < cols) tile[k][tx] = src[(r0 + k) * cols + c0 + tx];
    __syncthreads();
    for (int k = int(threadIdx.y); k < kTile; k += kTileRows)
      if (c0 + k < cols && r0 + tx < rows) dst[(c0 + k) * rows + r0 + tx] = tile[tx][k];
    __syncthreads();
  }
}

struct PixelStats {
  double mean, invstd;
};

// One pixel's statistics over its c channels (xp: channel 0; channels hw apart): biased
// variance, epsilon inside the square root, summed in channel order as the reference.
__device__ PixelStats pixel_stats(int c, int64_t hw, const float* xp, double eps) {
  double mean = 0.0, var = 0.0;
  for (int ch = 0; ch < c; ++ch) mean += double(xp[ch * hw]);
  mean /= c;
  for (int ch = 0; ch < c; ++ch) {
    const double d = double(xp[ch * hw]) - mean;
    var += d * d;
  }
  return {mean, 1.0 / sqrt(var / c + eps)};
}

// One thread per pixel q < pixels of [n, c, hw].
__global__ void layer_norm_forward_kernel(int64_t pixels, int c, int64_t hw, const float* x, double eps,
                                          const float* gamma, const float* beta, float* y) {
  HT_GRID_STRIDE(q, pixels) {
    const int64_t base = q / hw * c * hw + q % hw;
    const PixelStats s = pixel_stats(c, hw, x + base, eps);
    for (int ch = 0; ch < c; ++ch) {
      const double g = gamma ? double(gamma[ch]) : 1.0, b = beta ? double(beta[ch]) : 0.0;
      const int64_t i = base + ch * hw;
      y[i] = float((double(x[i]) - s.mean) * s.invstd * g + b);
    }
  }
}

// Lane 0 gets the sum of v over its warp: a fixed tree, the same bits every run.
__device__ double warp_sum(double v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// The block's sums for channels [ch0, ch0 + kChunk): its warps' sums added in warp order
// into partials [2][c][blocks] (dy * xhat, then dy).
__device__ void write_chunk(const double (*warp_sums)[kWarps][kChunk], int c, int ch0, double* partials) {
  __syncthreads();
  for (int t = int(threadIdx.x); t < 2 * kChunk; t += blockDim.x) {
    const int v = t / kChunk, j = t % kChunk;
    if (ch0 + j >= c) continue;
    double sum = 0.0;
    for (int w = 0; w < kWarps; ++w) sum += warp_sums[v][w][j];
    partials[(int64_t(v) * c + ch0 + j) * gridDim.x + blockIdx.x] = sum;
  }
  __syncthreads();
}

// dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, means over channels.
__device__ void layer_norm_dx(int c, int64_t hw, const float* xp, const float* dyp, const float* gamma,
                              PixelStats s, double sum_g, double sum_gx, float* dxp) {
  for (int ch = 0; ch < c; ++ch) {
    const int64_t i = ch * hw;
    const double gm = gamma ? double(gamma[ch]) : 1.0, xhat = (double(xp[i]) - s.mean) * s.invstd;
    dxp[i] = float(s.invstd * (double(dyp[i]) * gm - sum_g / c - xhat * sum_gx / c));
  }
}

// One thread per pixel, blocks of kThreads pixels (the last partly idle, adding zeros):
// the pixel's statistics and sums over its channels, per channel the block's share of
// dgamma and dbeta, then dx unless null. Every thread runs every channel: warp_sum and
// write_chunk need the whole block.
__global__ void layer_norm_backward_kernel(int64_t pixels, int c, int64_t hw, const float* x, const float* dy,
                                           double eps, const float* gamma, float* dx, double* partials) {
  __shared__ double warp_sums[2][kWarps][kChunk];
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool live = q < pixels;
  const int64_t base = live ? q / hw * c * hw + q % hw : 0;
  const PixelStats s = live ? pixel_stats(c, hw, x + base, eps) : PixelStats{0.0, 0.0};
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  double sum_g = 0.0, sum_gx = 0.0;
  for (int ch0 = 0; ch0 < c; ch0 += kChunk) {
    for (int j = 0; j < kChunk && ch0 + j < c; ++j) {
      const int64_t i = base + int64_t(ch0 + j) * hw;
      const double d = live ? double(dy[i]) : 0.0, xhat = live ? (double(x[i]) - s.mean) * s.invstd : 0.0;
      const double g = d * (gamma ? double(gamma[ch0 + j]) : 1.0);
      sum_g += g;
      sum_gx += g * xhat;
      const double dgamma = warp_sum(d * xhat), dbeta = warp_sum(d);
      if (lane == 0) {
        warp_sums[0][warp][j] = dgamma;
        warp_sums[1][warp][j] = dbeta;
      }
    }
    write_chunk(warp_sums, c, ch0, partials);
  }
  if (live && dx) layer_norm_dx(c, hw, x + base, dy + base, gamma, s, sum_g, sum_gx, dx + base);
}

}  // namespace

void launch_multiply(size_t count, const float* a, const float* b, float* y) {
  if (!count) return;
  multiply_kernel<<<grid_for(count), kThreads>>>(count, a, b, y);
  CUDA_CHECK_LAUNCH();
}

void launch_multiply_planes(int n, int c, int64_t hw, const float* x, const float* v, PlaneFactor per,
                            float* y) {
  const size_t total = size_t(n) * c * hw;
  if (!total) return;
  multiply_planes_kernel<<<grid_for(total), kThreads>>>(int64_t(total), c, hw, x, v, per, y);
  CUDA_CHECK_LAUNCH();
}

void launch_scale_images(int n, int64_t image, const float* x, const double* factors, float* y) {
  const size_t total = size_t(n) * image;
  if (!total) return;
  scale_images_kernel<<<grid_for(total), kThreads>>>(int64_t(total), image, x, factors, y);
  CUDA_CHECK_LAUNCH();
}

void launch_layer_norm_forward(int n, int c, int64_t hw, const float* x, double eps, const float* gamma,
                               const float* beta, float* y) {
  const size_t pixels = size_t(n) * hw;
  if (!pixels || c <= 0) return;
  layer_norm_forward_kernel<<<grid_for(pixels), kThreads>>>(int64_t(pixels), c, hw, x, eps, gamma, beta, y);
  CUDA_CHECK_LAUNCH();
}

int layer_norm_blocks(int n, int64_t hw) { return int((int64_t(n) * hw + kThreads - 1) / kThreads); }

void launch_layer_norm_backward(int n, int c, int64_t hw, const float* x, const float* dy, double eps,
                                const float* gamma, float* dx, double* partials) {
  const int blocks = layer_norm_blocks(n, hw);
  if (blocks <= 0 || c <= 0) return;
  layer_norm_backward_kernel<<<unsigned(blocks), kThreads>>>(int64_t(n) * hw, c, hw, x, dy, eps, gamma, dx,
                                                              partials);
  CUDA_CHECK_LAUNCH();
}

void launch_transpose(int n, int64_t rows, int64_t cols, const float* in, float* out) {
  const int64_t tiles = int64_t(n) * ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  if (tiles <= 0) return;
  const unsigned grid = unsigned(std::min<int64_t>(tiles, int64_t(1) << 20));
  transpose_kernel<<<grid, dim3(kTile, kTileRows)>>>(tiles, rows, cols, in, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ht::cuda
