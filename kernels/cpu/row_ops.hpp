// Row-level helpers shared by the plain-loop kernels (internal to kernels/cpu).
#pragma once

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

}  // namespace ht::cpu
