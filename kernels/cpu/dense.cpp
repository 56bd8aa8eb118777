// Dense layers sit after global pooling, so matrices are small; loops are ordered for
// unit-stride inner access and reductions accumulate in double.
#include "kernels/cpu/dense.hpp"

#include <cstddef>
#include <vector>

namespace ht::cpu {

template <class T>
void dense_forward(int n, int in, int out, const T* x, const T* W, const T* b, T* y) {
#pragma omp parallel for schedule(static) if (size_t(n) * in * out > 65536)
  for (int i = 0; i < n; ++i) {
    std::vector<double> acc(out);
    for (int o = 0; o < out; ++o) acc[o] = b ? double(b[o]) : 0.0;
    for (int k = 0; k < in; ++k) {
      const double xv = x[size_t(i) * in + k];
      const T* wr = W + size_t(k) * out;
      for (int o = 0; o < out; ++o) acc[o] += xv * double(wr[o]);
    }
    for (int o = 0; o < out; ++o) y[size_t(i) * out + o] = T(acc[o]);
  }
}

template <class T>
void dense_backward(int n, int in, int out, const T* x, const T* W, const T* dy, T* dx, T* dW,
                    T* db) {
  const bool par = size_t(n) * in * out > 65536;
  if (dx) {
#pragma omp parallel for schedule(static) if (par)
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < in; ++k) {
        const T* wr = W + size_t(k) * out;
        const T* g = dy + size_t(i) * out;
        double s = 0;
        for (int o = 0; o < out; ++o) s += double(g[o]) * double(wr[o]);
        dx[size_t(i) * in + k] = T(s);
      }
  }
#pragma omp parallel for schedule(static) if (par && dW)
  for (int k = 0; k < (dW ? in : 0); ++k) {
    std::vector<double> acc(out, 0.0);
    for (int i = 0; i < n; ++i) {
      const double xv = x[size_t(i) * in + k];
      const T* g = dy + size_t(i) * out;
      for (int o = 0; o < out; ++o) acc[o] += xv * double(g[o]);
    }
    for (int o = 0; o < out; ++o) dW[size_t(k) * out + o] = T(acc[o]);
  }
  if (db)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int i = 0; i < n; ++i) s += dy[size_t(i) * out + o];
      db[o] = T(s);
    }
}

template void dense_forward<float>(int, int, int, const float*, const float*, const float*, float*);
template void dense_forward<double>(int, int, int, const double*, const double*, const double*,
                                    double*);
template void dense_backward<float>(int, int, int, const float*, const float*, const float*, float*,
                                    float*, float*);
template void dense_backward<double>(int, int, int, const double*, const double*, const double*,
                                     double*, double*, double*);

}  // namespace ht::cpu
