// The fast paths of the CPU kernels against the plain rules they replace, bit for bit:
// max pooling vectorised across windows (ties, NaN, -inf, padding, overlapping, gapped and
// tiling windows), the branch-free ReLU backward, and the caching host allocator's accounting
// and reuse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/pool.hpp"
#include "worker/runtime/tensor.hpp"

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
      pgeom(1, 2, 6, 2 * 1024 + 7, 2, 2, 2, 2, 0, 0, 0, 0),  // tiling windows: rows over chunks
      pgeom(2, 1, 11, 4 * 1030 + 3, 4, 4, 4, 4, 0, 0, 0, 0),  // the same with pool 4
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

// A free piece up to twice the request is cut: the request takes its front, the rest stays
// free; freed neighbours merge again, so the whole block serves its own size once more.
TEST(AllocatorCache, AFreePieceIsCutForASmallerRequestAndMergesAgain) {
  Allocator a("test", 0, BlockCache::Reuse);
  char* p = static_cast<char*>(a.allocate(8000, "a"));
  a.deallocate(p, 8000);
  void* q = a.allocate(5000, "b");  // 5056 rounded
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.in_use(), 5000u);
  EXPECT_EQ(a.cached(), 8000u - 5056u);
  EXPECT_EQ(a.reserved(), 8000u);
  void* r = a.allocate(2900, "c");  // 2944 rounded: the rest of the block
  EXPECT_EQ(r, p + 5056);
  EXPECT_EQ(a.cached(), 0u);
  EXPECT_EQ(a.reserved(), 8000u);
  a.deallocate(q, 5000);
  void* s = a.allocate(3000, "d");  // the smallest free piece that holds it: q's front
  EXPECT_EQ(s, p);
  a.deallocate(s, 3000);
  a.deallocate(r, 2900);  // merges with the piece before it, which merged with s's
  EXPECT_EQ(a.cached(), 8000u);
  EXPECT_EQ(a.allocate(8000, "e"), p);  // one piece again
  EXPECT_EQ(a.reserved(), 8000u);
  a.deallocate(p, 8000);
}

// Only a block with nothing in use goes back to the system, and only when the reservation
// would pass the peak in use by more than a quarter of it. A free piece more than twice the
// request is cut only when a block of the request's own would pass that limit.
TEST(AllocatorCache, WhollyFreeBlocksYieldToThePeakLimit) {
  Allocator a("test", 0, BlockCache::Reuse);
  void* big = a.allocate(8192, "peak");
  a.deallocate(big, 8192);
  char* other = static_cast<char*>(a.allocate(16384, "other"));  // 8192 + 16384 would pass 16384 + 4096
  EXPECT_EQ(a.cached(), 0u);
  EXPECT_EQ(a.reserved(), 16384u);
  void* piece = a.allocate(64, "piece");  // 16448 <= 16384 + 4096: a block of its own
  EXPECT_EQ(a.reserved(), 16384u + 64u);
  a.deallocate(other, 16384);
  void* again = a.allocate(1024, "again");  // 17472 <= 20480: a block of its own, not a cut
  EXPECT_NE(again, other);
  EXPECT_EQ(a.reserved(), 16384u + 64u + 1024u);
  EXPECT_EQ(a.cached(), 16384u);
  void* cut = a.allocate(4096, "cut");  // 21568 would pass 20480: the free block is cut
  EXPECT_EQ(cut, other);
  EXPECT_EQ(a.reserved(), 16384u + 64u + 1024u);
  EXPECT_EQ(a.cached(), 16384u - 4096u);
  a.deallocate(cut, 4096);
  a.deallocate(again, 1024);
  a.deallocate(piece, 64);
  a.release_cached();
  EXPECT_EQ(a.reserved(), 0u);
}

// Counts what the system is asked for.
class SystemCountingAllocator : public Allocator {
 public:
  SystemCountingAllocator() : Allocator("test", 0, BlockCache::Reuse) {}
  ~SystemCountingAllocator() override { release_cached(); }
  int system_allocations = 0;

 protected:
  void* raw_allocate(size_t bytes) override {
    ++system_allocations;
    return Allocator::raw_allocate(bytes);
  }
};

// The allocations of a training step over conv -> BN -> ReLU -> 2x2 max-pool blocks (each
// a quarter of the area of the last, with more channels), in the trainer's order: forward
// keeps every output; each backward takes its input's gradient, then frees its output and
// the output's gradient. After the first step nothing comes from the system, though the
// backward asks for sizes the forward freed in other combinations, and the reservation
// stays within a quarter of the peak. Handing out whole cached blocks of up to twice the
// request instead took 11 blocks a step from the system (and released as many).
TEST(AllocatorCache, ARepeatedTrainingStepTakesNothingFromTheSystemAfterTheFirst) {
  SystemCountingAllocator a;
  std::vector<size_t> sizes = {1u << 20};  // the image, then every layer's output
  for (size_t conv : {12u << 20, 4u << 20, 2u << 20, 1u << 20}) sizes.insert(sizes.end(), {conv, conv, conv, conv / 4});
  auto step = [&] {
    std::vector<void*> acts;
    for (size_t s : sizes) acts.push_back(a.allocate(s, "activation"));
    void* grad = a.allocate(sizes.back(), "loss gradient");
    for (size_t l = sizes.size() - 1; l-- > 0;) {  // layer l reads tensor l, writes l + 1
      void* dx = l > 0 ? a.allocate(sizes[l], "input gradient") : nullptr;
      a.deallocate(grad, sizes[l + 1]);
      a.deallocate(acts[l + 1], sizes[l + 1]);
      grad = dx;
    }
    a.deallocate(acts[0], sizes[0]);
  };
  step();
  const int first = a.system_allocations;
  for (int i = 0; i < 4; ++i) step();
  EXPECT_EQ(a.system_allocations, first);
  EXPECT_EQ(a.in_use(), 0u);
  EXPECT_LE(a.reserved(), a.peak() + a.peak() / 4);
}

// The step of the demo model at 4096 x 4096 with its first batch norm, ReLU and 4x4 max pool
// fused (sizes in KiB for MiB): two tensors of 1024 live at the peak, many small ones
// around them. The first step learns the peak (what it frees early is released as the
// reservation passes the peak so far), the second takes those blocks back; from then on
// nothing comes from the system. Small tensors used to be cut out of the free 1024 blocks,
// so every step took a third 1024 block from the system and released it.
TEST(AllocatorCache, SmallTensorsDoNotSplitTheBlocksOfLargeOnes) {
  SystemCountingAllocator a;
  // {slot, KiB}: allocate slot; {slot, 0}: free it. Slots: 0 image, 1 conv1, 2 pool1,
  // 3 argmax1, 4 conv2, 5 pool2, 6 argmax2, 7 conv3, 8 relu3, 9..13 gradients.
  const std::vector<std::pair<int, size_t>> ops = {
      {0, 128}, {1, 1024}, {2, 64}, {3, 16}, {4, 128}, {5, 32}, {6, 8}, {7, 32}, {8, 32}, {9, 32},  // forward
      {8, 0},   {10, 32},  {7, 0},  {9, 0},  {5, 0},   {11, 128}, {6, 0}, {10, 0}, {12, 64}, {4, 0},
      {11, 0},  {2, 0},    {13, 1024}, {3, 0}, {12, 0}, {1, 0},  {13, 0}, {0, 0}};
  std::vector<void*> slot(14, nullptr);
  std::vector<size_t> size(14, 0);
  auto step = [&] {
    for (auto [i, kib] : ops) {
      if (kib) {
        size[i] = kib << 10;
        slot[i] = a.allocate(size[i], "tensor");
      } else {
        a.deallocate(slot[i], size[i]);
      }
    }
  };
  step();
  step();
  const int second = a.system_allocations;
  for (int i = 0; i < 4; ++i) step();
  EXPECT_EQ(a.system_allocations, second);
  EXPECT_LE(a.reserved(), a.peak() + a.peak() / 4);
}

TEST(AllocatorCache, OffFreesAtOnce) {
  Allocator a("test");
  void* p = a.allocate(4096, "a");
  a.deallocate(p, 4096);
  EXPECT_EQ(a.cached(), 0u);
  EXPECT_EQ(a.reserved(), 0u);
}

// Channel moments made by the kernel that wrote a tensor go with it when it moves, and go
// when its memory is zeroed, freed or passed on (a gradient written over it): a batch norm
// never reads moments of values they were not made from.
TEST(TensorMoments, MoveWithTheTensorAndGoWhenItsValuesMayChange) {
  Allocator a("test");
  auto made = [&] {
    Tensor t(a, 1, 2, 3, 4, "t");
    t.set_moments({{1.0, 2.0}, {3.0, 4.0}});
    return t;
  };
  Tensor t = made();
  ASSERT_NE(t.moments(), nullptr);
  EXPECT_EQ(t.moments()->mean, (std::vector<double>{1.0, 2.0}));
  Tensor moved(std::move(t));
  EXPECT_EQ(t.moments(), nullptr);
  ASSERT_NE(moved.moments(), nullptr);
  EXPECT_EQ(moved.moments()->m2, (std::vector<double>{3.0, 4.0}));
  Tensor assigned = made();
  assigned = std::move(moved);
  ASSERT_NE(assigned.moments(), nullptr);
  EXPECT_EQ(assigned.moments()->mean, (std::vector<double>{1.0, 2.0}));
  assigned.zero();
  EXPECT_EQ(assigned.moments(), nullptr);
  Tensor passed = made();
  passed.pass_on();
  EXPECT_EQ(passed.moments(), nullptr);
  Tensor released = made();
  released.release();
  EXPECT_EQ(released.moments(), nullptr);
}

}  // namespace
}  // namespace ht
