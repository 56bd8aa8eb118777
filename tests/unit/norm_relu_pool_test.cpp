// The fused batch norm + ReLU + max pool (kernels/cpu/norm_relu_pool.hpp), and batch norm +
// ReLU (norm.hpp bn_relu_forward), against the kernels they replace, run one after the other: the forward to the bit, the backward's input
// gradient to the bit for the same sums, and the sums within float rounding (their order of
// additions differs). The unfused kernels are checked against PyTorch by the oracle tests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/norm_relu_pool.hpp"
#include "kernels/cpu/pool.hpp"
#include "worker/runtime/backend.hpp"

namespace ht::cpu {
namespace {

struct Case {
  NormPoolShape s;
  double mean_shift;  // added to every pixel: batch norm's statistics around a large mean
};

template <class T>
struct Chain {
  NormPoolShape s;
  std::vector<T> x, gamma, beta, dpool;
  std::vector<double> mean, invstd;

  explicit Chain(const Case& k, unsigned seed) : s(k.s) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::uniform_int_distribution<int> level(-3, 3);
    x.resize(s.x_size());
    // Every third plane holds few distinct values, so windows tie (the first maximum in
    // row-major order wins) and many are all negative after the affine (no gradient).
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t plane = i / (size_t(s.h) * s.w);
      x[i] = T(k.mean_shift + (plane % 3 == 0 ? 0.5 * level(rng) : normal(rng)));
    }
    for (int ch = 0; ch < s.c; ++ch) {
      gamma.push_back(T(ch % 2 ? -0.7 : 1.3));  // a negative scale flips which pixel wins
      beta.push_back(T(0.1 * ch - 0.2));
    }
    dpool.resize(s.y_size());
    for (T& v : dpool) v = T(normal(rng));
    mean.assign(size_t(s.c), 0.0);
    std::vector<double> sq(size_t(s.c), 0.0);
    const long hw = long(s.h) * s.w;
    channel_sum<T>(s.n, s.c, hw, x.data(), mean.data());
    const double count = double(s.n) * hw;
    for (double& m : mean) m /= count;
    channel_sq_dev_sum<T>(s.n, s.c, hw, x.data(), mean.data(), sq.data());
    for (int ch = 0; ch < s.c; ++ch) invstd.push_back(1.0 / std::sqrt(sq[size_t(ch)] / count + 1e-3));
  }
  PoolGeom pool() const {
    PoolGeom g;
    g.n = s.n;
    g.c = s.c;
    // The unfused pool reads the rows and columns its windows cover (a shard's input that
    // the plan cut to its windows); the rest are in no window either way.
    g.hin = s.ho() * s.kh;
    g.win = s.wo() * s.kw;
    g.kh = g.stride_h = s.kh;
    g.kw = g.stride_w = s.kw;
    return g;
  }
  // Copies rows/cols covered by windows out of (or back into) a full plane tensor.
  std::vector<T> crop(const std::vector<T>& full) const {
    const PoolGeom g = pool();
    std::vector<T> out(g.x_size());
    for (size_t p = 0; p < size_t(s.n) * s.c; ++p)
      for (int h = 0; h < g.hin; ++h)
        for (int w = 0; w < g.win; ++w)
          out[(p * g.hin + h) * g.win + w] = full[(p * s.h + h) * s.w + w];
    return out;
  }
  std::vector<T> uncrop(const std::vector<T>& part) const {
    const PoolGeom g = pool();
    std::vector<T> out(s.x_size(), T(0));
    for (size_t p = 0; p < size_t(s.n) * s.c; ++p)
      for (int h = 0; h < g.hin; ++h)
        for (int w = 0; w < g.win; ++w)
          out[(p * s.h + h) * s.w + w] = part[(p * g.hin + h) * g.win + w];
    return out;
  }
  long hw() const { return long(s.h) * s.w; }

  // bn_forward_apply, relu_forward, max_pool_forward: returns the pool's output; keeps the
  // ReLU's output for the backward.
  std::vector<T> unfused_forward(std::vector<T>& relu_out) const {
    std::vector<T> y(x.size());
    bn_forward_apply<T>(s.n, s.c, hw(), x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(), y.data());
    relu_out.resize(x.size());
    relu_forward<T>(y.size(), y.data(), relu_out.data());
    std::vector<T> pooled(s.y_size());
    max_pool_forward<T>(pool(), crop(relu_out).data(), pooled.data());
    return pooled;
  }
  // The fused forward: returns the pooled output, and the argmax bytes in `argmax`.
  std::vector<T> fused_forward(std::vector<uint8_t>& argmax) const {
    std::vector<T> y(s.y_size());
    argmax.assign(s.y_size(), 0);
    bn_relu_max_pool_forward<T>(s, x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(), y.data(),
                                argmax.data());
    return y;
  }
  // The fused backward's sums (fresh) and its input gradient for the given sums.
  void fused_sums(const std::vector<uint8_t>& argmax, std::vector<double>& sum_dy,
                  std::vector<double>& sum_dy_xhat) const {
    sum_dy.assign(size_t(s.c), 0.0);
    sum_dy_xhat.assign(size_t(s.c), 0.0);
    bn_relu_max_pool_backward_sums<T>(s, dpool.data(), argmax.data(), x.data(), mean.data(), invstd.data(),
                                      sum_dy.data(), sum_dy_xhat.data());
  }
  std::vector<T> fused_input_gradient(const std::vector<uint8_t>& argmax, const std::vector<double>& sum_dy,
                                      const std::vector<double>& sum_dy_xhat) const {
    std::vector<T> dx(x.size(), T(1e3));
    bn_relu_max_pool_backward_apply<T>(s, dpool.data(), argmax.data(), x.data(), mean.data(), invstd.data(),
                                       gamma.data(), sum_dy.data(), sum_dy_xhat.data(), double(s.n) * hw(),
                                       dx.data());
    return dx;
  }
  // The same written over x, as the worker runs it where the chain alone reads its input
  // (step_schedule.hpp LayerSizes::chain_dx_over_input): each value read before its gradient is written.
  std::vector<T> fused_input_gradient_over_x(const std::vector<uint8_t>& argmax, const std::vector<double>& sum_dy,
                                             const std::vector<double>& sum_dy_xhat) const {
    std::vector<T> dx = x;
    bn_relu_max_pool_backward_apply<T>(s, dpool.data(), argmax.data(), dx.data(), mean.data(), invstd.data(),
                                       gamma.data(), sum_dy.data(), sum_dy_xhat.data(), double(s.n) * hw(),
                                       dx.data());
    return dx;
  }
  // max_pool_backward, relu_backward, then batch norm's sums and input gradient.
  std::vector<T> unfused_backward(const std::vector<T>& relu_out, std::vector<double>& sum_dy,
                                  std::vector<double>& sum_dy_xhat) const {
    std::vector<T> dcrop(pool().x_size());
    max_pool_backward<T>(pool(), crop(relu_out).data(), dpool.data(), dcrop.data());
    std::vector<T> drelu = uncrop(dcrop), dbn(x.size());
    relu_backward<T>(x.size(), relu_out.data(), drelu.data(), dbn.data());
    sum_dy.assign(size_t(s.c), 0.0);
    sum_dy_xhat.assign(size_t(s.c), 0.0);
    bn_backward_sums<T>(s.n, s.c, hw(), dbn.data(), x.data(), mean.data(), invstd.data(), sum_dy.data(),
                        sum_dy_xhat.data());
    std::vector<T> dx(x.size());
    bn_backward_apply<T>(s.n, s.c, hw(), dbn.data(), x.data(), mean.data(), invstd.data(), gamma.data(),
                         sum_dy.data(), sum_dy_xhat.data(), double(s.n) * hw(), dx.data());
    return dx;
  }
};

const Case kCases[] = {
    {{2, 3, 8, 12, 2, 2}, 0.0},
    {{1, 4, 9, 11, 2, 2}, 0.0},     // a row and a column in no window
    {{2, 2, 12, 10, 3, 2}, 0.0},    // unequal window sides
    {{1, 3, 16, 16, 4, 4}, 0.0},
    {{2, 3, 18, 23, 4, 4}, 0.0},    // 4 x 4 with rows and columns in no window
    {{2, 4, 64, 100, 4, 4}, 0.0},   // 4 x 4, large enough to run on threads
    {{2, 5, 64, 96, 2, 2}, 0.0},    // large enough to run on threads
    {{1, 2, 10, 10, 2, 2}, 1e4},    // pixels around 1e4
};

template <class T>
void expect_same_bits(const std::vector<T>& a, const std::vector<T>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i]) && !(std::isnan(a[i]) && std::isnan(b[i]))) ++bad;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() << " differ";
}

TEST(NormReluPoolCpu, ForwardIsTheThreeKernelsToTheBit) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << k.s.h << "x" << k.s.w << " pool " << k.s.kh << "x" << k.s.kw);
    const Chain<float> c(k, 7);
    std::vector<float> relu_out;
    const std::vector<float> expected = c.unfused_forward(relu_out);
    std::vector<uint8_t> argmax;
    const std::vector<float> y = c.fused_forward(argmax);
    expect_same_bits(y, expected, "pooled output");
    // Each argmax names a pixel holding the window's maximum, or the maximum is 0.
    for (size_t i = 0; i < y.size(); ++i) {
      if (argmax[i] == kNoArgmax) {
        EXPECT_EQ(y[i], 0.f);
        continue;
      }
      EXPECT_LT(argmax[i], k.s.kh * k.s.kw);
      EXPECT_GT(y[i], 0.f);
    }
  }
}

// In double the two orders of the sums agree to rounding; dx then agrees closely.
TEST(NormReluPoolCpu, BackwardMatchesTheThreeKernels) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << k.s.h << "x" << k.s.w << " pool " << k.s.kh << "x" << k.s.kw);
    const Chain<double> c(k, 11);
    std::vector<double> relu_out;
    c.unfused_forward(relu_out);
    std::vector<double> sum_dy, sum_dy_xhat;
    const std::vector<double> expected = c.unfused_backward(relu_out, sum_dy, sum_dy_xhat);

    std::vector<uint8_t> argmax;
    c.fused_forward(argmax);
    std::vector<double> fs, fsx;
    c.fused_sums(argmax, fs, fsx);
    for (int ch = 0; ch < k.s.c; ++ch) {
      EXPECT_NEAR(fs[size_t(ch)], sum_dy[size_t(ch)], 1e-10 * (1 + std::abs(sum_dy[size_t(ch)])));
      EXPECT_NEAR(fsx[size_t(ch)], sum_dy_xhat[size_t(ch)], 1e-10 * (1 + std::abs(sum_dy_xhat[size_t(ch)])));
    }
    const std::vector<double> dx = c.fused_input_gradient(argmax, fs, fsx);
    for (size_t i = 0; i < dx.size(); ++i) ASSERT_NEAR(dx[i], expected[i], 1e-9) << "pixel " << i;
  }
}

// For the same sums the input gradient is bn_backward_apply's to the bit, in float.
TEST(NormReluPoolCpu, InputGradientIsBatchNormsToTheBitForTheSameSums) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << k.s.h << "x" << k.s.w << " pool " << k.s.kh << "x" << k.s.kw);
    const Chain<float> c(k, 13);
    std::vector<float> relu_out;
    c.unfused_forward(relu_out);
    std::vector<double> sum_dy, sum_dy_xhat;
    const std::vector<float> expected = c.unfused_backward(relu_out, sum_dy, sum_dy_xhat);
    std::vector<uint8_t> argmax;
    c.fused_forward(argmax);
    expect_same_bits(c.fused_input_gradient(argmax, sum_dy, sum_dy_xhat), expected, "input gradient");
    expect_same_bits(c.fused_input_gradient_over_x(argmax, sum_dy, sum_dy_xhat), expected, "input gradient over x");
    // The float sums agree with the unfused ones within float rounding.
    std::vector<double> fs, fsx;
    c.fused_sums(argmax, fs, fsx);
    for (int ch = 0; ch < k.s.c; ++ch) {
      EXPECT_NEAR(fs[size_t(ch)], sum_dy[size_t(ch)], 1e-4 * (1 + std::abs(sum_dy[size_t(ch)])));
      EXPECT_NEAR(fsx[size_t(ch)], sum_dy_xhat[size_t(ch)], 1e-4 * (1 + std::abs(sum_dy_xhat[size_t(ch)])));
    }
  }
}

// The chain without a pool (norm.hpp bn_relu_forward): bn_forward_apply then relu_forward
// to the bit, NaN passing as the ReLU passes it, with and without gamma and beta.
TEST(NormReluCpu, ForwardIsBatchNormThenReluToTheBit) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << k.s.n << "x" << k.s.c << "x" << k.s.h << "x" << k.s.w);
    Chain<float> c(k, 17);
    c.x[c.x.size() / 3] = std::nanf("");
    for (const bool affine : {true, false}) {
      const float* gamma = affine ? c.gamma.data() : nullptr;
      const float* beta = affine ? c.beta.data() : nullptr;
      std::vector<float> normalised(c.x.size()), expected(c.x.size()), y(c.x.size(), 1e3f);
      bn_forward_apply<float>(k.s.n, k.s.c, c.hw(), c.x.data(), c.mean.data(), c.invstd.data(), gamma, beta,
                              normalised.data());
      relu_forward<float>(normalised.size(), normalised.data(), expected.data());
      bn_relu_forward<float>(k.s.n, k.s.c, c.hw(), c.x.data(), c.mean.data(), c.invstd.data(), gamma, beta, y.data());
      expect_same_bits(y, expected, affine ? "with gamma and beta" : "without");
      EXPECT_TRUE(std::isnan(y[c.x.size() / 3]));
    }
  }
}

// Its backward (bn_relu_backward_sums, bn_relu_backward_apply) against relu_backward, then
// bn_backward_sums and bn_backward_apply: the same sums and input gradient to the bit, the
// input gradient also written over the output gradient.
TEST(NormReluCpu, BackwardIsReluThenBatchNormToTheBit) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << k.s.n << "x" << k.s.c << "x" << k.s.h << "x" << k.s.w);
    const Chain<float> c(k, 19);
    const size_t size = c.x.size();
    const long hw = c.hw();
    const double count = double(k.s.n) * hw;
    std::vector<float> y(size), dy(size);
    bn_relu_forward<float>(k.s.n, k.s.c, hw, c.x.data(), c.mean.data(), c.invstd.data(), c.gamma.data(),
                           c.beta.data(), y.data());
    std::mt19937 rng(23);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (float& v : dy) v = normal(rng);

    std::vector<float> g(size), expected(size);
    relu_backward<float>(size, y.data(), dy.data(), g.data());
    std::vector<double> sd(size_t(k.s.c), 0.0), sdx(size_t(k.s.c), 0.0);
    bn_backward_sums<float>(k.s.n, k.s.c, hw, g.data(), c.x.data(), c.mean.data(), c.invstd.data(), sd.data(),
                            sdx.data());
    bn_backward_apply<float>(k.s.n, k.s.c, hw, g.data(), c.x.data(), c.mean.data(), c.invstd.data(),
                             c.gamma.data(), sd.data(), sdx.data(), count, expected.data());

    std::vector<double> fd(size_t(k.s.c), 0.0), fdx(size_t(k.s.c), 0.0);
    bn_relu_backward_sums<float>(k.s.n, k.s.c, hw, dy.data(), y.data(), c.x.data(), c.mean.data(), c.invstd.data(),
                                 fd.data(), fdx.data());
    for (int ch = 0; ch < k.s.c; ++ch) {
      EXPECT_EQ(fd[size_t(ch)], sd[size_t(ch)]) << "channel " << ch;
      EXPECT_EQ(fdx[size_t(ch)], sdx[size_t(ch)]) << "channel " << ch;
    }
    std::vector<float> over = dy;
    bn_relu_backward_apply<float>(k.s.n, k.s.c, hw, over.data(), y.data(), c.x.data(), c.mean.data(),
                                  c.invstd.data(), c.gamma.data(), fd.data(), fdx.data(), count, over.data());
    expect_same_bits(over, expected, "input gradient over the output gradient");
  }
}

// The backends without one-pass kernels (CUDA) run the chain as the base class does: the
// batch norm's and the ReLU's kernels in place. Called on the CPU backend, that path gives
// the CPU's fused kernels' bits, a frozen batch norm's input gradient (no sums) included.
TEST(NormReluCpu, BaseClassChainIsTheFusedKernelsToTheBit) {
  const auto backend = make_backend({});
  ComputeBackend& b = *backend;
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << k.s.n << "x" << k.s.c << "x" << k.s.h << "x" << k.s.w);
    const Chain<float> c(k, 29);
    const size_t size = c.x.size();
    const int64_t hw = c.hw();
    const double count = double(k.s.n) * hw;
    std::vector<float> fused(size), base(size, 1e3f);
    b.bn_relu_forward(k.s.n, k.s.c, hw, c.x.data(), c.mean.data(), c.invstd.data(), c.gamma.data(), c.beta.data(),
                      fused.data());
    b.ComputeBackend::bn_relu_forward(k.s.n, k.s.c, hw, c.x.data(), c.mean.data(), c.invstd.data(), c.gamma.data(),
                                      c.beta.data(), base.data());
    expect_same_bits(base, fused, "forward");

    std::mt19937 rng(31);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> dy(size);
    for (float& v : dy) v = normal(rng);
    std::vector<double> fs(size_t(k.s.c)), fsx(size_t(k.s.c)), bs(size_t(k.s.c)), bsx(size_t(k.s.c));
    std::vector<float> fdy = dy, bdy = dy;
    b.bn_relu_backward_sums(k.s.n, k.s.c, hw, fdy.data(), fused.data(), c.x.data(), c.mean.data(), c.invstd.data(),
                            fs.data(), fsx.data());
    b.ComputeBackend::bn_relu_backward_sums(k.s.n, k.s.c, hw, bdy.data(), fused.data(), c.x.data(), c.mean.data(),
                                            c.invstd.data(), bs.data(), bsx.data());
    EXPECT_EQ(bs, fs);
    EXPECT_EQ(bsx, fsx);
    b.bn_relu_backward_apply(k.s.n, k.s.c, hw, fdy.data(), fused.data(), c.x.data(), c.mean.data(), c.invstd.data(),
                             c.gamma.data(), fs.data(), fsx.data(), count, fdy.data());
    b.ComputeBackend::bn_relu_backward_apply(k.s.n, k.s.c, hw, bdy.data(), fused.data(), c.x.data(), c.mean.data(),
                                             c.invstd.data(), c.gamma.data(), bs.data(), bsx.data(), count, bdy.data());
    expect_same_bits(bdy, fdy, "input gradient");

    // Frozen: no sums, the gradient of the unmasked dy straight to apply.
    const std::vector<double> zero(size_t(k.s.c), 0.0);
    fdy = dy, bdy = dy;
    b.bn_relu_backward_apply(k.s.n, k.s.c, hw, fdy.data(), fused.data(), c.x.data(), c.mean.data(), c.invstd.data(),
                             c.gamma.data(), zero.data(), zero.data(), 1.0, fdy.data());
    b.ComputeBackend::bn_relu_backward_apply(k.s.n, k.s.c, hw, bdy.data(), fused.data(), c.x.data(), c.mean.data(),
                                             c.invstd.data(), c.gamma.data(), zero.data(), zero.data(), 1.0,
                                             bdy.data());
    expect_same_bits(bdy, fdy, "frozen input gradient");
  }
}

TEST(NormReluPoolCpu, RefusesWindowsThatDoNotFitOneByte) {
  const NormPoolShape s{1, 1, 32, 32, 16, 16};
  std::vector<float> x(s.x_size()), y(s.y_size());
  std::vector<uint8_t> argmax(s.y_size());
  const double mean = 0, invstd = 1;
  EXPECT_THROW(bn_relu_max_pool_forward<float>(s, x.data(), &mean, &invstd, nullptr, nullptr, y.data(), argmax.data()),
               std::invalid_argument);
}

}  // namespace
}  // namespace ht::cpu
