// Every CudaBackend method against the CPU reference kernels (kernels/cpu, in double where
// the reference offers it), |gpu - ref| <= atol + rtol * |ref|. Each test skips with the
// reason when no CUDA device answers (or the build has no CUDA backend). Batch norm's
// are in kernels_gpu_cuda_norm_test.cpp, section 11's in kernels_gpu_cuda_pixel_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/cuda_backend_fixture.hpp"
#include "kernels/cpu/conv.hpp"
#include "kernels/cpu/dense.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/loss.hpp"
#include "kernels/cpu/optim.hpp"
#include "kernels/cpu/pixel.hpp"
#include "kernels/cpu/pool.hpp"
#include "kernels/cpu/resample.hpp"
#include "worker/runtime/backend.hpp"
#ifdef HALOTRAIN_HAVE_CUDA_BACKEND
#include "worker/comm/nccl_comm.hpp"
#endif

namespace ht {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the fixture and its helpers

TEST_F(CudaBackendTest, MemoryMovementAndElementwise) {
  const Vec a = random_vec(1000, 1), b = random_vec(1000, 2);
  float* da = dev(a);
  float* db = dev(b);
  EXPECT_EQ(host(da, a.size()), a);
  gpu_->add(da, db, a.size());
  Vec sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  EXPECT_EQ(host(da, a.size()), sum);
  gpu_->scale(da, 0.5f, a.size());
  for (float& x : sum) x *= 0.5f;
  EXPECT_EQ(host(da, a.size()), sum);
  gpu_->copy(db, da, a.size());
  EXPECT_EQ(host(db, a.size()), sum);
  gpu_->fill_zero(db, a.size());
  EXPECT_EQ(host(db, a.size()), Vec(a.size(), 0.f));

  float* y = dev_zero(a.size());
  float* dx = dev_zero(a.size());
  Vec ry(a.size()), rdx(a.size());
  cpu::relu_forward(a.size(), a.data(), ry.data());
  cpu::relu_backward(a.size(), ry.data(), b.data(), rdx.data());
  gpu_->relu_forward(a.size(), dev(a), y);
  gpu_->relu_backward(a.size(), y, dev(b), dx);
  EXPECT_EQ(host(y, a.size()), ry);
  EXPECT_EQ(host(dx, a.size()), rdx);

  using ht::Activation;
  for (Activation f : {Activation::LeakyReLU, Activation::Sigmoid, Activation::Tanh, Activation::ReLU6,
                       Activation::Clip, Activation::SiLU, Activation::HardSigmoid, Activation::HardSwish,
                       Activation::GELU, Activation::GELUTanh}) {
    const ht::ActivationArgs args{0.2f, 0.5f};
    cpu::activation_forward(f, args, a.size(), a.data(), ry.data());
    cpu::activation_backward(f, args, a.size(), a.data(), ry.data(), b.data(), rdx.data());
    gpu_->activation_forward(f, args, a.size(), dev(a), y);
    gpu_->activation_backward(f, args, a.size(), dev(a), y, dev(b), dx);
    const Vec gy = host(y, a.size()), gdx = host(dx, a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(gy[i], ry[i], 1e-6 + 1e-5 * std::fabs(ry[i])) << "activation " << int(f) << " y[" << i << "]";
      ASSERT_NEAR(gdx[i], rdx[i], 1e-6 + 1e-5 * std::fabs(rdx[i])) << "activation " << int(f) << " dx[" << i << "]";
    }
  }
}

TEST_F(CudaBackendTest, PackUnpackRect) {
  const int n = 2, c = 3, h = 9, w = 7, row0 = 2, col0 = 1, rows = 4, cols = 5;
  Vec x(size_t(n) * c * h * w);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);  // every cell its global index
  Vec packed(size_t(n) * c * rows * cols), ref_packed(packed.size());
  cpu::pack_rect(x.data(), n, c, h, w, row0, col0, rows, cols, ref_packed.data());
  float* dp = dev_zero(packed.size());
  gpu_->pack_rect(dev(x), n, c, h, w, row0, col0, rows, cols, dp);
  EXPECT_EQ(host(dp, packed.size()), ref_packed);

  const Vec src = random_vec(packed.size(), 3), base = random_vec(x.size(), 4);
  for (bool accumulate : {false, true}) {
    Vec ref = base;
    if (accumulate)
      cpu::unpack_add_rect(src.data(), n, c, h, w, row0, col0, rows, cols, ref.data());
    else
      cpu::unpack_rect(src.data(), n, c, h, w, row0, col0, rows, cols, ref.data());
    float* dst = dev(base);
    gpu_->unpack_rect(dev(src), n, c, h, w, row0, col0, rows, cols, dst,
                      accumulate ? ht::ComputeBackend::Unpack::Accumulate : ht::ComputeBackend::Unpack::Overwrite);
    EXPECT_EQ(host(dst, x.size()), ref) << "accumulate " << accumulate;
  }
}

// Symmetric, one-sided (a shard's border), TensorFlow `same` with stride 2 (odd pixel at
// bottom/right), dilation, 1x1, and a layer without bias.
std::vector<ConvGeom> conv_cases() {
  auto make = [](int n, int cin, int h, int w, int cout, int k, int s, int d, int t, int b, int l, int r) {
    ConvGeom g;
    g.n = n, g.cin = cin, g.hin = h, g.win = w, g.cout = cout, g.kh = k, g.kw = k;
    g.stride_h = g.stride_w = s, g.dil_h = g.dil_w = d;
    g.pad_top = t, g.pad_bottom = b, g.pad_left = l, g.pad_right = r;
    return g;
  };
  std::vector<ConvGeom> cases = {
      make(2, 3, 11, 9, 4, 3, 1, 1, 1, 1, 1, 1),  make(2, 3, 11, 9, 4, 3, 1, 1, 1, 0, 0, 1),
      make(1, 2, 12, 10, 3, 3, 2, 1, 0, 1, 0, 1), make(2, 4, 13, 10, 2, 3, 1, 2, 2, 0, 1, 2),
      make(2, 5, 7, 6, 3, 1, 1, 1, 0, 0, 0, 0),   make(1, 3, 10, 12, 5, 5, 2, 1, 2, 1, 0, 2),
  };
  ConvGeom rect = make(2, 2, 9, 8, 3, 1, 1, 1, 0, 2, 1, 0);
  rect.kh = 3, rect.kw = 2, rect.stride_h = 1, rect.stride_w = 2;
  cases.push_back(rect);
  // Depthwise (cuDNN's grouped conv; one-sided padding through the padded copy) and grouped.
  ConvGeom depthwise = make(2, 4, 11, 9, 8, 3, 2, 1, 1, 0, 1, 1);
  depthwise.groups = 4;
  ConvGeom grouped = make(1, 6, 10, 8, 4, 3, 1, 1, 1, 1, 1, 1);
  grouped.groups = 2;
  cases.insert(cases.end(), {depthwise, grouped});
  return cases;
}

TEST_F(CudaBackendTest, ConvMatchesReference) {
  int id = 0;
  for (const ConvGeom& g : conv_cases()) {
    const ConvGeom& cg = g;  // the CPU kernels share kernels/geometry.hpp
    const std::string what = "conv case " + std::to_string(id++);
    const bool with_bias = id != 5;
    const Vec x = random_vec(cg.x_size(), 10 + id), w = random_vec(cg.w_size(), 20 + id);
    const Vec b = random_vec(size_t(g.cout), 30 + id), dy = random_vec(cg.y_size(), 40 + id);
    const DVec xd = to_double(x), wd = to_double(w), bd = to_double(b), dyd = to_double(dy);
    DVec ry(cg.y_size()), rdx(cg.x_size()), rdw(cg.w_size()), rdb(size_t(g.cout));
    cpu::conv2d_forward<double>(cg, xd.data(), wd.data(), with_bias ? bd.data() : nullptr, ry.data());
    cpu::conv2d_backward_data<double>(cg, dyd.data(), wd.data(), rdx.data());
    cpu::conv2d_backward_weights<double>(cg, xd.data(), dyd.data(), rdw.data(), rdb.data());

    auto conv = gpu_->make_conv(g);
    float *dxv = dev(x), *dwv = dev(w), *dyv = dev(dy);
    float *y = dev_zero(cg.y_size()), *dx = dev_zero(cg.x_size()), *dw = dev_zero(cg.w_size()),
          *db = dev_zero(size_t(g.cout));
    conv->forward(dxv, dwv, with_bias ? dev(b) : nullptr, y);
    conv->backward_data(dyv, dwv, dx);
    conv->backward_weights(dxv, dyv, dw, db);
    expect_close(host(y, cg.y_size()), ry, 2e-4, 2e-4, what + " forward");
    expect_close(host(dx, cg.x_size()), rdx, 2e-4, 2e-4, what + " backward_data");
    expect_close(host(dw, cg.w_size()), rdw, 3e-4, 2e-4, what + " backward_weights dw");
    expect_close(host(db, size_t(g.cout)), rdb, 3e-4, 2e-4, what + " backward_weights db");

    // Same inputs, same bits: the algorithms chosen are deterministic.
    const Vec dw_first = host(dw, cg.w_size()), dx_first = host(dx, cg.x_size());
    conv->backward_weights(dxv, dyv, dw, db);
    conv->backward_data(dyv, dwv, dx);
    EXPECT_EQ(host(dw, cg.w_size()), dw_first) << what;
    EXPECT_EQ(host(dx, cg.x_size()), dx_first) << what;
  }
}

TEST_F(CudaBackendTest, ConvRejectsBadGeometry) {
  ConvGeom g;
  g.hin = 2, g.win = 2, g.kh = 5, g.kw = 5;
  EXPECT_THROW(gpu_->make_conv(g), std::invalid_argument);
}

std::vector<PoolGeom> pool_cases() {
  auto make = [](int k, int s, int t, int b, int l, int r) {
    PoolGeom g;
    g.n = 2, g.c = 3, g.hin = 11, g.win = 10, g.kh = g.kw = k, g.stride_h = g.stride_w = s;
    g.pad_top = t, g.pad_bottom = b, g.pad_left = l, g.pad_right = r;
    return g;
  };
  return {make(2, 2, 0, 0, 0, 0), make(3, 2, 1, 0, 1, 0), make(3, 1, 1, 1, 0, 1), make(2, 1, 0, 1, 1, 0),
          make(3, 3, 0, 2, 2, 0)};
}

TEST_F(CudaBackendTest, PoolingMatchesReference) {
  int id = 0;
  for (const PoolGeom& g : pool_cases()) {
    const PoolGeom& cg = g;
    const std::string what = "pool case " + std::to_string(id++);
    // Small integers make ties common: the first maximum in scan order must win on both.
    Vec x = random_vec(cg.x_size(), 50 + id, 0.f, 4.f);
    for (float& v : x) v = std::floor(v);
    const Vec dy = random_vec(cg.y_size(), 60 + id);
    Vec ry(cg.y_size()), rdx(cg.x_size());
    float *dxin = dev(x), *ddy = dev(dy), *y = dev_zero(cg.y_size()), *dx = dev_zero(cg.x_size());

    cpu::max_pool_forward(cg, x.data(), ry.data());
    cpu::max_pool_backward(cg, x.data(), dy.data(), rdx.data());
    gpu_->max_pool_forward(g, dxin, y);
    gpu_->max_pool_backward(g, dxin, ddy, dx);
    EXPECT_EQ(host(y, cg.y_size()), ry) << what << " max forward";
    expect_close(host(dx, cg.x_size()), rdx, 1e-6, 1e-6, what + " max backward");

    const Vec xs = random_vec(cg.x_size(), 70 + id);
    const DVec xsd = to_double(xs), dyd = to_double(dy);
    DVec rya(cg.y_size()), rdxa(cg.x_size());
    cpu::avg_pool_forward<double>(cg, xsd.data(), rya.data());
    cpu::avg_pool_backward<double>(cg, dyd.data(), rdxa.data());
    gpu_->avg_pool_forward(g, dev(xs), y);
    gpu_->avg_pool_backward(g, ddy, dx);
    expect_close(host(y, cg.y_size()), rya, 1e-6, 1e-5, what + " avg forward");
    expect_close(host(dx, cg.x_size()), rdxa, 1e-6, 1e-5, what + " avg backward");
  }
}

// upsampling2d (nearest, bilinear) and the shifts, on a shard's part: outputs that start
// inside the image, read from a halo-extended buffer.
TEST_F(CudaBackendTest, ResampleMatchesReference) {
  auto axis = [](int out, int o0, int in, int i0, int size, int factor, int shift) {
    ResampleAxis a;
    a.out = out, a.o0 = o0, a.in = in, a.i0 = i0, a.size = size, a.scale = float(1.0 / factor), a.shift = shift;
    return a;
  };
  struct Case {
    Resample mode;
    ResampleAxis rows, cols;
  };
  const Case cases[] = {
      {Resample::Nearest, axis(6, 6, 2, 2, 9, 3, 0), axis(10, 0, 5, 0, 5, 2, 0)},
      {Resample::Bilinear, axis(6, 8, 5, 3, 9, 2, 0), axis(15, 0, 5, 0, 5, 3, 0)},
      {Resample::Shift, axis(5, 4, 5, 2, 9, 1, 2), axis(4, 0, 7, 0, 7, 1, -3)},
  };
  int id = 0;
  for (const Case& c : cases) {
    ResampleGeom g;
    g.mode = c.mode, g.n = 2, g.c = 3, g.rows = c.rows, g.cols = c.cols;
    const std::string what = "resample case " + std::to_string(id++);
    const Vec x = random_vec(g.x_size(), 80 + id), dy = random_vec(g.y_size(), 90 + id);
    const DVec xd = to_double(x), dyd = to_double(dy);
    DVec ry(g.y_size()), rdx(g.x_size());
    cpu::resample_forward<double>(g, xd.data(), ry.data());
    cpu::resample_backward<double>(g, dyd.data(), rdx.data());
    float *y = dev_zero(g.y_size()), *dx = dev_zero(g.x_size());
    gpu_->resample_forward(g, dev(x), y);
    gpu_->resample_backward(g, dev(dy), dx);
    expect_close(host(y, g.y_size()), ry, 1e-6, 1e-5, what + " forward");
    expect_close(host(dx, g.x_size()), rdx, 1e-6, 1e-5, what + " backward");
    const Vec first = host(dx, g.x_size());
    gpu_->resample_backward(g, dev(dy), dx);
    EXPECT_EQ(host(dx, g.x_size()), first) << what << ": the gathered backward is deterministic";
  }
}

TEST_F(CudaBackendTest, DropoutMatchesReference) {
  const int n = 2, c = 3, h = 37, w = 41;
  const Vec x = random_vec(size_t(n) * c * h * w, 8);
  ht::DropoutMask m;
  m.key = ht::dropout_key(99, 2, 5);
  m.first_image = 3;
  m.row0 = 10;
  m.col0 = 7;
  m.rate = 0.4;
  m.scale = float(1 / (1 - m.rate));
  Vec ref(x.size());
  cpu::dropout_apply(m, n, c, h, w, x.data(), ref.data());
  float* y = dev_zero(x.size());
  gpu_->dropout_apply(m, n, c, h, w, dev(x), y);
  EXPECT_EQ(host(y, x.size()), ref);
}

TEST_F(CudaBackendTest, GlobalMaxPoolMatchesReference) {
  const int n = 2, c = 3;
  const int64_t hw = 1000;
  Vec x = random_vec(size_t(n) * c * hw, 7);
  x[10] = x[20] = 9.f;  // a tie in plane 0
  std::vector<double> rmax(n * c), gmax(n * c), rcount(n * c), gcount(n * c), grads(n * c, 0.5);
  cpu::global_max(n, c, hw, x.data(), rmax.data());
  gpu_->global_max(n, c, hw, dev(x), gmax.data());
  EXPECT_EQ(gmax, rmax);
  cpu::global_max_count(n, c, hw, x.data(), rmax.data(), rcount.data());
  gpu_->global_max_count(n, c, hw, dev(x), rmax.data(), gcount.data());
  EXPECT_EQ(gcount, rcount);
  EXPECT_EQ(gcount[0], 2.0);
  Vec rdx(x.size());
  cpu::global_max_backward(n, c, hw, x.data(), rmax.data(), grads.data(), rdx.data());
  float* dx = dev_zero(x.size());
  gpu_->global_max_backward(n, c, hw, dev(x), rmax.data(), grads.data(), dx);
  EXPECT_EQ(host(dx, x.size()), rdx);
}

TEST_F(CudaBackendTest, GlobalAveragePoolAndDenseMatchReference) {
  const int n = 3, c = 4;
  const long hw = 97 * 389;
  const Vec x = random_vec(size_t(n) * c * hw, 90);
  const DVec xd = to_double(x);
  DVec rsums(size_t(n) * c, 0.0), sums(size_t(n) * c, -1.0);
  cpu::global_avg_sum(n, c, hw, xd.data(), rsums.data());
  gpu_->global_avg_sum(n, c, hw, dev(x), sums.data());
  expect_close(sums, rsums, 1e-6, 1e-12, "global_avg_sum");

  const Vec gy = random_vec(size_t(n) * c, 91);
  const DVec gyd = to_double(gy);
  DVec rgx(x.size());
  cpu::global_avg_backward(n, c, hw, gyd.data(), 1.0 / double(hw), rgx.data());
  float* gx = dev_zero(x.size());
  gpu_->global_avg_backward(n, c, hw, dev(gy), 1.0 / double(hw), gx);
  expect_close(host(gx, x.size()), rgx, 1e-9, 1e-6, "global_avg_backward");

  const int in = 7, out = 5;
  const Vec dx_in = random_vec(size_t(n) * in, 92), w = random_vec(size_t(in) * out, 93),
            b = random_vec(out, 94), dy = random_vec(size_t(n) * out, 95);
  const DVec xi = to_double(dx_in), wd = to_double(w), bd = to_double(b), dyd = to_double(dy);
  for (bool bias : {true, false}) {
    DVec ry(size_t(n) * out), rdx(size_t(n) * in), rdw(w.size()), rdb(out);
    cpu::dense_forward(n, in, out, xi.data(), wd.data(), bias ? bd.data() : nullptr, ry.data());
    cpu::dense_backward(n, in, out, xi.data(), wd.data(), dyd.data(), rdx.data(), rdw.data(), rdb.data());
    float *y = dev_zero(ry.size()), *ddx = dev_zero(rdx.size()), *dw = dev_zero(w.size()),
          *db = dev_zero(out);
    float *dxv = dev(dx_in), *dwv = dev(w);
    gpu_->dense_forward(n, in, out, dxv, dwv, bias ? dev(b) : nullptr, y);
    gpu_->dense_backward(n, in, out, dxv, dwv, dev(dy), bias ? ddx : nullptr, dw, db);
    expect_close(host(y, ry.size()), ry, 1e-6, 1e-5, "dense_forward");
    if (bias) expect_close(host(ddx, rdx.size()), rdx, 1e-6, 1e-5, "dense_backward dx");
    expect_close(host(dw, w.size()), rdw, 1e-6, 1e-5, "dense_backward dw");
    expect_close(host(db, size_t(out)), rdb, 1e-6, 1e-5, "dense_backward db");
  }
}

// Unweighted, and weighted by class (and pos_weight for BCE) as SPEC section 14 says.
TEST_F(CudaBackendTest, LossesMatchReference) {
  LossWeights weighted;
  weighted.classes = 4;
  const float class_weight[4] = {0.5f, 3.f, 1.25f, 0.f};
  std::copy(class_weight, class_weight + 4, weighted.class_weight);
  weighted.pos_weight = 2.5f;
  for (const LossWeights& w : {LossWeights(), weighted}) {
    const int n = 5, k = 4;
    const Vec logits = random_vec(size_t(n) * k, 100, -20.f, 20.f);
    const std::vector<int32_t> labels = {0, 3, 1, 2, 3};
    const DVec ld = to_double(logits);
    DVec rgrad(logits.size());
    const double rloss = cpu::softmax_xent(n, k, ld.data(), labels.data(), 1.0 / n, rgrad.data(), w);
    float* grad = dev_zero(logits.size());
    float* dl = dev(logits);
    const double loss = gpu_->softmax_xent(n, k, dl, labels.data(), 1.0 / n, grad, w);
    EXPECT_NEAR(loss, rloss, 1e-6 + 1e-6 * std::fabs(rloss));
    expect_close(host(grad, logits.size()), rgrad, 1e-7, 1e-5, "softmax_xent grad");
    const std::vector<int32_t> bad = {0, 4, 1, 2, 3};
    EXPECT_THROW(gpu_->softmax_xent(n, k, dl, bad.data(), 1.0, grad, w), std::out_of_range);

    // Per pixel: [n][k][hw] with hw spanning several reduction blocks.
    {
      const int pn = 2, pk = 3;
      const int64_t hw = 40000;
      const Vec z = random_vec(size_t(pn) * pk * hw, 103, -6.f, 6.f);
      Vec classes(size_t(pn) * hw);
      for (size_t e = 0; e < classes.size(); ++e) classes[e] = float(e % 7 % pk);
      const DVec zd = to_double(z), cd = to_double(classes);
      DVec rg(z.size());
      const double scale = 1.0 / double(pn * hw);
      const double r = cpu::softmax_xent_pixels(pn, pk, hw, zd.data(), cd.data(), scale, rg.data(), w);
      float* g = dev_zero(z.size());
      const double got = gpu_->softmax_xent_pixels(pn, pk, hw, dev(z), dev(classes), scale, g, w);
      EXPECT_NEAR(got, r, 1e-9 * std::fabs(r));
      expect_close(host(g, z.size()), rg, 1e-10, 1e-5, "softmax_xent_pixels grad");
    }

    // Large |x| checks the stable forms; count spans several reduction blocks.
    const size_t count = 70001;
    Vec x = random_vec(count, 101, -8.f, 8.f), t = random_vec(count, 102, 0.f, 1.f);
    x[0] = 60.f, x[1] = -60.f, t[0] = 0.f, t[1] = 1.f;
    for (size_t i = 2; i < count; i += 3) t[i] = std::round(t[i]);
    const DVec xd = to_double(x), td = to_double(t);
    DVec rg(count);
    const double scale = 1.0 / double(count);
    float* g = dev_zero(count);
    float *dxv = dev(x), *dt = dev(t);
    double r = cpu::sigmoid_bce(count, xd.data(), td.data(), scale, rg.data(), w);
    double got = gpu_->sigmoid_bce(count, dxv, dt, scale, g, w);
    EXPECT_NEAR(got, r, 1e-9 * std::fabs(r));
    expect_close(host(g, count), rg, 1e-10, 1e-5, "sigmoid_bce grad");
    EXPECT_NEAR(gpu_->sigmoid_bce(count, dxv, dt, scale, nullptr, w), r, 1e-9 * std::fabs(r));
    if (w.classes) continue;  // mse takes no weights

    r = cpu::mse(count, xd.data(), td.data(), scale, rg.data());
    got = gpu_->mse(count, dxv, dt, scale, g);
    EXPECT_NEAR(got, r, 1e-9 * std::fabs(r));
    expect_close(host(g, count), rg, 1e-10, 1e-5, "mse grad");
  }
}

TEST_F(CudaBackendTest, OptimizersMatchReference) {
  const size_t n = 4099;
  const Vec w0 = random_vec(n, 110);
  for (float momentum : {0.9f, 0.0f}) {
    Vec w = w0, v(n, 0.f);
    float* dw = dev(w0);
    float* dv = momentum != 0.f ? dev(v) : nullptr;
    for (int step = 0; step < 3; ++step) {
      const Vec g = random_vec(n, 111 + step);
      cpu::sgd_step(n, w.data(), g.data(), momentum != 0.f ? v.data() : nullptr, 0.01f, momentum);
      gpu_->sgd_step(n, dw, dev(g), dv, 0.01f, momentum);
    }
    expect_close(host(dw, n), w, 1e-6, 1e-5, "sgd momentum " + std::to_string(momentum));
  }
  Vec w = w0, m(n, 0.f), v(n, 0.f);
  float *dw = dev(w0), *dm = dev(m), *dv = dev(v);
  for (int64_t step = 1; step <= 5; ++step) {
    const Vec g = random_vec(n, 120 + unsigned(step), -1e-3f, 1e-3f);
    cpu::adam_step(n, w.data(), g.data(), m.data(), v.data(), 1e-3f, 0.9f, 0.999f, 1e-7f, step);
    gpu_->adam_step(n, dw, dev(g), dm, dv, 1e-3f, 0.9f, 0.999f, 1e-7f, step);
  }
  expect_close(host(dw, n), w, 1e-6, 1e-5, "adam w");
  expect_close(host(dm, n), m, 1e-9, 1e-5, "adam m");
  expect_close(host(dv, n), v, 1e-13, 1e-5, "adam v");
  EXPECT_THROW(gpu_->adam_step(n, dw, dw, dm, dv, 1e-3f, 0.9f, 0.999f, 1e-7f, 0), std::invalid_argument);
}

TEST_F(CudaBackendTest, AllocatorCountsAndEnforcesBudget) {
  BackendOptions o;
  o.kind = Backend::CUDA;
  o.memory_budget = 8 << 20;
  auto small = make_cuda_backend(o);
  Allocator& a = small->allocator();
  void* p = a.allocate(4 << 20, "first");
  EXPECT_EQ(a.in_use(), uint64_t(4) << 20);
  EXPECT_THROW(a.allocate(5 << 20, "second"), DeviceMemoryError);
  a.deallocate(p, 4 << 20);
  EXPECT_EQ(a.in_use(), 0u);
  EXPECT_EQ(a.peak(), uint64_t(4) << 20);
  EXPECT_NE(small->device_name().find("cuda:0"), std::string::npos) << small->device_name();
  o.device_index = 1 << 20;
  EXPECT_THROW(make_cuda_backend(o), std::runtime_error);
}

#ifdef HALOTRAIN_HAVE_CUDA_BACKEND
// One GPU allows only a one-rank communicator; the multi-rank paths are the MPI tests'.
TEST_F(CudaBackendTest, NcclCommOneRank) {
  for (int round = 0; round < 2; ++round) {  // destroy and create again, as a recycle does
    cuda::NcclComm comm(cuda::NcclComm::make_unique_id(), 0, 1, 0, &gpu_->allocator());
    EXPECT_EQ(comm.rank(), 0);
    EXPECT_EQ(comm.size(), 1);
    const Vec g = random_vec(3000, 130);
    float* dg = dev(g);
    comm.allreduce_sum(dg, g.size());
    EXPECT_EQ(host(dg, g.size()), g);
    DVec h = {1.5, -2.25, 3.0};
    comm.allreduce_sum_host(h.data(), h.size());
    EXPECT_EQ(h, (DVec{1.5, -2.25, 3.0}));

    float* out = dev_zero(1000);
    comm.exchange({{0, dg, 1000}, {0, dg + 1000, 0}}, {{0, out, 1000}});
    EXPECT_EQ(host(out, 1000), Vec(g.begin(), g.begin() + 1000));
    char text[16] = "broadcast";
    comm.broadcast_host(text, sizeof text, 0);
    EXPECT_STREQ(text, "broadcast");
    comm.barrier();
    auto sub = comm.split(0);
    EXPECT_EQ(sub->size(), 1);
    sub->barrier();
  }
}
#endif

}  // namespace
}  // namespace ht
