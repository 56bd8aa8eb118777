// Float kernels against references in double, shared by the kernel tests: random inputs
// exactly representable in float, the elementwise comparison, a convolution geometry and
// its name.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/gradient_check.hpp"
#include "kernels/geometry.hpp"

namespace ht::testing {

using VecF = std::vector<float>;

// Uniform in [-1, 1), each value exactly representable in float.
inline Vec random_float_vec(size_t n, std::mt19937_64& rng) {
  Vec v = random_vec(n, rng);
  for (auto& x : v) x = double(float(x));
  return v;
}
inline VecF to_float(const Vec& v) { return VecF(v.begin(), v.end()); }

// |a - r| <= atol + rtol |r| everywhere; reports the worst element.
inline void expect_close(const char* what, const VecF& a, const Vec& r, double atol, double rtol,
                         const std::string& ctx) {
  ASSERT_EQ(a.size(), r.size()) << what;
  double worst = 0;
  size_t wi = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const double ex = std::fabs(a[i] - r[i]) - (atol + rtol * std::fabs(r[i]));
    if (ex > worst || std::isnan(a[i])) worst = std::isnan(a[i]) ? 1 : ex, wi = i;
  }
  EXPECT_LE(worst, 0.0) << what << " " << ctx << ": element " << wi << " got " << a[wi] << " want "
                        << r[wi];
}

inline ConvGeom geom(int n, int cin, int h, int w, int cout, int kh, int kw, int sh, int sw, int dh, int dw,
                     int pt, int pb, int pl, int pr) {
  ConvGeom g;
  g.n = n, g.cin = cin, g.hin = h, g.win = w, g.cout = cout, g.kh = kh, g.kw = kw;
  g.stride_h = sh, g.stride_w = sw, g.dil_h = dh, g.dil_w = dw;
  g.pad_top = pt, g.pad_bottom = pb, g.pad_left = pl, g.pad_right = pr;
  return g;
}

inline std::string str(const ConvGeom& g) {
  char b[256];
  std::snprintf(b, sizeof b, "n%d ci%d %dx%d co%d k%dx%d s%d,%d d%d,%d pad t%d b%d l%d r%d", g.n, g.cin, g.hin,
                g.win, g.cout, g.kh, g.kw, g.stride_h, g.stride_w, g.dil_h, g.dil_w, g.pad_top, g.pad_bottom,
                g.pad_left, g.pad_right);
  return b;
}

}  // namespace ht::testing
