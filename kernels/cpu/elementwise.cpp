#include "kernels/cpu/elementwise.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace ht::cpu {

// Below this many elements a parallel region costs more than it saves.
constexpr size_t kParallelMin = 1 << 15;

template <class T>
void relu_forward(size_t n, const T* x, T* y) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (size_t i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];  // NaN passes, as torch
}

template <class T>
void relu_backward(size_t n, const T* y, const T* dy, T* dx) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    // Both loads unconditional: a branch-free select the compiler vectorises (a data-
    // dependent branch mispredicts on half the elements).
    const T yv = y[i], d = dy[i];
    dx[i] = yv <= T(0) ? T(0) : d;  // torch's test
  }
}

namespace {

// One activation's loops, its switch folded away (kernels/activation.hpp says what each
// computes). Those with transcendental functions are not `simd`: a vectorised exp would
// round differently from the scalar one.
template <Activation F>
constexpr bool algebraic() {
  return F == Activation::LeakyReLU || F == Activation::ReLU6 || F == Activation::Clip ||
         F == Activation::HardSigmoid || F == Activation::HardSwish;
}

template <Activation F, class T>
void forward_loop(ActivationArgs a, size_t n, const T* x, T* y) {
  if constexpr (algebraic<F>()) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (size_t i = 0; i < n; ++i) y[i] = activation_value(F, a, x[i]);
  } else {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (size_t i = 0; i < n; ++i) y[i] = activation_value(F, a, x[i]);
  }
}

template <Activation F, class T>
void backward_loop(ActivationArgs a, size_t n, const T* x, const T* y, const T* dy, T* dx) {
  if constexpr (F != Activation::SiLU && F != Activation::GELU && F != Activation::GELUTanh) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (size_t i = 0; i < n; ++i) dx[i] = activation_gradient(F, a, x[i], y[i], dy[i]);
  } else {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (size_t i = 0; i < n; ++i) dx[i] = activation_gradient(F, a, x[i], y[i], dy[i]);
  }
}

// Calls body.template operator()<F>() with the activation as a constant.
template <class Body>
void dispatch(Activation f, Body body) {
  switch (f) {
    case Activation::LeakyReLU: return body(std::integral_constant<Activation, Activation::LeakyReLU>());
    case Activation::Sigmoid: return body(std::integral_constant<Activation, Activation::Sigmoid>());
    case Activation::Tanh: return body(std::integral_constant<Activation, Activation::Tanh>());
    case Activation::ReLU6: return body(std::integral_constant<Activation, Activation::ReLU6>());
    case Activation::Clip: return body(std::integral_constant<Activation, Activation::Clip>());
    case Activation::SiLU: return body(std::integral_constant<Activation, Activation::SiLU>());
    case Activation::HardSigmoid: return body(std::integral_constant<Activation, Activation::HardSigmoid>());
    case Activation::HardSwish: return body(std::integral_constant<Activation, Activation::HardSwish>());
    case Activation::GELU: return body(std::integral_constant<Activation, Activation::GELU>());
    case Activation::GELUTanh: return body(std::integral_constant<Activation, Activation::GELUTanh>());
  }
}

}  // namespace

template <class T>
void activation_forward(Activation f, ActivationArgs a, size_t n, const T* x, T* y) {
  dispatch(f, [&](auto F) { forward_loop<decltype(F)::value>(a, n, x, y); });
}

template <class T>
void activation_backward(Activation f, ActivationArgs a, size_t n, const T* x, const T* y, const T* dy, T* dx) {
  dispatch(f, [&](auto F) { backward_loop<decltype(F)::value>(a, n, x, y, dy, dx); });
}

template <class T>
void global_avg_sum(int n, int c, long hw, const T* x, double* sums) {
  const long planes = long(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > kParallelMin)
  for (long p = 0; p < planes; ++p) {
    const T* xp = x + size_t(p) * hw;
    double acc = 0;
    for (long i0 = 0; i0 < hw; i0 += 1024) {  // short blocks in T, blocks in double
      const long i1 = i0 + 1024 < hw ? i0 + 1024 : hw;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (long i = i0; i < i1; ++i) s += xp[i];
      acc += double(s);
    }
    sums[p] += acc;
  }
}

template <class T>
void dropout_apply(const DropoutMask& m, int n, int c, int h, int w, const T* x, T* y) {
  const long planes = long(n) * c;
  const size_t hw = size_t(h) * w;
  const T scale = T(m.scale);
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > kParallelMin)
  for (long p = 0; p < planes; ++p) {
    const T* xp = x + size_t(p) * hw;
    T* yp = y + size_t(p) * hw;
    for (int r = 0; r < h; ++r)
      for (int col = 0; col < w; ++col) {
        const size_t i = size_t(r) * w + col;
        yp[i] = dropout_keeps(m, p / c, int(p % c), r, col) ? xp[i] * scale : T(0);
      }
  }
}

template <class T>
void global_max(int n, int c, long hw, const T* x, double* maxes) {
  const long planes = long(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > kParallelMin)
  for (long p = 0; p < planes; ++p) {
    const T* xp = x + size_t(p) * hw;
    T m = -std::numeric_limits<T>::infinity();
    for (long i = 0; i < hw; ++i) m = xp[i] > m ? xp[i] : m;
    maxes[p] = double(m);
  }
}

template <class T>
void global_max_count(int n, int c, long hw, const T* x, const double* maxes, double* counts) {
  const long planes = long(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > kParallelMin)
  for (long p = 0; p < planes; ++p) {
    const T* xp = x + size_t(p) * hw;
    long k = 0;
    for (long i = 0; i < hw; ++i) k += double(xp[i]) == maxes[p];
    counts[p] = double(k);
  }
}

template <class T>
void global_max_backward(int n, int c, long hw, const T* x, const double* maxes, const double* grads, T* dx) {
  const long planes = long(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > kParallelMin)
  for (long p = 0; p < planes; ++p) {
    const T* xp = x + size_t(p) * hw;
    T* out = dx + size_t(p) * hw;
    const T g = T(grads[p]);
    for (long i = 0; i < hw; ++i) out[i] = double(xp[i]) == maxes[p] ? g : T(0);
  }
}

template <class T>
void global_avg_backward(int n, int c, long hw, const T* dy, double scale, T* dx) {
  const long planes = long(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > kParallelMin)
  for (long p = 0; p < planes; ++p) {
    const T v = T(double(dy[p]) * scale);
    T* out = dx + size_t(p) * hw;
    for (long i = 0; i < hw; ++i) out[i] = v;
  }
}

namespace {

void check_rect(int h, int w, int row0, int col0, int rows, int cols) {
  if (row0 < 0 || col0 < 0 || rows < 0 || cols < 0 || row0 + rows > h || col0 + cols > w)
    throw std::out_of_range("rect rows [" + std::to_string(row0) + "," +
                            std::to_string(row0 + rows) + ") cols [" + std::to_string(col0) + "," +
                            std::to_string(col0 + cols) + ") outside " + std::to_string(h) + "x" +
                            std::to_string(w));
}

enum class Op { kPack, kUnpack, kUnpackAdd };

// Halo strips are thin, so parallelism is over planes; a row is one memcpy or add loop.
template <class T>
void rect(Op op, const T* packed_in, const T* src, T* packed_out, T* dst, int n, int c, int h,
          int w, int row0, int col0, int rows, int cols) {
  check_rect(h, w, row0, col0, rows, cols);
  const long planes = long(n) * c;
  const size_t plane = size_t(h) * w, pplane = size_t(rows) * cols;
#pragma omp parallel for schedule(static) if (planes * pplane > kParallelMin)
  for (long p = 0; p < planes; ++p)
    for (int r = 0; r < rows; ++r) {
      const size_t t = size_t(p) * plane + size_t(row0 + r) * w + col0;
      const size_t q = size_t(p) * pplane + size_t(r) * cols;
      if (op == Op::kPack) {
        std::memcpy(packed_out + q, src + t, sizeof(T) * cols);
      } else if (op == Op::kUnpack) {
        std::memcpy(dst + t, packed_in + q, sizeof(T) * cols);
      } else {
        for (int j = 0; j < cols; ++j) dst[t + j] += packed_in[q + j];
      }
    }
}

}  // namespace

template <class T>
void pack_rect(const T* src, int n, int c, int src_h, int src_w, int row0, int col0, int rows,
               int cols, T* packed) {
  rect<T>(Op::kPack, nullptr, src, packed, nullptr, n, c, src_h, src_w, row0, col0, rows, cols);
}
template <class T>
void unpack_rect(const T* packed, int n, int c, int dst_h, int dst_w, int row0, int col0, int rows,
                 int cols, T* dst) {
  rect<T>(Op::kUnpack, packed, nullptr, nullptr, dst, n, c, dst_h, dst_w, row0, col0, rows, cols);
}
template <class T>
void unpack_add_rect(const T* packed, int n, int c, int dst_h, int dst_w, int row0, int col0,
                     int rows, int cols, T* dst) {
  rect<T>(Op::kUnpackAdd, packed, nullptr, nullptr, dst, n, c, dst_h, dst_w, row0, col0, rows,
          cols);
}

#define HT_EW_INST(T)                                                                 \
  template void relu_forward<T>(size_t, const T*, T*);                                \
  template void relu_backward<T>(size_t, const T*, const T*, T*);                     \
  template void activation_forward<T>(Activation, ActivationArgs, size_t, const T*, T*); \
  template void activation_backward<T>(Activation, ActivationArgs, size_t, const T*, const T*, const T*, T*); \
  template void global_avg_sum<T>(int, int, long, const T*, double*);                 \
  template void global_avg_backward<T>(int, int, long, const T*, double, T*);         \
  template void global_max<T>(int, int, long, const T*, double*);                     \
  template void dropout_apply<T>(const DropoutMask&, int, int, int, int, const T*, T*); \
  template void global_max_count<T>(int, int, long, const T*, const double*, double*); \
  template void global_max_backward<T>(int, int, long, const T*, const double*, const double*, T*); \
  template void pack_rect<T>(const T*, int, int, int, int, int, int, int, int, T*);   \
  template void unpack_rect<T>(const T*, int, int, int, int, int, int, int, int, T*); \
  template void unpack_add_rect<T>(const T*, int, int, int, int, int, int, int, int, T*);
HT_EW_INST(float)
HT_EW_INST(double)
#undef HT_EW_INST

}  // namespace ht::cpu
