// DnnlConv2d against the plain-loop convolution in double: values on every kernel it runs
// (oneDNN's direct and Winograd ones, the small-channel kernels), which it runs where, and
// the scratch it asks. The optimizers and PyTorch itself: kernels_reference_test.cpp.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/conv.hpp"
#include "kernels/cpu/conv_small.hpp"
#include "kernels/cpu/conv_winograd.hpp"
#include "kernels/cpu/dnnl_isa.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/norm.hpp"
#include "tests/common/kernel_checks.hpp"

namespace ht::cpu {
namespace {

using namespace ht::testing;  // tests/common/kernel_checks.hpp

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
      // The data gradient on a grown dx (2 x 29 x 2 tiles: 117 x 7) and framed dy.
      geom(2, 32, 116, 7, 32, 3, 3, 1, 1, 1, 1, 1, 0, 1, 1),
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
  Vec x = random_float_vec(g.x_size(), rng), w = random_float_vec(g.w_size(), rng), b = random_float_vec(g.cout, rng),
      dy = random_float_vec(g.y_size(), rng);
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

// Batch-norm statistics in the forward's pass: where the small-channel kernels run the
// forward in bands holding whole blocks, y's channel moments come with it, with
// channel_moments' bits (blocks of the plane wholly inside a band of output rows summed in
// the band's task, the rest after); elsewhere none. y is the same either way. Bands of
// 400 elements (none: too narrow), 1024 (one block each), 1028 (blocks across bands), 1200,
// 2048 and 3072; odd channel counts; pixels around 1e4.
TEST(DnnlConv2d, ForwardWithMomentsGivesBatchNormsMomentsToTheBit) {
  std::vector<ConvGeom> gs = dnnl_geoms();
  gs.insert(gs.end(), {geom(2, 1, 37, 100, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
                       geom(1, 3, 21, 256, 12, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
                       geom(1, 16, 6, 257, 5, 3, 3, 1, 1, 1, 1, 0, 2, 2, 0),
                       geom(2, 8, 9, 300, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
                       geom(1, 12, 11, 512, 13, 3, 3, 1, 1, 1, 1, 1, 0, 1, 1),
                       geom(2, 1, 13, 768, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1)});
  std::mt19937_64 rng(23);
  const int saved = omp_get_max_threads();
  int made = 0;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (size_t i = 0; i < gs.size(); ++i) {
      const ConvGeom& g = gs[i];
      SCOPED_TRACE(str(g) + " threads " + std::to_string(threads));
      VecF x = to_float(random_float_vec(g.x_size(), rng)), w = to_float(random_float_vec(g.w_size(), rng));
      VecF b(size_t(g.cout), i % 2 ? 1e4f : 0.5f);  // odd ones: a large mean
      VecF y(g.y_size(), NAN), y2(g.y_size(), NAN);
      DnnlConv2d conv(g);
      std::vector<double> mean(size_t(g.cout), -1), m2(size_t(g.cout), -1);
      const bool with = conv.forward_with_moments(x.data(), w.data(), b.data(), y.data(), mean.data(), m2.data());
      EXPECT_EQ(with, (small_conv_passes(g) & kConvForward) != 0 && small_conv_moments_in_pass(g));
      conv.forward(x.data(), w.data(), b.data(), y2.data());
      EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)));
      if (!with) continue;
      ++made;
      const long hw = long(g.hout()) * g.wout();
      std::vector<double> want_mean(size_t(g.cout)), want_m2(size_t(g.cout));
      channel_moments<float>(g.n, g.cout, hw, y.data(), want_mean.data(), want_m2.data());
      EXPECT_EQ(mean, want_mean);
      EXPECT_EQ(m2, want_m2);
    }
  }
  omp_set_num_threads(saved);
  if (std::string(small_conv_isa()) != "none") EXPECT_EQ(made, 10);
}

// A conv + ReLU chain's forward: the ReLU in the conv's pass (the small-channel kernels'
// bands, oneDNN's post-op on its direct and Winograd kernels) has the bits of forward and
// then relu_forward, on every geometry above, one thread and two; about half the outputs
// below zero. A NaN, which relu_forward passes, may come out 0 (conv.hpp forward_relu).
TEST(DnnlConv2d, ForwardReluIsForwardThenReluToTheBit) {
  std::mt19937_64 rng(29);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (const ConvGeom& g : dnnl_geoms()) {
      SCOPED_TRACE(str(g) + " threads " + std::to_string(threads));
      VecF x = to_float(random_float_vec(g.x_size(), rng)), w = to_float(random_float_vec(g.w_size(), rng));
      VecF b = to_float(random_float_vec(size_t(g.cout), rng));
      x[x.size() / 3] = NAN;  // a NaN output where a window reads it
      VecF y(g.y_size(), 7.f), want(g.y_size(), 7.f);
      DnnlConv2d conv(g);
      conv.forward_relu(x.data(), w.data(), b.data(), y.data());
      conv.forward(x.data(), w.data(), b.data(), want.data());
      const size_t negative = size_t(std::count_if(want.begin(), want.end(), [](float v) { return v < 0; }));
      EXPECT_GT(negative, want.size() / 5);
      EXPECT_LT(negative, want.size() * 4 / 5);
      relu_forward(want.size(), want.data(), want.data());
      size_t differ = 0;  // the bits, but NaN or 0 for a NaN
      for (size_t i = 0; i < y.size(); ++i)
        differ += std::isnan(want[i]) ? !std::isnan(y[i]) && y[i] != 0.f
                                      : std::memcmp(&y[i], &want[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u);
    }
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
    VecF x = to_float(random_float_vec(g.x_size(), rng)), w = to_float(random_float_vec(g.w_size(), rng));
    VecF dy = to_float(random_float_vec(g.y_size(), rng)), y(g.y_size()), dx(g.x_size()), dw(g.w_size());
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
  // A forward or weight gradient whose 4x4 tiles (of the tensor it writes) count no divisor
  // from 8 to 28 stays direct: 29 x 29 tiles of the output. The data gradient grows dx
  // instead (116 -> 117 rows: 30 x 29), or needs not (30 x 30).
  EXPECT_EQ(passes_run(geom(1, 32, 118, 118, 32, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0), ConvKernels::Fastest),
            kConvBackwardData);
  EXPECT_EQ(passes_run(geom(1, 32, 116, 116, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), ConvKernels::Fastest),
            kConvBackwardData);
  EXPECT_EQ(passes_run(geom(2, 32, 116, 7, 32, 3, 3, 1, 1, 1, 1, 1, 0, 1, 1), ConvKernels::Fastest),
            kConvBackwardData);  // grown and framed (MatchesDoubleReference checks its values)
  // Too small to grow by an eighth (one tile): direct.
  EXPECT_EQ(passes_run(geom(1, 32, 4, 4, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), ConvKernels::Fastest), 0u);
  EXPECT_EQ(passes_run(wide, ConvKernels::OneDnnOnly), 0u);                                       // the baseline
  EXPECT_EQ(passes_run(geom(2, 16, 13, 18, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), ConvKernels::Fastest), 0u);  // 16 in
  EXPECT_EQ(passes_run(geom(2, 32, 13, 18, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), ConvKernels::Fastest), 0u);  // 16 out
  EXPECT_EQ(passes_run(geom(2, 32, 13, 18, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1), ConvKernels::Fastest), 0u);  // stride 2
  EXPECT_EQ(passes_run(geom(2, 32, 13, 18, 32, 5, 5, 1, 1, 1, 1, 2, 2, 2, 2), ConvKernels::Fastest), 0u);  // 5x5
}

// The data gradient's Winograd problem: pads made equal, dx grown only where its tiles
// block badly, by the least that blocks well (2 x 97 x 97 tiles -> 2 x 97 x 98 = 19012,
// divisible by 14; on a tie the columns grow), never by more than an eighth.
TEST(DnnlConv2d, WinogradDataProblemGrowsOnlyWhereItMust) {
  const ConvGeom shard = geom(2, 32, 385, 385, 32, 3, 3, 1, 1, 1, 1, 1, 0, 1, 0);
  const std::optional<ConvGeom> p = winograd_data_problem(shard);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->hin, 385);
  EXPECT_EQ(p->win, 389);  // the first column of a 98th column of tiles
  EXPECT_EQ(p->pad_top, 1);
  EXPECT_EQ(p->pad_bottom, 1);
  EXPECT_EQ(p->pad_left, 1);
  EXPECT_EQ(p->pad_right, 1);
  const std::optional<ConvGeom> same = winograd_data_problem(geom(2, 32, 384, 384, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1));
  ASSERT_TRUE(same);
  EXPECT_EQ(same->hin, 384);
  EXPECT_EQ(same->win, 384);
  EXPECT_FALSE(winograd_data_problem(geom(1, 32, 4, 4, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1)));  // one tile
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
  VecF x = to_float(random_float_vec(g.x_size(), rng)), w = to_float(random_float_vec(g.w_size(), rng)),
       b = to_float(random_float_vec(g.cout, rng)), dy = to_float(random_float_vec(g.y_size(), rng));
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
    Vec x = random_float_vec(g.x_size(), rng), w = random_float_vec(g.w_size(), rng),
        dy = random_float_vec(g.y_size(), rng);
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
// over forward (with and without its ReLU), backward data and backward weights, with and without bias, at the thread
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
      VecF x = to_float(random_float_vec(g.x_size(), rng)), w = to_float(random_float_vec(g.w_size(), rng)),
           dy = to_float(random_float_vec(g.y_size(), rng)), b(size_t(g.cout), 0.5f);
      VecF y(g.y_size()), dx(g.x_size()), dw(g.w_size()), db(size_t(g.cout));
      for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data())}) {
        conv.forward(x.data(), w.data(), bias, y.data());
        conv.forward_relu(x.data(), w.data(), bias, y.data());
        conv.backward_weights(x.data(), dy.data(), dw.data(), bias ? db.data() : nullptr);
        inference.forward(x.data(), w.data(), bias, y.data());
        inference.forward_relu(x.data(), w.data(), bias, y.data());
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
  const bool avx512 = dnnl_isa_reaches("avx512_core");
  const struct {
    ConvGeom g;
    bool shared;
  } cases[] = {{geom(2, 32, 20, 18, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), true},
               {geom(1, 32, 17, 15, 32, 3, 3, 2, 2, 1, 1, 0, 1, 1, 1), true},
               // 8-channel blocks for the data gradient on AVX-512; Winograd's framed dy there
               {geom(2, 24, 20, 18, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), !avx512},
               {geom(2, 32, 20, 18, 48, 3, 3, 1, 1, 1, 1, 1, 0, 1, 1), !avx512},
               {geom(2, 1, 33, 31, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), false},
               {geom(2, 12, 21, 20, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), false}};
  for (const auto& [g, shared] : cases) {
    RecordingArena apart_arena, both_arena;
    DnnlConv2d apart(g, &apart_arena), both(g, &both_arena);
    const VecF x = to_float(random_float_vec(g.x_size(), rng)), w = to_float(random_float_vec(g.w_size(), rng)),
               dy = to_float(random_float_vec(g.y_size(), rng));
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
    // The data gradient alone reorders dy once on the blocked kernels (AVX2 and AVX-512, as
    // the ctest under ONEDNN_MAX_CPU_ISA=AVX2 runs it too); backward() then shares the
    // weight gradient's reorder where the layouts agree, and makes its own where not.
    if (shared) {
      EXPECT_EQ(apart_b, 1) << ctx;
      EXPECT_EQ(both_arena.calls[kScratchB], before_dx) << ctx << ": dy reordered again";
    } else if (apart_b == 1) {
      EXPECT_EQ(both_arena.calls[kScratchB], before_dx + 1) << ctx << ": dy not reordered for the data gradient";
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

}  // namespace
}  // namespace ht::cpu
