// Batch norm + ReLU + tiling max pool in one pass, parallel over (image, channel) planes.
// Each pass normalises a window row's kh input rows into a small buffer (vectorised, in
// the order and types of bn_forward_apply and relu_forward), then pools the buffer.
#include "kernels/cpu/norm_relu_pool.hpp"

#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <vector>

namespace ht::cpu {

namespace {

void check(const NormPoolShape& s) {
  if (s.n < 1 || s.c < 1 || s.kh < 1 || s.kw < 1 || s.kh * s.kw >= kNoArgmax || s.ho() < 1 || s.wo() < 1)
    throw std::invalid_argument("bn_relu_max_pool: bad shape");
}

bool worth_threads(const NormPoolShape& s) { return s.x_size() > (size_t(1) << 15); }

// The per-channel constants of the forward, as bn_forward_apply makes them.
template <class T>
struct Affine {
  T m, s, b;
  Affine(int ch, const double* mean, const double* invstd, const T* gamma, const T* beta)
      : m(T(mean[ch])), s(T((gamma ? double(gamma[ch]) : 1.0) * invstd[ch])), b(beta ? beta[ch] : T(0)) {}
};

// The pixel of window (oh, ow) that argmax byte k names, as an offset in its plane.
inline size_t argmax_pixel(const NormPoolShape& s, int oh, int ow, int k) {
  return size_t(oh * s.kh + k / s.kw) * s.w + size_t(ow) * s.kw + k % s.kw;
}

}  // namespace

template <class T>
void bn_relu_max_pool_forward(const NormPoolShape& s, const T* x, const double* mean, const double* invstd,
                              const T* gamma, const T* beta, T* y, uint8_t* argmax) {
  check(s);
  const long planes = long(s.n) * s.c;
  const int ho = s.ho(), wo = s.wo(), used = wo * s.kw;
  const size_t xplane = size_t(s.h) * s.w, yplane = size_t(ho) * wo;
  const T ninf = -std::numeric_limits<T>::infinity();
#pragma omp parallel if (worth_threads(s))
  {
    std::vector<T> rows(size_t(s.kh) * used);
#pragma omp for schedule(static)
    for (long p = 0; p < planes; ++p) {
      const Affine<T> f(int(p % s.c), mean, invstd, gamma, beta);
      const T* xp = x + size_t(p) * xplane;
      T* yp = y + size_t(p) * yplane;
      uint8_t* ap = argmax + size_t(p) * yplane;
      for (int oh = 0; oh < ho; ++oh) {
        for (int r = 0; r < s.kh; ++r) {
          const T* xr = xp + size_t(oh * s.kh + r) * s.w;
          T* br = rows.data() + size_t(r) * used;
#pragma omp simd
          for (int i = 0; i < used; ++i) {
            const T v = (xr[i] - f.m) * f.s + f.b;
            br[i] = v < T(0) ? T(0) : v;
          }
        }
        for (int ow = 0; ow < wo; ++ow) {
          T best = ninf;
          int at = 0;
          for (int r = 0; r < s.kh; ++r)
            for (int q = 0; q < s.kw; ++q) {
              const T v = rows[size_t(r) * used + size_t(ow) * s.kw + q];
              if (v > best || std::isnan(v)) {
                best = v;
                at = r * s.kw + q;
              }
            }
          yp[size_t(oh) * wo + ow] = best;
          ap[size_t(oh) * wo + ow] = best <= T(0) ? kNoArgmax : uint8_t(at);
        }
      }
    }
  }
}

template <class T>
void bn_relu_max_pool_backward_sums(const NormPoolShape& s, const T* dy, const uint8_t* argmax, const T* x,
                                    const double* mean, const double* invstd, double* sum_dy, double* sum_dy_xhat) {
  check(s);
  const long planes = long(s.n) * s.c;
  const int ho = s.ho(), wo = s.wo();
  const size_t xplane = size_t(s.h) * s.w, yplane = size_t(ho) * wo;
  std::vector<double> part(size_t(planes) * 2, 0.0);
#pragma omp parallel for schedule(static) if (worth_threads(s))
  for (long p = 0; p < planes; ++p) {
    const T m = T(mean[p % s.c]);
    const T* xp = x + size_t(p) * xplane;
    const T* dp = dy + size_t(p) * yplane;
    const uint8_t* ap = argmax + size_t(p) * yplane;
    double a = 0, b = 0;
    for (int oh = 0; oh < ho; ++oh) {  // a window row's sums in T, the rows' in double
      T sa = 0, sb = 0;
      for (int ow = 0; ow < wo; ++ow) {
        const uint8_t k = ap[size_t(oh) * wo + ow];
        if (k == kNoArgmax) continue;
        const T d = dp[size_t(oh) * wo + ow];
        sa += d;
        sb += d * (xp[argmax_pixel(s, oh, ow, k)] - m);
      }
      a += double(sa);
      b += double(sb);
    }
    part[size_t(p) * 2] = a;
    part[size_t(p) * 2 + 1] = b;
  }
  for (long p = 0; p < planes; ++p) {  // plane order: the same sums for any thread count
    const int ch = int(p % s.c);
    sum_dy[ch] += part[size_t(p) * 2];
    sum_dy_xhat[ch] += part[size_t(p) * 2 + 1] * invstd[ch];
  }
}

template <class T>
void bn_relu_max_pool_backward_apply(const NormPoolShape& s, const T* dy, const uint8_t* argmax, const T* x,
                                     const double* mean, const double* invstd, const T* gamma, const double* sum_dy,
                                     const double* sum_dy_xhat, double count, T* dx) {
  check(s);
  const long planes = long(s.n) * s.c;
  const int ho = s.ho(), wo = s.wo();
  const size_t xplane = size_t(s.h) * s.w, yplane = size_t(ho) * wo;
#pragma omp parallel for schedule(static) if (worth_threads(s))
  for (long p = 0; p < planes; ++p) {
    const int ch = int(p % s.c);
    // bn_backward_apply's constants: dx = k*g + a*(x-mean) + b.
    const double is = invstd[ch], k = (gamma ? double(gamma[ch]) : 1.0) * is;
    const T tk = T(k), m = T(mean[ch]);
    const T a = T(-k * is * sum_dy_xhat[ch] / count), b = T(-k * sum_dy[ch] / count);
    const T* xp = x + size_t(p) * xplane;
    const T* dp = dy + size_t(p) * yplane;
    const uint8_t* ap = argmax + size_t(p) * yplane;
    T* out = dx + size_t(p) * xplane;
    for (int h = 0; h < s.h; ++h) {
      const T* xr = xp + size_t(h) * s.w;
      T* orow = out + size_t(h) * s.w;
#pragma omp simd
      for (int i = 0; i < s.w; ++i) orow[i] = a * (xr[i] - m) + b;  // g = 0
      const int oh = h / s.kh;
      if (oh >= ho) continue;
      for (int ow = 0; ow < wo; ++ow) {  // the window maxima in this row: g = dy
        const uint8_t kk = ap[size_t(oh) * wo + ow];
        if (kk == kNoArgmax || kk / s.kw != h - oh * s.kh) continue;
        const size_t i = size_t(ow) * s.kw + kk % s.kw;
        orow[i] = tk * dp[size_t(oh) * wo + ow] + a * (xr[i] - m) + b;
      }
    }
  }
}

#define HT_NORM_POOL_INST(T)                                                                                     \
  template void bn_relu_max_pool_forward<T>(const NormPoolShape&, const T*, const double*, const double*,        \
                                            const T*, const T*, T*, uint8_t*);                                   \
  template void bn_relu_max_pool_backward_sums<T>(const NormPoolShape&, const T*, const uint8_t*, const T*,      \
                                                  const double*, const double*, double*, double*);               \
  template void bn_relu_max_pool_backward_apply<T>(const NormPoolShape&, const T*, const uint8_t*, const T*,     \
                                                   const double*, const double*, const T*, const double*,        \
                                                   const double*, double, T*);
HT_NORM_POOL_INST(float)
HT_NORM_POOL_INST(double)
#undef HT_NORM_POOL_INST

}  // namespace ht::cpu
