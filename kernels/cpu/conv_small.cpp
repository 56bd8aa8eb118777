// Small-channel 3x3 stride-1 convolutions, register-blocked (conv_small.hpp).
//
// Forward: for one output row and a block of B columns (NV vectors), CB output channels'
// sums live in NV x CB vector registers; every input channel, kernel row and kernel column
// adds one input vector times a broadcast weight, in the order of the plain loops
// (conv.cpp: bias, then input channel, kernel row, kernel column), and the block is stored
// once. Backward data is the forward over the output gradient with the kernel flipped and
// its channels swapped, padded by 2 - pad.
//
// Backward weights: for CW input channels, the 9 taps' sums are vectors over the output
// channels; the band's output gradient is first turned pixel-major (a vector of output
// channels per pixel), and each pixel adds that vector times each tap's broadcast input.
#include "kernels/cpu/conv_small.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/dnnl_isa.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/row_ops.hpp"

namespace ht::cpu {

namespace {

typedef float V8 __attribute__((vector_size(32)));
typedef float V16 __attribute__((vector_size(64)));

// Per ISA: the vector, vectors per column block (NV), output channels per forward block
// (CB: CB x NV accumulators), and input channels per weight-gradient block (CW: 9 x CW
// accumulators, each a vector over output channels).
struct Avx2 {
  using V = V8;
  static constexpr int NV = 2, CB = 4, CW = 1;
};
struct Avx512 {
  using V = V16;
  static constexpr int NV = 2, CB = 8, CW = 3;
};
template <class V>
constexpr int lanes() {
  return int(sizeof(V) / sizeof(float));
}

constexpr int kRows = 4;        // output rows per task
constexpr int kWidest = 64;     // the widest column block (AVX-512): rows are padded to it on every ISA,
                                // so the scratch a plan counts does not depend on the CPU's vector width
constexpr int kWidestVector = 16;  // floats in an AVX-512 register
constexpr int kMaxChannels = 16;  // oneDNN's blocks on AVX-512: at most one, padded

int round_up(int a, int b) { return (a + b - 1) / b * b; }

// Floats of one padded input row: the output columns rounded up to the widest block, plus
// the two columns the kernel reaches beyond.
int row_pitch(const ConvGeom& g) { return round_up(g.wout(), kWidest) + 2; }
int bands_of(const ConvGeom& g) { return (g.hout() + kRows - 1) / kRows; }

int threads_for(const ConvGeom& g, int threads) {
  return worth_parallel(g) ? std::max(1, std::min(threads, g.n * bands_of(g))) : 1;
}

// Floats of one thread's scratch for the forward of g (its input band) and for its weight
// gradient (the input band and the output gradient's band, pixel-major, its channels
// padded to the widest vector).
size_t forward_floats(const ConvGeom& g) { return size_t(g.cin) * (kRows + 2) * row_pitch(g); }
size_t weights_floats(const ConvGeom& g) {
  return forward_floats(g) + size_t(round_up(g.cout, kWidestVector)) * kRows * g.wout();
}

// The geometry whose forward is g's backward data: over dy, the kernel flipped, channels
// swapped, padded by 2 - pad (small_conv_passes admits pads <= 2 only for it).
ConvGeom transposed(const ConvGeom& g) {
  ConvGeom t = g;
  t.cin = g.cout, t.cout = g.cin, t.hin = g.hout(), t.win = g.wout();
  t.pad_top = 2 - g.pad_top, t.pad_bottom = 2 - g.pad_bottom;
  t.pad_left = 2 - g.pad_left, t.pad_right = 2 - g.pad_right;
  return t;
}

// Rows ih0 .. ih0 + rows - 1 of every channel of one image, each padded to `pitch` floats
// with `pl` zeros in front; rows outside the image are zeros.
inline void pad_band(int channels, int hin, int win, const float* x, int ih0, int rows, int pl, int pitch,
                     float* band) {
  for (int c = 0; c < channels; ++c)
    for (int q = 0; q < rows; ++q) {
      float* d = band + (size_t(c) * rows + q) * pitch;
      const int ih = ih0 + q;
      if (ih < 0 || ih >= hin) {
        std::fill(d, d + pitch, 0.f);
        continue;
      }
      std::fill(d, d + pl, 0.f);
      std::memcpy(d + pl, x + (size_t(c) * hin + ih) * win, sizeof(float) * win);
      std::fill(d + pl + win, d + pitch, 0.f);
    }
}

// Output row `oh` (band row q), columns [jb, jb + B), channels [co, co + CB). `w` is
// packed by pack_weights: the block's weights start at w + co * cin * 9.
template <class P, int CB>
__attribute__((always_inline)) inline void forward_block(const ConvGeom& g, const float* band, int rows, int pitch,
                                                         const float* w, const float* bias, float* y, int n,
                                                         int oh, int q, int jb, int co) {
  using V = typename P::V;
  constexpr int VL = lanes<V>(), NV = P::NV, B = NV * VL;
  static_assert(B <= kWidest, "a block reads past its padded row");
  const int cin = g.cin;
  V acc[CB][NV];
#pragma GCC unroll 8
  for (int c = 0; c < CB; ++c) {
    const float b0 = bias ? bias[co + c] : 0.f;
    for (int v = 0; v < NV; ++v) acc[c][v] = V{} + b0;
  }
  for (int ci = 0; ci < cin; ++ci) {
    const float* x0 = band + (size_t(ci) * rows + q) * pitch + jb;
    const float* wc = w + size_t(co) * cin * 9 + size_t(ci) * 9 * CB;  // [tap][c]
#pragma GCC unroll 3
    for (int r = 0; r < 3; ++r)
#pragma GCC unroll 3
      for (int k = 0; k < 3; ++k) {
        V xv[NV];
        for (int v = 0; v < NV; ++v) std::memcpy(&xv[v], x0 + r * pitch + k + v * VL, sizeof(V));
#pragma GCC unroll 8
        for (int c = 0; c < CB; ++c) {
          const float wv = wc[(r * 3 + k) * CB + c];
          for (int v = 0; v < NV; ++v) acc[c][v] += xv[v] * wv;
        }
      }
  }
  const int ho = g.hout(), wo = g.wout(), m = std::min(B, wo - jb);
  for (int c = 0; c < CB; ++c) {
    float* yr = y + ((size_t(n) * g.cout + co + c) * ho + oh) * wo + jb;
    if (m == B) {
      for (int v = 0; v < NV; ++v) std::memcpy(yr + v * VL, &acc[c][v], sizeof(V));
    } else {
      float t[B];
      for (int v = 0; v < NV; ++v) std::memcpy(t + v * VL, &acc[c][v], sizeof(V));
      std::memcpy(yr, t, sizeof(float) * m);
    }
  }
}

// The weights [cout][cin][3][3] as forward_block reads them: output channels in the blocks
// forward_blocks makes (`widest`, then halves), each block's weights [cin][tap][channel]
// from w_packed + co * cin * 9 on; `flip` packs the backward-data kernel of [cin][cout][3][3]
// weights w instead: channels swapped, taps reversed.
std::vector<float> pack_weights(const float* w, int cout, int cin, int widest, bool flip) {
  std::vector<float> p(size_t(cout) * cin * 9);
  int co = 0;
  for (int cb = widest; cb >= 1; cb /= 2)
    for (; co + cb <= cout; co += cb)
      for (int ci = 0; ci < cin; ++ci)
        for (int t = 0; t < 9; ++t)
          for (int c = 0; c < cb; ++c)
            p[size_t(co) * cin * 9 + (size_t(ci) * 9 + t) * cb + c] =
                flip ? w[(size_t(ci) * cout + co + c) * 9 + 8 - t] : w[(size_t(co + c) * cin + ci) * 9 + t];
  return p;
}

// AVX-512 where the CPU has it and oneDNN's cap allows it, else AVX2 (below that
// small_conv_passes serves nothing).
bool use_avx512() {
  static const bool avx512 = cpu_isa() == Isa::Avx512 && dnnl_isa_reaches("avx512_core");
  return avx512;
}
int forward_widest_block() { return use_avx512() ? Avx512::CB : Avx2::CB; }

// Every output channel from `co` on, in blocks of CB, then of CB / 2, ... 1.
template <class P, int CB>
__attribute__((always_inline)) inline void forward_blocks(const ConvGeom& g, const float* band, int rows, int pitch,
                                                          const float* w, const float* bias, float* y, int n,
                                                          int oh, int q, int jb, int co) {
  for (; co + CB <= g.cout; co += CB) forward_block<P, CB>(g, band, rows, pitch, w, bias, y, n, oh, q, jb, co);
  if constexpr (CB > 1) forward_blocks<P, CB / 2>(g, band, rows, pitch, w, bias, y, n, oh, q, jb, co);
}

// One (image, band of output rows) task of the forward.
template <class P>
__attribute__((always_inline)) inline void forward_task(const ConvGeom& g, const float* x, const float* w,
                                                        const float* bias, float* y, float* band, int n, int b) {
  constexpr int B = P::NV * lanes<typename P::V>();
  const int ho = g.hout(), wo = g.wout(), oh0 = b * kRows, oh1 = std::min(ho, oh0 + kRows);
  const int rows = oh1 - oh0 + 2, pitch = row_pitch(g);
  pad_band(g.cin, g.hin, g.win, x + size_t(n) * g.cin * g.hin * g.win, oh0 - g.pad_top, rows, g.pad_left, pitch,
           band);
  for (int oh = oh0; oh < oh1; ++oh)
    for (int jb = 0; jb < wo; jb += B) forward_blocks<P, P::CB>(g, band, rows, pitch, w, bias, y, n, oh, oh - oh0, jb, 0);
}

// The weight gradient of input channels [ci, ci + CW) and output channels [cb * VL, cb * VL
// + VL) over one band: each pixel adds its output-gradient vector (over output channels)
// times the broadcast input value of each tap, then the sums go to the thread's slot `a`.
template <class P, int CW>
__attribute__((always_inline)) inline void weights_block(const ConvGeom& g, const float* xb, int rows, int pitch,
                                                         const float* dyt, int nr, int cb, int ci, double* a) {
  using V = typename P::V;
  constexpr int VL = lanes<V>();
  const int wo = g.wout();
  V acc[CW][9];
  for (int c = 0; c < CW; ++c)
    for (int t = 0; t < 9; ++t) acc[c][t] = V{};
  for (int q = 0; q < nr; ++q) {
    const float* d = dyt + (size_t(cb) * kRows + q) * wo * VL;
    const float* x0 = xb + (size_t(ci) * rows + q) * pitch;
    for (int j = 0; j < wo; ++j) {
      V dv;
      std::memcpy(&dv, d + size_t(j) * VL, sizeof(V));
#pragma GCC unroll 3
      for (int c = 0; c < CW; ++c) {
        const float* xc = x0 + size_t(c) * rows * pitch + j;
#pragma GCC unroll 3
        for (int r = 0; r < 3; ++r)
#pragma GCC unroll 3
          for (int k = 0; k < 3; ++k) acc[c][r * 3 + k] += dv * xc[r * pitch + k];
      }
    }
  }
  const int lanes_used = std::min(VL, g.cout - cb * VL);
  for (int c = 0; c < CW; ++c)
    for (int t = 0; t < 9; ++t)
      for (int l = 0; l < lanes_used; ++l) a[(size_t(cb * VL + l) * g.cin + ci + c) * 9 + t] += double(acc[c][t][l]);
}

// Input channels from `ci` on, in blocks of CW, then of CW / 2, ... 1.
template <class P, int CW>
__attribute__((always_inline)) inline void weights_blocks(const ConvGeom& g, const float* xb, int rows, int pitch,
                                                          const float* dyt, int nr, int cb, int ci, double* a) {
  for (; ci + CW <= g.cin; ci += CW) weights_block<P, CW>(g, xb, rows, pitch, dyt, nr, cb, ci, a);
  if constexpr (CW > 1) weights_blocks<P, CW / 2>(g, xb, rows, pitch, dyt, nr, cb, ci, a);
}

// One (image, band of output rows) task of the weight gradient: dw into a[0, w_size), the
// bias gradient into a[w_size, w_size + cout).
template <class P>
__attribute__((always_inline)) inline void weights_task(const ConvGeom& g, const float* x, const float* dy,
                                                        float* scratch, int n, int b, double* a) {
  constexpr int VL = lanes<typename P::V>();
  const int ho = g.hout(), wo = g.wout(), oh0 = b * kRows, nr = std::min(ho, oh0 + kRows) - oh0;
  const int rows = nr + 2, pitch = row_pitch(g), blocks = (g.cout + VL - 1) / VL;
  float* xb = scratch;
  float* dyt = scratch + forward_floats(g);  // [block][row][column][lane]
  pad_band(g.cin, g.hin, g.win, x + size_t(n) * g.cin * g.hin * g.win, oh0 - g.pad_top, rows, g.pad_left, pitch,
           xb);
  const size_t nw = g.w_size();
  for (int co = 0; co < blocks * VL; ++co) {
    float* d = dyt + size_t(co / VL) * kRows * wo * VL + co % VL;
    for (int q = 0; q < nr; ++q) {
      if (co >= g.cout) {
        for (int j = 0; j < wo; ++j) d[(size_t(q) * wo + j) * VL] = 0.f;
        continue;
      }
      const float* src = dy + ((size_t(n) * g.cout + co) * ho + oh0 + q) * wo;
      float s = 0;
      for (int j = 0; j < wo; ++j) {
        d[(size_t(q) * wo + j) * VL] = src[j];
        s += src[j];
      }
      a[nw + co] += double(s);
    }
  }
  for (int cb = 0; cb < blocks; ++cb) weights_blocks<P, P::CW>(g, xb, rows, pitch, dyt, nr, cb, 0, a);
}

using WeightsTask = void (*)(const ConvGeom&, const float*, const float*, float*, int, int, double*);
HT_AVX2 void weights_avx2(const ConvGeom& g, const float* x, const float* dy, float* scratch, int n, int b,
                          double* a) {
  weights_task<Avx2>(g, x, dy, scratch, n, b, a);
}
HT_AVX512 void weights_avx512(const ConvGeom& g, const float* x, const float* dy, float* scratch, int n, int b,
                              double* a) {
  weights_task<Avx512>(g, x, dy, scratch, n, b, a);
}

using ForwardTask = void (*)(const ConvGeom&, const float*, const float*, const float*, float*, float*, int, int);

HT_AVX2 void forward_avx2(const ConvGeom& g, const float* x, const float* w, const float* bias, float* y,
                          float* band, int n, int b) {
  forward_task<Avx2>(g, x, w, bias, y, band, n, b);
}
HT_AVX512 void forward_avx512(const ConvGeom& g, const float* x, const float* w, const float* bias, float* y,
                              float* band, int n, int b) {
  forward_task<Avx512>(g, x, w, bias, y, band, n, b);
}

// `w` packed by pack_weights. With `moments`, each task's output rows go into it while
// they are in cache (small_conv_moments_in_pass says whether they hold whole blocks).
void forward(const ConvGeom& g, const float* x, const float* w, const float* bias, float* y, float* scratch,
             MomentsByBlocks* moments, bool relu) {
  static const ForwardTask task = use_avx512() ? forward_avx512 : forward_avx2;
  const int bands = bands_of(g), nthr = threads_for(g, omp_get_max_threads());
  const long ho = g.hout(), wo = g.wout();
  const size_t per_thread = forward_floats(g);
#pragma omp parallel num_threads(nthr)
  {
    float* band = scratch + size_t(omp_get_thread_num()) * per_thread;
#pragma omp for collapse(2) schedule(static)
    for (int n = 0; n < g.n; ++n)
      for (int b = 0; b < bands; ++b) {
        task(g, x, w, bias, y, band, n, b);
        const long from = long(b) * kRows * wo, to = std::min(ho, long(b + 1) * kRows) * wo;
        if (relu)  // relu_forward's test (elementwise.cpp), on rows still in cache
          for (int c = 0; c < g.cout; ++c) {
            float* p = y + (size_t(n) * g.cout + size_t(c)) * size_t(ho * wo);
#pragma omp simd
            for (long i = from; i < to; ++i) p[i] = p[i] < 0.f ? 0.f : p[i];
          }
        if (!moments) continue;
        for (int c = 0; c < g.cout; ++c) moments->add_range(n, c, from, to);
      }
  }
}

}  // namespace

namespace {
bool enabled() {
  static const bool on = conv_loops_vectorised() && dnnl_isa_reaches("avx2");
  return on;
}
}  // namespace

bool small_conv_moments_in_pass(const ConvGeom& g) { return long(kRows) * g.wout() >= kMomentsBlock; }

const char* small_conv_isa() { return !enabled() ? "none" : use_avx512() ? "avx512" : "avx2"; }

unsigned small_conv_passes(const ConvGeom& g) {
  if (!enabled()) return 0;
  if (g.kh != 3 || g.kw != 3 || g.stride_h != 1 || g.stride_w != 1 || g.dil_h != 1 || g.dil_w != 1 ||
      g.groups != 1 || g.cin > kMaxChannels)
    return 0;
  // Which passes beat oneDNN's was measured pass by pass (bench/speed.py, table 5; 2 cores,
  // AVX-512). The forward: at one input channel always (oneDNN's took 1.8-2.7x as long), else
  // up to 16 output channels (with 32 and more oneDNN's blocks are full: it was 8-37% faster).
  unsigned passes = 0;
  if (g.cin == 1 || g.cout <= kMaxChannels) passes |= kConvForward;
  // Backward data, the forward over cout channels padded by 2 - pad: 0.1-1.0 of oneDNN's
  // time wherever its output has few channels (one noisy run 1.33).
  if (std::max({g.pad_top, g.pad_bottom, g.pad_left, g.pad_right}) <= 2) passes |= kConvBackwardData;
  // The weight gradient reads each output-gradient vector for 9 x cin products: at 1-4
  // input channels too few to pay for turning the band pixel-major (conv.cpp's loops and
  // oneDNN were faster there); at 16 oneDNN's blocks are not padded (measured, as equal).
  if (g.cin > 4 && g.cin < kMaxChannels) passes |= kConvBackwardWeights;
  return passes;
}

size_t small_conv_scratch_floats(const ConvGeom& g, unsigned pass, int threads) {
  switch (pass) {
    case kConvForward: return size_t(threads_for(g, threads)) * forward_floats(g);
    case kConvBackwardData: {
      const ConvGeom t = transposed(g);
      return size_t(threads_for(t, threads)) * forward_floats(t);
    }
    case kConvBackwardWeights: return size_t(threads_for(g, threads)) * weights_floats(g);
    default: return 0;
  }
}

void small_conv_forward(const ConvGeom& g, const float* x, const float* w, const float* bias, float* y,
                        float* scratch, MomentsByBlocks* moments, bool relu) {
  const std::vector<float> packed = pack_weights(w, g.cout, g.cin, forward_widest_block(), false);
  forward(g, x, packed.data(), bias, y, scratch, moments, relu);
}

void small_conv_backward_data(const ConvGeom& g, const float* dy, const float* w, float* dx, float* scratch) {
  // The forward of transposed(g) with w'[ci][co][r][k] = w[co][ci][2 - r][2 - k].
  const std::vector<float> packed = pack_weights(w, g.cin, g.cout, forward_widest_block(), true);
  forward(transposed(g), dy, packed.data(), nullptr, dx, scratch, nullptr, false);
}

// Each thread accumulates dW (in double) over its bands into a private slot; slots are
// summed in thread order, so the result is deterministic for a given thread count.
void small_conv_backward_weights(const ConvGeom& g, const float* x, const float* dy, float* dw, float* dbias,
                                 float* scratch) {
  static const WeightsTask task = use_avx512() ? weights_avx512 : weights_avx2;
  const int bands = bands_of(g), nthr = threads_for(g, omp_get_max_threads());
  const size_t nw = g.w_size(), slot = nw + g.cout, per_thread = weights_floats(g);
  std::vector<double> acc(size_t(nthr) * slot, 0.0);
#pragma omp parallel num_threads(nthr)
  {
    const int t = omp_get_thread_num();
    double* a = acc.data() + size_t(t) * slot;
    float* s = scratch + size_t(t) * per_thread;
#pragma omp for collapse(2) schedule(static)
    for (int n = 0; n < g.n; ++n)
      for (int b = 0; b < bands; ++b) task(g, x, dy, s, n, b, a);
  }
  add_thread_slots(acc, nthr, nw, slot, dw, dbias);
}

}  // namespace ht::cpu
