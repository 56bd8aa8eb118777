#include "kernels/cpu/resample.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace ht::cpu {

namespace {

std::vector<ResampleTaps> taps_of(Resample mode, const ResampleAxis& a) {
  std::vector<ResampleTaps> taps(size_t(a.out));
  for (int o = 0; o < a.out; ++o) taps[size_t(o)] = resample_taps(mode, a, o);
  return taps;
}

bool inside(int i, int n) { return i >= -1 && i < n; }  // -1: no tap

}  // namespace

void validate(const ResampleGeom& g) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("ResampleGeom: " + what);
  };
  need(g.n > 0 && g.c > 0, "sizes must be > 0");
  for (const ResampleAxis* a : {&g.rows, &g.cols}) {
    need(a->out > 0 && a->in > 0 && a->size > 0 && a->scale > 0.f, "sizes must be > 0");
    for (int o = 0; o < a->out; ++o) {
      const ResampleTaps t = resample_taps(g.mode, *a, o);
      need(inside(t.i0, a->in) && inside(t.i1, a->in),
           "output " + std::to_string(a->o0 + o) + " reads outside the local input");
    }
  }
}

template <class T>
void resample_forward(const ResampleGeom& g, const T* x, T* y) {
  validate(g);
  const std::vector<ResampleTaps> tr = taps_of(g.mode, g.rows), tc = taps_of(g.mode, g.cols);
  const int hi = g.rows.in, wi = g.cols.in, ho = g.rows.out, wo = g.cols.out;
#pragma omp parallel for schedule(static) if (g.y_size() > (1u << 16))
  for (int p = 0; p < g.n * g.c; ++p) {
    const T* xp = x + size_t(p) * hi * wi;
    T* yp = y + size_t(p) * ho * wo;
    for (int r = 0; r < ho; ++r) {
      const ResampleTaps& a = tr[size_t(r)];
      for (int q = 0; q < wo; ++q) {
        const ResampleTaps& b = tc[size_t(q)];
        T v = 0;
        if (a.i0 >= 0 && b.i0 >= 0) v += T(a.w0) * T(b.w0) * xp[size_t(a.i0) * wi + b.i0];
        if (a.i0 >= 0 && b.i1 >= 0) v += T(a.w0) * T(b.w1) * xp[size_t(a.i0) * wi + b.i1];
        if (a.i1 >= 0 && b.i0 >= 0) v += T(a.w1) * T(b.w0) * xp[size_t(a.i1) * wi + b.i0];
        if (a.i1 >= 0 && b.i1 >= 0) v += T(a.w1) * T(b.w1) * xp[size_t(a.i1) * wi + b.i1];
        yp[size_t(r) * wo + q] = v;
      }
    }
  }
}

// The adjoint, scattered plane by plane in output order: deterministic.
template <class T>
void resample_backward(const ResampleGeom& g, const T* dy, T* dx) {
  validate(g);
  const std::vector<ResampleTaps> tr = taps_of(g.mode, g.rows), tc = taps_of(g.mode, g.cols);
  const int hi = g.rows.in, wi = g.cols.in, ho = g.rows.out, wo = g.cols.out;
#pragma omp parallel for schedule(static) if (g.y_size() > (1u << 16))
  for (int p = 0; p < g.n * g.c; ++p) {
    T* xp = dx + size_t(p) * hi * wi;
    const T* yp = dy + size_t(p) * ho * wo;
    std::fill(xp, xp + size_t(hi) * wi, T(0));
    for (int r = 0; r < ho; ++r) {
      const ResampleTaps& a = tr[size_t(r)];
      for (int q = 0; q < wo; ++q) {
        const ResampleTaps& b = tc[size_t(q)];
        const T d = yp[size_t(r) * wo + q];
        if (a.i0 >= 0 && b.i0 >= 0) xp[size_t(a.i0) * wi + b.i0] += T(a.w0) * T(b.w0) * d;
        if (a.i0 >= 0 && b.i1 >= 0) xp[size_t(a.i0) * wi + b.i1] += T(a.w0) * T(b.w1) * d;
        if (a.i1 >= 0 && b.i0 >= 0) xp[size_t(a.i1) * wi + b.i0] += T(a.w1) * T(b.w0) * d;
        if (a.i1 >= 0 && b.i1 >= 0) xp[size_t(a.i1) * wi + b.i1] += T(a.w1) * T(b.w1) * d;
      }
    }
  }
}

template void resample_forward<float>(const ResampleGeom&, const float*, float*);
template void resample_forward<double>(const ResampleGeom&, const double*, double*);
template void resample_backward<float>(const ResampleGeom&, const float*, float*);
template void resample_backward<double>(const ResampleGeom&, const double*, double*);

}  // namespace ht::cpu
