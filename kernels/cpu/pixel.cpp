#include "kernels/cpu/pixel.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ht::cpu {

namespace {
constexpr size_t kParallelMin = 1 << 15;
constexpr int64_t kBlock = 1024;   // elements summed in T before going to double
constexpr int64_t kPixels = 2048;  // pixels a layer-norm task holds statistics for

// Sum of f(i) over [0, n): blocks of kBlock in T, the blocks in double.
template <class T, class F>
double block_sum(int64_t n, F f) {
  double acc = 0;
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t i1 = std::min(i0 + kBlock, n);
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = i0; i < i1; ++i) s += f(i);
    acc += double(s);
  }
  return acc;
}
}  // namespace

template <class T>
void multiply(size_t n, const T* a, const T* b, T* y) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (size_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

template <class T>
void multiply_planes(int n, int c, int64_t hw, const T* x, const T* v, PlaneFactor per, T* y) {
  const int64_t planes = int64_t(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes * hw) > kParallelMin)
  for (int64_t p = 0; p < planes; ++p) {
    const T f = v[per == PlaneFactor::PerPlane ? p : p % c];
    const T* xp = x + p * hw;
    T* yp = y + p * hw;
#pragma omp simd
    for (int64_t i = 0; i < hw; ++i) yp[i] = xp[i] * f;
  }
}

template <class T>
void plane_dot(int n, int c, int64_t hw, const T* a, const T* b, double* out) {
  const int64_t planes = int64_t(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes * hw) > kParallelMin)
  for (int64_t p = 0; p < planes; ++p) {
    const T* ap = a + p * hw;
    const T* bp = b + p * hw;
    out[p] = block_sum<T>(hw, [&](int64_t i) { return ap[i] * bp[i]; });
  }
}

template <class T>
void scale_images(int n, int64_t image, const T* x, const double* factors, T* y) {
  for (int i = 0; i < n; ++i) {
    const T f = T(factors[i]);
    const T* xi = x + int64_t(i) * image;
    T* yi = y + int64_t(i) * image;
#pragma omp parallel for simd schedule(static) if (size_t(image) > kParallelMin)
    for (int64_t e = 0; e < image; ++e) yi[e] = xi[e] * f;
  }
}

namespace {

// The mean and 1/std over the channels of pixels [p0, p0 + m) of one image.
template <class T>
void pixel_stats(int c, int64_t hw, const T* xi, int64_t p0, int64_t m, double eps, double* mean, double* invstd) {
  std::fill(mean, mean + m, 0.0);
  std::fill(invstd, invstd + m, 0.0);
  for (int ch = 0; ch < c; ++ch) {
    const T* row = xi + ch * hw + p0;
    for (int64_t j = 0; j < m; ++j) mean[j] += double(row[j]);
  }
  for (int64_t j = 0; j < m; ++j) mean[j] /= c;
  for (int ch = 0; ch < c; ++ch) {
    const T* row = xi + ch * hw + p0;
    for (int64_t j = 0; j < m; ++j) {
      const double d = double(row[j]) - mean[j];
      invstd[j] += d * d;
    }
  }
  for (int64_t j = 0; j < m; ++j) invstd[j] = 1.0 / std::sqrt(invstd[j] / c + eps);
}

}  // namespace

template <class T>
void layer_norm_forward(int n, int c, int64_t hw, const T* x, double eps, const T* gamma, const T* beta, T* y) {
  const int64_t chunks = (hw + kPixels - 1) / kPixels, tasks = int64_t(n) * chunks;
#pragma omp parallel for schedule(static) if (size_t(n) * c * hw > kParallelMin)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t i = t / chunks, p0 = (t % chunks) * kPixels, m = std::min(kPixels, hw - p0);
    std::vector<double> mean(static_cast<size_t>(m)), invstd(static_cast<size_t>(m));
    const T* xi = x + i * c * hw;
    T* yi = y + i * c * hw;
    pixel_stats(c, hw, xi, p0, m, eps, mean.data(), invstd.data());
    for (int ch = 0; ch < c; ++ch) {
      const double g = gamma ? double(gamma[ch]) : 1.0, b = beta ? double(beta[ch]) : 0.0;
      const T* xr = xi + ch * hw + p0;
      T* yr = yi + ch * hw + p0;
      for (int64_t j = 0; j < m; ++j) yr[j] = T((double(xr[j]) - mean[j]) * invstd[j] * g + b);
    }
  }
}

template <class T>
void layer_norm_backward(int n, int c, int64_t hw, const T* x, const T* dy, double eps, const T* gamma, T* dx,
                         double* dgamma, double* dbeta) {
  const int64_t chunks = (hw + kPixels - 1) / kPixels, tasks = int64_t(n) * chunks;
  // Per task, its share of dgamma and dbeta, added in task order at the end.
  std::vector<double> part(size_t(tasks) * 2 * c, 0.0);
#pragma omp parallel for schedule(static) if (size_t(n) * c * hw > kParallelMin)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t i = t / chunks, p0 = (t % chunks) * kPixels, m = std::min(kPixels, hw - p0);
    std::vector<double> mean(static_cast<size_t>(m)), invstd(static_cast<size_t>(m)), sum_g(static_cast<size_t>(m), 0.0), sum_gx(static_cast<size_t>(m), 0.0);
    const T* xi = x + i * c * hw;
    const T* di = dy + i * c * hw;
    pixel_stats(c, hw, xi, p0, m, eps, mean.data(), invstd.data());
    double* dg = &part[size_t(t) * 2 * c];
    double* db = dg + c;
    // g = dy * gamma; dx = invstd * (g - mean(g) - xhat * mean(g * xhat)) over the channels.
    for (int ch = 0; ch < c; ++ch) {
      const double gm = gamma ? double(gamma[ch]) : 1.0;
      const T* xr = xi + ch * hw + p0;
      const T* dr = di + ch * hw + p0;
      for (int64_t j = 0; j < m; ++j) {
        const double xhat = (double(xr[j]) - mean[j]) * invstd[j], d = double(dr[j]);
        dg[ch] += d * xhat;
        db[ch] += d;
        sum_g[j] += d * gm;
        sum_gx[j] += d * gm * xhat;
      }
    }
    if (!dx) continue;
    T* oi = dx + i * c * hw;
    for (int ch = 0; ch < c; ++ch) {
      const double gm = gamma ? double(gamma[ch]) : 1.0;
      const T* xr = xi + ch * hw + p0;
      const T* dr = di + ch * hw + p0;
      T* orow = oi + ch * hw + p0;
      for (int64_t j = 0; j < m; ++j) {
        const double xhat = (double(xr[j]) - mean[j]) * invstd[j];
        orow[j] = T(invstd[j] * (double(dr[j]) * gm - sum_g[j] / c - xhat * sum_gx[j] / c));
      }
    }
  }
  for (int64_t t = 0; t < tasks; ++t)
    for (int ch = 0; ch < c; ++ch) {
      dgamma[ch] += part[size_t(t) * 2 * c + ch];
      dbeta[ch] += part[size_t(t) * 2 * c + c + ch];
    }
}

template <class T>
void to_channels_last(int n, int c, int64_t hw, const T* x, T* y) {
#pragma omp parallel for schedule(static) if (size_t(n) * c * hw > kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < hw; ++p)
      for (int ch = 0; ch < c; ++ch) y[(i * hw + p) * c + ch] = x[(i * c + ch) * hw + p];
}

template <class T>
void from_channels_last(int n, int c, int64_t hw, const T* y, T* x) {
#pragma omp parallel for schedule(static) if (size_t(n) * c * hw > kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    for (int ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) x[(i * c + ch) * hw + p] = y[(i * hw + p) * c + ch];
}

#define HT_PIXEL_INST(T)                                                                                      \
  template void multiply<T>(size_t, const T*, const T*, T*);                                                 \
  template void multiply_planes<T>(int, int, int64_t, const T*, const T*, PlaneFactor, T*);                  \
  template void plane_dot<T>(int, int, int64_t, const T*, const T*, double*);                                \
  template void scale_images<T>(int, int64_t, const T*, const double*, T*);                                  \
  template void layer_norm_forward<T>(int, int, int64_t, const T*, double, const T*, const T*, T*);          \
  template void layer_norm_backward<T>(int, int, int64_t, const T*, const T*, double, const T*, T*, double*, \
                                       double*);                                                             \
  template void to_channels_last<T>(int, int, int64_t, const T*, T*);                                        \
  template void from_channels_last<T>(int, int, int64_t, const T*, T*);
HT_PIXEL_INST(float)
HT_PIXEL_INST(double)
#undef HT_PIXEL_INST

}  // namespace ht::cpu
