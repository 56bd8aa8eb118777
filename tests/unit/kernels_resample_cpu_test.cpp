// CPU resample kernels in double (upsampling2d, zero_padding2d, cropping2d): forwards
// against torch's definitions written out here, backwards against central differences,
// and a shard's part computed from its halo-extended rows equal to that part of the whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/resample.hpp"

#include "common/gradient_check.hpp"

namespace ht::cpu {
namespace {

using testing::check_grad;
using testing::dotv;
using testing::random_vec;
using testing::Vec;

// The whole image along both axes: outputs [0, out) of an input [0, in).
ResampleAxis whole(int in, int out, int factor = 1, int shift = 0) {
  ResampleAxis a;
  a.in = a.size = in;
  a.out = out;
  a.scale = float(1.0 / factor);
  a.shift = shift;
  return a;
}

ResampleGeom geom(Resample mode, int n, int c, ResampleAxis rows, ResampleAxis cols) {
  ResampleGeom g;
  g.mode = mode;
  g.n = n;
  g.c = c;
  g.rows = rows;
  g.cols = cols;
  return g;
}

// torch's upsample_bilinear2d source index and weights (align_corners=False) along one
// axis, in double.
void bilinear_source(int o, int factor, int in, int* i0, int* i1, double* lambda) {
  const double src = std::max((o + 0.5) / factor - 0.5, 0.0);
  *i0 = int(src);
  *i1 = *i0 < in - 1 ? *i0 + 1 : *i0;
  *lambda = src - *i0;
}

TEST(ResampleCpu, ForwardsMatchTheDefinitions) {
  std::mt19937_64 rng(31);
  const int n = 2, c = 3, h = 5, w = 7;
  const Vec x = random_vec(size_t(n) * c * h * w, rng);
  auto at = [&](int p, int r, int q) { return x[(size_t(p) * h + r) * w + q]; };
  {  // nearest, factors 2 x 3
    const ResampleGeom g = geom(Resample::Nearest, n, c, whole(h, 2 * h, 2), whole(w, 3 * w, 3));
    Vec y(g.y_size());
    resample_forward<double>(g, x.data(), y.data());
    for (int p = 0; p < n * c; ++p)
      for (int r = 0; r < 2 * h; ++r)
        for (int q = 0; q < 3 * w; ++q) ASSERT_EQ(y[(size_t(p) * 2 * h + r) * 3 * w + q], at(p, r / 2, q / 3));
  }
  {  // bilinear, factors 2 x 3
    const ResampleGeom g = geom(Resample::Bilinear, n, c, whole(h, 2 * h, 2), whole(w, 3 * w, 3));
    Vec y(g.y_size());
    resample_forward<double>(g, x.data(), y.data());
    for (int p = 0; p < n * c; ++p)
      for (int r = 0; r < 2 * h; ++r)
        for (int q = 0; q < 3 * w; ++q) {
          int r0, r1, q0, q1;
          double lr, lq;
          bilinear_source(r, 2, h, &r0, &r1, &lr);
          bilinear_source(q, 3, w, &q0, &q1, &lq);
          const double ref = (1 - lr) * ((1 - lq) * at(p, r0, q0) + lq * at(p, r0, q1)) +
                             lr * ((1 - lq) * at(p, r1, q0) + lq * at(p, r1, q1));
          ASSERT_NEAR(y[(size_t(p) * 2 * h + r) * 3 * w + q], ref, 1e-6) << r << "," << q;
        }
  }
  {  // zero padding [[2, 1], [0, 3]] and cropping [[1, 2], [2, 1]]
    const ResampleGeom pad = geom(Resample::Shift, n, c, whole(h, h + 3, 1, 2), whole(w, w + 3, 1, 0));
    Vec y(pad.y_size());
    resample_forward<double>(pad, x.data(), y.data());
    for (int p = 0; p < n * c; ++p)
      for (int r = 0; r < h + 3; ++r)
        for (int q = 0; q < w + 3; ++q) {
          const bool in = r >= 2 && r < h + 2 && q < w;
          ASSERT_EQ(y[(size_t(p) * (h + 3) + r) * (w + 3) + q], in ? at(p, r - 2, q) : 0.0);
        }
    const ResampleGeom crop = geom(Resample::Shift, n, c, whole(h, h - 3, 1, -1), whole(w, w - 3, 1, -2));
    Vec z(crop.y_size());
    resample_forward<double>(crop, x.data(), z.data());
    for (int p = 0; p < n * c; ++p)
      for (int r = 0; r < h - 3; ++r)
        for (int q = 0; q < w - 3; ++q) ASSERT_EQ(z[(size_t(p) * (h - 3) + r) * (w - 3) + q], at(p, r + 1, q + 2));
  }
}

TEST(ResampleCpu, BackwardIsTheGradient) {
  const ResampleGeom cases[] = {
      geom(Resample::Nearest, 2, 2, whole(4, 8, 2), whole(3, 9, 3)),
      geom(Resample::Bilinear, 2, 2, whole(4, 8, 2), whole(5, 15, 3)),
      geom(Resample::Bilinear, 1, 1, whole(1, 4, 4), whole(2, 4, 2)),
      geom(Resample::Shift, 2, 1, whole(4, 7, 1, 2), whole(5, 3, 1, -1)),
  };
  for (const ResampleGeom& g : cases) {
    std::mt19937_64 rng(32);
    Vec x = random_vec(g.x_size(), rng), r = random_vec(g.y_size(), rng), y(g.y_size()), dx(g.x_size(), 1e3);
    resample_backward<double>(g, r.data(), dx.data());
    check_grad("resample dx", x, dx, [&] {
      resample_forward<double>(g, x.data(), y.data());
      return dotv(y, r);
    });
  }
}

// A shard's output rows [o0, o0 + out) from the input rows [i0, i0 + in) it holds (owned
// plus halo) equal those rows of the whole image's output.
TEST(ResampleCpu, AShardsPartIsThatPartOfTheWhole) {
  std::mt19937_64 rng(33);
  const int h = 9, w = 4;
  const Vec x = random_vec(size_t(h) * w, rng);
  struct Case {
    Resample mode;
    int factor, shift, out_h, o0, out, i0, in;
  };
  const Case cases[] = {
      {Resample::Bilinear, 2, 0, 18, 8, 6, 3, 5},  // rows [8, 14) read image rows [3, 8)
      {Resample::Nearest, 3, 0, 27, 9, 9, 3, 3},
      {Resample::Shift, 1, 2, 12, 4, 5, 2, 5},      // zero padding 2 on top: rows [4, 9) read [2, 7)
      {Resample::Shift, 1, -3, 5, 1, 3, 4, 3},      // cropping 3 at the top
  };
  for (const Case& c : cases) {
    ResampleAxis all = whole(h, c.out_h, c.factor, c.shift);
    const ResampleGeom g = geom(c.mode, 1, 1, all, whole(w, c.mode == Resample::Shift ? w : w * c.factor, c.factor));
    Vec full(g.y_size());
    resample_forward<double>(g, x.data(), full.data());
    ResampleGeom part = g;
    part.rows.o0 = c.o0;
    part.rows.out = c.out;
    part.rows.i0 = c.i0;
    part.rows.in = c.in;
    const Vec xs(x.begin() + size_t(c.i0) * w, x.begin() + size_t(c.i0 + c.in) * w);
    Vec ys(part.y_size());
    resample_forward<double>(part, xs.data(), ys.data());
    const int wo = g.cols.out;
    for (int r = 0; r < c.out; ++r)
      for (int q = 0; q < wo; ++q) ASSERT_EQ(ys[size_t(r) * wo + q], full[size_t(c.o0 + r) * wo + q]) << r;
    // One row fewer of input than the part reads is refused, not read out of bounds.
    part.rows.in = c.in - 1;
    EXPECT_THROW(resample_forward<double>(part, xs.data(), ys.data()), std::invalid_argument);
  }
}

}  // namespace
}  // namespace ht::cpu
