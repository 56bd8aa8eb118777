// The fast float paths against the double reference: DnnlConv2d against the plain-loop
// convolution in double, the optimizers against their formulas in double, and, where
// /usr/bin/python3 has torch, a few kernels against PyTorch itself.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/conv.hpp"
#include "kernels/cpu/conv_small.hpp"
#include "kernels/cpu/dnnl_isa.hpp"
#include "kernels/cpu/loss.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/optim.hpp"
#include "kernels/cpu/pool.hpp"

namespace ht::cpu {
namespace {

using Vec = std::vector<double>;
using VecF = std::vector<float>;

Vec random_vec(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> d(-1, 1);
  Vec v(n);
  for (auto& x : v) x = double(float(d(rng)));  // exactly representable in float
  return v;
}
VecF to_float(const Vec& v) { return VecF(v.begin(), v.end()); }

// |a - r| <= atol + rtol |r| everywhere; reports the worst element.
void expect_close(const char* what, const VecF& a, const Vec& r, double atol, double rtol,
                  const std::string& ctx) {
  ASSERT_EQ(a.size(), r.size()) << what;
  double worst = 0;
  size_t wi = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const double ex = std::fabs(a[i] - r[i]) - (atol + rtol * std::fabs(r[i]));
    if (ex > worst || std::isnan(a[i])) worst = std::isnan(a[i]) ? 1 : ex, wi = i;
  }
  EXPECT_LE(worst, 0.0) << what << " " << ctx << ": element " << wi << " got " << a[wi] << " want "
                        << r[wi];
}

ConvGeom geom(int n, int cin, int h, int w, int cout, int kh, int kw, int sh, int sw, int dh,
              int dw, int pt, int pb, int pl, int pr) {
  ConvGeom g;
  g.n = n, g.cin = cin, g.hin = h, g.win = w, g.cout = cout, g.kh = kh, g.kw = kw;
  g.stride_h = sh, g.stride_w = sw, g.dil_h = dh, g.dil_w = dw;
  g.pad_top = pt, g.pad_bottom = pb, g.pad_left = pl, g.pad_right = pr;
  return g;
}

std::string str(const ConvGeom& g) {
  char b[256];
  std::snprintf(b, sizeof b, "n%d ci%d %dx%d co%d k%dx%d s%d,%d d%d,%d pad t%d b%d l%d r%d", g.n,
                g.cin, g.hin, g.win, g.cout, g.kh, g.kw, g.stride_h, g.stride_w, g.dil_h, g.dil_w,
                g.pad_top, g.pad_bottom, g.pad_left, g.pad_right);
  return b;
}

std::vector<ConvGeom> dnnl_geoms() {
  std::vector<ConvGeom> gs = {
      geom(2, 16, 17, 19, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),  // the common layer, blocked
      geom(1, 1, 23, 20, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),   // first layer: one channel
      geom(2, 16, 15, 16, 32, 3, 3, 2, 2, 1, 1, 0, 1, 0, 1),  // TF 'same' stride 2
      geom(1, 8, 13, 12, 8, 3, 3, 1, 1, 2, 2, 2, 3, 2, 1),    // dilation 2, asymmetric
      geom(2, 5, 9, 11, 7, 3, 2, 1, 2, 1, 1, 0, 2, 1, 0),     // odd channels and kernel
      geom(1, 16, 10, 10, 16, 3, 3, 1, 1, 1, 1, 3, 0, 0, 2),  // halo-style one-sided pads
      geom(1, 4, 12, 12, 4, 1, 1, 2, 2, 1, 1, 0, 0, 0, 0),    // 1x1 stride 2
      // Small-channel 3x3 stride 1 (conv_small.hpp): rows past one and two column blocks,
      // output channels outside the register blocks, every pad from 0 to 2, RGB.
      geom(2, 12, 9, 70, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
      geom(1, 3, 11, 33, 7, 3, 3, 1, 1, 1, 1, 0, 2, 2, 0),
      geom(2, 1, 6, 65, 12, 3, 3, 1, 1, 1, 1, 2, 1, 0, 1),
      geom(1, 16, 5, 31, 17, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0),
      geom(1, 8, 3, 3, 16, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2),
      geom(1, 5, 7, 9, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
      geom(2, 13, 10, 18, 5, 3, 3, 1, 1, 1, 1, 0, 1, 2, 1),
      geom(2, 1, 9, 20, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
      // Winograd (32 channels and more in and out, 3x3 stride 1): sizes off its 4x4 output
      // tiles, a halo's one-sided pads (the data gradient framed), 8 mod 16 channels (padded
      // to its 16-blocks, framed too), no pad, pads of 2 (refused: direct).
      geom(2, 32, 13, 18, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
      geom(1, 48, 10, 9, 32, 3, 3, 1, 1, 1, 1, 0, 1, 1, 0),
      geom(1, 40, 7, 11, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
      geom(2, 40, 9, 10, 40, 3, 3, 1, 1, 1, 1, 1, 0, 1, 1),
      geom(2, 32, 9, 10, 64, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0),
      geom(1, 32, 12, 12, 32, 3, 3, 1, 1, 1, 1, 0, 1, 1, 1),
      geom(1, 32, 9, 10, 32, 3, 3, 1, 1, 1, 1, 1, 0, 1, 1),
      geom(1, 32, 9, 10, 32, 3, 3, 1, 1, 1, 1, 0, 1, 1, 1),
      geom(1, 32, 9, 10, 32, 3, 3, 1, 1, 1, 1, 0, 0, 1, 1),
      geom(1, 32, 9, 10, 32, 3, 3, 1, 1, 1, 1, 1, 1, 0, 1),
      geom(1, 32, 9, 10, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0),
      geom(1, 32, 9, 10, 32, 3, 3, 1, 1, 1, 1, 1, 1, 0, 0),
      geom(1, 32, 12, 12, 32, 3, 3, 1, 1, 1, 1, 1, 0, 1, 1),
      geom(1, 32, 12, 12, 32, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2),
  };
  std::mt19937_64 rng(21);
  auto u = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (const size_t want = gs.size() + 6; gs.size() < want;) {
    ConvGeom g = geom(u(1, 2), u(1, 20), u(4, 20), u(4, 20), u(1, 20), u(1, 5), u(1, 5), u(1, 3),
                      u(1, 3), u(1, 2), u(1, 2), u(0, 3), u(0, 3), u(0, 3), u(0, 3));
    if (g.hin + g.pad_top + g.pad_bottom >= g.dil_h * (g.kh - 1) + 1 &&
        g.win + g.pad_left + g.pad_right >= g.dil_w * (g.kw - 1) + 1)
      gs.push_back(g);
  }
  // Depthwise (groups = cin, multipliers 1 and 3, strided, one-sided pads) and grouped.
  ConvGeom dw = geom(2, 16, 15, 13, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1);
  dw.groups = 16;
  ConvGeom dw3 = geom(1, 8, 14, 11, 24, 5, 5, 2, 2, 1, 1, 0, 3, 2, 2);
  dw3.groups = 8;
  ConvGeom grouped = geom(1, 12, 9, 10, 8, 3, 3, 1, 1, 2, 2, 2, 2, 0, 3);
  grouped.groups = 4;
  gs.insert(gs.end(), {dw, dw3, grouped});
  return gs;
}

// One geometry through DnnlConv2d (float) and the plain loops (double).
void check_dnnl(const ConvGeom& g, std::mt19937_64& rng, bool with_bias) {
  const std::string ctx = str(g) + (with_bias ? " bias" : " no-bias") + " threads " +
                          std::to_string(omp_get_max_threads());
  Vec x = random_vec(g.x_size(), rng), w = random_vec(g.w_size(), rng), b = random_vec(g.cout, rng),
      dy = random_vec(g.y_size(), rng);
  Vec y(g.y_size()), dx(g.x_size()), dw(g.w_size()), db(g.cout);
  conv2d_forward<double>(g, x.data(), w.data(), with_bias ? b.data() : nullptr, y.data());
  conv2d_backward_data<double>(g, dy.data(), w.data(), dx.data());
  conv2d_backward_weights<double>(g, x.data(), dy.data(), dw.data(), db.data());

  VecF xf = to_float(x), wf = to_float(w), bf = to_float(b), dyf = to_float(dy);
  VecF yf(y.size(), NAN), dxf(dx.size(), NAN), dwf(dw.size(), NAN), dbf(db.size(), NAN);
  DnnlConv2d conv(g);
  conv.forward(xf.data(), wf.data(), with_bias ? bf.data() : nullptr, yf.data());
  conv.backward_data(dyf.data(), wf.data(), dxf.data());
  conv.backward_weights(xf.data(), dyf.data(), dwf.data(), with_bias ? dbf.data() : nullptr);
  expect_close("y", yf, y, 1e-4, 1e-4, ctx);
  expect_close("dx", dxf, dx, 1e-4, 1e-4, ctx);
  expect_close("dw", dwf, dw, 1e-4, 1e-4, ctx);
  if (with_bias) expect_close("db", dbf, db, 1e-4, 1e-4, ctx);
}

TEST(DnnlConv2d, MatchesDoubleReference) {
  std::mt19937_64 rng(22);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    int i = 0;
    for (const ConvGeom& g : dnnl_geoms()) check_dnnl(g, rng, i++ % 3 != 2);
  }
  omp_set_num_threads(saved);
}

// The geometries above that the small-channel kernels serve on this CPU are served by them
// (so MatchesDoubleReference checks those kernels), and those they refuse are refused.
TEST(DnnlConv2d, SmallChannelKernelsServeTheirGeometries) {
  if (!conv_loops_vectorised()) GTEST_SKIP() << "no AVX2 on this CPU: oneDNN serves every convolution";
  // ctest runs this program a second time under ONEDNN_MAX_CPU_ISA=AVX2 (tests/CMakeLists.txt):
  // then the AVX2 kernels run, on an AVX-512 machine too.
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap && std::string(cap) == "AVX2") {
    EXPECT_STREQ(small_conv_isa(), "avx2");
  }
  const unsigned both = kConvForward | kConvBackwardData;
  EXPECT_EQ(small_conv_passes(geom(2, 12, 9, 70, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1)), kConvAllPasses);
  EXPECT_EQ(small_conv_passes(geom(1, 8, 3, 3, 16, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2)), kConvAllPasses);
  // The forward of more than 16 output channels stays with oneDNN, except from one channel.
  EXPECT_EQ(small_conv_passes(geom(1, 5, 7, 9, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1)),
            kConvBackwardData | kConvBackwardWeights);
  EXPECT_EQ(small_conv_passes(geom(1, 16, 5, 31, 17, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0)), kConvBackwardData);
  EXPECT_EQ(small_conv_passes(geom(2, 1, 9, 20, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1)), both);
  // The weight gradient at 1-4 and 16 input channels stays with the loops and oneDNN.
  EXPECT_EQ(small_conv_passes(geom(2, 1, 6, 65, 12, 3, 3, 1, 1, 1, 1, 2, 1, 0, 1)), both);
  EXPECT_EQ(small_conv_passes(geom(1, 3, 11, 33, 7, 3, 3, 1, 1, 1, 1, 0, 2, 2, 0)), both);
  // Backward data would need a negative pad.
  EXPECT_EQ(small_conv_passes(geom(1, 16, 10, 10, 16, 3, 3, 1, 1, 1, 1, 3, 0, 0, 2)), kConvForward);
  EXPECT_EQ(small_conv_passes(geom(2, 32, 9, 9, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1)), 0u);   // wide input
  EXPECT_EQ(small_conv_passes(geom(2, 8, 9, 9, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1)), 0u);    // stride 2
  EXPECT_EQ(small_conv_passes(geom(2, 8, 9, 9, 8, 5, 5, 1, 1, 1, 1, 2, 2, 2, 2)), 0u);    // 5x5
  EXPECT_EQ(small_conv_passes(geom(2, 8, 9, 9, 8, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2)), 0u);    // dilated
}

// 3x3 stride-1 convolutions with 32 channels and more in and out run every pass on oneDNN's
// Winograd kernels where this CPU has them (AVX-512); MatchesDoubleReference checks their
// values on the geometries of dnnl_geoms() that qualify.
TEST(DnnlConv2d, WinogradServesWideThreeByThree) {
  auto passes_run = [](const ConvGeom& g, ConvKernels kernels) {
    std::mt19937_64 rng(5);
    VecF x = to_float(random_vec(g.x_size(), rng)), w = to_float(random_vec(g.w_size(), rng));
    VecF dy = to_float(random_vec(g.y_size(), rng)), y(g.y_size()), dx(g.x_size()), dw(g.w_size());
    DnnlConv2d conv(g, nullptr, kernels);
    conv.forward(x.data(), w.data(), nullptr, y.data());
    conv.backward(x.data(), dy.data(), w.data(), dw.data(), nullptr, [&] { return dx.data(); });
    return conv.on_winograd();
  };
  const ConvGeom wide = geom(2, 32, 13, 18, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1);
  if (!dnnl_isa_reaches("avx512_core")) {
    EXPECT_EQ(passes_run(wide, ConvKernels::Fastest), 0u) << "oneDNN has f32 Winograd on AVX-512 only";
    GTEST_SKIP() << "no AVX-512 for oneDNN here: the direct kernels serve every convolution";
  }
  EXPECT_EQ(passes_run(wide, ConvKernels::Fastest), kConvAllPasses);
  // Unequal pads (a shard's halo side): the data gradient runs framed, as oneDNN 2.6's
  // Winograd one is wrong there otherwise (MatchesDoubleReference fails without the frame).
  EXPECT_EQ(passes_run(geom(2, 48, 14, 17, 32, 3, 3, 1, 1, 1, 1, 0, 1, 1, 0), ConvKernels::Fastest),
            kConvAllPasses);
  EXPECT_EQ(passes_run(geom(2, 40, 9, 10, 40, 3, 3, 1, 1, 1, 1, 1, 0, 1, 1), ConvKernels::Fastest),
            kConvAllPasses);  // 8 mod 16 channels
  EXPECT_EQ(passes_run(geom(2, 32, 18, 16, 32, 3, 3, 1, 1, 1, 1, 0, 0, 1, 1), ConvKernels::Fastest),
            kConvAllPasses);  // no pad rows
  EXPECT_EQ(passes_run(geom(2, 32, 13, 18, 32, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2), ConvKernels::Fastest), 0u);  // pad 2
  // A pass whose 4x4 tiles (of the tensor it writes) count no divisor from 8 to 28 stays
  // direct: 29 x 29 tiles of the output, 30 x 30 of the input.
  EXPECT_EQ(passes_run(geom(1, 32, 118, 118, 32, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0), ConvKernels::Fastest),
            kConvBackwardData);
  EXPECT_EQ(passes_run(geom(1, 32, 116, 116, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), ConvKernels::Fastest), 0u);
  EXPECT_EQ(passes_run(wide, ConvKernels::OneDnnOnly), 0u);                                       // the baseline
  EXPECT_EQ(passes_run(geom(2, 16, 13, 18, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), ConvKernels::Fastest), 0u);  // 16 in
  EXPECT_EQ(passes_run(geom(2, 32, 13, 18, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), ConvKernels::Fastest), 0u);  // 16 out
  EXPECT_EQ(passes_run(geom(2, 32, 13, 18, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1), ConvKernels::Fastest), 0u);  // stride 2
  EXPECT_EQ(passes_run(geom(2, 32, 13, 18, 32, 5, 5, 1, 1, 1, 1, 2, 2, 2, 2), ConvKernels::Fastest), 0u);  // 5x5
}

// Where oneDNN's Winograd would transform whole tensors (770 MB of scratchpad for the seed
// case's 32 -> 64 convolution at full resolution, on this project's 2-core AVX-512 machine)
// the direct kernels run: a convolution's scratchpad stays within an eighth of its tensors
// or 16 MiB. Primitives only; nothing of that size is allocated.
TEST(DnnlConv2d, WinogradNeverTransformsWholeTensors) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  for (const ConvGeom& g : {geom(2, 32, 741, 591, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
                            geom(2, 64, 370, 295, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
                            geom(2, 32, 742, 591, 32, 3, 3, 1, 1, 1, 1, 1, 0, 1, 1)}) {
    DnnlConv2d conv(g);
    const size_t pad = conv.scratch_need(kConvAllPasses).slot[kScratchPad];
    const size_t tensors = sizeof(float) * (g.x_size() + g.y_size());
    EXPECT_LE(pad, std::max<size_t>(size_t(16) << 20, tensors / 8)) << str(g) << ", Winograd passes "
                                                                     << conv.on_winograd();
  }
  omp_set_num_threads(saved);
}

// A hash of the bits of every pass of one small-channel convolution (uneven pads, output
// channels outside the register blocks), on the kernels this process runs.
uint64_t small_conv_bits() {
  const ConvGeom g = geom(2, 12, 37, 101, 13, 3, 3, 1, 1, 1, 1, 1, 2, 0, 1);
  std::mt19937_64 rng(5);
  VecF x = to_float(random_vec(g.x_size(), rng)), w = to_float(random_vec(g.w_size(), rng)),
       b = to_float(random_vec(g.cout, rng)), dy = to_float(random_vec(g.y_size(), rng));
  VecF y(g.y_size()), dx(g.x_size()), dw(g.w_size()), db(g.cout);
  DnnlConv2d conv(g);
  conv.forward(x.data(), w.data(), b.data(), y.data());
  conv.backward_data(dy.data(), w.data(), dx.data());
  conv.backward_weights(x.data(), dy.data(), dw.data(), db.data());
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const VecF* v : {&y, &dx, &dw, &db})
    for (float f : *v) {
      uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      h = (h ^ u) * 1099511628211ull;
    }
  return h;
}

// Two runs give the same bits; the hash is printed for the next test, which runs this one
// in a child process at the AVX2 cap.
TEST(DnnlConv2d, SmallChannelKernelsAreDeterministic) {
  const uint64_t first = small_conv_bits();
  EXPECT_EQ(small_conv_bits(), first);
  std::printf("small-conv %s %llx\n", small_conv_isa(), static_cast<unsigned long long>(first));
}

// The AVX2 and AVX-512 variants of the few-channel kernels sum in the same order: the same
// bits (so a plan's results do not depend on which of the two a node runs).
TEST(DnnlConv2d, SmallChannelKernelsGiveTheSameBitsOnAvx2AndAvx512) {
  if (std::string(small_conv_isa()) != "avx512") GTEST_SKIP() << "needs AVX-512 to compare with AVX2";
  omp_set_num_threads(2);
  char exe[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", exe, sizeof exe - 1), 0);
  const std::string cmd = std::string("OMP_NUM_THREADS=2 ONEDNN_MAX_CPU_ISA=AVX2 '") + exe +
                          "' --gtest_filter=DnnlConv2d.SmallChannelKernelsAreDeterministic";
  FILE* child = popen(cmd.c_str(), "r");
  ASSERT_NE(child, nullptr);
  std::string out;
  char line[512];
  while (std::fgets(line, sizeof line, child)) out += line;
  ASSERT_EQ(pclose(child), 0) << out;
  char want[64];
  std::snprintf(want, sizeof want, "small-conv avx2 %llx", static_cast<unsigned long long>(small_conv_bits()));
  EXPECT_NE(out.find(want), std::string::npos) << "AVX-512 here: " << want + 15 << "; the AVX2 child printed:\n" << out;
}

TEST(DnnlConv2d, ReusedAcrossCallsAndThreadCounts) {
  // Cached primitives must follow new data and a changed thread count; outputs are
  // overwritten, never accumulated.
  std::mt19937_64 rng(23);
  const ConvGeom g = geom(1, 16, 12, 14, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1);
  DnnlConv2d conv(g);
  const int saved = omp_get_max_threads();
  for (int rep = 0; rep < 3; ++rep) {
    omp_set_num_threads(rep % 2 + 1);
    Vec x = random_vec(g.x_size(), rng), w = random_vec(g.w_size(), rng),
        dy = random_vec(g.y_size(), rng);
    Vec y(g.y_size()), dw(g.w_size());
    conv2d_forward<double>(g, x.data(), w.data(), nullptr, y.data());
    conv2d_backward_weights<double>(g, x.data(), dy.data(), dw.data(), nullptr);
    VecF xf = to_float(x), wf = to_float(w), dyf = to_float(dy), yf(y.size(), 9), dwf(dw.size(), 9);
    conv.forward(xf.data(), wf.data(), nullptr, yf.data());
    conv.backward_weights(xf.data(), dyf.data(), dwf.data(), nullptr);
    expect_close("y", yf, y, 1e-4, 1e-4, "rep " + std::to_string(rep));
    expect_close("dw", dwf, dw, 1e-4, 1e-4, "rep " + std::to_string(rep));
  }
  omp_set_num_threads(saved);
}

// An arena that records each slot's largest request.
class RecordingArena : public ScratchArena {
 public:
  void* get(int slot, size_t bytes) override {
    ++calls[slot];
    asked.slot[slot] = std::max(asked.slot[slot], bytes);
    if (buf[slot].size() < bytes / sizeof(float) + 32) buf[slot].resize(bytes / sizeof(float) + 32);
    // 64-byte aligned, as the worker's tensors and arena are (oneDNN's Winograd needs it).
    return buf[slot].data() + (64 - reinterpret_cast<uintptr_t>(buf[slot].data()) % 64) % 64 / sizeof(float);
  }
  ConvScratch asked;
  int calls[kScratchSlots] = {};
  std::vector<float> buf[kScratchSlots];
};

// dnnl_conv_scratch (what the memory model counts) is exactly each slot's largest request
// over forward, backward data and backward weights, with and without bias, at the thread
// count it is given; and the calls run in the caller's arena.
TEST(DnnlConv2d, ScratchIsWhatTheCallsAsk) {
  std::mt19937_64 rng(29);
  const int saved = omp_get_max_threads();
  for (const ConvGeom& g : {geom(2, 16, 20, 18, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0),
                            geom(1, 8, 17, 15, 16, 3, 3, 2, 2, 1, 1, 0, 1, 1, 1),
                            geom(2, 1, 33, 31, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
                            geom(2, 12, 21, 70, 13, 3, 3, 1, 1, 1, 1, 2, 0, 1, 2),
                            geom(2, 32, 20, 18, 32, 3, 3, 1, 1, 1, 1, 1, 0, 1, 1)}) {  // framed backward
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      RecordingArena all, forward_only;
      DnnlConv2d conv(g, &all), inference(g, &forward_only);
      VecF x = to_float(random_vec(g.x_size(), rng)), w = to_float(random_vec(g.w_size(), rng)),
           dy = to_float(random_vec(g.y_size(), rng)), b(size_t(g.cout), 0.5f);
      VecF y(g.y_size()), dx(g.x_size()), dw(g.w_size()), db(size_t(g.cout));
      for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data())}) {
        conv.forward(x.data(), w.data(), bias, y.data());
        conv.backward_weights(x.data(), dy.data(), dw.data(), bias ? db.data() : nullptr);
        inference.forward(x.data(), w.data(), bias, y.data());
      }
      conv.backward_data(dy.data(), w.data(), dx.data());
      conv.backward(x.data(), dy.data(), w.data(), dw.data(), db.data(), [&] { return dx.data(); });
      const ConvScratch need = dnnl_conv_scratch(g, kConvAllPasses, threads);
      const ConvScratch need_forward = dnnl_conv_scratch(g, kConvForward, threads);
      for (int s = 0; s < kScratchSlots; ++s) {
        EXPECT_EQ(all.asked.slot[s], need.slot[s]) << "slot " << s << ", cin " << g.cin << ", threads " << threads;
        EXPECT_EQ(forward_only.asked.slot[s], need_forward.slot[s]) << "slot " << s << ", cin " << g.cin;
      }
      if (g.cin > 1) {
        EXPECT_GT(need.total(), 0u);  // blocked layouts: reorders through the arena
      }
    }
  }
  omp_set_num_threads(saved);
}

// backward() gives the bits of backward_weights then backward_data, with and without the
// weight gradient, calls dx_buffer after the weight gradient is written, and where both
// passes run on oneDNN in one blocked layout reorders dy once: it asks for slot B once
// where the two calls ask twice. Not shared: few input channels (the small-channel
// kernels); 8 mod 16 input channels on AVX-512 (the data gradient's 8-channel blocks).
TEST(DnnlConv2d, BackwardReordersDyOnceForBothPasses) {
  std::mt19937_64 rng(31);
  const struct {
    ConvGeom g;
    bool shared;
  } cases[] = {{geom(2, 32, 20, 18, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), true},
               {geom(1, 32, 17, 15, 32, 3, 3, 2, 2, 1, 1, 0, 1, 1, 1), true},
               {geom(2, 24, 20, 18, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), false},  // shared on AVX2
               {geom(2, 32, 20, 18, 48, 3, 3, 1, 1, 1, 1, 1, 0, 1, 1), false},  // framed on AVX-512
               {geom(2, 1, 33, 31, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), false},
               {geom(2, 12, 21, 20, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), false}};
  for (const auto& [g, shared] : cases) {
    RecordingArena apart_arena, both_arena;
    DnnlConv2d apart(g, &apart_arena), both(g, &both_arena);
    const VecF x = to_float(random_vec(g.x_size(), rng)), w = to_float(random_vec(g.w_size(), rng)),
               dy = to_float(random_vec(g.y_size(), rng));
    VecF dw(g.w_size()), db(size_t(g.cout)), dx(g.x_size());
    apart.backward_weights(x.data(), dy.data(), dw.data(), db.data());
    const int apart_b_after_weights = apart_arena.calls[kScratchB];
    apart.backward_data(dy.data(), w.data(), dx.data());
    const int apart_b = apart_arena.calls[kScratchB] - apart_b_after_weights;
    VecF dw2(g.w_size(), -1.f), db2(size_t(g.cout), -1.f), dx2(g.x_size(), -1.f);
    int before_dx = -1;
    both.backward(x.data(), dy.data(), w.data(), dw2.data(), db2.data(), [&] {
      EXPECT_EQ(dw2, dw) << "the weight gradient is written before dx_buffer is called";
      before_dx = both_arena.calls[kScratchB];
      return dx2.data();
    });
    const std::string ctx = "cin " + std::to_string(g.cin) + ", cout " + std::to_string(g.cout);
    EXPECT_EQ(dw2, dw) << ctx;
    EXPECT_EQ(db2, db) << ctx;
    EXPECT_EQ(dx2, dx) << ctx;
    // Where the data gradient alone reorders dy (blocked kernels: AVX2 and AVX-512, as the
    // ctest under ONEDNN_MAX_CPU_ISA=AVX2 runs it too), backward() does not again.
    if (shared && apart_b == 1) {
      EXPECT_EQ(both_arena.calls[kScratchB], before_dx) << ctx << ": dy reordered again";
    }
    // A framed data gradient takes dy framed: its own reorder, never the weight gradient's.
    if (g.pad_top != g.pad_bottom && both.on_winograd() & kConvBackwardData) {
      EXPECT_EQ(both_arena.calls[kScratchB], before_dx + 1) << ctx << ": the framed dy was not made";
    }
    // Without the weight gradient (a frozen layer), and without dx.
    VecF dx3(g.x_size(), -1.f);
    both.backward(x.data(), dy.data(), w.data(), nullptr, nullptr, [&] { return dx3.data(); });
    EXPECT_EQ(dx3, dx) << ctx;
    VecF dw4(g.w_size(), -1.f);
    both.backward(x.data(), dy.data(), w.data(), dw4.data(), nullptr, [] { return static_cast<float*>(nullptr); });
    VecF dw_nobias(g.w_size());
    apart.backward_weights(x.data(), dy.data(), dw_nobias.data(), nullptr);
    EXPECT_EQ(dw4, dw_nobias) << ctx;
  }
}

TEST(DnnlConv2d, RejectsBadGeometry) {
  EXPECT_THROW(DnnlConv2d(geom(1, 1, 2, 2, 1, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0)),
               std::invalid_argument);
}

// ---------------------------------------------------------------------------- optimizers

TEST(Optim, SgdMomentumThreeSteps) {
  std::mt19937_64 rng(24);
  const size_t n = 37;
  const double lr = 0.05, mu = 0.9;
  Vec w = random_vec(n, rng), v(n, 0.0);
  VecF wf = to_float(w), vf(n, 0.f), wf0 = wf;
  for (int step = 1; step <= 3; ++step) {
    Vec g = random_vec(n, rng);
    VecF gf = to_float(g);
    for (size_t i = 0; i < n; ++i) {
      v[i] = mu * v[i] + g[i];
      w[i] -= lr * v[i];
    }
    sgd_step(n, wf.data(), gf.data(), vf.data(), float(lr), float(mu));
    expect_close("sgd w", wf, w, 1e-6, 1e-5, "step " + std::to_string(step));
    expect_close("sgd v", vf, v, 1e-6, 1e-5, "step " + std::to_string(step));
  }
  // Without momentum there is no state: w -= lr*g.
  VecF g1(n, 2.f), before = wf0;
  sgd_step(n, wf0.data(), g1.data(), nullptr, 0.25f, 0.f);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(wf0[i], before[i] - 0.5f);
}

TEST(Optim, AdamThreeSteps) {
  std::mt19937_64 rng(25);
  const size_t n = 41;
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-7;
  Vec w = random_vec(n, rng), m(n, 0.0), v(n, 0.0);
  VecF wf = to_float(w), mf(n, 0.f), vf(n, 0.f);
  for (int t = 1; t <= 3; ++t) {
    Vec g = random_vec(n, rng);
    for (auto& x : g) x *= t == 2 ? 1e-3 : 1.0;  // a small-gradient step too
    VecF gf = to_float(g);
    // torch.optim.Adam (PyTorch 1.13, foreach=False), written out in double.
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (size_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
      w[i] -= lr / bc1 * m[i] / denom;
    }
    adam_step(n, wf.data(), gf.data(), mf.data(), vf.data(), lr, b1, b2, eps, t);
    const std::string ctx = "step " + std::to_string(t);
    expect_close("adam w", wf, w, 1e-7, 1e-6, ctx);
    expect_close("adam m", mf, m, 1e-10, 1e-6, ctx);
    expect_close("adam v", vf, v, 1e-13, 1e-6, ctx);
  }
  EXPECT_THROW(adam_step(n, wf.data(), wf.data(), mf.data(), vf.data(), 1, .9f, .9f, 1, 0),
               std::invalid_argument);
}

// ---------------------------------------------------------------------------- PyTorch

// PyTorch 1.13 itself on the same inputs, when /usr/bin/python3 has it. Arrays travel as
// raw float64 files in a temporary folder; one Python run computes every reference.
const char* kTorchScript = R"PY(
import sys, numpy as np, torch, torch.nn.functional as F
d = sys.argv[1]
def get(n): return torch.from_numpy(np.fromfile(f"{d}/{n}.bin", dtype="<f8"))
def put(n, t): t.detach().to(torch.float64).contiguous().numpy().tofile(f"{d}/out_{n}.bin")
def leaf(n, shape): return get(n).reshape(shape).requires_grad_(True)
# conv: geometry n,cin,h,w,cout,kh,kw,sh,sw,dh,dw,pt,pb,pl,pr
n,ci,h,w,co,kh,kw,sh,sw,dh,dw,pt,pb,pl,pr = [int(v) for v in get("conv_geom")]
x, wt, b = leaf("conv_x", (n,ci,h,w)), leaf("conv_w", (co,ci,kh,kw)), leaf("conv_b", (co,))
y = F.conv2d(F.pad(x, (pl,pr,pt,pb)), wt, b, stride=(sh,sw), dilation=(dh,dw))
y.backward(get("conv_dy").reshape(y.shape))
put("conv_y", y); put("conv_dx", x.grad); put("conv_dw", wt.grad); put("conv_db", b.grad)
# pools: plane 2x3x7x8, window 3, stride 2, padding 1
for kind in ("max", "avg"):
    x = leaf("pool_x", (2,3,7,8))
    y = F.max_pool2d(x, 3, 2, 1) if kind == "max" else \
        F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
    y.backward(get("pool_dy").reshape(y.shape))
    put(kind + "_y", y); put(kind + "_dx", x.grad)
# batch norm, training mode
x, g, bb = leaf("bn_x", (3,4,5,6)), leaf("bn_g", (4,)), leaf("bn_b", (4,))
y = F.batch_norm(x, None, None, g, bb, training=True, eps=1e-3)
y.backward(get("bn_dy").reshape(y.shape))
put("bn_y", y); put("bn_dx", x.grad); put("bn_dg", g.grad); put("bn_db", bb.grad)
# losses (sums)
z = leaf("xent_z", (5,4))
l = F.cross_entropy(z, get("xent_l").long(), reduction="sum"); l.backward()
put("xent_loss", l.reshape(1)); put("xent_g", z.grad)
z = leaf("bce_z", (30,))
l = F.binary_cross_entropy_with_logits(z, get("bce_t"), reduction="sum"); l.backward()
put("bce_loss", l.reshape(1)); put("bce_g", z.grad)
# optimizers in float32, three steps
for kind in ("adam", "sgd"):
    p = torch.nn.Parameter(get("opt_w").float())
    opt = torch.optim.Adam([p], lr=1e-2, betas=(0.9, 0.999), eps=1e-7) if kind == "adam" else \
          torch.optim.SGD([p], lr=0.05, momentum=0.9)
    grads = get("opt_g").float().reshape(3, -1)
    for s in range(3):
        p.grad = grads[s].clone(); opt.step()
    put(kind + "_w", p)
)PY";

// One test, because each ctest test is a process and importing torch takes seconds.
class TorchOracle {
 public:
  TorchOracle() {
    char tmpl[] = "/tmp/ht_torch_oracle_XXXXXX";
    if (mkdtemp(tmpl)) dir_ = tmpl;
  }
  ~TorchOracle() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  bool run() {
    std::ofstream(dir_ + "/oracle.py") << kTorchScript;
    return std::system(("/usr/bin/python3 " + dir_ + "/oracle.py " + dir_).c_str()) == 0;
  }
  void put(const std::string& name, const Vec& v) const {
    std::ofstream(dir_ + "/" + name + ".bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 8));
  }
  Vec get(const std::string& name) const {
    std::ifstream f(dir_ + "/" + name + ".bin", std::ios::binary | std::ios::ate);
    if (!f) return {};
    Vec v(size_t(f.tellg()) / 8);
    f.seekg(0).read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 8));
    return v;
  }
  Vec out(const std::string& name) const { return get("out_" + name); }

 private:
  std::string dir_;
};

void near(const char* what, const Vec& a, const Vec& r, double tol = 1e-10) {
  ASSERT_EQ(a.size(), r.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], r[i], tol * (1 + std::fabs(r[i]))) << what << " element " << i;
}

void check_conv(const TorchOracle& o, const ConvGeom& g) {
  Vec x = o.get("conv_x"), w = o.get("conv_w"), b = o.get("conv_b"), dy = o.get("conv_dy");
  Vec y(g.y_size()), dx(g.x_size()), dw(g.w_size()), db(g.cout);
  conv2d_forward<double>(g, x.data(), w.data(), b.data(), y.data());
  conv2d_backward_data<double>(g, dy.data(), w.data(), dx.data());
  conv2d_backward_weights<double>(g, x.data(), dy.data(), dw.data(), db.data());
  near("conv y", y, o.out("conv_y"));
  near("conv dx", dx, o.out("conv_dx"));
  near("conv dw", dw, o.out("conv_dw"));
  near("conv db", db, o.out("conv_db"));
}

void check_pools(const TorchOracle& o) {
  PoolGeom g;
  g.n = 2, g.c = 3, g.hin = 7, g.win = 8, g.kh = g.kw = 3, g.stride_h = g.stride_w = 2;
  g.pad_top = g.pad_bottom = g.pad_left = g.pad_right = 1;
  Vec x = o.get("pool_x"), dy = o.get("pool_dy"), y(g.y_size()), dx(g.x_size());
  max_pool_forward<double>(g, x.data(), y.data());
  max_pool_backward<double>(g, x.data(), dy.data(), dx.data());
  near("max y", y, o.out("max_y"), 0);
  near("max dx (ties)", dx, o.out("max_dx"));
  avg_pool_forward<double>(g, x.data(), y.data());
  avg_pool_backward<double>(g, dy.data(), dx.data());
  near("avg y", y, o.out("avg_y"));
  near("avg dx", dx, o.out("avg_dx"));
}

void check_batch_norm(const TorchOracle& o) {
  const int n = 3, c = 4;
  const long hw = 30;
  const double count = double(n) * hw;
  Vec x = o.get("bn_x"), g = o.get("bn_g"), b = o.get("bn_b"), dy = o.get("bn_dy");
  Vec y(x.size()), dx(x.size()), mean(c, 0), sq(c, 0), invstd(c), sdy(c, 0), sdyx(c, 0);
  channel_sum<double>(n, c, hw, x.data(), mean.data());
  for (auto& m : mean) m /= count;
  channel_sq_dev_sum<double>(n, c, hw, x.data(), mean.data(), sq.data());
  for (int i = 0; i < c; ++i) invstd[i] = 1 / std::sqrt(sq[i] / count + 1e-3);
  bn_forward_apply<double>(n, c, hw, x.data(), mean.data(), invstd.data(), g.data(), b.data(),
                           y.data());
  bn_backward_sums<double>(n, c, hw, dy.data(), x.data(), mean.data(), invstd.data(), sdy.data(),
                           sdyx.data());
  bn_backward_apply<double>(n, c, hw, dy.data(), x.data(), mean.data(), invstd.data(), g.data(),
                            sdy.data(), sdyx.data(), count, dx.data());
  near("bn y", y, o.out("bn_y"));
  near("bn dx", dx, o.out("bn_dx"));
  near("bn dgamma", sdyx, o.out("bn_dg"));
  near("bn dbeta", sdy, o.out("bn_db"));
}

void check_losses(const TorchOracle& o) {
  Vec z = o.get("xent_z"), lv = o.get("xent_l"), g(z.size());
  std::vector<int32_t> labels(lv.begin(), lv.end());
  const double xent = softmax_xent<double>(5, 4, z.data(), labels.data(), 1, g.data());
  near("xent", {xent}, o.out("xent_loss"));
  near("xent grad", g, o.out("xent_g"));
  Vec bz = o.get("bce_z"), bt = o.get("bce_t"), bg(bz.size());
  const double bce = sigmoid_bce<double>(bz.size(), bz.data(), bt.data(), 1, bg.data());
  near("bce", {bce}, o.out("bce_loss"));
  near("bce grad", bg, o.out("bce_g"));
}

void check_optimizers(const TorchOracle& o) {
  const VecF w0 = to_float(o.get("opt_w")), gs = to_float(o.get("opt_g"));
  const size_t n = w0.size();
  VecF wa(w0), m(n, 0.f), v(n, 0.f), ws(w0), vs(n, 0.f);
  for (int t = 1; t <= 3; ++t) {
    const float* g = gs.data() + (t - 1) * n;
    adam_step(n, wa.data(), g, m.data(), v.data(), 1e-2, 0.9, 0.999, 1e-7, t);
    sgd_step(n, ws.data(), g, vs.data(), 0.05f, 0.9f);
  }
  near("adam float32", Vec(wa.begin(), wa.end()), o.out("adam_w"), 1e-6);
  near("sgd float32", Vec(ws.begin(), ws.end()), o.out("sgd_w"), 1e-6);
}

TEST(TorchOracle, KernelsMatchPyTorch) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no /usr/bin/python3 with torch";
  TorchOracle o;
  std::mt19937_64 rng(31);
  const ConvGeom cg = geom(2, 3, 9, 10, 4, 3, 2, 2, 1, 2, 1, 2, 0, 1, 3);
  o.put("conv_geom", {double(cg.n), double(cg.cin), double(cg.hin), double(cg.win), double(cg.cout),
                      double(cg.kh), double(cg.kw), double(cg.stride_h), double(cg.stride_w),
                      double(cg.dil_h), double(cg.dil_w), double(cg.pad_top), double(cg.pad_bottom),
                      double(cg.pad_left), double(cg.pad_right)});
  o.put("conv_x", random_vec(cg.x_size(), rng));
  o.put("conv_w", random_vec(cg.w_size(), rng));
  o.put("conv_b", random_vec(cg.cout, rng));
  o.put("conv_dy", random_vec(cg.y_size(), rng));
  Vec px(2 * 3 * 7 * 8);  // small integers: many ties inside windows
  for (auto& v : px) v = double(rng() % 3) - 3;
  o.put("pool_x", px);
  o.put("pool_dy", random_vec(2 * 3 * 4 * 4, rng));
  o.put("bn_x", random_vec(3 * 4 * 30, rng));
  o.put("bn_g", random_vec(4, rng));
  o.put("bn_b", random_vec(4, rng));
  o.put("bn_dy", random_vec(3 * 4 * 30, rng));
  o.put("xent_z", random_vec(20, rng));
  o.put("xent_l", {0, 3, 1, 1, 2});
  Vec bz = random_vec(30, rng), bt(30);
  for (size_t i = 0; i < bz.size(); ++i) bz[i] *= 20, bt[i] = double(i % 2);
  o.put("bce_z", bz);
  o.put("bce_t", bt);
  o.put("opt_w", random_vec(50, rng));
  o.put("opt_g", random_vec(150, rng));
  ASSERT_TRUE(o.run()) << "the torch script failed";
  check_conv(o, cg);
  check_pools(o);
  check_batch_norm(o);
  check_losses(o);
  check_optimizers(o);
}

}  // namespace
}  // namespace ht::cpu
