// The float kernels against references outside halotrain: the optimizers against their
// formulas in double and, where /usr/bin/python3 has torch, the plain-loop convolution,
// the pools, batch norm, the losses and the optimizers against PyTorch 1.13 itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/conv.hpp"
#include "kernels/cpu/loss.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/optim.hpp"
#include "kernels/cpu/pool.hpp"
#include "tests/common/kernel_checks.hpp"

namespace ht::cpu {
namespace {

using namespace ht::testing;  // tests/common/kernel_checks.hpp

// ---------------------------------------------------------------------------- optimizers

TEST(Optim, SgdMomentumThreeSteps) {
  std::mt19937_64 rng(24);
  const size_t n = 37;
  const double lr = 0.05, mu = 0.9;
  Vec w = random_float_vec(n, rng), v(n, 0.0);
  VecF wf = to_float(w), vf(n, 0.f), wf0 = wf;
  for (int step = 1; step <= 3; ++step) {
    Vec g = random_float_vec(n, rng);
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
  Vec w = random_float_vec(n, rng), m(n, 0.0), v(n, 0.0);
  VecF wf = to_float(w), mf(n, 0.f), vf(n, 0.f);
  for (int t = 1; t <= 3; ++t) {
    Vec g = random_float_vec(n, rng);
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
  o.put("conv_x", random_float_vec(cg.x_size(), rng));
  o.put("conv_w", random_float_vec(cg.w_size(), rng));
  o.put("conv_b", random_float_vec(cg.cout, rng));
  o.put("conv_dy", random_float_vec(cg.y_size(), rng));
  Vec px(2 * 3 * 7 * 8);  // small integers: many ties inside windows
  for (auto& v : px) v = double(rng() % 3) - 3;
  o.put("pool_x", px);
  o.put("pool_dy", random_float_vec(2 * 3 * 4 * 4, rng));
  o.put("bn_x", random_float_vec(3 * 4 * 30, rng));
  o.put("bn_g", random_float_vec(4, rng));
  o.put("bn_b", random_float_vec(4, rng));
  o.put("bn_dy", random_float_vec(3 * 4 * 30, rng));
  o.put("xent_z", random_float_vec(20, rng));
  o.put("xent_l", {0, 3, 1, 1, 2});
  Vec bz = random_float_vec(30, rng), bt(30);
  for (size_t i = 0; i < bz.size(); ++i) bz[i] *= 20, bt[i] = double(i % 2);
  o.put("bce_z", bz);
  o.put("bce_t", bt);
  o.put("opt_w", random_float_vec(50, rng));
  o.put("opt_g", random_float_vec(150, rng));
  ASSERT_TRUE(o.run()) << "the torch script failed";
  check_conv(o, cg);
  check_pools(o);
  check_batch_norm(o);
  check_losses(o);
  check_optimizers(o);
}

}  // namespace
}  // namespace ht::cpu
