// The gradient checker of the CPU kernel tests (caffe's test_gradient_check_util): central
// differences of a loss against an analytic gradient, in double.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace ht::testing {

using Vec = std::vector<double>;

inline Vec random_vec(size_t n, std::mt19937_64& rng, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline double dotv(const Vec& a, const Vec& b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
}

// Central differences of `loss` w.r.t. every element of `p`, against `analytic`.
// Reports the worst element so a failure says where.
inline void check_grad(const std::string& what, Vec& p, const Vec& analytic,
                const std::function<double()>& loss, double h = 1e-5, double atol = 1e-7,
                double rtol = 1e-6) {
  ASSERT_EQ(p.size(), analytic.size()) << what;
  double worst = 0;
  size_t worst_i = 0;
  double worst_num = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double s = p[i];
    p[i] = s + h;
    const double lp = loss();
    p[i] = s - h;
    const double lm = loss();
    p[i] = s;
    const double num = (lp - lm) / (2 * h);
    const double excess = std::fabs(num - analytic[i]) - (atol + rtol * std::fabs(num));
    if (excess > worst || std::isnan(analytic[i])) {
      worst = std::isnan(analytic[i]) ? 1 : excess;
      worst_i = i;
      worst_num = num;
    }
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << worst_i << " analytic " << analytic[worst_i]
                        << " numeric " << worst_num;
}

}  // namespace ht::testing
