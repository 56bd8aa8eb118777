// The CUDA backend's batch norm against the CPU reference kernels: its pieces, the chain
// with a ReLU, and the chain with a ReLU and a tiling max pool (against the CUDA kernels
// run apart), as kernels_gpu_cuda_test.cpp does the rest. Each test skips without a device.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "common/cuda_backend_fixture.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/norm_relu_pool.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the fixture and its helpers

TEST_F(CudaBackendTest, BatchNormPiecesMatchReference) {
  // n * hw spans several reduction blocks per channel.
  const int n = 2, c = 3;
  const long hw = 151 * 211;
  const size_t count = size_t(n) * c * hw;
  const Vec x = random_vec(count, 80, 2.f, 6.f), dy = random_vec(count, 81);
  const Vec gamma = random_vec(c, 82, 0.5f, 1.5f), beta = random_vec(c, 83);
  const DVec xd = to_double(x), dyd = to_double(dy), gd = to_double(gamma), bd = to_double(beta);
  float *dxv = dev(x), *ddy = dev(dy), *dg = dev(gamma), *dbeta = dev(beta);

  DVec rsum(c, 0.0), sum(c, -1.0);
  cpu::channel_sum(n, c, hw, xd.data(), rsum.data());
  gpu_->channel_sum(n, c, hw, dxv, sum.data());
  expect_close(sum, rsum, 1e-6, 1e-12, "channel_sum");

  DVec mean(c), rsq(c, 0.0), sq(c, -1.0), invstd(c);
  for (int i = 0; i < c; ++i) mean[i] = rsum[i] / double(n * hw);
  cpu::channel_sq_dev_sum(n, c, hw, xd.data(), mean.data(), rsq.data());
  gpu_->channel_sq_dev_sum(n, c, hw, dxv, mean.data(), sq.data());
  expect_close(sq, rsq, 1e-6, 1e-11, "channel_sq_dev_sum");
  for (int i = 0; i < c; ++i) invstd[i] = 1.0 / std::sqrt(rsq[i] / double(n * hw) + 1e-3);

  DVec ry(count);
  cpu::bn_forward_apply(n, c, hw, xd.data(), mean.data(), invstd.data(), gd.data(), bd.data(), ry.data());
  float* y = dev_zero(count);
  gpu_->bn_forward_apply(n, c, hw, dxv, mean.data(), invstd.data(), dg, dbeta, y);
  expect_close(host(y, count), ry, 1e-5, 1e-5, "bn_forward_apply");

  DVec rsdy(c, 0.0), rsdx(c, 0.0), sdy(c, -1.0), sdx(c, -1.0);
  cpu::bn_backward_sums(n, c, hw, dyd.data(), xd.data(), mean.data(), invstd.data(), rsdy.data(),
                        rsdx.data());
  gpu_->bn_backward_sums(n, c, hw, ddy, dxv, mean.data(), invstd.data(), sdy.data(), sdx.data());
  expect_close(sdy, rsdy, 1e-6, 1e-11, "bn_backward_sums sum_dy");
  expect_close(sdx, rsdx, 1e-6, 1e-11, "bn_backward_sums sum_dy_xhat");

  DVec rdx(count);
  const double total = double(n * hw);
  cpu::bn_backward_apply(n, c, hw, dyd.data(), xd.data(), mean.data(), invstd.data(), gd.data(), rsdy.data(),
                         rsdx.data(), total, rdx.data());
  float* dx = dev_zero(count);
  gpu_->bn_backward_apply(n, c, hw, ddy, dxv, mean.data(), invstd.data(), dg, rsdy.data(), rsdx.data(), total,
                          dx);
  expect_close(host(dx, count), rdx, 1e-5, 1e-5, "bn_backward_apply");
}

// The batch norm + ReLU chain (the base class's: the two layers' kernels in place) against
// the CPU's in double: the ReLU's output, then the sums and the input gradient written
// over the output gradient.
TEST_F(CudaBackendTest, BatchNormReluChainMatchesReference) {
  const int n = 2, c = 3;
  const long hw = 97 * 131;
  const size_t count = size_t(n) * c * hw;
  const Vec x = random_vec(count, 90, -2.f, 2.f), dy = random_vec(count, 91);
  const Vec gamma = random_vec(c, 92, 0.5f, 1.5f), beta = random_vec(c, 93);
  const DVec xd = to_double(x), dyd = to_double(dy), gd = to_double(gamma), bd = to_double(beta);
  const DVec mean = {0.1, -0.2, 0.05}, invstd = {0.9, 1.1, 1.3};
  float *dxv = dev(x), *dg = dev(gamma), *dbeta = dev(beta);

  DVec ry(count);
  cpu::bn_relu_forward(n, c, hw, xd.data(), mean.data(), invstd.data(), gd.data(), bd.data(), ry.data());
  float* y = dev_zero(count);
  gpu_->bn_relu_forward(n, c, hw, dxv, mean.data(), invstd.data(), dg, dbeta, y);
  const Vec yv = host(y, count);
  expect_close(yv, ry, 1e-5, 1e-5, "bn_relu_forward");

  // The reference reads the GPU's ReLU output for its mask: a value at 0 either side of
  // rounding would otherwise pick another pixel's gradient.
  const DVec yd = to_double(yv);
  DVec rsdy(c, 0.0), rsdx(c, 0.0), sdy(c, -1.0), sdx(c, -1.0);
  cpu::bn_relu_backward_sums(n, c, hw, dyd.data(), yd.data(), xd.data(), mean.data(), invstd.data(), rsdy.data(),
                             rsdx.data());
  float* ddy = dev(dy);
  gpu_->bn_relu_backward_sums(n, c, hw, ddy, y, dxv, mean.data(), invstd.data(), sdy.data(), sdx.data());
  expect_close(sdy, rsdy, 1e-6, 1e-11, "bn_relu_backward_sums sum_dy");
  expect_close(sdx, rsdx, 1e-6, 1e-11, "bn_relu_backward_sums sum_dy_xhat");

  DVec rdx(count);
  const double total = double(n * hw);
  cpu::bn_relu_backward_apply(n, c, hw, dyd.data(), yd.data(), xd.data(), mean.data(), invstd.data(), gd.data(),
                              rsdy.data(), rsdx.data(), total, rdx.data());
  gpu_->bn_relu_backward_apply(n, c, hw, ddy, y, dxv, mean.data(), invstd.data(), dg, rsdy.data(), rsdx.data(),
                               total, ddy);
  expect_close(host(ddy, count), rdx, 1e-5, 1e-5, "bn_relu_backward_apply over dy");
}

// The fused batch norm + ReLU + tiling max pool against the CUDA kernels of the three
// layers run apart: the pooled tensor and the input gradient (for the same sums) to the
// bit, the argmax bytes those of the unfused ReLU output; the sums within rounding of the
// double reference over the gradient the pool and ReLU pass down, and the pooled tensor of
// the CPU's double kernel within float rounding. Windows 2x2 and 4x4 (the CPU's vectorised
// cases) and 3x2, over planes whose last rows and columns no window covers.
TEST_F(CudaBackendTest, BatchNormReluMaxPoolChainIsTheUnfusedKernels) {
  for (const auto& [h, w, k, kw] : {std::array<int, 4>{37, 30, 2, 2}, {64, 38, 4, 4}, {31, 17, 3, 2}}) {
    NormPoolShape s;
    s.n = 2, s.c = 3, s.h = h, s.w = w, s.kh = k, s.kw = kw;
    const std::string what = std::to_string(h) + "x" + std::to_string(w) + " pool " + std::to_string(k) + "x" +
                             std::to_string(kw);
    const size_t count = s.x_size(), pooled = s.y_size();
    const int64_t hw = int64_t(h) * w;
    const Vec x = random_vec(count, 94, -2.f, 2.f), dy = random_vec(pooled, 95);
    const Vec gamma = random_vec(size_t(s.c), 96, 0.5f, 1.5f), beta = random_vec(size_t(s.c), 97);
    const DVec mean = {0.1, -0.2, 0.05}, invstd = {0.9, 1.1, 1.3};
    float *dxv = dev(x), *dg = dev(gamma), *dbeta = dev(beta), *ddy = dev(dy);

    // Apart: bn_forward_apply, relu_forward, max_pool_forward.
    PoolGeom pg;
    pg.n = s.n, pg.c = s.c, pg.hin = h, pg.win = w, pg.kh = k, pg.kw = kw, pg.stride_h = k, pg.stride_w = kw;
    float* relu = dev_zero(count);
    gpu_->bn_forward_apply(s.n, s.c, hw, dxv, mean.data(), invstd.data(), dg, dbeta, relu);
    gpu_->relu_forward(count, relu, relu);
    float* y_apart = dev_zero(pooled);
    gpu_->max_pool_forward(pg, relu, y_apart);

    float* y = dev_zero(pooled);
    uint8_t* argmax = dev(std::vector<uint8_t>(pooled, 0));
    gpu_->bn_relu_max_pool_forward(s, dxv, mean.data(), invstd.data(), dg, dbeta, y, argmax);
    const Vec yv = host(y, pooled);
    EXPECT_EQ(yv, host(y_apart, pooled)) << what;
    DVec ry(pooled);
    std::vector<uint8_t> ra(pooled);
    const DVec xd = to_double(x), gd = to_double(gamma), bd = to_double(beta);
    cpu::bn_relu_max_pool_forward<double>(s, xd.data(), mean.data(), invstd.data(), gd.data(), bd.data(), ry.data(),
                                          ra.data());
    expect_close(yv, ry, 1e-5, 1e-5, "bn_relu_max_pool_forward " + what);

    // The argmax bytes: each window's first maximum of the unfused ReLU output, none at <= 0.
    const Vec rv = host(relu, count);
    std::vector<uint8_t> av(pooled);
    gpu_->to_host(av.data(), argmax, pooled);
    std::vector<uint8_t> want(pooled);
    for (size_t p = 0; p < size_t(s.n) * s.c; ++p)
      for (int oh = 0; oh < s.ho(); ++oh)
        for (int ow = 0; ow < s.wo(); ++ow) {
          float best = -INFINITY;
          int at = 0;
          for (int i = 0; i < k * kw; ++i) {
            const float v = rv[p * size_t(hw) + size_t(oh * k + i / kw) * w + size_t(ow) * kw + i % kw];
            if (i == 0 || v > best) best = v, at = i;
          }
          want[(p * s.ho() + oh) * s.wo() + ow] = best <= 0.f ? kNoArgmax : uint8_t(at);
        }
    EXPECT_EQ(av, want) << what;

    // Apart: max_pool_backward, relu_backward (over the pool's gradient), then the sums.
    float* g_apart = dev_zero(count);
    gpu_->max_pool_backward(pg, relu, ddy, g_apart);
    gpu_->relu_backward(count, relu, g_apart, g_apart);
    const DVec gad = to_double(host(g_apart, count));
    DVec rsdy(size_t(s.c), 0.0), rsdx(size_t(s.c), 0.0), sdy(size_t(s.c), -1.0), sdx(size_t(s.c), -1.0);
    cpu::bn_backward_sums(s.n, s.c, hw, gad.data(), xd.data(), mean.data(), invstd.data(), rsdy.data(), rsdx.data());
    gpu_->bn_relu_max_pool_backward_sums(s, ddy, argmax, dxv, mean.data(), invstd.data(), sdy.data(), sdx.data());
    expect_close(sdy, rsdy, 1e-6, 1e-11, "bn_relu_max_pool_backward_sums sum_dy " + what);
    expect_close(sdx, rsdx, 1e-6, 1e-11, "bn_relu_max_pool_backward_sums sum_dy_xhat " + what);

    const double total = double(s.n) * double(hw);
    float* dx_apart = dev_zero(count);
    gpu_->bn_backward_apply(s.n, s.c, hw, g_apart, dxv, mean.data(), invstd.data(), dg, rsdy.data(), rsdx.data(),
                            total, dx_apart);
    float* dx = dev_zero(count);
    gpu_->bn_relu_max_pool_backward_apply(s, ddy, argmax, dxv, mean.data(), invstd.data(), dg, rsdy.data(),
                                          rsdx.data(), total, dx);
    EXPECT_EQ(host(dx, count), host(dx_apart, count)) << what;
    // Written over x, as the worker runs it where the chain alone reads its input.
    float* x_then_dx = dev(x);
    gpu_->bn_relu_max_pool_backward_apply(s, ddy, argmax, x_then_dx, mean.data(), invstd.data(), dg, rsdy.data(),
                                          rsdx.data(), total, x_then_dx);
    EXPECT_EQ(host(x_then_dx, count), host(dx_apart, count)) << what << ", over x";
  }
}

}  // namespace
}  // namespace ht
