// CPU element-wise kernels in double: activations, global pools, dropout's mask and the
// halo rectangles; every backward against central differences of its forward, every
// forward against a direct formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/elementwise.hpp"

#include "common/gradient_check.hpp"

namespace ht::cpu {
namespace {

using testing::check_grad;
using testing::dotv;
using testing::random_vec;
using testing::Vec;

// ---------------------------------------------------------------------------- elementwise

TEST(ElementwiseCpu, ReluGradientCheck) {
  std::mt19937_64 rng(8);
  Vec x = random_vec(50, rng), r = random_vec(50, rng), y(50), dx(50, 1e3);
  for (auto& v : x) v += v > 0 ? 0.1 : -0.1;  // away from the kink
  relu_forward<double>(x.size(), x.data(), y.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i] > 0 ? x[i] : 0.0);
  relu_backward<double>(x.size(), y.data(), r.data(), dx.data());
  check_grad("relu dx", x, dx, [&] {
    relu_forward<double>(x.size(), x.data(), y.data());
    return dotv(y, r);
  });
  Vec zero = {0.0}, g = {5.0}, d = {1.0};  // torch: no gradient where the output is 0
  relu_backward<double>(1, zero.data(), g.data(), d.data());
  EXPECT_EQ(d[0], 0.0);
}

// Every activation of kernels/activation.hpp: forward against its definition written out
// here, backward against central differences of the forward (away from the kinks), and
// torch's choices at the kinks.
TEST(ElementwiseCpu, ActivationsGradientCheck) {
  using F = double (*)(double x, double a, double b);
  struct Case {
    Activation f;
    ActivationArgs args;
    F ref;
  };
  const double pi = std::acos(-1.0);
  auto clamp = [](double v, double lo, double hi) { return std::min(std::max(v, lo), hi); };
  (void)clamp;
  const Case cases[] = {
      {Activation::LeakyReLU, {0.2f, 0}, [](double x, double a, double) { return x > 0 ? x : a * x; }},
      {Activation::LeakyReLU, {0.0f, 0}, [](double x, double a, double) { return x > 0 ? x : a * x; }},
      {Activation::Sigmoid, {}, [](double x, double, double) { return 1 / (1 + std::exp(-x)); }},
      {Activation::Tanh, {}, [](double x, double, double) { return std::tanh(x); }},
      {Activation::ReLU6, {}, [](double x, double, double) { return std::min(std::max(x, 0.0), 6.0); }},
      {Activation::Clip, {-1.5f, 2.5f}, [](double x, double a, double b) { return std::min(std::max(x, a), b); }},
      {Activation::SiLU, {}, [](double x, double, double) { return x / (1 + std::exp(-x)); }},
      {Activation::HardSigmoid, {0.2f, 0.5f},
       [](double x, double a, double b) { return std::min(std::max(a * x + b, 0.0), 1.0); }},
      {Activation::HardSigmoid, {1.0f / 6, 0.5f},
       [](double x, double a, double b) { return std::min(std::max(a * x + b, 0.0), 1.0); }},
      {Activation::HardSwish, {},
       [](double x, double, double) { return x * std::min(std::max(x + 3, 0.0), 6.0) / 6; }},
      {Activation::GELU, {}, [](double x, double, double) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
      {Activation::GELUTanh, {}, [](double x, double, double) {
         return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::acos(-1.0)) * (x + 0.044715 * x * x * x)));
       }},
  };
  (void)pi;
  for (const Case& c : cases) {
    std::mt19937_64 rng(9);
    Vec x = random_vec(80, rng), r = random_vec(80, rng), y(80), dx(80, 1e3);
    for (auto& v : x) v = 8 * v + (v > 0 ? 0.1 : -0.1);  // both tails, past relu6's 6
    x[0] = -40;  // sigmoid's exp must not overflow
    activation_forward<double>(c.f, c.args, x.size(), x.data(), y.data());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(y[i], c.ref(x[i], c.args.alpha, c.args.beta), 1e-14) << int(c.f) << " " << x[i];
    activation_backward<double>(c.f, c.args, x.size(), x.data(), y.data(), r.data(), dx.data());
    // It reads only what gradient_reads says: where the other tensor is gone, the layer
    // passes the one it has in its place (worker/layers/layers.cpp ActivationLayer).
    const ActivationReads reads = gradient_reads(c.f);
    EXPECT_NE(reads.input, reads.output) << int(c.f);
    Vec dx_one(80);
    activation_backward<double>(c.f, c.args, x.size(), reads.input ? x.data() : y.data(),
                                reads.output ? y.data() : x.data(), r.data(), dx_one.data());
    EXPECT_EQ(dx_one, dx) << int(c.f);
    check_grad("activation dx", x, dx, [&] {
      activation_forward<double>(c.f, c.args, x.size(), x.data(), y.data());
      return dotv(y, r);
    });
  }
  // At the kinks, torch's choices: leaky_relu's slope at 0 is alpha; relu6 (hardtanh) passes
  // nothing at 0 and 6; clip (clamp) passes at its bounds; hard_swish at -3 is -0.5.
  auto grad_at = [](Activation f, ActivationArgs a, double x) {
    Vec xs = {x}, ys(1), g = {5.0}, d = {1.0};
    activation_forward<double>(f, a, 1, xs.data(), ys.data());
    activation_backward<double>(f, a, 1, xs.data(), ys.data(), g.data(), d.data());
    return d[0];
  };
  EXPECT_EQ(grad_at(Activation::LeakyReLU, {0.25f, 0}, 0.0), 1.25);
  EXPECT_EQ(grad_at(Activation::ReLU6, {}, 0.0), 0.0);
  EXPECT_EQ(grad_at(Activation::ReLU6, {}, 6.0), 0.0);
  EXPECT_EQ(grad_at(Activation::Clip, {-1, 2}, -1.0), 5.0);
  EXPECT_EQ(grad_at(Activation::Clip, {-1, 2}, 2.0), 5.0);
  EXPECT_EQ(grad_at(Activation::HardSwish, {}, -3.0), -2.5);
}

// The max of every plane, its ties counted, and the gradient shared among them (torch's
// amax); off the ties, central differences of the max agree.
TEST(ElementwiseCpu, GlobalMaxAndItsGradient) {
  std::mt19937_64 rng(10);
  const int n = 2, c = 3, hw = 17;
  Vec x = random_vec(size_t(n) * c * hw, rng), r = random_vec(size_t(n) * c, rng);
  x[5] = x[9] = 3.0;  // plane 0: a tie at the max
  std::vector<double> maxes(n * c), counts(n * c), grads(n * c);
  global_max<double>(n, c, hw, x.data(), maxes.data());
  global_max_count<double>(n, c, hw, x.data(), maxes.data(), counts.data());
  for (int p = 0; p < n * c; ++p) {
    double m = -1e300;
    for (int i = 0; i < hw; ++i) m = std::max(m, x[size_t(p) * hw + i]);
    EXPECT_EQ(maxes[p], m) << p;
    EXPECT_EQ(counts[p], p == 0 ? 2.0 : 1.0) << p;
    grads[p] = r[p] / counts[p];
  }
  Vec dx(x.size(), 1e3);
  global_max_backward<double>(n, c, hw, x.data(), maxes.data(), grads.data(), dx.data());
  EXPECT_EQ(dx[5], r[0] / 2);
  EXPECT_EQ(dx[9], r[0] / 2);
  Vec untied(x.begin() + hw, x.end()), dx_untied(dx.begin() + hw, dx.end());  // planes 1..5
  check_grad("global max dx", untied, dx_untied, [&] {
    std::vector<double> m((n * c) - 1);
    global_max<double>(1, n * c - 1, hw, untied.data(), m.data());
    double l = 0;
    for (int p = 0; p < n * c - 1; ++p) l += m[p] * r[p + 1];
    return l;
  });
}

// Dropout's mask: the kept fraction is 1 - rate within 1% over a large tensor, kept values
// are scaled by 1 / (1 - rate), a shard's part (its offsets in the whole image and the
// batch) is the same as that part of the whole, and rate 0 is the identity.
TEST(ElementwiseCpu, DropoutMask) {
  const int n = 2, c = 4, h = 256, w = 200;
  std::mt19937_64 rng(11);
  Vec x = random_vec(size_t(n) * c * h * w, rng), y(x.size());
  DropoutMask m;
  m.key = dropout_key(1234, 3, 17);
  m.rate = 0.3;
  m.scale = float(1 / (1 - m.rate));
  dropout_apply<double>(m, n, c, h, w, x.data(), y.data());
  size_t kept = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] != 0) {
      ++kept;
      ASSERT_EQ(y[i], x[i] * double(m.scale)) << i;
    }
  }
  EXPECT_NEAR(double(kept) / double(x.size()), 1 - m.rate, 0.01);
  // Image 1, rows [100, 140), cols [50, 90) of every channel, as a shard would hold it.
  const int sh = 40, sw = 40;
  Vec part(size_t(c) * sh * sw), part_y(part.size());
  for (int ch = 0; ch < c; ++ch)
    for (int r = 0; r < sh; ++r)
      for (int col = 0; col < sw; ++col)
        part[(size_t(ch) * sh + r) * sw + col] = x[((size_t(c) + ch) * h + 100 + r) * w + 50 + col];
  DropoutMask shard = m;
  shard.first_image = 1;
  shard.row0 = 100;
  shard.col0 = 50;
  dropout_apply<double>(shard, 1, c, sh, sw, part.data(), part_y.data());
  for (int ch = 0; ch < c; ++ch)
    for (int r = 0; r < sh; ++r)
      for (int col = 0; col < sw; ++col)
        ASSERT_EQ(part_y[(size_t(ch) * sh + r) * sw + col], y[((size_t(c) + ch) * h + 100 + r) * w + 50 + col]);
  DropoutMask none = m;
  none.rate = 0;
  none.scale = 1;
  dropout_apply<double>(none, n, c, h, w, x.data(), y.data());
  EXPECT_EQ(y, x);
  // Another step draws another mask.
  DropoutMask next = m;
  next.key = dropout_key(1234, 3, 18);
  Vec y1(x.size()), y2(x.size());
  dropout_apply<double>(m, n, c, h, w, x.data(), y1.data());
  dropout_apply<double>(next, n, c, h, w, x.data(), y2.data());
  EXPECT_NE(y1, y2);
}

TEST(ElementwiseCpu, GlobalAvgGradientCheck) {
  std::mt19937_64 rng(9);
  const int n = 2, c = 3;
  const long hw = 10;
  Vec x = random_vec(n * c * hw, rng), r = random_vec(n * c, rng), dx(x.size(), 1e3);
  auto loss = [&] {
    Vec s(n * c, 0);
    global_avg_sum<double>(n, c, hw, x.data(), s.data());
    for (auto& v : s) v /= double(hw);
    return dotv(s, r);
  };
  global_avg_backward<double>(n, c, hw, r.data(), 1.0 / hw, dx.data());
  check_grad("gap dx", x, dx, loss);
  Vec s = {100, 0, 0, 0, 0, 0};  // accumulates
  global_avg_sum<double>(n, c, hw, x.data(), s.data());
  EXPECT_NEAR(s[0], 100 + std::accumulate(x.begin(), x.begin() + hw, 0.0), 1e-12);
}

TEST(ElementwiseCpu, PackUnpackRects) {
  const int n = 2, c = 3, h = 5, w = 7, r0 = 1, c0 = 2, rows = 3, cols = 4;
  Vec src(n * c * h * w);
  std::iota(src.begin(), src.end(), 0.0);  // every cell holds its own index
  Vec packed(n * c * rows * cols);
  pack_rect<double>(src.data(), n, c, h, w, r0, c0, rows, cols, packed.data());
  for (int p = 0; p < n * c; ++p)
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < cols; ++j)
        ASSERT_EQ(packed[(p * rows + r) * cols + j], double((p * h + r0 + r) * w + c0 + j));
  Vec dst(src.size(), -1);
  unpack_rect<double>(packed.data(), n, c, h, w, r0, c0, rows, cols, dst.data());
  for (size_t i = 0; i < dst.size(); ++i) {
    const int col = int(i % w), row = int(i / w % h);
    const bool in = row >= r0 && row < r0 + rows && col >= c0 && col < c0 + cols;
    ASSERT_EQ(dst[i], in ? src[i] : -1.0) << i;
  }
  // unpack_add is the adjoint of pack: <pack(x), y> == <x, unpack_add(y)>.
  std::mt19937_64 rng(10);
  Vec x = random_vec(src.size(), rng), y = random_vec(packed.size(), rng), px(packed.size());
  Vec uy(src.size(), 0.0);
  pack_rect<double>(x.data(), n, c, h, w, r0, c0, rows, cols, px.data());
  unpack_add_rect<double>(y.data(), n, c, h, w, r0, c0, rows, cols, uy.data());
  EXPECT_NEAR(dotv(px, y), dotv(x, uy), 1e-12);
  unpack_add_rect<double>(y.data(), n, c, h, w, r0, c0, rows, cols, uy.data());  // adds again
  EXPECT_NEAR(dotv(px, y) * 2, dotv(x, uy), 1e-12);
  EXPECT_THROW(pack_rect<double>(src.data(), n, c, h, w, 3, 0, 3, 1, packed.data()),
               std::out_of_range);
}

}  // namespace
}  // namespace ht::cpu
