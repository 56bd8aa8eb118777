// Measured pass by pass on 2 cores (AVX-512, best of 5; milliseconds direct / Winograd):
// 2x32x768^2 32->32 forward 56.6 / 44.5, data 60.6 / 45.9, weights 68.7 / 51.8; 2x64x256^2
// 64->64 24.7 / 16.1, 27.1 / 15.7, 30.8 / 22.6; 2x128x32^2 128->128 1.5 / 1.1, 1.7 / 1.1,
// 1.8 / 0.8. With 16 input channels it won at some image sizes and lost up to 1.5x at
// others (16->32 at 512^2: forward 13.0 / 19.1), and with 8-16 it lost. It rounds
// differently from the direct kernels (its transforms), within float tolerance.
#include "kernels/cpu/conv_winograd.hpp"

#include <algorithm>

#include "kernels/cpu/conv.hpp"
#include "kernels/cpu/dnnl_isa.hpp"

namespace ht::cpu {

namespace {

// oneDNN blocks a pass's 4x4 tiles (n x ceil(h / 4) x ceil(w / 4) of the tensor it writes)
// by a divisor of their count; where the count has none from 8 to 28 (a shard of 385 x 385:
// 2 x 97 x 97) Winograd took 1.25-3x the direct kernels' time, one thread, 32 -> 32, and
// 0.56-0.72 elsewhere (the weight gradient 0.94-1.03 at some counts with such divisors).
bool tiles_block(long n, long h, long w) {
  const long tiles = n * ((h + 3) / 4) * ((w + 3) / 4);
  for (long d = 8; d <= 28; ++d)
    if (tiles % d == 0) return true;
  return false;
}

}  // namespace

// oneDNN 2.6's Winograd data gradient is wrong where the pads of an axis differ (a shard's
// halo side: tests/unit/kernels_dnnl_test.cpp caught it) and slow where dx's tiles block
// badly, hence the larger problem. Zero gradient in dy's frame adds nothing to dx, and dx's
// added rows and columns only receive.
std::optional<ConvGeom> winograd_data_problem(const ConvGeom& g) {
  int hx = g.hin, wx = g.win;
  if (!tiles_block(g.n, hx, wx)) {
    long best = -1;  // over the sizes that add a row or a column of tiles, each the least
    for (int th = (g.hin + 3) / 4;; ++th) {
      const int h = std::max(g.hin, 4 * th - 3);
      if (h > g.hin + g.hin / 8) break;
      for (int tw = (g.win + 3) / 4;; ++tw) {
        const int w = std::max(g.win, 4 * tw - 3);
        if (w > g.win + g.win / 8) break;
        if ((best < 0 || long(h) * w < best) && tiles_block(g.n, h, w)) best = long(h) * w, hx = h, wx = w;
      }
    }
    if (best < 0) return std::nullopt;
  }
  ConvGeom p = g;
  p.hin = hx, p.win = wx;
  p.pad_top = p.pad_bottom = std::max(g.pad_top, g.pad_bottom);
  p.pad_left = p.pad_right = std::max(g.pad_left, g.pad_right);
  return p;
}

unsigned winograd_passes(const ConvGeom& g) {
  if (g.kh != 3 || g.kw != 3 || g.stride_h != 1 || g.stride_w != 1 || g.dil_h != 1 || g.dil_w != 1 ||
      g.groups != 1 || std::min(g.cin, g.cout) < 32 || !dnnl_isa_reaches("avx512_core") ||
      std::max({g.pad_top, g.pad_bottom, g.pad_left, g.pad_right}) > 1)  // its Winograd refuses more
    return 0;
  unsigned passes = 0;
  if (tiles_block(g.n, g.hout(), g.wout())) passes |= kConvForward | kConvBackwardWeights;
  if (winograd_data_problem(g)) passes |= kConvBackwardData;
  return passes;
}

}  // namespace ht::cpu
