// Batch-norm pieces, parallel over (image, channel) planes. Reductions accumulate each
// plane in T (vector-friendly) in short blocks and the blocks in double, then add the
// per-plane results in a fixed order so results do not depend on the thread count.
#include "kernels/cpu/norm.hpp"

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "kernels/cpu/isa.hpp"

namespace ht::cpu {

namespace {

constexpr long kBlock = kMomentsBlock;  // elements summed in T before going to double

// Runs `plane(p, out2)` for every (n, c) plane into a private pair of doubles, then adds
// the pairs to a[c], b[c] in plane order.
template <class F>
void reduce_planes(int n, int c, long hw, double* a, double* b, F plane) {
  const long planes = long(n) * c;
  std::vector<double> part(size_t(planes) * 2, 0.0);
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > (1 << 15))
  for (long p = 0; p < planes; ++p) plane(p, &part[size_t(p) * 2]);
  for (long p = 0; p < planes; ++p) {
    a[p % c] += part[size_t(p) * 2];
    if (b) b[p % c] += part[size_t(p) * 2 + 1];
  }
}

// Count, mean and sum of squared deviations of a set, merged by Chan et al.'s formula.
struct Moments {
  double n = 0, mean = 0, m2 = 0;
  void merge(const Moments& b) {
    if (b.n == 0) return;
    const double total = n + b.n, d = b.mean - mean;
    mean += d * (b.n / total);
    m2 += b.m2 + d * d * (n * b.n / total);
    n = total;
  }
};

// One block's moments (the float loops also built for AVX2 and AVX-512): a centre near the
// block's mean (its first element, shifted by the mean of the differences), then the sum
// and squares of the deviations from it, in T: each term of the size of the spread, not of
// the mean.
template <class T>
__attribute__((always_inline)) inline Moments block_moments(const T* xp, long len) {
  const T x0 = xp[0];
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (long i = 0; i < len; ++i) s += xp[i] - x0;
  const T centre = T(double(x0) + double(s) / double(len));
  T d = 0, q = 0;
#pragma omp simd reduction(+ : d, q)
  for (long i = 0; i < len; ++i) {
    const T e = xp[i] - centre;
    d += e;
    q += e * e;
  }
  return {double(len), double(centre) + double(d) / double(len),
          std::max(0.0, double(q) - double(d) * double(d) / double(len))};
}

template <class T>
Moments block_moments_baseline(const T* xp, long len) {
  return block_moments(xp, len);
}
HT_AVX2 Moments block_moments_avx2(const float* xp, long len) { return block_moments(xp, len); }
HT_AVX512 Moments block_moments_avx512(const float* xp, long len) { return block_moments(xp, len); }

template <class T>
using BlockMoments = Moments (*)(const T*, long);
template <class T>
BlockMoments<T> block_moments_for_cpu() {
  if constexpr (std::is_same_v<T, float>)
    return for_this_cpu<BlockMoments<float>>(block_moments_baseline<float>, block_moments_avx2, block_moments_avx512);
  else
    return block_moments_baseline<T>;
}

// Blocks of kBlock elements from each plane's start (the last one shorter).
long blocks_per_plane(long hw) { return (hw + kBlock - 1) / kBlock; }
long block_length(long hw, long b) { return std::min(kBlock, hw - b * kBlock); }

// channel_moments from its blocks' moments: each plane's blocks merged in block order
// (those in `blocks`, [plane][block], where `done`; the others summed from x), and the
// planes in plane order into their channels.
template <class T>
void merge_blocks(int n, int c, long hw, const T* x, const std::vector<Moments>* blocks,
                  const std::vector<char>* done, double* mean, double* m2) {
  const BlockMoments<T> block = block_moments_for_cpu<T>();
  const long planes = long(n) * c, per_plane = blocks_per_plane(hw);
  std::vector<Moments> part(static_cast<size_t>(planes));
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    Moments m;
    for (long b = 0; b < per_plane; ++b) {
      const size_t i = size_t(p * per_plane + b);
      m.merge(done && (*done)[i] ? (*blocks)[i]
                                 : block(x + size_t(p) * hw + size_t(b) * kBlock, block_length(hw, b)));
    }
    part[size_t(p)] = m;
  }
  std::vector<Moments> ch(static_cast<size_t>(c));
  for (long p = 0; p < planes; ++p) ch[size_t(p % c)].merge(part[size_t(p)]);
  for (int i = 0; i < c; ++i) {
    mean[i] = ch[size_t(i)].mean;
    m2[i] = ch[size_t(i)].m2;
  }
}

}  // namespace

template <class T>
void channel_moments(int n, int c, long hw, const T* x, double* mean, double* m2) {
  merge_blocks<T>(n, c, hw, x, nullptr, nullptr, mean, m2);
}

struct MomentsByBlocks::Blocks {
  int n, c;
  long hw;
  const float* x;
  std::vector<Moments> moments;  // [plane][block]
  std::vector<char> done;
};

MomentsByBlocks::MomentsByBlocks(int n, int c, long hw, const float* x)
    : blocks_(new Blocks{n, c, hw, x, {}, {}}) {
  const size_t count = size_t(n) * c * size_t(blocks_per_plane(hw));
  blocks_->moments.resize(count);
  blocks_->done.assign(count, 0);
}

MomentsByBlocks::~MomentsByBlocks() = default;

void MomentsByBlocks::add_range(int image, int channel, long from, long to) {
  static const BlockMoments<float> block = block_moments_for_cpu<float>();
  Blocks& k = *blocks_;
  const long p = long(image) * k.c + channel, per_plane = blocks_per_plane(k.hw);
  const float* plane = k.x + size_t(p) * k.hw;
  to = std::min(to, k.hw);
  for (long b = (std::max(from, 0L) + kBlock - 1) / kBlock; b < per_plane && b * kBlock + block_length(k.hw, b) <= to;
       ++b) {
    const size_t i = size_t(p * per_plane + b);
    k.moments[i] = block(plane + size_t(b) * kBlock, block_length(k.hw, b));
    k.done[i] = 1;
  }
}

void MomentsByBlocks::finish(double* mean, double* m2) {
  const Blocks& k = *blocks_;
  merge_blocks<float>(k.n, k.c, k.hw, k.x, &k.moments, &k.done, mean, m2);
}

template <class T>
void channel_sum(int n, int c, long hw, const T* x, double* sum) {
  reduce_planes(n, c, hw, sum, nullptr, [&](long p, double* out) {
    const T* xp = x + size_t(p) * hw;
    for (long i0 = 0; i0 < hw; i0 += kBlock) {
      const long i1 = i0 + kBlock < hw ? i0 + kBlock : hw;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (long i = i0; i < i1; ++i) s += xp[i];
      out[0] += double(s);
    }
  });
}

template <class T>
void channel_sq_dev_sum(int n, int c, long hw, const T* x, const double* mean, double* out_sum) {
  reduce_planes(n, c, hw, out_sum, nullptr, [&](long p, double* out) {
    const T* xp = x + size_t(p) * hw;
    const T m = T(mean[p % c]);
    for (long i0 = 0; i0 < hw; i0 += kBlock) {
      const long i1 = i0 + kBlock < hw ? i0 + kBlock : hw;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (long i = i0; i < i1; ++i) s += (xp[i] - m) * (xp[i] - m);
      out[0] += double(s);
    }
  });
}

namespace {

// y = (x - mean) * invstd * gamma + beta per plane, then `after` of each value.
template <class T, class After>
void bn_affine(int n, int c, long hw, const T* x, const double* mean, const double* invstd, const T* gamma,
               const T* beta, T* y, After after) {
  const long planes = long(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    const int ch = int(p % c);
    const T m = T(mean[ch]), s = T((gamma ? double(gamma[ch]) : 1.0) * invstd[ch]), b = beta ? beta[ch] : T(0);
    const T* xp = x + size_t(p) * hw;
    T* yp = y + size_t(p) * hw;
#pragma omp simd
    for (long i = 0; i < hw; ++i) yp[i] = after((xp[i] - m) * s + b);
  }
}

}  // namespace

template <class T>
void bn_forward_apply(int n, int c, long hw, const T* x, const double* mean, const double* invstd,
                      const T* gamma, const T* beta, T* y) {
  bn_affine(n, c, hw, x, mean, invstd, gamma, beta, y, [](T v) { return v; });
}

template <class T>
void bn_relu_forward(int n, int c, long hw, const T* x, const double* mean, const double* invstd, const T* gamma,
                     const T* beta, T* y) {
  // relu_forward's test: NaN passes.
  bn_affine(n, c, hw, x, mean, invstd, gamma, beta, y, [](T v) { return v < T(0) ? T(0) : v; });
}

namespace {

// The gradient reaching the batch norm at pixel i: dy, or with a ReLU after it (its output
// y) relu_backward's dy where y > 0, else 0.
template <class T, bool Relu>
__attribute__((always_inline)) inline T grad_in(const T* dp, const T* yp, long i) {
  const T d = dp[i];
  if constexpr (Relu) {
    const T yv = yp[i];  // both loads unconditional: a select the loops vectorise
    return yv <= T(0) ? T(0) : d;
  }
  (void)yp;
  return d;
}

// One plane's sums of g and of g * (x - m), g = grad_in: float partial sums over kBlock
// elements (vectorised), accumulated in double.
template <class T, bool Relu>
void plane_dy_sums(const T* dp, const T* yp, const T* xp, T m, long hw, double& sum_dy, double& sum_dy_dev) {
  for (long i0 = 0; i0 < hw; i0 += kBlock) {
    const long i1 = i0 + kBlock < hw ? i0 + kBlock : hw;
    T s = 0, sx = 0;
#pragma omp simd reduction(+ : s, sx)
    for (long i = i0; i < i1; ++i) {
      const T g = grad_in<T, Relu>(dp, yp, i);
      s += g;
      sx += g * (xp[i] - m);
    }
    sum_dy += double(s);
    sum_dy_dev += double(sx);
  }
}

template <class T, bool Relu>
void backward_sums(int n, int c, long hw, const T* dy, const T* y, const T* x, const double* mean,
                   const double* invstd, double* sum_dy, double* sum_dy_xhat) {
  std::vector<double> sdx(c, 0.0);
  reduce_planes(n, c, hw, sum_dy, sdx.data(), [&](long p, double* out) {
    plane_dy_sums<T, Relu>(dy + size_t(p) * hw, Relu ? y + size_t(p) * hw : nullptr, x + size_t(p) * hw,
                           T(mean[p % c]), hw, out[0], out[1]);
  });
  // invstd is constant per channel: apply it once to the sum of dy*(x-mean).
  for (int ch = 0; ch < c; ++ch) sum_dy_xhat[ch] += sdx[ch] * invstd[ch];
}

template <class T, bool Relu>
void backward_apply(int n, int c, long hw, const T* dy, const T* y, const T* x, const double* mean,
                    const double* invstd, const T* gamma, const double* sum_dy, const double* sum_dy_xhat,
                    double count, T* dx) {
  const long planes = long(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    const int ch = int(p % c);
    // dx = k*g + a*(x-mean) + b  with the per-channel constants below.
    const double is = invstd[ch], k = (gamma ? double(gamma[ch]) : 1.0) * is;
    const T tk = T(k), m = T(mean[ch]);
    const T a = T(-k * is * sum_dy_xhat[ch] / count), b = T(-k * sum_dy[ch] / count);
    const T* dp = dy + size_t(p) * hw;
    const T* yp = Relu ? y + size_t(p) * hw : nullptr;
    const T* xp = x + size_t(p) * hw;
    T* out = dx + size_t(p) * hw;
#pragma omp simd
    for (long i = 0; i < hw; ++i) out[i] = tk * grad_in<T, Relu>(dp, yp, i) + a * (xp[i] - m) + b;
  }
}

}  // namespace

template <class T>
void bn_backward_sums(int n, int c, long hw, const T* dy, const T* x, const double* mean,
                      const double* invstd, double* sum_dy, double* sum_dy_xhat) {
  backward_sums<T, false>(n, c, hw, dy, nullptr, x, mean, invstd, sum_dy, sum_dy_xhat);
}

template <class T>
void bn_backward_apply(int n, int c, long hw, const T* dy, const T* x, const double* mean,
                       const double* invstd, const T* gamma, const double* sum_dy,
                       const double* sum_dy_xhat, double count, T* dx) {
  backward_apply<T, false>(n, c, hw, dy, nullptr, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, dx);
}

template <class T>
void bn_relu_backward_sums(int n, int c, long hw, const T* dy, const T* y, const T* x, const double* mean,
                           const double* invstd, double* sum_dy, double* sum_dy_xhat) {
  backward_sums<T, true>(n, c, hw, dy, y, x, mean, invstd, sum_dy, sum_dy_xhat);
}

template <class T>
void bn_relu_backward_apply(int n, int c, long hw, const T* dy, const T* y, const T* x, const double* mean,
                            const double* invstd, const T* gamma, const double* sum_dy, const double* sum_dy_xhat,
                            double count, T* dx) {
  backward_apply<T, true>(n, c, hw, dy, y, x, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, dx);
}

template <class T>
void plane_sq_dev_sum(int n, int c, long hw, const T* x, const double* mean, double* out) {
  const long planes = long(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    const T* xp = x + size_t(p) * hw;
    const T m = T(mean[p]);
    double acc = 0;
    for (long i0 = 0; i0 < hw; i0 += kBlock) {
      const long i1 = i0 + kBlock < hw ? i0 + kBlock : hw;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (long i = i0; i < i1; ++i) s += (xp[i] - m) * (xp[i] - m);
      acc += double(s);
    }
    out[p] = acc;
  }
}

template <class T>
void plane_affine(int n, int c, long hw, const T* x, const double* mean, const double* scale, const double* shift,
                  T* y) {
  const long planes = long(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    const T m = T(mean[p]), s = T(scale[p]), b = T(shift[p]);
    const T* xp = x + size_t(p) * hw;
    T* yp = y + size_t(p) * hw;
#pragma omp simd
    for (long i = 0; i < hw; ++i) yp[i] = (xp[i] - m) * s + b;
  }
}

template <class T>
void plane_backward_sums(int n, int c, long hw, const T* dy, const T* x, const double* mean, double* sum_dy,
                         double* sum_dy_dev) {
  const long planes = long(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    double a = 0, b = 0;
    plane_dy_sums<T, false>(dy + size_t(p) * hw, nullptr, x + size_t(p) * hw, T(mean[p]), hw, a, b);
    sum_dy[p] = a;
    sum_dy_dev[p] = b;
  }
}

template <class T>
void plane_backward_apply(int n, int c, long hw, const T* dy, const T* x, const double* mean, const double* k,
                          const double* a, const double* b, T* dx) {
  const long planes = long(n) * c;
#pragma omp parallel for schedule(static) if (size_t(planes) * hw > (1 << 15))
  for (long p = 0; p < planes; ++p) {
    const T tk = T(k[p]), ta = T(a[p]), tb = T(b[p]), m = T(mean[p]);
    const T* dp = dy + size_t(p) * hw;
    const T* xp = x + size_t(p) * hw;
    T* out = dx + size_t(p) * hw;
#pragma omp simd
    for (long i = 0; i < hw; ++i) out[i] = tk * dp[i] + ta * (xp[i] - m) + tb;
  }
}

#define HT_NORM_INST(T)                                                                     \
  template void channel_moments<T>(int, int, long, const T*, double*, double*);             \
  template void channel_sum<T>(int, int, long, const T*, double*);                          \
  template void channel_sq_dev_sum<T>(int, int, long, const T*, const double*, double*);    \
  template void bn_forward_apply<T>(int, int, long, const T*, const double*, const double*, \
                                    const T*, const T*, T*);                                \
  template void bn_relu_forward<T>(int, int, long, const T*, const double*, const double*, \
                                   const T*, const T*, T*);                                \
  template void bn_backward_sums<T>(int, int, long, const T*, const T*, const double*,      \
                                    const double*, double*, double*);                       \
  template void bn_relu_backward_sums<T>(int, int, long, const T*, const T*, const T*, const double*, \
                                         const double*, double*, double*);                  \
  template void bn_relu_backward_apply<T>(int, int, long, const T*, const T*, const T*, const double*, \
                                          const double*, const T*, const double*, const double*, double, T*); \
  template void bn_backward_apply<T>(int, int, long, const T*, const T*, const double*,     \
                                     const double*, const T*, const double*, const double*, \
                                     double, T*);                                           \
  template void plane_sq_dev_sum<T>(int, int, long, const T*, const double*, double*);      \
  template void plane_affine<T>(int, int, long, const T*, const double*, const double*, const double*, T*); \
  template void plane_backward_sums<T>(int, int, long, const T*, const T*, const double*, double*, double*); \
  template void plane_backward_apply<T>(int, int, long, const T*, const T*, const double*, const double*,   \
                                        const double*, const double*, T*);
HT_NORM_INST(float)
HT_NORM_INST(double)
#undef HT_NORM_INST

}  // namespace ht::cpu
