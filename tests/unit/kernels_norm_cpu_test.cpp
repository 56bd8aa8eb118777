// Batch-norm kernels in double: the forward against its definition, the backward against
// central differences of the forward (caffe's gradient checker), and the one-pass
// statistics against a long-double two-pass sum.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/norm.hpp"

#include "common/gradient_check.hpp"

namespace ht::cpu {
namespace {

using testing::check_grad;
using testing::dotv;
using testing::random_vec;
using testing::Vec;

// Full training-mode BN built from the pieces; the batch is split in two "shards" to show
// the partial sums combine.
struct Bn {
  Bn(int n_, int c_, long hw_) : n(n_), c(c_), hw(hw_) {}
  int n, c;
  long hw;
  double eps = 1e-3;
  Vec mean, invstd;

  Vec forward(const Vec& x, const Vec& gamma, const Vec& beta) {
    const int n1 = n / 2;
    const size_t off = size_t(n1) * c * hw;
    mean.assign(c, 0);
    Vec sq(c, 0), y(x.size());
    channel_sum<double>(n1, c, hw, x.data(), mean.data());
    channel_sum<double>(n - n1, c, hw, x.data() + off, mean.data());
    const double count = double(n) * hw;
    for (auto& m : mean) m /= count;
    channel_sq_dev_sum<double>(n1, c, hw, x.data(), mean.data(), sq.data());
    channel_sq_dev_sum<double>(n - n1, c, hw, x.data() + off, mean.data(), sq.data());
    invstd.resize(c);
    for (int i = 0; i < c; ++i) invstd[i] = 1.0 / std::sqrt(sq[i] / count + eps);
    bn_forward_apply<double>(n, c, hw, x.data(), mean.data(), invstd.data(), gamma.data(),
                             beta.data(), y.data());
    return y;
  }
  // Returns dx; dgamma, dbeta from the reduced sums.
  Vec backward(const Vec& x, const Vec& dy, const Vec& gamma, Vec& dgamma, Vec& dbeta) {
    const int n1 = n / 2;
    const size_t off = size_t(n1) * c * hw;
    dbeta.assign(c, 0), dgamma.assign(c, 0);
    bn_backward_sums<double>(n1, c, hw, dy.data(), x.data(), mean.data(), invstd.data(),
                             dbeta.data(), dgamma.data());
    bn_backward_sums<double>(n - n1, c, hw, dy.data() + off, x.data() + off, mean.data(),
                             invstd.data(), dbeta.data(), dgamma.data());
    Vec dx(x.size(), 1e3);
    bn_backward_apply<double>(n, c, hw, dy.data(), x.data(), mean.data(), invstd.data(),
                              gamma.data(), dbeta.data(), dgamma.data(), double(n) * hw, dx.data());
    return dx;
  }
};

TEST(NormCpu, ForwardMatchesDefinition) {
  std::mt19937_64 rng(6);
  Bn bn{3, 2, 5};
  Vec x = random_vec(30, rng, 2, 5), gamma = {1.5, -0.5}, beta = {0.25, 2};
  Vec y = bn.forward(x, gamma, beta);
  for (int ch = 0; ch < 2; ++ch) {
    double m = 0, v = 0;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 5; ++i) m += x[(n * 2 + ch) * 5 + i] / 15;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 5; ++i) v += std::pow(x[(n * 2 + ch) * 5 + i] - m, 2) / 15;  // biased
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 5; ++i) {
        const size_t k = (n * 2 + ch) * 5 + i;
        EXPECT_NEAR(y[k], (x[k] - m) / std::sqrt(v + 1e-3) * gamma[ch] + beta[ch], 1e-12);
      }
  }
}

TEST(NormCpu, GradientCheck) {
  std::mt19937_64 rng(7);
  for (auto [n, c, hw] : {std::tuple{3, 2, 7L}, std::tuple{2, 3, 12L}, std::tuple{5, 1, 1L}}) {
    Bn bn{n, c, hw};
    Vec x = random_vec(size_t(n) * c * hw, rng, -2, 3), gamma = random_vec(c, rng, 0.5, 2),
        beta = random_vec(c, rng), r = random_vec(x.size(), rng);
    auto loss = [&] { return dotv(bn.forward(x, gamma, beta), r); };
    loss();
    Vec dgamma, dbeta, dx = bn.backward(x, r, gamma, dgamma, dbeta);
    check_grad("bn dx", x, dx, loss, 1e-5, 1e-6, 1e-5);
    check_grad("bn dgamma", gamma, dgamma, loss, 1e-5, 1e-6, 1e-5);
    check_grad("bn dbeta", beta, dbeta, loss, 1e-5, 1e-6, 1e-5);
  }
}

// One pass over pixels far from zero with a small spread (raw 16-bit-like values): the mean
// and the squared deviations equal a two-pass sum in long double over the same floats, for
// planes of whole and partial blocks, and do not depend on the thread count.
TEST(NormCpu, MomentsInOnePassAreExactAroundLargeMeans) {
  const int n = 3, c = 2;
  const long hw = 2500;  // two whole blocks and part of a third per plane
  std::vector<float> x(size_t(n) * c * hw);
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0.0, 1.0);
  for (int i = 0; i < n; ++i)
    for (int ch = 0; ch < c; ++ch)
      for (long k = 0; k < hw; ++k)
        x[(size_t(i) * c + ch) * hw + k] =
            ch == 0 ? float(1e4 + 0.1 * i + 0.05 * noise(rng)) : float(-3e3 + 2.0 * noise(rng));
  std::vector<double> ref_mean(c), ref_m2(c);
  for (int ch = 0; ch < c; ++ch) {
    long double sum = 0, sq = 0;
    for (int i = 0; i < n; ++i)
      for (long k = 0; k < hw; ++k) sum += x[(size_t(i) * c + ch) * hw + k];
    const long double mean = sum / (n * hw);
    for (int i = 0; i < n; ++i)
      for (long k = 0; k < hw; ++k) {
        const long double d = x[(size_t(i) * c + ch) * hw + k] - mean;
        sq += d * d;
      }
    ref_mean[ch] = double(mean);
    ref_m2[ch] = double(sq);
  }
  std::vector<double> first_mean, first_m2;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    std::vector<double> mean(c, -1), m2(c, -1);
    channel_moments<float>(n, c, hw, x.data(), mean.data(), m2.data());
    for (int ch = 0; ch < c; ++ch) {
      EXPECT_NEAR(mean[ch], ref_mean[ch], 1e-12 * std::abs(ref_mean[ch])) << "channel " << ch;
      EXPECT_NEAR(m2[ch], ref_m2[ch], 1e-5 * ref_m2[ch]) << "channel " << ch;
    }
    if (first_mean.empty()) {
      first_mean = mean, first_m2 = m2;
    } else {
      EXPECT_EQ(mean, first_mean);
      EXPECT_EQ(m2, first_m2);
    }
  }
}

// MomentsByBlocks: whichever ranges a writer adds (none, all, ranges cutting blocks, one
// range in pieces, past the plane's end), finish() gives channel_moments' bits; and it
// takes the added blocks from add_range: they are spoilt in x before finish() and the
// moments stay those of the unspoilt x. Planes of 3000 (two whole blocks and part of a
// third) and of 700 elements (one short block).
TEST(NormCpu, MomentsByBlocksAreChannelMomentsWhateverRangesComeFirst) {
  const int n = 2, c = 3;
  for (const long hw : {3000L, 700L}) {
    std::vector<float> x(size_t(n) * c * hw);
    std::mt19937 rng(9);
    std::normal_distribution<double> noise(0.0, 1.0);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float((i / hw) % 2 ? 1e4 + 0.05 * noise(rng) : noise(rng));
    std::vector<double> want_mean(c), want_m2(c);
    channel_moments<float>(n, c, hw, x.data(), want_mean.data(), want_m2.data());
    const std::vector<std::vector<std::pair<long, long>>> orders = {
        {}, {{0, hw}}, {{0, 1500}, {1500, hw}}, {{100, 2100}}, {{2048, 9000}, {0, 1024}}, {{0, 700}, {700, 2900}}};
    for (const auto& ranges : orders) {
      std::vector<float> y = x;
      MomentsByBlocks moments(n, c, hw, y.data());
      for (int i = 0; i < n; ++i)
        for (int ch = 0; ch < c; ++ch)
          for (const auto& [from, to] : ranges) moments.add_range(i, ch, from, to);
      // Spoil every block wholly inside an added range.
      for (const auto& [from, to] : ranges)
        for (long b0 = 0; b0 < hw; b0 += kMomentsBlock) {
          const long b1 = std::min(hw, b0 + kMomentsBlock);
          if (b0 >= from && b1 <= to)
            for (size_t p = 0; p < size_t(n) * c; ++p) std::fill(&y[p * hw + b0], &y[p * hw + b1], NAN);
        }
      std::vector<double> mean(c, -1), m2(c, -1);
      moments.finish(mean.data(), m2.data());
      EXPECT_EQ(mean, want_mean) << hw << " elements, " << ranges.size() << " ranges";
      EXPECT_EQ(m2, want_m2) << hw << " elements, " << ranges.size() << " ranges";
    }
  }
}

}  // namespace
}  // namespace ht::cpu
