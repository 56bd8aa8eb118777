// Dense layer y = x W + b, W (in, out) as Keras. The matrices are tiny (after global
// pooling), so one thread per output with a double accumulator beats a cuBLAS dependency
// and keeps every sum in a fixed order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

__global__ void dense_forward_kernel(int n, int in, int out, const float* x, const float* w, const float* b,
                                     float* y) {
  HT_GRID_STRIDE(i, int64_t(n) * out) {
    const int64_t row = i / out;
    const int o = int(i % out);
    double acc = b ? double(b[o]) : 0.0;
    for (int k = 0; k < in; ++k) acc += double(x[row * in + k]) * w[int64_t(k) * out + o];
    y[i] = float(acc);
  }
}

__global__ void dense_dx_kernel(int n, int in, int out, const float* w, const float* dy, float* dx) {
  HT_GRID_STRIDE(i, int64_t(n) * in) {
    const int64_t row = i / in;
    const int k = int(i % in);
    double acc = 0.0;
    for (int o = 0; o < out; ++o) acc += double(dy[row * out + o]) * w[int64_t(k) * out + o];
    dx[i] = float(acc);
  }
}

__global__ void dense_dw_kernel(int n, int in, int out, const float* x, const float* dy, float* dw) {
  HT_GRID_STRIDE(i, int64_t(in) * out) {
    const int k = int(i / out), o = int(i % out);
    double acc = 0.0;
    for (int r = 0; r < n; ++r) acc += double(x[int64_t(r) * in + k]) * dy[int64_t(r) * out + o];
    dw[i] = float(acc);
  }
}

__global__ void dense_db_kernel(int n, int out, const float* dy, float* db) {
  HT_GRID_STRIDE(o, out) {
    double acc = 0.0;
    for (int r = 0; r < n; ++r) acc += dy[int64_t(r) * out + o];
    db[o] = float(acc);
  }
}

}  // namespace

void launch_dense_forward(int n, int in, int out, const float* x, const float* w, const float* b, float* y) {
  const size_t total = size_t(n) * out;
  if (!total) return;
  dense_forward_kernel<<<grid_for(total), kThreads>>>(n, in, out, x, w, b, y);
  CUDA_CHECK_LAUNCH();
}

void launch_dense_backward(int n, int in, int out, const float* x, const float* w, const float* dy, float* dx,
                           float* dw, float* db) {
  if (dx && n && in) {
    dense_dx_kernel<<<grid_for(size_t(n) * in), kThreads>>>(n, in, out, w, dy, dx);
    CUDA_CHECK_LAUNCH();
  }
  if (dw && in && out) {
    dense_dw_kernel<<<grid_for(size_t(in) * out), kThreads>>>(n, in, out, x, dy, dw);
    CUDA_CHECK_LAUNCH();
  }
  if (db && out) {
    dense_db_kernel<<<grid_for(size_t(out)), kThreads>>>(n, out, dy, db);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace ht::cuda
