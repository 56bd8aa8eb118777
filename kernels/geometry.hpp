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

struct PoolGeom {
  int n = 1, c = 1, hin = 1, win = 1, kh = 1, kw = 1;
  int stride_h = 1, stride_w = 1;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int hout() const { return (hin + pad_top + pad_bottom - kh) / stride_h + 1; }
  int wout() const { return (win + pad_left + pad_right - kw) / stride_w + 1; }
  size_t x_size() const { return size_t(n) * c * hin * win; }
  size_t y_size() const { return size_t(n) * c * hout() * wout(); }
};

}  // namespace ht
