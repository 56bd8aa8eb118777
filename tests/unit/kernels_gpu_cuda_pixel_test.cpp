// The CUDA kernels of SPEC section 11's layers (instance and group norm's plane pieces,
// the products of multiply and squeeze-excitation, layer norm, the channels-last
// transposes) against the CPU reference kernels, as kernels_gpu_cuda_test.cpp does the rest.
#include <gtest/gtest.h>

#include <vector>

#include "common/cuda_backend_fixture.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/pixel.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the fixture and its helpers

// instance and group norm's pieces; hw spans several reduction blocks per plane.
TEST_F(CudaBackendTest, PlaneNormPiecesMatchReference) {
  const int n = 2, c = 3, planes = n * c;
  const long hw = 131 * 157;
  const size_t count = size_t(planes) * hw;
  const Vec x = random_vec(count, 84, 2.f, 6.f), dy = random_vec(count, 85);
  const DVec xd = to_double(x), dyd = to_double(dy);
  float *dxv = dev(x), *ddy = dev(dy);
  DVec mean(planes), scale(planes), shift(planes), k(planes), a(planes), b(planes);
  for (int p = 0; p < planes; ++p) {
    mean[p] = 4.0 + 0.1 * p, scale[p] = 0.5 + 0.2 * p, shift[p] = -0.3 * p;
    k[p] = 1.5 - 0.1 * p, a[p] = 1e-3 * (p - 2), b[p] = 0.05 * p;
  }

  DVec rsq(planes), sq(planes, -1.0);
  cpu::plane_sq_dev_sum(n, c, hw, xd.data(), mean.data(), rsq.data());
  gpu_->plane_sq_dev_sum(n, c, hw, dxv, mean.data(), sq.data());
  expect_close(sq, rsq, 1e-10, 1e-9, "plane_sq_dev_sum");

  DVec ry(count);
  cpu::plane_affine(n, c, hw, xd.data(), mean.data(), scale.data(), shift.data(), ry.data());
  float* y = dev_zero(count);
  gpu_->plane_affine(n, c, hw, dxv, mean.data(), scale.data(), shift.data(), y);
  expect_close(host(y, count), ry, 1e-6, 1e-5, "plane_affine");

  DVec rsdy(planes), rsdd(planes), sdy(planes, -1.0), sdd(planes, -1.0);
  cpu::plane_backward_sums(n, c, hw, dyd.data(), xd.data(), mean.data(), rsdy.data(), rsdd.data());
  gpu_->plane_backward_sums(n, c, hw, ddy, dxv, mean.data(), sdy.data(), sdd.data());
  expect_close(sdy, rsdy, 1e-10, 1e-9, "plane_backward_sums sum_dy");
  expect_close(sdd, rsdd, 1e-10, 1e-9, "plane_backward_sums sum_dy_dev");

  DVec rdx(count);
  cpu::plane_backward_apply(n, c, hw, dyd.data(), xd.data(), mean.data(), k.data(), a.data(), b.data(), rdx.data());
  float* dx = dev_zero(count);
  gpu_->plane_backward_apply(n, c, hw, ddy, dxv, mean.data(), k.data(), a.data(), b.data(), dx);
  expect_close(host(dx, count), rdx, 1e-6, 1e-5, "plane_backward_apply");
}

TEST_F(CudaBackendTest, ProductsMatchReference) {
  const int n = 3, c = 4;
  const long hw = 127 * 163;  // several reduction blocks per plane
  const size_t count = size_t(n) * c * hw;
  const Vec x = random_vec(count, 140), z = random_vec(count, 141), v = random_vec(size_t(n) * c, 142);
  float *dxv = dev(x), *dz = dev(z), *y = dev_zero(count);
  Vec ry(count);
  cpu::multiply(count, x.data(), z.data(), ry.data());
  gpu_->multiply(count, dxv, dz, y);
  expect_close(host(y, count), ry, 1e-6, 1e-5, "multiply");

  for (PlaneFactor per : {PlaneFactor::PerPlane, PlaneFactor::PerChannel}) {
    cpu::multiply_planes(n, c, hw, x.data(), v.data(), per, ry.data());
    gpu_->multiply_planes(n, c, hw, dxv, dev(v), per, y);
    expect_close(host(y, count), ry, 1e-6, 1e-5, "multiply_planes " + std::to_string(int(per)));
  }

  const DVec xd = to_double(x), zd = to_double(z);
  DVec rdot(size_t(n) * c), dot(size_t(n) * c, -1.0);
  cpu::plane_dot(n, c, hw, xd.data(), zd.data(), rdot.data());
  gpu_->plane_dot(n, c, hw, dxv, dz, dot.data());
  expect_close(dot, rdot, 1e-10, 1e-9, "plane_dot");

  const DVec factors = {0.5, -1.25, 1.0 / 3.0};
  const long image = long(c) * hw;
  cpu::scale_images(n, image, x.data(), factors.data(), ry.data());
  gpu_->scale_images(n, image, dxv, factors.data(), y);
  expect_close(host(y, count), ry, 1e-6, 1e-5, "scale_images");
}

// Over 32 channels (several rounds of the block's channel sums) and a partial last block
// of pixels; without gamma and beta too. dx null still gives the weight sums.
TEST_F(CudaBackendTest, LayerNormMatchesReference) {
  const int n = 3;
  const long hw = 301;
  const double eps = 1e-6;
  for (int c : {37, 5}) {
    const bool affine = c == 37;
    const std::string what = "layer_norm c " + std::to_string(c);
    const size_t count = size_t(n) * c * hw;
    const Vec x = random_vec(count, 150 + c, 2.f, 6.f), dy = random_vec(count, 151 + c);
    const Vec gamma = random_vec(c, 152 + c, 0.5f, 1.5f), beta = random_vec(c, 153 + c);
    const DVec xd = to_double(x), dyd = to_double(dy), gd = to_double(gamma), bd = to_double(beta);
    const float* dgam = affine ? dev(gamma) : nullptr;
    const float* dbet = affine ? dev(beta) : nullptr;
    DVec ry(count), rdx(count), rdg(c, 0.0), rdb(c, 0.0);
    cpu::layer_norm_forward<double>(n, c, hw, xd.data(), eps, affine ? gd.data() : nullptr,
                                    affine ? bd.data() : nullptr, ry.data());
    cpu::layer_norm_backward<double>(n, c, hw, xd.data(), dyd.data(), eps, affine ? gd.data() : nullptr,
                                     rdx.data(), rdg.data(), rdb.data());
    float *dxv = dev(x), *ddy = dev(dy), *y = dev_zero(count), *dx = dev_zero(count);
    gpu_->layer_norm_forward(n, c, hw, dxv, eps, dgam, dbet, y);
    expect_close(host(y, count), ry, 1e-6, 1e-5, what + " forward");
    DVec dg(c, -1.0), db(c, -1.0);
    gpu_->layer_norm_backward(n, c, hw, dxv, ddy, eps, dgam, dx, dg.data(), db.data());
    expect_close(host(dx, count), rdx, 1e-6, 1e-5, what + " dx");
    expect_close(dg, rdg, 1e-10, 1e-9, what + " dgamma");
    expect_close(db, rdb, 1e-10, 1e-9, what + " dbeta");
    DVec dg2(c, -1.0), db2(c, -1.0);
    gpu_->layer_norm_backward(n, c, hw, dxv, ddy, eps, dgam, nullptr, dg2.data(), db2.data());
    EXPECT_EQ(dg2, dg) << what << ": the weight sums are deterministic, with or without dx";
    EXPECT_EQ(db2, db) << what;
  }
}

// Sizes that are not multiples of the 32x32 tiles; pure copies, so exact.
TEST_F(CudaBackendTest, ChannelsLastMatchesReference) {
  const int n = 2, c = 37;
  const long hw = 45;
  const size_t count = size_t(n) * c * hw;
  const Vec x = random_vec(count, 160);
  Vec ry(count), rx(count);
  cpu::to_channels_last(n, c, hw, x.data(), ry.data());
  cpu::from_channels_last(n, c, hw, ry.data(), rx.data());
  float *y = dev_zero(count), *back = dev_zero(count);
  gpu_->to_channels_last(n, c, hw, dev(x), y);
  gpu_->from_channels_last(n, c, hw, y, back);
  EXPECT_EQ(host(y, count), ry);
  EXPECT_EQ(host(back, count), rx);
  EXPECT_EQ(rx, x);
}

}  // namespace
}  // namespace ht
