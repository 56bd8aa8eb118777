// Plain-loop convolution. No im2col: work is split over (image, band of rows) so one
// task's input rows and output rows stay in cache while every channel pair visits them;
// the innermost loop is a row-long axpy or dot that the compiler vectorizes.
#include "kernels/cpu/conv.hpp"

#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/row_ops.hpp"

namespace ht::cpu {

void validate(const ConvGeom& g) {
  auto need = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("ConvGeom: ") + what);
  };
  need(g.n > 0 && g.cin > 0 && g.hin > 0 && g.win > 0 && g.cout > 0, "sizes must be > 0");
  need(g.kh > 0 && g.kw > 0, "kernel must be > 0");
  need(g.stride_h > 0 && g.stride_w > 0, "stride must be > 0");
  need(g.dil_h > 0 && g.dil_w > 0, "dilation must be > 0");
  need(g.groups > 0 && g.cin % g.groups == 0 && g.cout % g.groups == 0, "groups must divide cin and cout");
  need(g.pad_top >= 0 && g.pad_bottom >= 0 && g.pad_left >= 0 && g.pad_right >= 0,
       "padding must be >= 0");
  need(g.hin + g.pad_top + g.pad_bottom >= g.dil_h * (g.kh - 1) + 1 &&
           g.win + g.pad_left + g.pad_right >= g.dil_w * (g.kw - 1) + 1,
       "kernel extent larger than the padded input");
}

namespace {

constexpr int kBand = 4;  // output rows per task: a few KiB per channel, fits L1/L2

// Output columns [lo, hi) whose tap `k` lands inside [0, in): 0 <= o*s - pad + k*d < in.
struct Span {
  int lo, hi, in0;  // in0: input column of output column lo
};
inline Span tap_span(int out, int in, int s, int pad, int kd) {
  int lo = std::max(0, div_ceil(pad - kd, s));
  int hi = std::min(out, div_floor(in - 1 + pad - kd, s) + 1);
  return {lo, std::max(lo, hi), lo * s - pad + kd};
}

}  // namespace

namespace {

// The float tasks below also exist for AVX2 and AVX-512 (isa.hpp); each task body is
// always inlined into its ISA wrapper.

// One (image, band of output rows) task of the forward: y = bias + sum of row axpys.
template <class T>
__attribute__((always_inline)) inline void forward_task(const ConvGeom& g, const T* x, const T* w,
                                                        const T* bias, T* y, const Span* spans, int n,
                                                        int b) {
  const int ho = g.hout(), wo = g.wout();
  const size_t xplane = size_t(g.hin) * g.win, yplane = size_t(ho) * wo;
  const int oh0 = b * kBand, oh1 = std::min(ho, oh0 + kBand);
  const int cig = g.cin_per_group();
  for (int co = 0; co < g.cout; ++co) {
    T* yc = y + (size_t(n) * g.cout + co) * yplane;
    std::fill(yc + size_t(oh0) * wo, yc + size_t(oh1) * wo, bias ? bias[co] : T(0));
    const int c0 = co / g.cout_per_group() * cig;  // the group's first input channel
    for (int ci = 0; ci < cig; ++ci) {
      const T* xc = x + (size_t(n) * g.cin + c0 + ci) * xplane;
      const T* wc = w + (size_t(co) * cig + ci) * g.kh * g.kw;
      for (int oh = oh0; oh < oh1; ++oh)
        for (int r = 0; r < g.kh; ++r) {
          const int ih = oh * g.stride_h - g.pad_top + r * g.dil_h;
          if (ih < 0 || ih >= g.hin) continue;
          const T* xr = xc + size_t(ih) * g.win;
          T* yr = yc + size_t(oh) * wo;
          for (int k = 0; k < g.kw; ++k) {
            const Span& s = spans[k];
            axpy(s.hi - s.lo, wc[r * g.kw + k], xr + s.in0, g.stride_w, yr + s.lo, 1);
          }
        }
    }
  }
}

// The same task for 3x3 windows at stride 1 and dilation 1 (the usual first layer): each
// output element's 9 * cin terms are summed in a register in the order above (input
// channel, kernel row, kernel column, after the bias), so the result is the same, with
// one store of y instead of one load and store per term. Columns whose taps all lie in
// the input run vectorised; the few at the borders skip their outside taps as above.
template <class T>
__attribute__((always_inline)) inline void forward_task_3x3(const ConvGeom& g, const T* x, const T* w,
                                                            const T* bias, T* y, int n, int b) {
  const int ho = g.hout(), wo = g.wout();
  const size_t xplane = size_t(g.hin) * g.win, yplane = size_t(ho) * wo;
  const int oh0 = b * kBand, oh1 = std::min(ho, oh0 + kBand);
  const int cig = g.cin_per_group();
  // Output columns [lo, hi) read input columns j - pad_left + k, k < 3, all inside.
  const int lo = std::min(wo, g.pad_left), hi = std::max(lo, std::min(wo, g.win + g.pad_left - 2));
  for (int co = 0; co < g.cout; ++co) {
    T* yc = y + (size_t(n) * g.cout + co) * yplane;
    const int c0 = co / g.cout_per_group() * cig;
    const T b0 = bias ? bias[co] : T(0);
    for (int oh = oh0; oh < oh1; ++oh) {
      T* yr = yc + size_t(oh) * wo;
      auto border = [&](int j) {
        T acc = b0;
        for (int ci = 0; ci < cig; ++ci)
          for (int r = 0; r < 3; ++r) {
            const int ih = oh - g.pad_top + r;
            if (ih < 0 || ih >= g.hin) continue;
            const T* xr = x + (size_t(n) * g.cin + c0 + ci) * xplane + size_t(ih) * g.win;
            const T* wr = w + ((size_t(co) * cig + ci) * 3 + r) * 3;
            for (int k = 0; k < 3; ++k) {
              const int iw = j - g.pad_left + k;
              if (iw >= 0 && iw < g.win) acc += wr[k] * xr[iw];
            }
          }
        yr[j] = acc;
      };
      for (int j = 0; j < lo; ++j) border(j);
      for (int j = hi; j < wo; ++j) border(j);
      if (lo >= hi) continue;
      // Here lo == pad_left: output column lo + i reads input columns i, i + 1, i + 2.
      T* yo = yr + lo;
      const int m = hi - lo;
      for (int i = 0; i < m; ++i) yo[i] = b0;
      for (int ci = 0; ci < cig; ++ci) {
        const T* xc = x + (size_t(n) * g.cin + c0 + ci) * xplane;
        const T* wc = w + (size_t(co) * cig + ci) * 9;
        const int r0 = std::max(0, g.pad_top - oh), r1 = std::min(3, g.hin + g.pad_top - oh);
        const T* x0 = xc + size_t(oh - g.pad_top + r0) * g.win;
        if (r1 - r0 == 3) {
          const T w0 = wc[0], w1 = wc[1], w2 = wc[2], w3 = wc[3], w4 = wc[4], w5 = wc[5], w6 = wc[6],
                  w7 = wc[7], w8 = wc[8];
          const T *a = x0, *bb = x0 + g.win, *c = x0 + 2 * g.win;
#pragma omp simd
          for (int i = 0; i < m; ++i) {
            T acc = yo[i];
            acc += w0 * a[i];
            acc += w1 * a[i + 1];
            acc += w2 * a[i + 2];
            acc += w3 * bb[i];
            acc += w4 * bb[i + 1];
            acc += w5 * bb[i + 2];
            acc += w6 * c[i];
            acc += w7 * c[i + 1];
            acc += w8 * c[i + 2];
            yo[i] = acc;
          }
        } else {
          for (int r = r0; r < r1; ++r) {
            const T* xr = x0 + size_t(r - r0) * g.win;
            const T* wr = wc + r * 3;
#pragma omp simd
            for (int i = 0; i < m; ++i) {
              T acc = yo[i];
              acc += wr[0] * xr[i];
              acc += wr[1] * xr[i + 1];
              acc += wr[2] * xr[i + 2];
              yo[i] = acc;
            }
          }
        }
      }
    }
  }
}

// Whether the 3x3 stride-1 loops below (forward and weight gradient) serve this geometry.
inline bool plain_3x3(const ConvGeom& g) {
  return g.kh == 3 && g.kw == 3 && g.stride_h == 1 && g.stride_w == 1 && g.dil_h == 1 && g.dil_w == 1;
}

template <class T>
__attribute__((always_inline)) inline void forward_any(const ConvGeom& g, const T* x, const T* w, const T* bias,
                                                       T* y, const Span* sp, int n, int b) {
  if (plain_3x3(g))
    forward_task_3x3<T>(g, x, w, bias, y, n, b);
  else
    forward_task<T>(g, x, w, bias, y, sp, n, b);
}

template <class T>
using ForwardTask = void (*)(const ConvGeom&, const T*, const T*, const T*, T*, const Span*, int, int);
template <class T>
void forward_baseline(const ConvGeom& g, const T* x, const T* w, const T* bias, T* y, const Span* sp,
                      int n, int b) {
  forward_any<T>(g, x, w, bias, y, sp, n, b);
}
HT_AVX2 void forward_avx2(const ConvGeom& g, const float* x, const float* w, const float* bias,
                          float* y, const Span* sp, int n, int b) {
  forward_any<float>(g, x, w, bias, y, sp, n, b);
}
HT_AVX512 void forward_avx512(const ConvGeom& g, const float* x, const float* w, const float* bias,
                              float* y, const Span* sp, int n, int b) {
  forward_any<float>(g, x, w, bias, y, sp, n, b);
}
template <class T>
ForwardTask<T> forward_for_cpu() {
  return forward_baseline<T>;
}
template <>
ForwardTask<float> forward_for_cpu<float>() {
  return for_this_cpu<ForwardTask<float>>(forward_baseline<float>, forward_avx2, forward_avx512);
}

}  // namespace

bool conv_loops_vectorised() { return cpu_isa() != Isa::Baseline; }

template <class T>
void conv2d_forward(const ConvGeom& g, const T* x, const T* w, const T* bias, T* y) {
  validate(g);
  const int ho = g.hout(), bands = (ho + kBand - 1) / kBand;
  std::vector<Span> spans(g.kw);
  for (int k = 0; k < g.kw; ++k)
    spans[k] = tap_span(g.wout(), g.win, g.stride_w, g.pad_left, k * g.dil_w);
  static const ForwardTask<T> task = forward_for_cpu<T>();

#pragma omp parallel for collapse(2) schedule(static) if (worth_parallel(g))
  for (int n = 0; n < g.n; ++n)
    for (int b = 0; b < bands; ++b) task(g, x, w, bias, y, spans.data(), n, b);
}

// Gather by input row: each task owns a band of dx rows for every channel, so the
// scatter of the adjoint never races.
template <class T>
void conv2d_backward_data(const ConvGeom& g, const T* dy, const T* w, T* dx) {
  validate(g);
  const int ho = g.hout(), wo = g.wout(), bands = (g.hin + kBand - 1) / kBand;
  const size_t xplane = size_t(g.hin) * g.win, yplane = size_t(ho) * wo;
  std::vector<Span> spans(g.kw);
  for (int k = 0; k < g.kw; ++k)
    spans[k] = tap_span(wo, g.win, g.stride_w, g.pad_left, k * g.dil_w);

#pragma omp parallel for collapse(2) schedule(static) if (worth_parallel(g))
  for (int n = 0; n < g.n; ++n)
    for (int b = 0; b < bands; ++b) {
      const int ih0 = b * kBand, ih1 = std::min(g.hin, ih0 + kBand);
      const int cig = g.cin_per_group(), cog = g.cout_per_group();
      for (int ci = 0; ci < g.cin; ++ci) {
        T* xc = dx + (size_t(n) * g.cin + ci) * xplane;
        std::fill(xc + size_t(ih0) * g.win, xc + size_t(ih1) * g.win, T(0));
        const int group = ci / cig;
        for (int co = group * cog; co < (group + 1) * cog; ++co) {
          const T* yc = dy + (size_t(n) * g.cout + co) * yplane;
          const T* wc = w + (size_t(co) * cig + ci % cig) * g.kh * g.kw;
          for (int ih = ih0; ih < ih1; ++ih)
            for (int r = 0; r < g.kh; ++r) {
              // ih = oh*s - pad + r*d  =>  oh = (ih + pad - r*d) / s when divisible.
              const int num = ih + g.pad_top - r * g.dil_h;
              if (num < 0 || num % g.stride_h) continue;
              const int oh = num / g.stride_h;
              if (oh >= ho) continue;
              const T* yr = yc + size_t(oh) * wo;
              T* xr = xc + size_t(ih) * g.win;
              for (int k = 0; k < g.kw; ++k) {
                const Span& s = spans[k];
                axpy(s.hi - s.lo, wc[r * g.kw + k], yr + s.lo, 1, xr + s.in0, g.stride_w);
              }
            }
        }
      }
    }
}

namespace {

// The work of one (image, band of output rows) task of the weight gradient, added to the
// thread's double slot `a` (dw, then dbias). Always inlined, so each ISA wrapper below
// compiles it with its own vector width.
template <class T>
__attribute__((always_inline)) inline void bwd_weights_task(const ConvGeom& g, const T* x, const T* dy,
                                                            const Span* spans, int n, int b,
                                                            double* a) {
  const int ho = g.hout(), wo = g.wout();
  const size_t xplane = size_t(g.hin) * g.win, yplane = size_t(ho) * wo, nw = g.w_size();
  const int oh0 = b * kBand, oh1 = std::min(ho, oh0 + kBand);
  const int cig = g.cin_per_group();
  for (int co = 0; co < g.cout; ++co) {
    const T* yc = dy + (size_t(n) * g.cout + co) * yplane;
    for (int oh = oh0; oh < oh1; ++oh) a[nw + co] += sum(wo, yc + size_t(oh) * wo);
    const int c0 = co / g.cout_per_group() * cig;
    for (int ci = 0; ci < cig; ++ci) {
      const T* xc = x + (size_t(n) * g.cin + c0 + ci) * xplane;
      double* ac = a + (size_t(co) * cig + ci) * g.kh * g.kw;
      for (int oh = oh0; oh < oh1; ++oh)
        for (int r = 0; r < g.kh; ++r) {
          const int ih = oh * g.stride_h - g.pad_top + r * g.dil_h;
          if (ih < 0 || ih >= g.hin) continue;
          const T* xr = xc + size_t(ih) * g.win;
          const T* yr = yc + size_t(oh) * wo;
          for (int k = 0; k < g.kw; ++k) {
            const Span& s = spans[k];
            ac[r * g.kw + k] += dot(s.hi - s.lo, yr + s.lo, xr + s.in0, g.stride_w);
          }
        }
    }
  }
}

// The same task for 3x3 windows at stride 1 and dilation 1: an output row's 9 sums (3
// input rows x 3 taps) in one pass over dy, each dy element loaded once instead of 9
// times; a tap's sum still covers its whole span in T and goes to double once a row, the
// columns outside the interior added after it.
template <class T>
__attribute__((always_inline)) inline void bwd_weights_task_3x3(const ConvGeom& g, const T* x, const T* dy,
                                                                const Span* spans, int n, int b, double* a) {
  const int ho = g.hout(), wo = g.wout();
  const size_t xplane = size_t(g.hin) * g.win, yplane = size_t(ho) * wo, nw = g.w_size();
  const int oh0 = b * kBand, oh1 = std::min(ho, oh0 + kBand);
  const int cig = g.cin_per_group();
  const int lo = std::max({spans[0].lo, spans[1].lo, spans[2].lo});
  const int hi = std::max(lo, std::min({spans[0].hi, spans[1].hi, spans[2].hi}));
  // lo == pad_left: output column lo + i reads input columns i, i + 1, i + 2.
  const int m = hi - lo, pl = g.pad_left;
  for (int co = 0; co < g.cout; ++co) {
    const T* yc = dy + (size_t(n) * g.cout + co) * yplane;
    for (int oh = oh0; oh < oh1; ++oh) a[nw + co] += sum(wo, yc + size_t(oh) * wo);
    const int c0 = co / g.cout_per_group() * cig;
    for (int ci = 0; ci < cig; ++ci) {
      const T* xc = x + (size_t(n) * g.cin + c0 + ci) * xplane;
      double* ac = a + (size_t(co) * cig + ci) * 9;
      for (int oh = oh0; oh < oh1; ++oh) {
        const T* yr = yc + size_t(oh) * wo;
        const T* yo = yr + std::min(lo, wo);  // read only when m > 0, where lo < wo
        const int r0 = std::max(0, g.pad_top - oh), r1 = std::min(3, g.hin + g.pad_top - oh);
        if (r0 >= r1) continue;
        const T* x0 = xc + size_t(oh - g.pad_top + r0) * g.win;  // input row of kernel row r0
        T s[9] = {};
        if (r1 - r0 == 3) {
          const T *p = x0, *q = x0 + g.win, *r = x0 + 2 * g.win;
          T s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0, s8 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3, s4, s5, s6, s7, s8)
          for (int i = 0; i < m; ++i) {
            const T d = yo[i];
            s0 += d * p[i], s1 += d * p[i + 1], s2 += d * p[i + 2];
            s3 += d * q[i], s4 += d * q[i + 1], s5 += d * q[i + 2];
            s6 += d * r[i], s7 += d * r[i + 1], s8 += d * r[i + 2];
          }
          s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3, s[4] = s4, s[5] = s5, s[6] = s6, s[7] = s7, s[8] = s8;
        } else {
          for (int kr = r0; kr < r1; ++kr) {
            const T* p = x0 + size_t(kr - r0) * g.win;
            T s0 = 0, s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s0, s1, s2)
            for (int i = 0; i < m; ++i) {
              const T d = yo[i];
              s0 += d * p[i], s1 += d * p[i + 1], s2 += d * p[i + 2];
            }
            s[kr * 3] = s0, s[kr * 3 + 1] = s1, s[kr * 3 + 2] = s2;
          }
        }
        for (int kr = r0; kr < r1; ++kr) {
          const T* p = x0 + size_t(kr - r0) * g.win;
          for (int k = 0; k < 3; ++k) {
            T& sk = s[kr * 3 + k];
            for (int j = spans[k].lo; j < std::min(lo, spans[k].hi); ++j) sk += yr[j] * p[j - pl + k];
            for (int j = std::max(hi, spans[k].lo); j < spans[k].hi; ++j) sk += yr[j] * p[j - pl + k];
            ac[kr * 3 + k] += double(sk);
          }
        }
      }
    }
  }
}

template <class T>
__attribute__((always_inline)) inline void bwd_weights_any(const ConvGeom& g, const T* x, const T* dy,
                                                           const Span* sp, int n, int b, double* a) {
  if (plain_3x3(g))
    bwd_weights_task_3x3<T>(g, x, dy, sp, n, b, a);
  else
    bwd_weights_task<T>(g, x, dy, sp, n, b, a);
}

template <class T>
using BwdWeightsTask = void (*)(const ConvGeom&, const T*, const T*, const Span*, int, int, double*);

template <class T>
void bwd_weights_portable(const ConvGeom& g, const T* x, const T* dy, const Span* sp, int n, int b,
                          double* a) {
  bwd_weights_any<T>(g, x, dy, sp, n, b, a);
}
HT_AVX2 void bwd_weights_avx2(const ConvGeom& g, const float* x, const float* dy, const Span* sp, int n, int b,
                              double* a) {
  bwd_weights_any<float>(g, x, dy, sp, n, b, a);
}
HT_AVX512 void bwd_weights_avx512(const ConvGeom& g, const float* x, const float* dy, const Span* sp, int n,
                                  int b, double* a) {
  bwd_weights_any<float>(g, x, dy, sp, n, b, a);
}

template <class T>
BwdWeightsTask<T> bwd_weights_for_cpu() {
  return bwd_weights_portable<T>;
}
template <>
BwdWeightsTask<float> bwd_weights_for_cpu<float>() {
  return for_this_cpu<BwdWeightsTask<float>>(bwd_weights_portable<float>, bwd_weights_avx2, bwd_weights_avx512);
}

}  // namespace

// Each thread accumulates dW (in double) over its bands into a private slot; slots are
// summed in thread order, so the result is deterministic for a given thread count.
template <class T>
void conv2d_backward_weights(const ConvGeom& g, const T* x, const T* dy, T* dw, T* dbias) {
  validate(g);
  const int ho = g.hout(), wo = g.wout(), bands = (ho + kBand - 1) / kBand;
  const size_t nw = g.w_size(), slot = nw + g.cout;
  std::vector<Span> spans(g.kw);
  for (int k = 0; k < g.kw; ++k)
    spans[k] = tap_span(wo, g.win, g.stride_w, g.pad_left, k * g.dil_w);
  const int nthr =
      worth_parallel(g) ? std::max(1, std::min(omp_get_max_threads(), g.n * bands)) : 1;
  std::vector<double> acc(size_t(nthr) * slot, 0.0);
  static const BwdWeightsTask<T> task = bwd_weights_for_cpu<T>();

#pragma omp parallel num_threads(nthr)
  {
    double* a = acc.data() + size_t(omp_get_thread_num()) * slot;
#pragma omp for collapse(2) schedule(static)
    for (int n = 0; n < g.n; ++n)
      for (int b = 0; b < bands; ++b) task(g, x, dy, spans.data(), n, b, a);
  }
  add_thread_slots(acc, nthr, nw, slot, dw, dbias);
}

template void conv2d_forward<float>(const ConvGeom&, const float*, const float*, const float*,
                                    float*);
template void conv2d_forward<double>(const ConvGeom&, const double*, const double*, const double*,
                                     double*);
template void conv2d_backward_data<float>(const ConvGeom&, const float*, const float*, float*);
template void conv2d_backward_data<double>(const ConvGeom&, const double*, const double*, double*);
template void conv2d_backward_weights<float>(const ConvGeom&, const float*, const float*, float*,
                                             float*);
template void conv2d_backward_weights<double>(const ConvGeom&, const double*, const double*,
                                              double*, double*);

}  // namespace ht::cpu
