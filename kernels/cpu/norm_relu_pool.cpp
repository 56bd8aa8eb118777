// Batch norm + ReLU + tiling max pool in one pass, parallel over (image, channel) planes.
// The forward normalises a chunk of a window row's input rows into a buffer (in the order
// and types of bn_forward_apply and relu_forward), then pools the buffer. The float loops
// are built for baseline, AVX2 and AVX-512 (isa.hpp) like the pooling they stand in for.
#include "kernels/cpu/norm_relu_pool.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/row_ops.hpp"

namespace ht::cpu {

namespace {

void check(const NormPoolShape& s) {
  if (!s.valid()) throw std::invalid_argument("bn_relu_max_pool: bad shape");
}

bool worth_threads(const NormPoolShape& s) { return s.x_size() > (size_t(1) << 15); }

// The per-channel constants of the forward, as bn_forward_apply makes them.
template <class T>
struct Affine {
  T m, s, b;
  Affine(int ch, const double* mean, const double* invstd, const T* gamma, const T* beta)
      : m(T(mean[ch])), s(T((gamma ? double(gamma[ch]) : 1.0) * invstd[ch])), b(beta ? beta[ch] : T(0)) {}
};

// bn_backward_apply's per-channel constants: dx = k*g + a*(x - m) + b.
template <class T>
struct BackwardAffine {
  T k, m, a, b;
  BackwardAffine(int ch, const double* mean, const double* invstd, const T* gamma, const double* sum_dy,
                 const double* sum_dy_xhat, double count) {
    const double is = invstd[ch], kk = (gamma ? double(gamma[ch]) : 1.0) * is;
    k = T(kk);
    m = T(mean[ch]);
    a = T(-kk * is * sum_dy_xhat[ch] / count);
    b = T(-kk * sum_dy[ch] / count);
  }
};

// One plane of the forward. Windows of K x K (K = 2 or 4: the vectorised scan of max_pool,
// row_ops.hpp tiled_scan) go in chunks: the chunk's K input rows normalised into a buffer
// that stays in L1, then scanned; any other window size takes the scalar scan.
template <class T, int K>
__attribute__((always_inline)) inline void forward_plane(const NormPoolShape& s, const Affine<T>& f, const T* xp,
                                                         T* yp, uint8_t* ap) {
  constexpr int kChunk = 256;  // windows per chunk
  constexpr int kCols = kChunk * (K > 0 ? K : 1);
  const int ho = s.ho(), wo = s.wo();
  alignas(64) T rows[(K > 0 ? K : 1) * kCols];
  alignas(64) T best[kChunk];
  alignas(64) int which[kChunk];
  auto normalise = [&](const T* xr, int cols, T* out) {
#pragma omp simd
    for (int i = 0; i < cols; ++i) {
      const T v = (xr[i] - f.m) * f.s + f.b;  // bn_forward_apply, then relu_forward
      out[i] = v < T(0) ? T(0) : v;
    }
  };
  for (int oh = 0; oh < ho; ++oh) {
    T* yr = yp + size_t(oh) * wo;
    uint8_t* ar = ap + size_t(oh) * wo;
    if constexpr (K > 0) {
      for (int j0 = 0; j0 < wo; j0 += kChunk) {
        const int n = std::min(kChunk, wo - j0);
        for (int r = 0; r < K; ++r) normalise(xp + size_t(oh * K + r) * s.w + size_t(j0) * K, n * K, rows + r * kCols);
        tiled_scan<T, K>(n, rows, kCols, best, which);
        for (int j = 0; j < n; ++j) {
          yr[j0 + j] = best[j];
          ar[j0 + j] = best[j] <= T(0) ? kNoArgmax : uint8_t(which[j]);
        }
      }
    } else {
      std::vector<T> window(size_t(s.kh) * s.kw);
      for (int ow = 0; ow < wo; ++ow) {
        for (int r = 0; r < s.kh; ++r)
          normalise(xp + size_t(oh * s.kh + r) * s.w + size_t(ow) * s.kw, s.kw, window.data() + size_t(r) * s.kw);
        T b = -std::numeric_limits<T>::infinity();
        int at = 0;
        for (int i = 0; i < s.kh * s.kw; ++i)  // max_pool's rule: the first maximum, the last NaN
          if (window[i] > b || std::isnan(window[i])) b = window[i], at = i;
        yr[ow] = b;
        ar[ow] = b <= T(0) ? kNoArgmax : uint8_t(at);
      }
    }
  }
}

// One plane of the backward's apply, a row at a time: the gradient g that the pool and the
// ReLU pass down (0 + dy at each window's maximum, 0 elsewhere, as max_pool_backward and
// relu_backward write it), then bn_backward_apply's dx = k*g + a*(x - mean) + b over the
// row. 2 x 2 windows make g row by row; 4 x 4 ones spread a window row's dy and argmax over
// its columns once (`code`: the argmax less the column's place in its window, so that row
// r of the window has its maximum where code == r*4) and select g in the row's vector loop
// (measured 2-3.5x faster at 4 x 4 on AVX-512, slower at 2 x 2).
template <class T, int K>
__attribute__((always_inline)) inline void apply_plane(const NormPoolShape& s, const BackwardAffine<T>& f,
                                                       const T* xp, const T* dp, const uint8_t* ap, T* out) {
  constexpr bool spread = K >= 4;
  const int ho = s.ho(), wo = s.wo();
  const int kh = K > 0 ? K : s.kh, kw = K > 0 ? K : s.kw;
  const int covered = wo * kw;  // columns right of the last window get g = 0
  std::vector<T> g(size_t(s.w), T(0));
  std::vector<int> code(spread ? size_t(covered) : 0);
  for (int h = 0; h < s.h; ++h) {
    const int oh = h / kh, r = h - oh * kh;
    const T* dr = dp + size_t(oh) * wo;
    const uint8_t* ar = ap + size_t(oh) * wo;
    const T* xr = xp + size_t(h) * s.w;
    T* orow = out + size_t(h) * s.w;
    const int zeros_from = oh < ho ? covered : 0;  // g is 0 from this column on
    if (oh < ho) {
      if constexpr (spread) {
        if (r == 0)
          for (int j = 0; j < wo; ++j)
#pragma GCC unroll 4
            for (int k = 0; k < K; ++k) {
              g[size_t(j) * K + k] = T(0) + dr[j];
              code[size_t(j) * K + k] = int(ar[j]) - k;  // kNoArgmax: never r*K
            }
        const int here = r * K;
        const T* gr = g.data();
        const int* cr = code.data();
#pragma omp simd
        for (int i = 0; i < covered; ++i) {
          const T gi = cr[i] == here ? gr[i] : T(0);
          orow[i] = f.k * gi + f.a * (xr[i] - f.m) + f.b;
        }
      } else {
        if constexpr (K > 0) {
          for (int j = 0; j < wo; ++j) {
            const int chosen = int(ar[j]) - r * K;  // kNoArgmax: never in [0, K)
            const T d = T(0) + dr[j];
#pragma GCC unroll 4
            for (int k = 0; k < K; ++k) g[size_t(j) * K + k] = chosen == k ? d : T(0);
          }
        } else {
          std::fill(g.begin(), g.end(), T(0));
          for (int j = 0; j < wo; ++j)
            if (ar[j] != kNoArgmax && ar[j] / kw == r) g[size_t(j) * kw + ar[j] % kw] = T(0) + dr[j];
        }
        const T* gr = g.data();
#pragma omp simd
        for (int i = 0; i < covered; ++i) orow[i] = f.k * gr[i] + f.a * (xr[i] - f.m) + f.b;
      }
    }
#pragma omp simd
    for (int i = zeros_from; i < s.w; ++i) orow[i] = f.k * T(0) + f.a * (xr[i] - f.m) + f.b;
  }
}

// One plane's backward sums, over the windows' maxima only: per window row in T, the
// rows' in double. A window without one (kNoArgmax) adds nothing, whatever its pixels.
template <class T, int K>
__attribute__((always_inline)) inline void sums_plane(const NormPoolShape& s, T m, const T* xp, const T* dp,
                                                      const uint8_t* ap, double* out) {
  const int ho = s.ho(), wo = s.wo();
  const int kh = K > 0 ? K : s.kh, kw = K > 0 ? K : s.kw;
  double a = 0, b = 0;
  for (int oh = 0; oh < ho; ++oh) {
    const T* xr = xp + size_t(oh) * kh * s.w;
    const T* dr = dp + size_t(oh) * wo;
    const uint8_t* ar = ap + size_t(oh) * wo;
    T sa = 0, sb = 0;
#pragma omp simd reduction(+ : sa, sb)
    for (int ow = 0; ow < wo; ++ow) {
      const int k = ar[ow];
      const bool hit = k != kNoArgmax;
      const int at = hit ? k : 0;
      const T d = hit ? dr[ow] : T(0);
      const T v = hit ? xr[size_t(at / kw) * s.w + size_t(ow) * kw + at % kw] : m;
      sa += d;
      sb += hit ? d * (v - m) : T(0);
    }
    a += double(sa);
    b += double(sb);
  }
  out[0] = a;
  out[1] = b;
}

template <class T>
using ForwardPlane = void (*)(const NormPoolShape&, const Affine<T>&, const T*, T*, uint8_t*);
template <class T>
using SumsPlane = void (*)(const NormPoolShape&, T, const T*, const T*, const uint8_t*, double*);
template <class T>
using ApplyPlane = void (*)(const NormPoolShape&, const BackwardAffine<T>&, const T*, const T*, const uint8_t*, T*);

// A plane function's body built for baseline x86-64 (any T), AVX2 and AVX-512 (float only:
// their T is a template parameter for the common signature, instantiated as float).
#define HT_NORM_POOL_PLANE(name, body, Params, ...)                                  \
  template <class T, int K>                                                          \
  void name##_baseline Params { body<T, K>(__VA_ARGS__); }                           \
  template <class T, int K>                                                          \
  HT_AVX2 void name##_avx2 Params { body<float, K>(__VA_ARGS__); }                   \
  template <class T, int K>                                                          \
  HT_AVX512 void name##_avx512 Params { body<float, K>(__VA_ARGS__); }
HT_NORM_POOL_PLANE(forward, forward_plane,
                   (const NormPoolShape& s, const Affine<T>& f, const T* x, T* y, uint8_t* a), s, f, x, y, a)
HT_NORM_POOL_PLANE(sums, sums_plane, (const NormPoolShape& s, T m, const T* x, const T* dy, const uint8_t* a, double* out),
                   s, m, x, dy, a, out)
HT_NORM_POOL_PLANE(apply, apply_plane,
                   (const NormPoolShape& s, const BackwardAffine<T>& f, const T* x, const T* dy, const uint8_t* a, T* dx),
                   s, f, x, dy, a, dx)
#undef HT_NORM_POOL_PLANE

template <class T>
struct Planes {
  ForwardPlane<T> forward;
  SumsPlane<T> sums;
  ApplyPlane<T> apply;
};

// The plane functions for this window size (2 and 4 square: specialised) and this CPU.
template <class T, int K>
Planes<T> planes_for_cpu() {
  if constexpr (std::is_same_v<T, float>)
    return {for_this_cpu<ForwardPlane<float>>(forward_baseline<float, K>, forward_avx2<float, K>,
                                              forward_avx512<float, K>),
            for_this_cpu<SumsPlane<float>>(sums_baseline<float, K>, sums_avx2<float, K>, sums_avx512<float, K>),
            for_this_cpu<ApplyPlane<float>>(apply_baseline<float, K>, apply_avx2<float, K>, apply_avx512<float, K>)};
  else
    return {forward_baseline<T, K>, sums_baseline<T, K>, apply_baseline<T, K>};
}
template <class T>
Planes<T> planes_for(const NormPoolShape& s) {
  if (s.kh == 2 && s.kw == 2) return planes_for_cpu<T, 2>();
  if (s.kh == 4 && s.kw == 4) return planes_for_cpu<T, 4>();
  return planes_for_cpu<T, 0>();
}

}  // namespace

template <class T>
void bn_relu_max_pool_forward(const NormPoolShape& s, const T* x, const double* mean, const double* invstd,
                              const T* gamma, const T* beta, T* y, uint8_t* argmax) {
  check(s);
  const ForwardPlane<T> plane = planes_for<T>(s).forward;
  const long planes = long(s.n) * s.c;
  const size_t xplane = size_t(s.h) * s.w, yplane = s.y_size() / size_t(planes);
#pragma omp parallel for schedule(static) if (worth_threads(s))
  for (long p = 0; p < planes; ++p)
    plane(s, Affine<T>(int(p % s.c), mean, invstd, gamma, beta), x + size_t(p) * xplane, y + size_t(p) * yplane,
          argmax + size_t(p) * yplane);
}

template <class T>
void bn_relu_max_pool_backward_sums(const NormPoolShape& s, const T* dy, const uint8_t* argmax, const T* x,
                                    const double* mean, const double* invstd, double* sum_dy, double* sum_dy_xhat) {
  check(s);
  const long planes = long(s.n) * s.c;
  const SumsPlane<T> plane = planes_for<T>(s).sums;
  const size_t xplane = size_t(s.h) * s.w, yplane = s.y_size() / size_t(planes);
  std::vector<double> part(size_t(planes) * 2, 0.0);
#pragma omp parallel for schedule(static) if (worth_threads(s))
  for (long p = 0; p < planes; ++p)
    plane(s, T(mean[p % s.c]), x + size_t(p) * xplane, dy + size_t(p) * yplane, argmax + size_t(p) * yplane,
          part.data() + size_t(p) * 2);
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
  const ApplyPlane<T> plane = planes_for<T>(s).apply;
  const long planes = long(s.n) * s.c;
  const size_t xplane = size_t(s.h) * s.w, yplane = s.y_size() / size_t(planes);
#pragma omp parallel for schedule(static) if (worth_threads(s))
  for (long p = 0; p < planes; ++p) {
    const int ch = int(p % s.c);
    plane(s, BackwardAffine<T>(ch, mean, invstd, gamma, sum_dy, sum_dy_xhat, count), x + size_t(p) * xplane,
          dy + size_t(p) * yplane, argmax + size_t(p) * yplane, dx + size_t(p) * xplane);
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
