// The pointwise kinds of SPEC section 11 (the layers of current models): products of maps
// and channel vectors, layer norm, layer scale, stochastic depth, flatten and channel
// permutations. A replicated input's gradient is summed over the group, gathered inputs
// are gathered and weight gradients of replicated layers counted once by Layer itself.
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "orchestrator/layer_kind.hpp"
#include "worker/layers/window_layers.hpp"

namespace ht {

namespace {

// Layers of one input whose output has the input's shape unless they say otherwise.
class PixelLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  Tensor like(const Tensor& x, int channels, const std::string& what) {
    return Tensor(ctx_.backend.allocator(), x.n(), channels, x.h(), x.w(), what + " of " + label());
  }
  // Weight gradient `name` from per-channel sums on the host.
  void set_weight_grad(const char* name, const std::vector<double>& sums) {
    float* g = weight_grad(name);
    if (!g) return;
    const std::vector<float> values(sums.begin(), sums.end());
    ctx_.backend.from_host(g, values.data(), values.size() * sizeof(float));
  }
  static int64_t plane(const Tensor& x) { return int64_t(x.h()) * x.w(); }
};

// multiply: a * b of one shape, or a feature map times a channel vector standing for its
// value at every pixel (squeeze-excitation's gate). The vector's gradient is the sum over
// the map of dy * map (summed over the group by Layer when the map is split).
class MultiplyLayer : public PixelLayer {
 public:
  using PixelLayer::PixelLayer;

 protected:
  Tensor forward_impl(const Tensor&, ForwardMode) override { throw std::logic_error(label() + " has two inputs"); }
  Tensor backward_impl(const Tensor&, const Tensor&, const Tensor&, bool) override {
    throw std::logic_error(label() + " has two inputs");
  }
  bool broadcast() const { return spec().ins_spatial[0] != spec().ins_spatial[1]; }
  size_t map_index() const { return spec().ins_spatial[0] ? 0 : 1; }

  Tensor forward_inputs(const LayerInputs& xs, ForwardMode) override {
    const size_t m = map_index();
    const Tensor &a = *xs[m], &b = *xs[1 - m];
    Tensor y = like(a, a.c(), "output");
    if (broadcast())
      ctx_.backend.multiply_planes(a.n(), a.c(), plane(a), a.data(), b.data(), PlaneFactor::PerPlane, y.data());
    else
      ctx_.backend.multiply(y.size(), a.data(), b.data(), y.data());
    return y;
  }
  std::vector<Tensor> backward_inputs(const LayerInputs& xs, const Tensor&, const Tensor& dy,
                                      const std::vector<bool>& need_dx) override {
    std::vector<Tensor> dx(2);
    const size_t m = map_index(), v = 1 - m;
    const Tensor &a = *xs[m], &b = *xs[v];
    if (!broadcast()) {
      for (size_t k = 0; k < 2; ++k) {
        if (!need_dx[k]) continue;
        dx[k] = like(dy, dy.c(), "input gradient");
        ctx_.backend.multiply(dy.size(), dy.data(), xs[1 - k]->data(), dx[k].data());
      }
      return dx;
    }
    // In input order, as the step schedule allocates them.
    for (size_t k = 0; k < 2; ++k) {
      if (!need_dx[k]) continue;
      if (k == m) {
        dx[m] = like(a, a.c(), "input gradient");
        ctx_.backend.multiply_planes(a.n(), a.c(), plane(a), dy.data(), b.data(), PlaneFactor::PerPlane,
                                     dx[m].data());
        continue;
      }
      std::vector<double> sums(size_t(a.n()) * a.c());
      ctx_.backend.plane_dot(a.n(), a.c(), plane(a), dy.data(), a.data(), sums.data());
      const std::vector<float> values(sums.begin(), sums.end());
      dx[v] = like(b, b.c(), "input gradient");
      ctx_.backend.from_host(dx[v].data(), values.data(), values.size() * sizeof(float));
    }
    return dx;
  }
};

// layer_norm over the channels of each pixel; dgamma and dbeta are this shard's share.
class LayerNormLayer : public PixelLayer {
 public:
  using PixelLayer::PixelLayer;

 protected:
  double eps() const { return spec().config.number("epsilon"); }
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    Tensor y = like(x, x.c(), "output");
    ctx_.backend.layer_norm_forward(x.n(), x.c(), plane(x), x.data(), eps(), weight("gamma:0"), weight("beta:0"),
                                    y.data());
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (need_dx) dx = like(x, x.c(), "input gradient");
    std::vector<double> dgamma(size_t(x.c())), dbeta(size_t(x.c()));
    ctx_.backend.layer_norm_backward(x.n(), x.c(), plane(x), x.data(), dy.data(), eps(), weight("gamma:0"),
                                     need_dx ? dx.data() : nullptr, dgamma.data(), dbeta.data());
    set_weight_grad("gamma:0", dgamma);
    set_weight_grad("beta:0", dbeta);
    return dx;
  }
};

// scale: x * gamma[c] (layer scale).
class ScaleLayer : public PixelLayer {
 public:
  using PixelLayer::PixelLayer;

 protected:
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    Tensor y = like(x, x.c(), "output");
    ctx_.backend.multiply_planes(x.n(), x.c(), plane(x), x.data(), weight("gamma:0"), PlaneFactor::PerChannel,
                                 y.data());
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    std::vector<double> planes(size_t(x.n()) * x.c()), dgamma(size_t(x.c()), 0.0);
    ctx_.backend.plane_dot(x.n(), x.c(), plane(x), dy.data(), x.data(), planes.data());
    for (size_t p = 0; p < planes.size(); ++p) dgamma[p % dgamma.size()] += planes[p];
    set_weight_grad("gamma:0", dgamma);
    Tensor dx;
    if (!need_dx) return dx;
    dx = like(x, x.c(), "input gradient");
    ctx_.backend.multiply_planes(x.n(), x.c(), plane(x), dy.data(), weight("gamma:0"), PlaneFactor::PerChannel,
                                 dx.data());
    return dx;
  }
};

// drop_path (stochastic depth): while training, each image kept whole and scaled by
// 1 / (1 - rate) or dropped whole (kernels/dropout.hpp's drop_path_keeps, a function of the
// seed, layer, step and the image's batch position); the identity otherwise.
class DropPathLayer : public PixelLayer {
 public:
  using PixelLayer::PixelLayer;

 protected:
  std::vector<double> factors(int n) const {
    const StepPosition& at = *ctx_.position;
    const double rate = spec().config.number("rate"), keep_scale = double(float(1.0 / (1.0 - rate)));
    const uint64_t key = dropout_key(at.seed, index_, at.step);
    std::vector<double> f(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) f[size_t(i)] = drop_path_keeps(key, at.first_image + i, rate) ? keep_scale : 0.0;
    return f;
  }
  Tensor apply(const Tensor& x, const std::string& what) {
    Tensor y = like(x, x.c(), what);
    ctx_.backend.scale_images(x.n(), int64_t(x.c()) * plane(x), x.data(), factors(x.n()).data(), y.data());
    return y;
  }
  Tensor forward_impl(const Tensor& x, ForwardMode mode) override {
    if (mode == ForwardMode::Eval || !ctx_.position) {
      Tensor y = like(x, x.c(), "output");
      ctx_.backend.copy(y.data(), x.data(), x.size());
      return y;
    }
    return apply(x, "output");
  }
  Tensor backward_impl(const Tensor&, const Tensor&, const Tensor& dy, bool need_dx) override {
    return need_dx ? apply(dy, "input gradient") : Tensor();
  }
  void backward_over(const Tensor&, const Tensor&, Tensor& dy) override {
    ctx_.backend.scale_images(dy.n(), int64_t(dy.c()) * plane(dy), dy.data(), factors(dy.n()).data(), dy.data());
  }
};

// flatten: the gathered map as a channel vector in Keras's (h, w, c) order.
class FlattenLayer : public PixelLayer {
 public:
  using PixelLayer::PixelLayer;

 protected:
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    Tensor y(ctx_.backend.allocator(), x.n(), int(x.size() / size_t(x.n())), 1, 1, "output of " + label());
    ctx_.backend.to_channels_last(x.n(), x.c(), plane(x), x.data(), y.data());
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (!need_dx) return dx;
    dx = like(x, x.c(), "input gradient");
    ctx_.backend.from_channels_last(x.n(), x.c(), plane(x), dy.data(), dx.data());
    return dx;
  }
};

// channel_shuffle and channel_slice: output channel o of an image is input channel
// source(o); the backward copies each plane back (a slice's other channels get zeros).
class ChannelMapLayer : public PixelLayer {
 public:
  using PixelLayer::PixelLayer;

 protected:
  int source(int o) const {
    const LayerConfig& c = spec().config;
    if (c.type() == "channel_slice") return c.integer("start") + o;
    const int groups = c.integer("groups"), per = spec().in.c / groups;
    return (o % groups) * per + o / groups;  // output j * g + i reads input i * C/g + j
  }
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    Tensor y = like(x, spec().out.c, "output");
    each_plane(y.n(), y.c(), [&](int i, int o) {
      ctx_.backend.copy(y.data() + at(i, o, y), x.data() + at(i, source(o), x), size_t(plane(x)));
    });
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (!need_dx) return dx;
    dx = like(x, x.c(), "input gradient");
    if (dy.c() != x.c()) ctx_.backend.fill_zero(dx.data(), dx.size());
    each_plane(dy.n(), dy.c(), [&](int i, int o) {
      ctx_.backend.copy(dx.data() + at(i, source(o), dx), dy.data() + at(i, o, dy), size_t(plane(x)));
    });
    return dx;
  }

 private:
  static size_t at(int image, int channel, const Tensor& t) {
    return (size_t(image) * t.c() + size_t(channel)) * size_t(plane(t));
  }
  template <class F>
  static void each_plane(int n, int c, F f) {
    for (int i = 0; i < n; ++i)
      for (int o = 0; o < c; ++o) f(i, o);
  }
};

// instance_norm and group_norm: statistics per image and group of channels over the whole
// image (the shards of its sample group), two passes: the mean from the summed plane sums,
// then the variance from the summed squared deviations from it (exact for large means, as
// raw 16-bit pixels). No moving statistics: training and inference compute the same.
class ImageNormLayer : public PixelLayer {
 public:
  using PixelLayer::PixelLayer;

 protected:
  int groups() const {
    return spec().config.type() == "group_norm" ? spec().config.integer("groups") : spec().in.c;
  }
  double count() const { return double(spec().in.c / groups()) * spec().in.h * spec().in.w; }
  // Plane values summed into their groups [n * groups], in channel order.
  std::vector<double> group_sums(int n, const std::vector<double>& planes) const {
    const int c = spec().in.c, g = groups(), per = c / g;
    std::vector<double> out(size_t(n) * g, 0.0);
    for (size_t p = 0; p < planes.size(); ++p) out[p / c * g + p % c / per] += planes[p];
    return out;
  }
  size_t group_of(size_t plane) const {
    const int c = spec().in.c;
    return plane / c * groups() + plane % c / (c / groups());
  }
  std::vector<float> host_weight(const char* name, int c) {
    std::vector<float> v(size_t(c), name[0] == 'g' ? 1.f : 0.f);
    if (const float* w = weight(name)) ctx_.backend.to_host(v.data(), w, v.size() * sizeof(float));
    return v;
  }

  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    const int n = x.n(), c = x.c();
    const size_t planes = size_t(n) * c;
    std::vector<double> sums(planes);
    ctx_.backend.global_avg_sum(n, c, plane(x), x.data(), sums.data());
    std::vector<double> mean = group_sums(n, sums);
    sum_over_image(mean.data(), mean.size());
    for (double& m : mean) m /= count();
    plane_mean_.resize(planes);
    for (size_t p = 0; p < planes; ++p) plane_mean_[p] = mean[group_of(p)];
    ctx_.backend.plane_sq_dev_sum(n, c, plane(x), x.data(), plane_mean_.data(), sums.data());
    invstd_ = group_sums(n, sums);
    sum_over_image(invstd_.data(), invstd_.size());
    const double eps = spec().config.number("epsilon");
    for (double& v : invstd_) v = 1.0 / std::sqrt(v / count() + eps);
    const std::vector<float> gamma = host_weight("gamma:0", c), beta = host_weight("beta:0", c);
    std::vector<double> scale(planes), shift(planes);
    for (size_t p = 0; p < planes; ++p) {
      scale[p] = invstd_[group_of(p)] * double(gamma[p % c]);
      shift[p] = beta[p % c];
    }
    Tensor y = like(x, c, "output");
    ctx_.backend.plane_affine(n, c, plane(x), x.data(), plane_mean_.data(), scale.data(), shift.data(), y.data());
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (need_dx) dx = like(x, x.c(), "input gradient");
    gradients(x, dy, need_dx ? dx.data() : nullptr);
    return dx;
  }
  void backward_over(const Tensor& x, const Tensor&, Tensor& dy) override { gradients(x, dy, dy.data()); }
  // The weight gradients, and the input gradient into dx unless it is null. dx may be dy:
  // the sums read dy before the last pass writes dx, element by element.
  void gradients(const Tensor& x, const Tensor& dy, float* dx) {
    const int n = x.n(), c = x.c();
    const size_t planes = size_t(n) * c;
    std::vector<double> s1(planes), s2(planes);  // per plane: sum dy, sum dy * (x - mean)
    ctx_.backend.plane_backward_sums(n, c, plane(x), dy.data(), x.data(), plane_mean_.data(), s1.data(), s2.data());
    std::vector<double> dgamma(size_t(c), 0.0), dbeta(size_t(c), 0.0);
    for (size_t p = 0; p < planes; ++p) {
      dgamma[p % c] += invstd_[group_of(p)] * s2[p];
      dbeta[p % c] += s1[p];
    }
    set_weight_grad("gamma:0", dgamma);
    set_weight_grad("beta:0", dbeta);
    if (!dx) return;
    // dx = invstd (g - mean(g) - xhat mean(g xhat)), g = dy * gamma, over each group.
    const std::vector<float> gamma = host_weight("gamma:0", c);
    std::vector<double> a(planes), b(planes);
    for (size_t p = 0; p < planes; ++p) {
      a[p] = double(gamma[p % c]) * s1[p];
      b[p] = double(gamma[p % c]) * s2[p];
    }
    std::vector<double> ga = group_sums(n, a), gb = group_sums(n, b);
    sum_over_image(ga.data(), ga.size());
    sum_over_image(gb.data(), gb.size());
    std::vector<double> k(planes);
    for (size_t p = 0; p < planes; ++p) {
      const double is = invstd_[group_of(p)];
      k[p] = double(gamma[p % c]) * is;
      a[p] = -is * is * is * gb[group_of(p)] / count();
      b[p] = -is * ga[group_of(p)] / count();
    }
    ctx_.backend.plane_backward_apply(n, c, plane(x), dy.data(), x.data(), plane_mean_.data(), k.data(), a.data(),
                                      b.data(), dx);
  }

 private:
  std::vector<double> plane_mean_, invstd_;  // per plane, per (image, group)
};

}  // namespace

std::map<std::string, LayerFactory> pixel_layer_kernels() {
  return {{"multiply", layer_factory<MultiplyLayer>()},         {"layer_norm", layer_factory<LayerNormLayer>()},
          {"scale", layer_factory<ScaleLayer>()},               {"drop_path", layer_factory<DropPathLayer>()},
          {"flatten", layer_factory<FlattenLayer>()},           {"channel_shuffle", layer_factory<ChannelMapLayer>()},
          {"channel_slice", layer_factory<ChannelMapLayer>()}, {"instance_norm", layer_factory<ImageNormLayer>()},
          {"group_norm", layer_factory<ImageNormLayer>()}};
}

}  // namespace ht
