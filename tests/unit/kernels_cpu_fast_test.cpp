// The fast paths of the CPU kernels against the plain rules they replace, bit for bit:
// max pooling vectorised across windows (ties, NaN, -inf, padding, overlapping and gapped
// windows), the branch-free ReLU backward, and the caching host allocator's accounting.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/pool.hpp"
#include "worker/tensor.hpp"

namespace ht {
namespace {

PoolGeom pgeom(int n, int c, int h, int w, int kh, int kw, int sh, int sw, int pt, int pb, int pl, int pr) {
  PoolGeom g;
  g.n = n, g.c = c, g.hin = h, g.win = w, g.kh = kh, g.kw = kw, g.stride_h = sh, g.stride_w = sw;
  g.pad_top = pt, g.pad_bottom = pb, g.pad_left = pl, g.pad_right = pr;
  return g;
}

// PyTorch's CPU rule, written out: scan the window row-major from -inf, take `v > best ||
// isnan(v)`; gradients add into the chosen element, windows in (oh, ow) order.
template <class T>
long ref_argmax(const PoolGeom& g, const T* xp, int oh, int ow) {
  const int hs = oh * g.stride_h - g.pad_top, ws = ow * g.stride_w - g.pad_left;
  const int h0 = std::max(hs, 0), h1 = std::min(hs + g.kh, g.hin);
  const int w0 = std::max(ws, 0), w1 = std::min(ws + g.kw, g.win);
  if (h0 >= h1 || w0 >= w1) return -1;
  long best = long(h0) * g.win + w0;
  T bv = -std::numeric_limits<T>::infinity();
  for (int h = h0; h < h1; ++h)
    for (int c = w0; c < w1; ++c) {
      const T v = xp[long(h) * g.win + c];
      if (v > bv || std::isnan(v)) {
        best = long(h) * g.win + c;
        bv = v;
      }
    }
  return best;
}

template <class T>
void ref_pool(const PoolGeom& g, const std::vector<T>& x, const std::vector<T>& dy, std::vector<T>& y,
              std::vector<T>& dx) {
  const int ho = g.hout(), wo = g.wout();
  y.assign(g.y_size(), 0);
  dx.assign(g.x_size(), 0);
  for (long p = 0; p < long(g.n) * g.c; ++p)
    for (int oh = 0; oh < ho; ++oh)
      for (int ow = 0; ow < wo; ++ow) {
        const T* xp = x.data() + size_t(p) * g.hin * g.win;
        const long i = ref_argmax(g, xp, oh, ow);
        const size_t o = size_t(p) * ho * wo + size_t(oh) * wo + ow;
        y[o] = i < 0 ? -std::numeric_limits<T>::infinity() : xp[i];
        if (i >= 0) dx[size_t(p) * g.hin * g.win + i] += dy[o];
      }
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0 || (std::isnan(a) && std::isnan(b));
}

// Few distinct levels (many ties, as after a ReLU), some -0, -inf and NaN.
template <class T>
std::vector<T> tie_heavy(size_t n, std::mt19937_64& rng, bool specials) {
  std::uniform_int_distribution<int> level(-2, 3), pick(0, 99);
  std::vector<T> v(n);
  for (auto& x : v) {
    x = T(std::max(0, level(rng))) * T(0.5);
    const int k = pick(rng);
    if (k < 5) x = T(-0.0);
    if (specials && k == 5) x = -std::numeric_limits<T>::infinity();
    if (specials && k == 6) x = std::numeric_limits<T>::quiet_NaN();
  }
  return v;
}

template <class T>
void check_pool_matches_rule() {
  std::mt19937_64 rng(11);
  const std::vector<PoolGeom> geoms = {
      pgeom(2, 3, 16, 24, 4, 4, 4, 4, 0, 0, 0, 0),  // the demo's pool 4
      pgeom(1, 2, 17, 23, 2, 2, 2, 2, 0, 0, 0, 0),  // odd sizes: uncovered last row/col
      pgeom(1, 2, 13, 29, 3, 3, 2, 2, 1, 1, 1, 1),  // overlapping, padded
      pgeom(1, 1, 12, 40, 3, 3, 1, 1, 1, 1, 1, 1),  // stride 1
      pgeom(1, 1, 11, 37, 2, 3, 3, 4, 0, 1, 2, 0),  // gaps between windows, asymmetric pad
      pgeom(1, 1, 5, 6, 3, 3, 1, 1, 2, 2, 2, 2),    // windows wholly in padding
      pgeom(1, 1, 9, 3, 3, 5, 2, 1, 1, 1, 2, 2),    // no interior column at all
  };
  for (const PoolGeom& g : geoms)
    for (bool specials : {false, true}) {
      const std::vector<T> x = tie_heavy<T>(g.x_size(), rng, specials);
      std::vector<T> dy(g.y_size());
      for (auto& d : dy) d = T(std::uniform_real_distribution<double>(-1, 1)(rng));
      std::vector<T> ry, rdx, y(g.y_size(), T(7)), dx(g.x_size(), T(7));
      ref_pool(g, x, dy, ry, rdx);
      cpu::max_pool_forward<T>(g, x.data(), y.data());
      cpu::max_pool_backward<T>(g, x.data(), dy.data(), dx.data());
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_TRUE(same_bits(y[i], ry[i])) << "y[" << i << "] " << y[i] << " vs " << ry[i] << " geom "
                                            << g.hin << "x" << g.win << " k" << g.kh << "x" << g.kw;
      for (size_t i = 0; i < dx.size(); ++i)
        ASSERT_TRUE(same_bits(dx[i], rdx[i])) << "dx[" << i << "] " << dx[i] << " vs " << rdx[i] << " geom "
                                              << g.hin << "x" << g.win << " k" << g.kh << "x" << g.kw;
    }
}

TEST(PoolCpuFast, MaxMatchesScanRuleFloat) { check_pool_matches_rule<float>(); }
TEST(PoolCpuFast, MaxMatchesScanRuleDouble) { check_pool_matches_rule<double>(); }

TEST(ElementwiseCpuFast, ReluBackwardKeepsTorchTestAndMayAlias) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y = {1, 0, -0.0f, -2, nan, 3}, dy = {10, 20, 30, 40, 50, 60}, dx(6);
  cpu::relu_backward<float>(y.size(), y.data(), dy.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<float>{10, 0, 0, 0, 50, 60}));  // y <= 0 -> 0; NaN passes dy
  cpu::relu_backward<float>(y.size(), y.data(), dy.data(), dy.data());
  EXPECT_EQ(dy, dx);
}

TEST(AllocatorCache, ReusesBlocksAndKeepsInUseAndPeak) {
  Allocator a("test", 0, BlockCache::Reuse);
  void* p = a.allocate(1000, "a");
  void* q = a.allocate(5000, "b");
  EXPECT_EQ(a.in_use(), 6000u);
  EXPECT_EQ(a.peak(), 6000u);
  a.deallocate(p, 1000);
  EXPECT_EQ(a.in_use(), 5000u);  // cached blocks are not in use
  EXPECT_EQ(a.cached(), 1024u);  // 64-byte rounded
  EXPECT_EQ(a.reserved(), 5056u + 1024u);  // both rounded
  void* r = a.allocate(1000, "c");  // same rounded size: the same block
  EXPECT_EQ(r, p);
  EXPECT_EQ(a.cached(), 0u);
  EXPECT_EQ(a.peak(), 6000u);
  a.deallocate(r, 1000);
  a.deallocate(q, 5000);
  EXPECT_EQ(a.in_use(), 0u);
  a.release_cached();
  EXPECT_EQ(a.cached(), 0u);
  EXPECT_EQ(a.reserved(), 0u);
}

TEST(AllocatorCache, CachedBlocksYieldToTheBudget) {
  Allocator a("test", 10000, BlockCache::Reuse);
  void* p = a.allocate(6000, "a");
  a.deallocate(p, 6000);
  EXPECT_EQ(a.cached(), 6016u);
  // A different size: the cached block is released so the reservation stays in budget.
  void* q = a.allocate(8000, "b");
  EXPECT_EQ(a.cached(), 0u);
  EXPECT_LE(a.reserved(), 10000u);
  EXPECT_THROW(a.allocate(4000, "c"), DeviceMemoryError);  // the budget counts bytes in use
  a.deallocate(q, 8000);
}

// A request whose size is not cached takes the smallest cached block of up to twice its
// size (the sizes of a sharded step change within it); the block keeps its own size.
TEST(AllocatorCache, ALargerCachedBlockServesASmallerRequest) {
  Allocator a("test", 0, BlockCache::Reuse);
  void* p = a.allocate(8000, "a");
  a.deallocate(p, 8000);
  void* q = a.allocate(5000, "b");
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.in_use(), 5000u);
  EXPECT_EQ(a.cached(), 0u);
  EXPECT_EQ(a.reserved(), 8000u);  // the whole block is held
  a.deallocate(q, 5000);
  EXPECT_EQ(a.cached(), 8000u);
  EXPECT_EQ(a.allocate(8000, "c"), p);  // filed under its own size again
  a.deallocate(p, 8000);
  void* small = a.allocate(900, "d");  // more than twice smaller: a block of its own
  EXPECT_NE(small, p);
  EXPECT_EQ(a.cached(), 8000u);
  a.deallocate(small, 900);
}

// The reservation may pass the peak in use by an eighth of it, so that a block alive at
// the peak is not released and faulted in again each step for a smaller one elsewhere.
TEST(AllocatorCache, TheReservationStaysWithinAnEighthAboveThePeak) {
  Allocator a("test", 0, BlockCache::Reuse);
  void* big = a.allocate(8192, "peak");
  a.deallocate(big, 8192);
  void* small = a.allocate(1024, "other");  // 8192 + 1024 = 9216 = peak + peak / 8: kept
  EXPECT_EQ(a.cached(), 8192u);
  void* more = a.allocate(64, "more");  // would pass it: the cached block goes
  EXPECT_EQ(a.cached(), 0u);
  EXPECT_LE(a.reserved(), a.peak() + a.peak() / 8);
  a.deallocate(small, 1024);
  a.deallocate(more, 64);
}

TEST(AllocatorCache, OffFreesAtOnce) {
  Allocator a("test");
  void* p = a.allocate(4096, "a");
  a.deallocate(p, 4096);
  EXPECT_EQ(a.cached(), 0u);
  EXPECT_EQ(a.reserved(), 0u);
}

}  // namespace
}  // namespace ht
