// Plain-loop pooling, parallel over (image, channel) planes. Pooling is memory-bound, so
// one pass per plane with the plane in cache is as good as a library call.
#include "kernels/cpu/pool.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace ht::cpu {

void validate(const PoolGeom& g) {
  auto need = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("PoolGeom: ") + what);
  };
  need(g.n > 0 && g.c > 0 && g.hin > 0 && g.win > 0, "sizes must be > 0");
  need(g.kh > 0 && g.kw > 0 && g.stride_h > 0 && g.stride_w > 0, "window and stride must be > 0");
  need(g.pad_top >= 0 && g.pad_bottom >= 0 && g.pad_left >= 0 && g.pad_right >= 0,
       "padding must be >= 0");
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

template <class T>
void max_pool_forward(const PoolGeom& g, const T* x, T* y) {
  validate(g);
  const int ho = g.hout(), wo = g.wout();
  const long planes = long(g.n) * g.c;
#pragma omp parallel for schedule(static) if (g.x_size() > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    const T* xp = x + size_t(p) * g.hin * g.win;
    T* yp = y + size_t(p) * ho * wo;
    for (int oh = 0; oh < ho; ++oh)
      for (int ow = 0; ow < wo; ++ow) {
        const long i = argmax(g, xp, window(g, oh, ow));
        yp[oh * wo + ow] = i < 0 ? -std::numeric_limits<T>::infinity() : xp[i];
      }
  }
}

template <class T>
void max_pool_backward(const PoolGeom& g, const T* x, const T* dy, T* dx) {
  validate(g);
  const int ho = g.hout(), wo = g.wout();
  const long planes = long(g.n) * g.c;
#pragma omp parallel for schedule(static) if (g.x_size() > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    const T* xp = x + size_t(p) * g.hin * g.win;
    const T* dyp = dy + size_t(p) * ho * wo;
    T* dxp = dx + size_t(p) * g.hin * g.win;
    std::fill(dxp, dxp + size_t(g.hin) * g.win, T(0));
    for (int oh = 0; oh < ho; ++oh)
      for (int ow = 0; ow < wo; ++ow) {
        const long i = argmax(g, xp, window(g, oh, ow));
        if (i >= 0) dxp[i] += dyp[oh * wo + ow];
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
        const int count = std::max(0, w.h1 - w.h0) * std::max(0, w.w1 - w.w0);
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
        const int count = std::max(0, w.h1 - w.h0) * std::max(0, w.w1 - w.w0);
        if (count == 0) continue;
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
