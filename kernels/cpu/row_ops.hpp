// Helpers shared by the plain-loop kernels and the few-channel convolutions (internal to
// kernels/cpu).
#pragma once

#include <cstddef>
#include <limits>
#include <vector>

#include "kernels/geometry.hpp"

namespace ht::cpu {

inline int div_floor(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
inline int div_ceil(int a, int b) { return -div_floor(-a, b); }

// y[j*sy] += a * x[j*sx], j < n. The unit-stride case gets its own loop so it vectorizes.
template <class T>
__attribute__((always_inline)) inline void axpy(int n, T a, const T* x, int sx, T* y, int sy) {
  if (sx == 1 && sy == 1) {
#pragma omp simd
    for (int j = 0; j < n; ++j) y[j] += a * x[j];
  } else {
    for (int j = 0; j < n; ++j) y[j * sy] += a * x[j * sx];
  }
}

// sum_j a[j] * b[j*sb], accumulated in T along one row (rows are short) and returned in
// double so long reductions over many rows stay accurate in float.
template <class T>
__attribute__((always_inline)) inline double dot(int n, const T* a, const T* b, int sb) {
  T s = 0;
  if (sb == 1) {
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; ++j) s += a[j] * b[j];
  } else {
    for (int j = 0; j < n; ++j) s += a[j] * b[j * sb];
  }
  return double(s);
}

template <class T>
__attribute__((always_inline)) inline double sum(int n, const T* a) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < n; ++j) s += a[j];
  return double(s);
}

// Max pooling whose windows tile the rows (K x K, stride K): the maximum of each of n
// windows of one output row (x0: its first input row, rows win apart) and, if `which` is
// given, the window-relative index (row * K + column) of the chosen element. The rule is
// max_pool's (`v > best || isnan(v)` in row-major order), vectorised across windows.
template <class T, int K>
__attribute__((always_inline)) inline void tiled_scan(int n, const T* x0, long win, T* best, int* which) {
#pragma omp simd
  for (int j = 0; j < n; ++j) {
    T b = -std::numeric_limits<T>::infinity();
    int w = 0;
#pragma GCC unroll 4
    for (int r = 0; r < K; ++r)
#pragma GCC unroll 4
      for (int k = 0; k < K; ++k) {
        const T v = x0[r * win + j * K + k];
        const bool take = v > b || v != v;
        b = take ? v : b;
        w = take ? r * K + k : w;
      }
    best[j] = b;
    if (which) which[j] = w;
  }
}

// Small convolutions (deep layers of a small shard, tests) run on the calling thread:
// a parallel region would cost more than the work.
inline bool worth_parallel(const ConvGeom& g) {
  return double(g.y_size()) * g.cin_per_group() * g.kh * g.kw > double(1 << 16);
}

// A weight gradient summed by `threads` threads, each into its own slot of `slot` doubles
// (dw's nw, then dbias's): the slots added in thread order, so the result depends on the
// thread count only. dbias may be null.
template <class T>
inline void add_thread_slots(const std::vector<double>& acc, int threads, size_t nw, size_t slot, T* dw, T* dbias) {
  for (size_t i = 0; i < slot; ++i) {
    double t = 0;
    for (int j = 0; j < threads; ++j) t += acc[size_t(j) * slot + i];
    if (i < nw)
      dw[i] = T(t);
    else if (dbias)
      dbias[i - nw] = T(t);
  }
}

}  // namespace ht::cpu
