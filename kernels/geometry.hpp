// Geometry of the windowed kernels, shared by the CPU and CUDA kernels. NCHW, floor mode,
// asymmetric zero padding (a shard pads only on the sides where it meets the image border).
#pragma once

#include <cstddef>

namespace ht {

struct ConvGeom {
  int n = 1, cin = 1, hin = 1, win = 1, cout = 1, kh = 1, kw = 1;
  int stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  // Grouped convolution (torch's `groups`): output channel o reads input channels
  // [g * cin/groups, (g + 1) * cin/groups) of its group g = o / (cout/groups); the weight
  // is [cout][cin/groups][kh][kw]. Depthwise: groups = cin.
  int groups = 1;
  int cin_per_group() const { return cin / groups; }
  int cout_per_group() const { return cout / groups; }
  int hout() const { return (hin + pad_top + pad_bottom - dil_h * (kh - 1) - 1) / stride_h + 1; }
  int wout() const { return (win + pad_left + pad_right - dil_w * (kw - 1) - 1) / stride_w + 1; }
  size_t x_size() const { return size_t(n) * cin * hin * win; }
  size_t y_size() const { return size_t(n) * cout * hout() * wout(); }
  size_t w_size() const { return size_t(cout) * cin_per_group() * kh * kw; }
};

// Batch norm, ReLU and a max pool whose windows tile the plane (kernel == stride, no
// padding) as one fused chain (kernels/cpu/norm_relu_pool.hpp): the pool reads ho = h / kh
// by wo = w / kw windows (rows and columns past the last whole window are in no window) and
// keeps one byte per window, the position of its maximum, or kNoArgmax where the maximum is
// not above 0 (ReLU passes it no gradient). kh * kw < kNoArgmax.
constexpr unsigned char kNoArgmax = 255;
struct NormPoolShape {
  int n = 1, c = 1, h = 1, w = 1, kh = 2, kw = 2;
  int ho() const { return h / kh; }
  int wo() const { return w / kw; }
  size_t x_size() const { return size_t(n) * c * h * w; }
  size_t y_size() const { return size_t(n) * c * ho() * wo(); }
  // Sizes of at least 1, a window per plane, its positions within a byte.
  bool valid() const { return n >= 1 && c >= 1 && kh >= 1 && kw >= 1 && kh * kw < kNoArgmax && ho() >= 1 && wo() >= 1; }
};

// How a factor per plane of an NCHW tensor is indexed: one per (image, channel) plane (a
// channel vector broadcast over its map), or one per channel (layer scale).
enum class PlaneFactor { PerPlane, PerChannel };

struct PoolGeom {
  int n = 1, c = 1, hin = 1, win = 1, kh = 1, kw = 1;
  int stride_h = 1, stride_w = 1;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  // Average pooling: the rows / cols of padding on each side that count in the divisor
  // (torch's count_include_pad); 0: only taps inside the input count.
  int count_top = 0, count_bottom = 0, count_left = 0, count_right = 0;
  int hout() const { return (hin + pad_top + pad_bottom - kh) / stride_h + 1; }
  int wout() const { return (win + pad_left + pad_right - kw) / stride_w + 1; }
  size_t x_size() const { return size_t(n) * c * hin * win; }
  size_t y_size() const { return size_t(n) * c * hout() * wout(); }
};

// The divisor of average-pool output (oh, ow): its taps inside the input and inside the
// padding that counts.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int pool_divisor(const PoolGeom& g, int oh, int ow) {
  const int hs = oh * g.stride_h - g.pad_top, ws = ow * g.stride_w - g.pad_left;
  const int h0 = hs > -g.count_top ? hs : -g.count_top, w0 = ws > -g.count_left ? ws : -g.count_left;
  const int h1 = hs + g.kh < g.hin + g.count_bottom ? hs + g.kh : g.hin + g.count_bottom;
  const int w1 = ws + g.kw < g.win + g.count_right ? ws + g.kw : g.win + g.count_right;
  return (h1 > h0 ? h1 - h0 : 0) * (w1 > w0 ? w1 - w0 : 0);
}

// Layers that read their input by image coordinates (upsampling2d, zero_padding2d,
// cropping2d): along each axis, local output index o is image output o0 + o, and local
// input index i is image input i0 + i of an image input of `size`.
enum class Resample {
  Nearest,   // image input min(floor(O * scale), size - 1) (scale in float, as torch)
  Bilinear,  // half-pixel: src = max((O + 0.5) * scale - 0.5, 0), rows floor(src) and the
             // next (the last row at the bottom), weighted as torch's upsample_bilinear2d
  Shift,     // image input O - shift; zero outside the image
};
struct ResampleAxis {
  int out = 1, o0 = 0;   // local outputs, and the image index of the first
  int in = 1, i0 = 0;    // local inputs (the halo-extended buffer), and the image index of the first
  int size = 1;          // the image input's extent
  float scale = 1.f;     // Nearest, Bilinear: image input pixels per output pixel (1/factor, or in/out)
  int shift = 0;         // Shift
};
struct ResampleGeom {
  Resample mode = Resample::Nearest;
  int n = 1, c = 1;
  ResampleAxis rows, cols;
  size_t x_size() const { return size_t(n) * c * rows.in * cols.in; }
  size_t y_size() const { return size_t(n) * c * rows.out * cols.out; }
};

// The (at most two) local inputs output o reads along one axis, with their weights;
// index -1: none (a shift's zero).
struct ResampleTaps {
  int i0 = -1, i1 = -1;
  float w0 = 0.f, w1 = 0.f;
};
#if defined(__CUDACC__)
__host__ __device__
#endif
inline ResampleTaps resample_taps(Resample mode, const ResampleAxis& a, int o) {
  ResampleTaps t;
  const int O = a.o0 + o;
  if (mode == Resample::Shift) {
    const int I = O - a.shift;
    if (I >= 0 && I < a.size) t.i0 = I - a.i0, t.w0 = 1.f;
    return t;
  }
  if (mode == Resample::Nearest) {
    const int I = int(float(O) * a.scale);
    t.i0 = (I < a.size - 1 ? I : a.size - 1) - a.i0;
    t.w0 = 1.f;
    return t;
  }
  float src = (float(O) + 0.5f) * a.scale - 0.5f;
  if (src < 0.f) src = 0.f;
  const int I = int(src);
  const float lambda = src - float(I);
  t.i0 = I - a.i0;
  t.i1 = (I < a.size - 1 ? I + 1 : I) - a.i0;
  t.w0 = 1.f - lambda;
  t.w1 = lambda;
  return t;
}

}  // namespace ht
