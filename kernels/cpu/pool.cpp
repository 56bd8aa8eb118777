// Plain-loop pooling, parallel over (image, channel) planes. Pooling is memory-bound, so
// one pass per plane with the plane in cache is as good as a library call.
#include "kernels/cpu/pool.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/row_ops.hpp"

namespace ht::cpu {

void validate(const PoolGeom& g) {
  auto need = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("PoolGeom: ") + what);
  };
  need(g.n > 0 && g.c > 0 && g.hin > 0 && g.win > 0, "sizes must be > 0");
  need(g.kh > 0 && g.kw > 0 && g.stride_h > 0 && g.stride_w > 0, "window and stride must be > 0");
  need(g.pad_top >= 0 && g.pad_bottom >= 0 && g.pad_left >= 0 && g.pad_right >= 0,
       "padding must be >= 0");
  need(g.count_top >= 0 && g.count_top <= g.pad_top && g.count_bottom >= 0 && g.count_bottom <= g.pad_bottom &&
           g.count_left >= 0 && g.count_left <= g.pad_left && g.count_right >= 0 && g.count_right <= g.pad_right,
       "counted padding must be within the padding");
  need(g.hin + g.pad_top + g.pad_bottom >= g.kh && g.win + g.pad_left + g.pad_right >= g.kw,
       "window larger than the padded input");
}

namespace {

// The window of output (oh, ow), clipped to the image: rows [h0,h1), cols [w0,w1).
struct Window {
  int h0, h1, w0, w1;
};
inline Window window(const PoolGeom& g, int oh, int ow) {
  const int hs = oh * g.stride_h - g.pad_top, ws = ow * g.stride_w - g.pad_left;
  return {std::max(hs, 0), std::min(hs + g.kh, g.hin), std::max(ws, 0), std::min(ws + g.kw, g.win)};
}

// Index (within the plane) of the window's maximum, or -1 for an empty window. This is
// PyTorch's CPU rule verbatim: start at the first element with -inf, take `v > best ||
// isnan(v)`; so ties keep the first maximum and the last NaN wins.
template <class T>
inline long argmax(const PoolGeom& g, const T* xp, const Window& w) {
  if (w.h0 >= w.h1 || w.w0 >= w.w1) return -1;
  long best = long(w.h0) * g.win + w.w0;
  T bv = -std::numeric_limits<T>::infinity();
  for (int h = w.h0; h < w.h1; ++h)
    for (int c = w.w0; c < w.w1; ++c) {
      const long i = long(h) * g.win + c;
      const T v = xp[i];
      if (v > bv || std::isnan(v)) {
        best = i;
        bv = v;
      }
    }
  return best;
}

}  // namespace

namespace {

// Output columns [lo, hi) whose window lies wholly inside the image columns; they take the
// vector path, the few others the clipped scalar one.
struct Interior {
  int lo, hi;
};
inline Interior interior_cols(const PoolGeom& g) {
  const int wo = g.wout();
  const int lo = std::min(wo, std::max(0, div_ceil(g.pad_left, g.stride_w)));
  const int hi = std::min(wo, div_floor(g.win + g.pad_left - g.kw, g.stride_w) + 1);
  return {lo, std::max(lo, hi)};
}

// The max-pool scan of one output row's interior windows, vectorised across windows: each
// window still sees its elements in row-major order with argmax's rule (`v > best ||
// isnan(v)`), so values and chosen indices equal the scalar scan. idx may be null.
template <class T>
void scan_row(const PoolGeom& g, const T* xp, int h0, int h1, Interior in, T* best, int* idx) {
  const int sw = g.stride_w, n = in.hi - in.lo, col0 = in.lo * sw - g.pad_left;  // col0 >= 0
  best += in.lo;
  if (idx) idx += in.lo;
  for (int j = 0; j < n; ++j) best[j] = -std::numeric_limits<T>::infinity();
  if (idx)
    for (int j = 0; j < n; ++j) idx[j] = h0 * g.win + col0 + j * sw;
  for (int h = h0; h < h1; ++h) {
    const T* xr = xp + long(h) * g.win + col0;
    for (int k = 0; k < g.kw; ++k) {
      if (idx) {
        const int first = h * g.win + col0 + k;
#pragma omp simd
        for (int j = 0; j < n; ++j) {
          const T v = xr[j * sw + k], b = best[j];
          const bool take = v > b || v != v;
          best[j] = take ? v : b;
          idx[j] = take ? first + j * sw : idx[j];
        }
      } else {
#pragma omp simd
        for (int j = 0; j < n; ++j) {
          const T v = xr[j * sw + k], b = best[j];
          best[j] = (v > b || v != v) ? v : b;
        }
      }
    }
  }
}

inline bool int_indexable(const PoolGeom& g) { return long(g.hin) * g.win < (1L << 31) - 1; }

// Windows that tile the image (k x k, stride k, no padding, k = 2 or 4: max_pool2d's usual
// form) take a path of their own. A window's elements are k runs of k consecutive columns,
// scanned in the rule's order (values and chosen elements equal the scan's), vectorised
// across windows without strided loads; the backward writes every dx element once, 0 + dy
// at the chosen element and 0 elsewhere, instead of zeroing dx and adding into it.
// (int_indexable: a window row's offset r * win is an int.)
bool windows_tile(const PoolGeom& g) {
  const int k = g.kh;
  return (k == 2 || k == 4) && g.kw == k && g.stride_h == k && g.stride_w == k && g.pad_top == 0 &&
         g.pad_bottom == 0 && g.pad_left == 0 && g.pad_right == 0 && int_indexable(g);
}

constexpr int kTileChunk = 1024;  // windows scanned before their dx rows are written

template <class T, int K>
__attribute__((always_inline)) inline void tiled_forward_plane(const PoolGeom& g, const T* xp, T* yp) {
  const int ho = g.hout(), wo = g.wout();
  for (int oh = 0; oh < ho; ++oh) tiled_scan<T, K>(wo, xp + size_t(oh) * K * g.win, g.win, yp + size_t(oh) * wo, nullptr);
}

// K lanes of T and of an integer of T's width, so that a window's K elements of one row are
// one vector: `lane == chosen ? d : 0` (GCC vector extensions, at the width the caller
// is compiled for).
template <class T, int K>
struct WindowRow;
template <>
struct WindowRow<float, 2> {
  typedef float V __attribute__((vector_size(8)));
  typedef int I __attribute__((vector_size(8)));
};
template <>
struct WindowRow<float, 4> {
  typedef float V __attribute__((vector_size(16)));
  typedef int I __attribute__((vector_size(16)));
};
template <>
struct WindowRow<double, 2> {
  typedef double V __attribute__((vector_size(16)));
  typedef long long I __attribute__((vector_size(16)));
};
template <>
struct WindowRow<double, 4> {
  typedef double V __attribute__((vector_size(32)));
  typedef long long I __attribute__((vector_size(32)));
};

template <class T, int K>
__attribute__((always_inline)) inline void tiled_backward_plane(const PoolGeom& g, const T* xp, const T* dyp, T* dxp) {
  using V = typename WindowRow<T, K>::V;
  using I = typename WindowRow<T, K>::I;
  const int ho = g.hout(), wo = g.wout();
  alignas(64) T value[kTileChunk];  // each window's maximum, then what its dx element gets
  alignas(64) int which[kTileChunk];
  for (int oh = 0; oh < ho; ++oh) {
    const T* x0 = xp + size_t(oh) * K * g.win;
    T* dx0 = dxp + size_t(oh) * K * g.win;
    for (int j0 = 0; j0 < wo; j0 += kTileChunk) {
      const int n = std::min(kTileChunk, wo - j0);
      tiled_scan<T, K>(n, x0 + j0 * K, g.win, value, which);
      for (int j = 0; j < n; ++j) value[j] = T(0) + dyp[size_t(oh) * wo + j0 + j];  // as 0 += dy: -0 becomes +0
      for (int r = 0; r < K; ++r) {
        I lane;
        for (int k = 0; k < K; ++k) lane[k] = r * K + k;
        T* out = dx0 + r * g.win + j0 * K;
        for (int j = 0; j < n; ++j) {
          V d, zero;
          I chosen;
          for (int k = 0; k < K; ++k) d[k] = value[j], zero[k] = T(0), chosen[k] = which[j];
          const V v = chosen == lane ? d : zero;
          std::memcpy(out + j * K, &v, sizeof v);
        }
      }
    }
    for (int r = 0; r < K && wo * K < g.win; ++r)  // columns no window covers
      std::fill(dx0 + r * g.win + wo * K, dx0 + (r + 1) * g.win, T(0));
  }
  std::fill(dxp + size_t(ho) * K * g.win, dxp + size_t(g.hin) * g.win, T(0));  // rows no window covers
}

template <class T>
using TiledForward = void (*)(const PoolGeom&, const T*, T*);
template <class T>
using TiledBackward = void (*)(const PoolGeom&, const T*, const T*, T*);

template <class T, int K>
void tiled_forward_baseline(const PoolGeom& g, const T* xp, T* yp) {
  tiled_forward_plane<T, K>(g, xp, yp);
}
template <int K>
HT_AVX2 void tiled_forward_avx2(const PoolGeom& g, const float* xp, float* yp) {
  tiled_forward_plane<float, K>(g, xp, yp);
}
template <int K>
HT_AVX512 void tiled_forward_avx512(const PoolGeom& g, const float* xp, float* yp) {
  tiled_forward_plane<float, K>(g, xp, yp);
}
template <class T, int K>
void tiled_backward_baseline(const PoolGeom& g, const T* xp, const T* dyp, T* dxp) {
  tiled_backward_plane<T, K>(g, xp, dyp, dxp);
}
template <int K>
HT_AVX2 void tiled_backward_avx2(const PoolGeom& g, const float* xp, const float* dyp, float* dxp) {
  tiled_backward_plane<float, K>(g, xp, dyp, dxp);
}
template <int K>
HT_AVX512 void tiled_backward_avx512(const PoolGeom& g, const float* xp, const float* dyp, float* dxp) {
  tiled_backward_plane<float, K>(g, xp, dyp, dxp);
}

template <class T, int K>
TiledForward<T> tiled_forward_for_cpu() {
  if constexpr (std::is_same_v<T, float>)
    return for_this_cpu<TiledForward<float>>(tiled_forward_baseline<float, K>, tiled_forward_avx2<K>,
                                             tiled_forward_avx512<K>);
  else
    return tiled_forward_baseline<T, K>;
}
template <class T, int K>
TiledBackward<T> tiled_backward_for_cpu() {
  if constexpr (std::is_same_v<T, float>)
    return for_this_cpu<TiledBackward<float>>(tiled_backward_baseline<float, K>, tiled_backward_avx2<K>,
                                              tiled_backward_avx512<K>);
  else
    return tiled_backward_baseline<T, K>;
}

template <class T>
void tiled_max_pool_forward(const PoolGeom& g, const T* x, T* y) {
  const TiledForward<T> plane = g.kh == 2 ? tiled_forward_for_cpu<T, 2>() : tiled_forward_for_cpu<T, 4>();
  const long planes = long(g.n) * g.c;
#pragma omp parallel for schedule(static) if (g.x_size() > (1 << 15))
  for (long p = 0; p < planes; ++p) plane(g, x + size_t(p) * g.hin * g.win, y + size_t(p) * g.hout() * g.wout());
}

template <class T>
void tiled_max_pool_backward(const PoolGeom& g, const T* x, const T* dy, T* dx) {
  const TiledBackward<T> plane = g.kh == 2 ? tiled_backward_for_cpu<T, 2>() : tiled_backward_for_cpu<T, 4>();
  const long planes = long(g.n) * g.c;
#pragma omp parallel for schedule(static) if (g.x_size() > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    const size_t xo = size_t(p) * g.hin * g.win;
    plane(g, x + xo, dy + size_t(p) * g.hout() * g.wout(), dx + xo);
  }
}

}  // namespace

template <class T>
void max_pool_forward(const PoolGeom& g, const T* x, T* y) {
  validate(g);
  if (windows_tile(g)) return tiled_max_pool_forward(g, x, y);
  const int ho = g.hout(), wo = g.wout();
  const long planes = long(g.n) * g.c;
  const Interior in = int_indexable(g) ? interior_cols(g) : Interior{0, 0};
  const T ninf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for schedule(static) if (g.x_size() > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    const T* xp = x + size_t(p) * g.hin * g.win;
    for (int oh = 0; oh < ho; ++oh) {
      T* yr = y + size_t(p) * ho * wo + size_t(oh) * wo;
      const Window rows = window(g, oh, 0);
      if (rows.h0 >= rows.h1) {
        std::fill(yr, yr + wo, ninf);
        continue;
      }
      auto scalar = [&](int ow) {
        const long i = argmax(g, xp, window(g, oh, ow));
        yr[ow] = i < 0 ? ninf : xp[i];
      };
      for (int ow = 0; ow < in.lo; ++ow) scalar(ow);
      scan_row<T>(g, xp, rows.h0, rows.h1, in, yr, nullptr);
      for (int ow = in.hi; ow < wo; ++ow) scalar(ow);
    }
  }
}

// dx rows are zeroed just before the first window that reaches them, so each plane is
// written once while in cache; overlapping windows add in the scalar kernel's order.
template <class T>
void max_pool_backward(const PoolGeom& g, const T* x, const T* dy, T* dx) {
  validate(g);
  if (windows_tile(g)) return tiled_max_pool_backward(g, x, dy, dx);
  const int ho = g.hout(), wo = g.wout();
  const long planes = long(g.n) * g.c;
  const Interior in = int_indexable(g) ? interior_cols(g) : Interior{0, 0};
#pragma omp parallel if (g.x_size() > (1 << 15))
  {
    std::vector<T> best(wo);
    std::vector<int> idx(wo);
#pragma omp for schedule(static)
    for (long p = 0; p < planes; ++p) {
      const T* xp = x + size_t(p) * g.hin * g.win;
      const T* dyp = dy + size_t(p) * ho * wo;
      T* dxp = dx + size_t(p) * g.hin * g.win;
      int zeroed = 0;  // rows [0, zeroed) of dx are initialised
      auto zero_to = [&](int row) {
        if (row <= zeroed) return;
        std::fill(dxp + size_t(zeroed) * g.win, dxp + size_t(row) * g.win, T(0));
        zeroed = row;
      };
      for (int oh = 0; oh < ho; ++oh) {
        const Window rows = window(g, oh, 0);
        zero_to(rows.h1);
        if (rows.h0 >= rows.h1) continue;
        const T* dyr = dyp + size_t(oh) * wo;
        auto scalar = [&](int ow) {
          const long i = argmax(g, xp, window(g, oh, ow));
          if (i >= 0) dxp[i] += dyr[ow];
        };
        for (int ow = 0; ow < in.lo; ++ow) scalar(ow);
        scan_row<T>(g, xp, rows.h0, rows.h1, in, best.data(), idx.data());
        for (int ow = in.lo; ow < in.hi; ++ow) dxp[idx[ow]] += dyr[ow];
        for (int ow = in.hi; ow < wo; ++ow) scalar(ow);
      }
      zero_to(g.hin);
    }
  }
}

template <class T>
void avg_pool_forward(const PoolGeom& g, const T* x, T* y) {
  validate(g);
  const int ho = g.hout(), wo = g.wout();
  const long planes = long(g.n) * g.c;
#pragma omp parallel for schedule(static) if (g.x_size() > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    const T* xp = x + size_t(p) * g.hin * g.win;
    T* yp = y + size_t(p) * ho * wo;
    for (int oh = 0; oh < ho; ++oh)
      for (int ow = 0; ow < wo; ++ow) {
        const Window w = window(g, oh, ow);
        const int count = pool_divisor(g, oh, ow);
        T s = 0;
        for (int h = w.h0; h < w.h1; ++h)
          for (int c = w.w0; c < w.w1; ++c) s += xp[size_t(h) * g.win + c];
        // An empty window (only possible with padding >= window) gives 0, not NaN.
        yp[oh * wo + ow] = count > 0 ? s / T(count) : T(0);
      }
  }
}

template <class T>
void avg_pool_backward(const PoolGeom& g, const T* dy, T* dx) {
  validate(g);
  const int ho = g.hout(), wo = g.wout();
  const long planes = long(g.n) * g.c;
#pragma omp parallel for schedule(static) if (g.x_size() > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    const T* dyp = dy + size_t(p) * ho * wo;
    T* dxp = dx + size_t(p) * g.hin * g.win;
    std::fill(dxp, dxp + size_t(g.hin) * g.win, T(0));
    for (int oh = 0; oh < ho; ++oh)
      for (int ow = 0; ow < wo; ++ow) {
        const Window w = window(g, oh, ow);
        const int count = pool_divisor(g, oh, ow);
        if (count == 0 || w.h0 >= w.h1 || w.w0 >= w.w1) continue;
        const T v = dyp[oh * wo + ow] / T(count);
        for (int h = w.h0; h < w.h1; ++h)
          for (int c = w.w0; c < w.w1; ++c) dxp[size_t(h) * g.win + c] += v;
      }
  }
}

#define HT_POOL_INST(T)                                                        \
  template void max_pool_forward<T>(const PoolGeom&, const T*, T*);            \
  template void max_pool_backward<T>(const PoolGeom&, const T*, const T*, T*); \
  template void avg_pool_forward<T>(const PoolGeom&, const T*, T*);            \
  template void avg_pool_backward<T>(const PoolGeom&, const T*, T*);
HT_POOL_INST(float)
HT_POOL_INST(double)
#undef HT_POOL_INST

}  // namespace ht::cpu
