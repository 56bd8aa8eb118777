// What the CUDA backend's kernel tests share: random inputs, a comparison at each value's
// own precision, and a fixture that holds a CUDA backend (skipping the test with the
// reason when no device answers, or the build has no CUDA backend) and its buffers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "worker/runtime/backend.hpp"

namespace ht::cuda_test {


using Vec = std::vector<float>;
using DVec = std::vector<double>;

inline Vec random_vec(size_t n, unsigned seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  Vec v(n);
  for (float& x : v) x = u(rng);
  return v;
}

inline DVec to_double(const Vec& v) { return DVec(v.begin(), v.end()); }

// Floats or doubles, each compared at its own precision: a host double sum is not rounded
// to float first (that alone is off by 6e-8 relative, far above the sums' tolerance).
template <class G, class R>
void expect_close(const G& got, const R& ref, double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = double(ref[i]), a = double(got[i]);
    if (!(std::fabs(a - r) <= atol + rtol * std::fabs(r))) {
      if (++bad <= 5) ADD_FAILURE() << std::setprecision(17) << what << "[" << i << "]: gpu " << a << " ref " << r;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ";
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendOptions o;
    o.kind = Backend::CUDA;
    o.name = "test";
    try {
      gpu_ = make_cuda_backend(o);
    } catch (const std::exception& e) {
      GTEST_SKIP() << "no usable CUDA backend: " << e.what();
    }
  }
  void TearDown() override {
    for (auto& b : buffers_) gpu_->allocator().deallocate(b.first, b.second);
    buffers_.clear();
  }

  // Device buffers live until the end of the test.
  template <class T>
  T* dev(const std::vector<T>& host) {
    T* p = static_cast<T*>(gpu_->allocator().allocate(std::max<size_t>(host.size(), 1) * sizeof(T), "test"));
    buffers_.push_back({p, std::max<size_t>(host.size(), 1) * sizeof(T)});
    gpu_->from_host(p, host.data(), host.size() * sizeof(T));
    return p;
  }
  float* dev_zero(size_t n) { return dev(Vec(n, 0.f)); }
  Vec host(const float* p, size_t n) {
    Vec v(n);
    gpu_->to_host(v.data(), p, n * sizeof(float));
    return v;
  }

  std::unique_ptr<ComputeBackend> gpu_;
  std::vector<std::pair<void*, size_t>> buffers_;
};

}  // namespace ht::cuda_test
