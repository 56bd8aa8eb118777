// CPU kernels in double: every backward is checked against central differences of its
// forward (caffe's gradient checker), and every forward against an independent direct
// formula or hand-computed values, so a wrong forward cannot hide behind a consistent
// backward.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/conv.hpp"
#include "kernels/cpu/dense.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/loss.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/pool.hpp"

#include "common/gradient_check.hpp"
#include "common/kernel_checks.hpp"

namespace ht::cpu {
namespace {

using testing::check_grad;
using testing::dotv;
using testing::random_vec;
using testing::Vec;

// ---------------------------------------------------------------------------- conv

using testing::geom;
using testing::str;

std::vector<ConvGeom> conv_geoms() {
  std::vector<ConvGeom> gs = {
      geom(2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),  // 'same', odd sizes
      geom(1, 2, 9, 8, 3, 3, 3, 2, 2, 1, 1, 0, 1, 0, 1),  // TF 'same' stride 2: pad bottom/right
      geom(2, 2, 8, 9, 2, 3, 2, 1, 1, 2, 2, 2, 1, 0, 3),  // dilation 2, asymmetric
      geom(1, 3, 7, 7, 2, 1, 1, 2, 2, 1, 1, 0, 0, 0, 0),  // 1x1 stride 2
      geom(2, 1, 6, 5, 3, 5, 3, 2, 1, 1, 2, 3, 2, 1, 0),  // mixed strides and dilations
      geom(1, 2, 5, 5, 2, 2, 2, 3, 2, 2, 1, 0, 2, 1, 1),  // stride 3, even kernel
      geom(1, 2, 4, 5, 2, 2, 2, 1, 1, 1, 1, 3, 0, 0, 3),  // padding wider than the kernel
      geom(1, 2, 6, 11, 3, 3, 3, 1, 1, 1, 1, 2, 0, 0, 1),  // 3x3 stride 1 (its own loop), asymmetric
      geom(1, 1, 5, 2, 2, 3, 3, 1, 1, 1, 1, 1, 2, 2, 1),   // 3x3 stride 1, no column reads all taps
  };
  std::mt19937_64 rng(7);
  auto u = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  while (gs.size() < 13) {
    ConvGeom g = geom(u(1, 2), u(1, 3), u(3, 9), u(3, 9), u(1, 3), u(1, 4), u(1, 4), u(1, 3),
                      u(1, 3), u(1, 2), u(1, 2), u(0, 2), u(0, 2), u(0, 2), u(0, 2));
    if (g.hin + g.pad_top + g.pad_bottom >= g.dil_h * (g.kh - 1) + 1 &&
        g.win + g.pad_left + g.pad_right >= g.dil_w * (g.kw - 1) + 1)
      gs.push_back(g);
  }
  // Grouped: depthwise (one group per input channel, depth multiplier 2 and 1), and two
  // groups of two input channels.
  ConvGeom dw = geom(2, 3, 8, 7, 6, 3, 3, 2, 1, 1, 2, 1, 1, 2, 2);
  dw.groups = 3;
  ConvGeom dw1 = geom(1, 4, 9, 9, 4, 5, 3, 1, 1, 1, 1, 2, 2, 1, 1);
  dw1.groups = 4;
  ConvGeom two = geom(1, 4, 6, 7, 6, 3, 2, 1, 2, 1, 1, 0, 1, 1, 0);
  two.groups = 2;
  ConvGeom dw3 = geom(2, 3, 7, 9, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1);  // depthwise 3x3 stride 1
  dw3.groups = 3;
  gs.insert(gs.end(), {dw, dw1, two, dw3});
  return gs;
}

// The definition, written independently of the kernel: a zero-padded input read.
Vec conv_direct(const ConvGeom& g, const Vec& x, const Vec& w, const Vec& b) {
  const int ho = g.hout(), wo = g.wout();
  Vec y(g.y_size());
  for (int n = 0; n < g.n; ++n)
    for (int co = 0; co < g.cout; ++co)
      for (int oh = 0; oh < ho; ++oh)
        for (int ow = 0; ow < wo; ++ow) {
          double s = b.empty() ? 0 : b[co];
          // Output channel co of group co / (cout / groups) reads that group's inputs.
          const int per_group = g.cin / g.groups, first = co / (g.cout / g.groups) * per_group;
          for (int ci = 0; ci < per_group; ++ci)
            for (int r = 0; r < g.kh; ++r)
              for (int k = 0; k < g.kw; ++k) {
                const int ih = oh * g.stride_h - g.pad_top + r * g.dil_h;
                const int iw = ow * g.stride_w - g.pad_left + k * g.dil_w;
                if (ih < 0 || ih >= g.hin || iw < 0 || iw >= g.win) continue;
                s += x[((n * g.cin + first + ci) * g.hin + ih) * g.win + iw] *
                     w[((co * per_group + ci) * g.kh + r) * g.kw + k];
              }
          y[((n * g.cout + co) * ho + oh) * wo + ow] = s;
        }
  return y;
}

TEST(ConvCpu, HandComputedCrossCorrelation) {
  // x = 1..9 in a 3x3 image, w = [[1,2],[3,4]]: cross-correlation gives 37 at (0,0);
  // a flipped kernel (true convolution) would give 23.
  ConvGeom g = geom(1, 1, 3, 3, 1, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  Vec x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w = {1, 2, 3, 4}, b = {0.5}, y(g.y_size());
  conv2d_forward<double>(g, x.data(), w.data(), b.data(), y.data());
  EXPECT_EQ(y, (Vec{37.5, 47.5, 67.5, 77.5}));
  // Asymmetric padding: one row on top only, so the first output row sees padding.
  g.pad_top = 1;
  Vec y2(g.y_size());
  conv2d_forward<double>(g, x.data(), w.data(), nullptr, y2.data());
  EXPECT_EQ(y2, (Vec{3 * 1 + 4 * 2, 3 * 2 + 4 * 3, 37, 47, 67, 77}));
}

TEST(ConvCpu, ForwardMatchesDefinition) {
  std::mt19937_64 rng(1);
  for (const ConvGeom& g : conv_geoms()) {
    Vec x = random_vec(g.x_size(), rng), w = random_vec(g.w_size(), rng),
        b = random_vec(g.cout, rng), y(g.y_size()), yn(g.y_size());
    conv2d_forward<double>(g, x.data(), w.data(), b.data(), y.data());
    Vec r = conv_direct(g, x, w, b);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], r[i], 1e-12) << str(g) << " i=" << i;
    conv2d_forward<double>(g, x.data(), w.data(), nullptr, yn.data());
    Vec rn = conv_direct(g, x, w, {});
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(yn[i], rn[i], 1e-12) << str(g);
  }
}

TEST(ConvCpu, GradientCheck) {
  std::mt19937_64 rng(2);
  for (const ConvGeom& g : conv_geoms()) {
    SCOPED_TRACE(str(g));
    Vec x = random_vec(g.x_size(), rng), w = random_vec(g.w_size(), rng),
        b = random_vec(g.cout, rng), r = random_vec(g.y_size(), rng), y(g.y_size());
    auto loss = [&] {
      conv2d_forward<double>(g, x.data(), w.data(), b.data(), y.data());
      return dotv(y, r);
    };
    // Poison the outputs: the kernels must overwrite, not accumulate.
    Vec dx(g.x_size(), 1e3), dw(g.w_size(), 1e3), db(g.cout, 1e3);
    conv2d_backward_data<double>(g, r.data(), w.data(), dx.data());
    conv2d_backward_weights<double>(g, x.data(), r.data(), dw.data(), db.data());
    check_grad("dx", x, dx, loss);
    check_grad("dw", w, dw, loss);
    check_grad("dbias", b, db, loss);
    Vec dw2(g.w_size());
    conv2d_backward_weights<double>(g, x.data(), r.data(), dw2.data(), nullptr);
    EXPECT_EQ(dw, dw2);
  }
}

TEST(ConvCpu, FloatLoopsMatchDouble) {
  std::mt19937_64 rng(3);
  for (const ConvGeom& g : conv_geoms()) {
    Vec x = random_vec(g.x_size(), rng), w = random_vec(g.w_size(), rng),
        b = random_vec(g.cout, rng), dy = random_vec(g.y_size(), rng);
    Vec y(g.y_size()), dx(g.x_size()), dw(g.w_size()), db(g.cout);
    conv2d_forward<double>(g, x.data(), w.data(), b.data(), y.data());
    conv2d_backward_data<double>(g, dy.data(), w.data(), dx.data());
    conv2d_backward_weights<double>(g, x.data(), dy.data(), dw.data(), db.data());
    auto f = [](const Vec& v) { return std::vector<float>(v.begin(), v.end()); };
    auto xf = f(x), wf = f(w), bf = f(b), dyf = f(dy);
    std::vector<float> yf(y.size()), dxf(dx.size()), dwf(dw.size()), dbf(db.size());
    conv2d_forward<float>(g, xf.data(), wf.data(), bf.data(), yf.data());
    conv2d_backward_data<float>(g, dyf.data(), wf.data(), dxf.data());
    conv2d_backward_weights<float>(g, xf.data(), dyf.data(), dwf.data(), dbf.data());
    auto near = [&](const char* what, const std::vector<float>& a, const Vec& r) {
      for (size_t i = 0; i < r.size(); ++i)
        ASSERT_LE(std::fabs(a[i] - r[i]), 1e-5 + 1e-5 * std::fabs(r[i])) << what << " " << str(g);
    };
    near("y", yf, y), near("dx", dxf, dx), near("dw", dwf, dw), near("db", dbf, db);
  }
}

TEST(ConvCpu, RejectsBadGeometry) {
  std::vector<double> buf(64);
  ConvGeom g = geom(1, 1, 2, 2, 1, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0);  // 3x3 kernel on 2x2
  EXPECT_THROW(conv2d_forward<double>(g, buf.data(), buf.data(), nullptr, buf.data()),
               std::invalid_argument);
  g = geom(1, 1, 4, 4, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0);  // stride 0
  EXPECT_THROW(validate(g), std::invalid_argument);
}

// ---------------------------------------------------------------------------- pool

PoolGeom pgeom(int n, int c, int h, int w, int kh, int kw, int sh, int sw, int pt, int pb, int pl,
               int pr) {
  PoolGeom g;
  g.n = n, g.c = c, g.hin = h, g.win = w, g.kh = kh, g.kw = kw, g.stride_h = sh, g.stride_w = sw;
  g.pad_top = pt, g.pad_bottom = pb, g.pad_left = pl, g.pad_right = pr;
  return g;
}

std::vector<PoolGeom> pool_geoms() {
  return {pgeom(2, 3, 6, 6, 2, 2, 2, 2, 0, 0, 0, 0), pgeom(1, 2, 7, 5, 2, 2, 2, 2, 0, 0, 0, 0),
          pgeom(2, 1, 7, 8, 3, 3, 2, 2, 1, 1, 1, 1), pgeom(1, 2, 5, 7, 3, 2, 1, 2, 0, 1, 1, 0),
          pgeom(1, 1, 9, 6, 3, 3, 1, 1, 1, 0, 0, 1), pgeom(2, 2, 5, 5, 4, 3, 3, 2, 2, 1, 1, 1)};
}

// Distinct values (a shuffled ramp) so no window has a tie that a nudge could flip.
Vec distinct_vec(size_t n, std::mt19937_64& rng) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = -1.0 + 2.0 * double(i) / double(n);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

TEST(PoolCpu, MaxGradientCheck) {
  std::mt19937_64 rng(4);
  for (const PoolGeom& g : pool_geoms()) {
    Vec x = distinct_vec(g.x_size(), rng), r = random_vec(g.y_size(), rng), y(g.y_size());
    Vec dx(g.x_size(), 1e3);
    max_pool_backward<double>(g, x.data(), r.data(), dx.data());
    check_grad(
        "maxpool dx", x, dx,
        [&] {
          max_pool_forward<double>(g, x.data(), y.data());
          return dotv(y, r);
        },
        1e-6);
  }
}

TEST(PoolCpu, AvgGradientCheck) {
  std::mt19937_64 rng(5);
  for (const PoolGeom& g : pool_geoms()) {
    Vec x = random_vec(g.x_size(), rng), r = random_vec(g.y_size(), rng), y(g.y_size());
    Vec dx(g.x_size(), 1e3);
    avg_pool_backward<double>(g, r.data(), dx.data());
    check_grad("avgpool dx", x, dx, [&] {
      avg_pool_forward<double>(g, x.data(), y.data());
      return dotv(y, r);
    });
  }
}

TEST(PoolCpu, MaxTiesGoToFirstInScanOrderAndPaddingNeverWins) {
  // 1 plane 2x4, window 2x2 stride 2: left window [[5,5],[5,5]] -> (0,0);
  // right window [[1,3],[3,2]] -> (0,3), the first 3 in row-major order.
  PoolGeom g = pgeom(1, 1, 2, 4, 2, 2, 2, 2, 0, 0, 0, 0);
  Vec x = {5, 5, 1, 3, 5, 5, 3, 2}, y(2), dx(8, 7.0), dy = {10, 20};
  max_pool_forward<double>(g, x.data(), y.data());
  EXPECT_EQ(y, (Vec{5, 3}));
  max_pool_backward<double>(g, x.data(), dy.data(), dx.data());
  EXPECT_EQ(dx, (Vec{10, 0, 0, 20, 0, 0, 0, 0}));
  // Overlapping windows (3x3 stride 1, pad 1) over a constant image: every window's
  // first in-image element gets its gradient, and they add up.
  PoolGeom o = pgeom(1, 1, 2, 2, 3, 3, 1, 1, 1, 1, 1, 1);
  Vec c = {-2, -2, -2, -2}, yc(4), dyc = {1, 2, 4, 8}, dxc(4);
  max_pool_forward<double>(o, c.data(), yc.data());
  EXPECT_EQ(yc, (Vec{-2, -2, -2, -2}));  // all negative: padding (-inf) never wins
  max_pool_backward<double>(o, c.data(), dyc.data(), dxc.data());
  EXPECT_EQ(dxc, (Vec{15, 0, 0, 0}));  // every window starts at (0,0)
}

TEST(PoolCpu, AvgExcludesPadding) {
  // 3x3 image 1..9, window 2x2 stride 2, pad 1 each side -> 2x2 output.
  PoolGeom g = pgeom(1, 1, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1);
  Vec x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, y(4);
  avg_pool_forward<double>(g, x.data(), y.data());
  EXPECT_EQ(y, (Vec{1, (2 + 3) / 2.0, (4 + 7) / 2.0, (5 + 6 + 8 + 9) / 4.0}));
}

// ---------------------------------------------------------------------------- dense

TEST(DenseCpu, GradientCheck) {
  std::mt19937_64 rng(11);
  const int n = 3, in = 4, out = 5;
  Vec x = random_vec(n * in, rng), W = random_vec(in * out, rng), b = random_vec(out, rng),
      r = random_vec(n * out, rng), y(n * out);
  dense_forward<double>(n, in, out, x.data(), W.data(), b.data(), y.data());
  EXPECT_NEAR(y[1 * out + 2], x[4] * W[2] + x[5] * W[7] + x[6] * W[12] + x[7] * W[17] + b[2],
              1e-12);  // y = x W + b with W [in][out]
  auto loss = [&] {
    dense_forward<double>(n, in, out, x.data(), W.data(), b.data(), y.data());
    return dotv(y, r);
  };
  Vec dx(x.size(), 1e3), dW(W.size(), 1e3), db(out, 1e3);
  dense_backward<double>(n, in, out, x.data(), W.data(), r.data(), dx.data(), dW.data(), db.data());
  check_grad("dense dx", x, dx, loss);
  check_grad("dense dW", W, dW, loss);
  check_grad("dense db", b, db, loss);
}

// ---------------------------------------------------------------------------- losses

TEST(LossCpu, SoftmaxXent) {
  std::mt19937_64 rng(12);
  const int n = 4, k = 3;
  Vec z = random_vec(n * k, rng, -3, 3), g(z.size());
  std::vector<int32_t> labels = {0, 2, 1, 2};
  softmax_xent<double>(n, k, z.data(), labels.data(), 1.0, g.data());
  check_grad("xent", z, g,
             [&] { return softmax_xent<double>(n, k, z.data(), labels.data(), 1, nullptr); });
  Vec eq(6, 0.7);  // equal logits: log k per sample
  EXPECT_NEAR(softmax_xent<double>(2, 3, eq.data(), labels.data(), 1, nullptr), 2 * std::log(3.0),
              1e-12);
  Vec big = {1000, 0, -1000}, gb(3);  // stable for huge logits
  EXPECT_NEAR(softmax_xent<double>(1, 3, big.data(), labels.data() + 2, 0.5, gb.data()), 1000,
              1e-9);
  EXPECT_NEAR(gb[0], 0.5, 1e-12);
  EXPECT_NEAR(gb[1], -0.5, 1e-12);
  std::vector<int32_t> bad = {3};
  EXPECT_THROW(softmax_xent<double>(1, 3, big.data(), bad.data(), 1, nullptr), std::out_of_range);
}

// Per pixel of [n][k][hw]: the gradient, and each pixel equal to softmax_xent of its k
// channel values gathered into a vector.
TEST(LossCpu, SoftmaxXentPixels) {
  std::mt19937_64 rng(14);
  const int n = 2, k = 3;
  const int64_t hw = 5;
  Vec z = random_vec(size_t(n) * k * hw, rng, -3, 3), g(z.size());
  Vec classes(size_t(n) * hw);
  for (size_t e = 0; e < classes.size(); ++e) classes[e] = double(e % k);
  softmax_xent_pixels<double>(n, k, hw, z.data(), classes.data(), 1.0, g.data());
  check_grad("pixel xent", z, g,
             [&] { return softmax_xent_pixels<double>(n, k, hw, z.data(), classes.data(), 1, nullptr); });
  double sum = 0;
  for (int i = 0; i < n; ++i)
    for (int64_t p = 0; p < hw; ++p) {
      Vec v(k);
      for (int c = 0; c < k; ++c) v[c] = z[(size_t(i) * k + c) * hw + p];
      const int32_t label = int32_t(classes[size_t(i) * hw + p]);
      sum += softmax_xent<double>(1, k, v.data(), &label, 1, nullptr);
    }
  EXPECT_NEAR(softmax_xent_pixels<double>(n, k, hw, z.data(), classes.data(), 1, nullptr), sum, 1e-12);
  Vec bad = classes;
  bad[3] = 3;
  EXPECT_THROW(softmax_xent_pixels<double>(n, k, hw, z.data(), bad.data(), 1, nullptr), std::out_of_range);
  bad[3] = 0.5;
  EXPECT_THROW(softmax_xent_pixels<double>(n, k, hw, z.data(), bad.data(), 1, nullptr), std::out_of_range);
}

TEST(LossCpu, SigmoidBce) {
  std::mt19937_64 rng(13);
  Vec x = random_vec(20, rng, -4, 4), t(20), g(20);
  for (size_t i = 0; i < t.size(); ++i) t[i] = i % 3 == 0;
  sigmoid_bce<double>(x.size(), x.data(), t.data(), 1.0, g.data());
  check_grad("bce", x, g,
             [&] { return sigmoid_bce<double>(x.size(), x.data(), t.data(), 1, nullptr); });
  // Against the textbook form where it is safe, and finite where it is not.
  double want = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double p = 1 / (1 + std::exp(-x[i]));
    want -= t[i] * std::log(p) + (1 - t[i]) * std::log(1 - p);
  }
  EXPECT_NEAR(sigmoid_bce<double>(x.size(), x.data(), t.data(), 1, nullptr), want, 1e-10);
  Vec xs = {800, -800, 800, -800}, ts = {1, 0, 0, 1}, gs(4);
  EXPECT_NEAR(sigmoid_bce<double>(4, xs.data(), ts.data(), 0.25, gs.data()), 1600, 1e-9);
  EXPECT_EQ(gs, (Vec{0, 0, 0.25, -0.25}));
}

// Keras's class_weight (each element's loss times its class's weight) and torch's
// pos_weight: against the weighted textbook forms, and the gradients of the weighted sums.
TEST(LossCpu, WeightedByClassAndPosWeight) {
  std::mt19937_64 rng(15);
  LossWeights w;
  w.classes = 3;
  w.class_weight[0] = 0.5f, w.class_weight[1] = 4.f, w.class_weight[2] = 1.5f;
  w.pos_weight = 3.f;
  const int n = 4, k = 3;
  Vec z = random_vec(n * k, rng, -3, 3), g(z.size());
  std::vector<int32_t> labels = {0, 2, 1, 1};
  softmax_xent<double>(n, k, z.data(), labels.data(), 1.0, g.data(), w);
  check_grad("weighted xent", z, g,
             [&] { return softmax_xent<double>(n, k, z.data(), labels.data(), 1, nullptr, w); });
  double want = 0;
  for (int i = 0; i < n; ++i)
    want += w.class_weight[labels[i]] * softmax_xent<double>(1, k, z.data() + i * k, &labels[i], 1, nullptr);
  EXPECT_NEAR(softmax_xent<double>(n, k, z.data(), labels.data(), 1, nullptr, w), want, 1e-12);

  const int64_t hw = 5;
  Vec zp = random_vec(size_t(n) * k * hw, rng, -3, 3), gp(zp.size()), classes(size_t(n) * hw);
  for (size_t e = 0; e < classes.size(); ++e) classes[e] = double(e * 7 % k);
  softmax_xent_pixels<double>(n, k, hw, zp.data(), classes.data(), 1.0, gp.data(), w);
  check_grad("weighted pixel xent", zp, gp,
             [&] { return softmax_xent_pixels<double>(n, k, hw, zp.data(), classes.data(), 1, nullptr, w); });

  // BCE: -c (p t log s + (1 - t) log (1 - s)), c = w[t].
  Vec x = random_vec(20, rng, -4, 4), t(20), gb(20);
  for (size_t i = 0; i < t.size(); ++i) t[i] = i % 3 == 0;
  sigmoid_bce<double>(x.size(), x.data(), t.data(), 1.0, gb.data(), w);
  check_grad("weighted bce", x, gb,
             [&] { return sigmoid_bce<double>(x.size(), x.data(), t.data(), 1, nullptr, w); });
  double bce = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double s = 1 / (1 + std::exp(-x[i]));
    bce -= w.class_weight[int(t[i])] * (w.pos_weight * t[i] * std::log(s) + (1 - t[i]) * std::log(1 - s));
  }
  EXPECT_NEAR(sigmoid_bce<double>(x.size(), x.data(), t.data(), 1, nullptr, w), bce, 1e-10);
  // Unweighted: the gradient is the plain one, scale * (sigmoid(x) - t).
  Vec g1(20);
  sigmoid_bce<double>(x.size(), x.data(), t.data(), 0.5, g1.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const double s = 1 / (1 + std::exp(-x[i]));
    EXPECT_NEAR(g1[i], 0.5 * (s - t[i]), 1e-15);
  }
}

TEST(LossCpu, Mse) {
  std::mt19937_64 rng(14);
  Vec p = random_vec(15, rng), t = random_vec(15, rng), g(15);
  const double total = mse<double>(p.size(), p.data(), t.data(), 1.0, g.data());
  double want = 0;
  for (size_t i = 0; i < p.size(); ++i) want += (p[i] - t[i]) * (p[i] - t[i]);
  EXPECT_NEAR(total, want, 1e-12);
  check_grad("mse", p, g, [&] { return mse<double>(p.size(), p.data(), t.data(), 1, nullptr); });
  Vec g2(15);
  mse<double>(p.size(), p.data(), t.data(), 0.1, g2.data());
  EXPECT_NEAR(g2[3], 0.2 * (p[3] - t[3]), 1e-15);
}

// ---------------------------------------------------------------------------- threads

// Small shapes above run on one thread (parallel regions are skipped below a size), so
// here shapes big enough to go parallel are run with 1 and 3 threads: a race or a wrong
// partition shows as a difference. Only the weight gradient may differ in rounding (its
// per-thread partial sums are added in thread order).
TEST(ParallelCpu, MatchesSingleThread) {
  std::mt19937_64 rng(15);
  const ConvGeom g = geom(2, 4, 41, 37, 5, 3, 3, 2, 1, 1, 2, 1, 0, 2, 1);
  const PoolGeom pg = pgeom(2, 5, 61, 58, 3, 3, 2, 2, 1, 0, 0, 1);
  const int bn_n = 2, bn_c = 5;
  const long bn_hw = 61 * 58;
  Vec x = random_vec(g.x_size(), rng), w = random_vec(g.w_size(), rng), b = random_vec(5, rng),
      dy = random_vec(g.y_size(), rng), px = random_vec(pg.x_size(), rng),
      pdy = random_vec(pg.y_size(), rng), pdx = random_vec(pg.x_size(), rng), mean = random_vec(bn_c, rng, -0.1, 0.1),
      invstd = random_vec(bn_c, rng, 0.5, 2), gamma = random_vec(bn_c, rng);
  ASSERT_GT(pg.x_size(), size_t(1) << 15);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<Vec> r;
    auto add = [&](size_t n) -> double* { return r.emplace_back(n, 0.0).data(); };
    conv2d_forward<double>(g, x.data(), w.data(), b.data(), add(g.y_size()));
    conv2d_backward_data<double>(g, dy.data(), w.data(), add(g.x_size()));
    conv2d_backward_weights<double>(g, x.data(), dy.data(), add(g.w_size()), add(5));
    max_pool_forward<double>(pg, px.data(), add(pg.y_size()));
    max_pool_backward<double>(pg, px.data(), pdy.data(), add(pg.x_size()));
    avg_pool_forward<double>(pg, px.data(), add(pg.y_size()));
    avg_pool_backward<double>(pg, pdy.data(), add(pg.x_size()));
    channel_sum<double>(bn_n, bn_c, bn_hw, px.data(), add(bn_c));
    channel_sq_dev_sum<double>(bn_n, bn_c, bn_hw, px.data(), mean.data(), add(bn_c));
    bn_forward_apply<double>(bn_n, bn_c, bn_hw, px.data(), mean.data(), invstd.data(),
                             gamma.data(), gamma.data(), add(px.size()));
    double* sdy = add(bn_c);
    double* sdyx = add(bn_c);
    bn_backward_sums<double>(bn_n, bn_c, bn_hw, px.data(), px.data(), mean.data(),
                             invstd.data(), sdy, sdyx);
    bn_backward_apply<double>(bn_n, bn_c, bn_hw, px.data(), px.data(), mean.data(),
                              invstd.data(), gamma.data(), sdy, sdyx, 1e4, add(px.size()));
    relu_forward<double>(px.size(), px.data(), add(px.size()));
    relu_backward<double>(px.size(), px.data(), pdx.data(), add(px.size()));
    global_avg_sum<double>(bn_n, bn_c, bn_hw, px.data(), add(bn_n * bn_c));
    global_avg_backward<double>(bn_n, bn_c, bn_hw, mean.data(), 0.5, add(px.size()));
    return r;
  };
  const int saved = omp_get_max_threads();
  const std::vector<Vec> one = run(1), three = run(3);
  omp_set_num_threads(saved);
  ASSERT_EQ(one.size(), three.size());
  for (size_t k = 0; k < one.size(); ++k) {
    const bool rounding = k == 2 || k == 3;  // conv dw, db
    for (size_t i = 0; i < one[k].size(); ++i)
      ASSERT_NEAR(one[k][i], three[k][i], rounding ? 1e-12 * (1 + std::fabs(one[k][i])) : 0)
          << "output " << k << " element " << i;
  }
}

}  // namespace
}  // namespace ht::cpu
