#include "worker/layers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "orchestrator/layer_kind.hpp"

namespace ht {

Layer::Layer(const LayerContext& ctx, int index) : ctx_(ctx), index_(index) {}

std::string Layer::label() const { return fmt::format("layer {} (rank {})", spec().config.name, ctx_.rank); }

Tensor Layer::make_output(int n, int c, const Rect& rect, const std::string& what) {
  return Tensor(ctx_.backend.allocator(), n, c, rect.rows.size(), rect.cols.size(),
                what + " of " + label());
}

float* Layer::weight(const std::string& name) {
  const ParamRef* r = ctx_.params.find(index_, name);
  return r ? ctx_.params.value(*r) : nullptr;
}

float* Layer::weight_grad(const std::string& name) {
  const ParamRef* r = ctx_.params.find(index_, name);
  return r ? ctx_.params.grad(*r) : nullptr;
}

namespace {

void check_shape(const Tensor& t, int n, int c, int h, int w, const char* what, const std::string& layer) {
  if (t.n() != n || t.c() != c || t.h() != h || t.w() != w)
    throw std::logic_error(fmt::format("{}: {} is [{}, {}, {}, {}], the plan says [{}, {}, {}, {}]", layer,
                                       what, t.n(), t.c(), t.h(), t.w(), n, c, h, w));
}

}  // namespace

Tensor Layer::forward(const LayerInputs& xs, ForwardMode mode) {
  if (xs.size() != spec().inputs.size())
    throw std::logic_error(fmt::format("{}: {} inputs given, the model says {}", label(), xs.size(),
                                       spec().inputs.size()));
  // The inputs of a join share their shard (shard_plan.cpp lines them up).
  const Rect in = spec().spatial ? ctx_.plan.owned_input(index_, ctx_.rank) : Rect{{0, 1}, {0, 1}};
  const int n = mode == ForwardMode::Eval ? std::max(xs[0]->n(), 1) : ctx_.local_batch;
  for (size_t k = 0; k < xs.size(); ++k)
    check_shape(*xs[k], n, spec().ins[k].c, in.rows.size(), in.cols.size(), "input", label());
  return forward_inputs(xs, mode);
}

std::vector<Tensor> Layer::backward(const LayerInputs& xs, const Tensor& y, const Tensor& dy,
                                    const std::vector<bool>& need_dx) {
  check_shape(dy, y.n(), y.c(), y.h(), y.w(), "output gradient", label());
  if (need_dx.size() != xs.size()) throw std::logic_error(label() + ": one need_dx per input expected");
  return backward_inputs(xs, y, dy, need_dx);
}

namespace {

// Conv and pools: gather the halo, run the kernel on the extended input, keep it for backward.
class WindowedLayer : public Layer {
 public:
  WindowedLayer(const LayerContext& ctx, int index)
      : Layer(ctx, index), halo_(ctx.plan, index, ctx.rank, ctx.world, ctx.backend) {
    const LayerPlan& lp = ctx.plan.layers[index];
    const int iy = ctx.plan.grid_row_of(ctx.rank), ix = ctx.plan.grid_col_of(ctx.rank);
    pad_top_ = lp.rows.pad_lo[iy];
    pad_bottom_ = lp.rows.pad_hi[iy];
    pad_left_ = lp.cols.pad_lo[ix];
    pad_right_ = lp.cols.pad_hi[ix];
    out_rect_ = ctx.plan.owned_output(index, ctx.rank);
  }
  void release_saved() override { ext_.release(); }

 protected:
  // Under keep the extended input waits for backward when the backward reads it (the
  // kind's WindowUse); otherwise it is dropped after forward and gathered again for
  // backward, by every rank alike (orchestrator's StepReplay follows the same traits).
  bool keeps_ext() const {
    return policy() == ActivationPolicy::Keep && spec().kind().traits.backward_window != WindowUse::None;
  }
  const Tensor& regather(const Tensor& x) {
    if (keeps_ext()) return kernel_input(x);
    return gather(x);
  }
  // The kernel's input: the extended tensor, or x itself when this rank needs no halo
  // (its neighbours may still read from it).
  const Tensor& gather(const Tensor& x) {
    if (halo_.in_place()) {
      halo_.gather_in_place(x);
      return x;
    }
    ext_ = halo_.gather(x, "halo-extended input of " + label());
    return ext_;
  }
  const Tensor& kernel_input(const Tensor& x) const { return halo_.in_place() ? x : ext_; }
  Tensor make_dext(const Tensor& x) {
    const Rect& need = halo_.needed();
    return Tensor(ctx_.backend.allocator(), x.n(), x.c(), need.rows.size(), need.cols.size(),
                  "input gradient of " + label());
  }
  Tensor finish_dx(Tensor dext) {
    if (halo_.in_place()) {
      halo_.scatter_add_in_place(dext);
      return dext;
    }
    return halo_.scatter_add(std::move(dext), "input gradient of " + label());
  }

  // The window's kernel, strides and this shard's padding, into a ConvGeom or PoolGeom.
  template <class Geom>
  void set_window(Geom& g) const {
    const LayerSpec& s = spec();
    g.kh = s.rows.kernel;
    g.kw = s.cols.kernel;
    g.stride_h = s.rows.stride;
    g.stride_w = s.cols.stride;
    g.pad_top = pad_top_;
    g.pad_bottom = pad_bottom_;
    g.pad_left = pad_left_;
    g.pad_right = pad_right_;
  }

  HaloExchange halo_;
  Tensor ext_;
  Rect out_rect_;
  int pad_top_, pad_bottom_, pad_left_, pad_right_;
};

// conv2d, and depthwise_conv2d: a grouped conv with one group per input channel, whose
// weight is "depthwise_kernel:0".
class Conv2DLayer : public WindowedLayer {
 public:
  Conv2DLayer(const LayerContext& ctx, int index, bool depthwise = false)
      : WindowedLayer(ctx, index), depthwise_(depthwise), kernel_name_(depthwise ? "depthwise_kernel:0" : "kernel:0") {}

 protected:
  // The window's conv; a depthwise one makes in.c() * depth_multiplier channels.
  ConvGeom geom(const Tensor& in) const {
    const LayerSpec& s = spec();
    ConvGeom g;
    g.n = in.n();
    g.cin = in.c();
    g.hin = in.h();
    g.win = in.w();
    g.cout = depthwise_ ? in.c() * s.config.integer("depth_multiplier") : s.out.c;
    g.groups = depthwise_ ? in.c() : 1;
    set_window(g);
    g.dil_h = s.rows.dilation;
    g.dil_w = s.cols.dilation;
    return g;
  }
  struct SizedKernel {
    std::unique_ptr<ConvKernel> kernel;
    int batch = 0;
  };
  // One kernel per batch size: training and inference may take different batches.
  ConvKernel& kernel(const ConvGeom& g, SizedKernel& train, SizedKernel& other) {
    SizedKernel& k = g.n == ctx_.local_batch ? train : other;
    if (!k.kernel || k.batch != g.n) k = {ctx_.backend.make_conv(g), g.n};
    return *k.kernel;
  }
  ConvKernel& kernel(const ConvGeom& g) { return kernel(g, train_conv_, other_conv_); }
  void check_output(const ConvGeom& g, const Tensor& y) const {
    if (g.hout() != y.h() || g.wout() != y.w())
      throw std::logic_error(fmt::format("{}: kernel output {}x{} != planned {}x{}", label(), g.hout(),
                                         g.wout(), y.h(), y.w()));
  }
  Tensor forward_impl(const Tensor& x, ForwardMode mode) override {
    const Tensor& in = gather(x);
    const ConvGeom g = geom(in);
    Tensor y = make_output(x.n(), spec().out.c, out_rect_, "output");
    check_output(g, y);
    kernel(g).forward(in.data(), weight(kernel_name_), weight("bias:0"), y.data());
    if (!keeps_ext() || mode == ForwardMode::Eval) ext_.release();
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    const Tensor& in = regather(x);
    ConvKernel& k = kernel(geom(in));
    k.backward_weights(in.data(), dy.data(), weight_grad(kernel_name_), weight_grad("bias:0"));
    ext_.release();  // backward_data needs only dy: free the extended input first
    Tensor dx;
    if (need_dx) {
      Tensor dext = make_dext(x);
      k.backward_data(dy.data(), weight(kernel_name_), dext.data());
      dx = finish_dx(std::move(dext));
    }
    return dx;
  }

  bool depthwise_;
  const char* kernel_name_;
  SizedKernel train_conv_, other_conv_;  // the training batch's, and inference's
};

// separable_conv2d: the depthwise conv (no bias) into an inner tensor of the output's
// size, then a 1x1 conv with the bias. The inner tensor lives only inside forward, and
// backward makes it again from the extended input (LayerSpec::inner_channels; the memory
// model's replay does the same).
class SeparableConvLayer : public Conv2DLayer {
 public:
  SeparableConvLayer(const LayerContext& ctx, int index) : Conv2DLayer(ctx, index, /*depthwise=*/true) {}

 protected:
  ConvGeom pointwise_geom(const Tensor& inner) const {
    ConvGeom g;
    g.n = inner.n();
    g.cin = inner.c();
    g.hin = inner.h();
    g.win = inner.w();
    g.cout = spec().out.c;
    return g;
  }
  ConvKernel& pointwise(const ConvGeom& g) { return kernel(g, train_pointwise_, other_pointwise_); }
  Tensor depthwise_part(const Tensor& in) {
    const ConvGeom g = geom(in);
    Tensor inner = make_output(in.n(), g.cout, out_rect_, "depthwise output");
    check_output(g, inner);
    kernel(g).forward(in.data(), weight("depthwise_kernel:0"), nullptr, inner.data());
    return inner;
  }
  Tensor forward_impl(const Tensor& x, ForwardMode mode) override {
    const Tensor& in = gather(x);
    Tensor inner = depthwise_part(in);
    Tensor y = make_output(x.n(), spec().out.c, out_rect_, "output");
    pointwise(pointwise_geom(inner)).forward(inner.data(), weight("pointwise_kernel:0"), weight("bias:0"), y.data());
    inner.release();
    if (!keeps_ext() || mode == ForwardMode::Eval) ext_.release();
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    const Tensor& in = regather(x);
    Tensor inner = depthwise_part(in);
    ConvKernel& p = pointwise(pointwise_geom(inner));
    p.backward_weights(inner.data(), dy.data(), weight_grad("pointwise_kernel:0"), weight_grad("bias:0"));
    Tensor dinner = make_output(x.n(), inner.c(), out_rect_, "depthwise output gradient");
    p.backward_data(dy.data(), weight("pointwise_kernel:0"), dinner.data());
    inner.release();
    ConvKernel& d = kernel(geom(in));
    d.backward_weights(in.data(), dinner.data(), weight_grad("depthwise_kernel:0"), nullptr);
    ext_.release();
    Tensor dx;
    if (need_dx) {
      Tensor dext = make_dext(x);
      d.backward_data(dinner.data(), weight("depthwise_kernel:0"), dext.data());
      dinner.release();
      dx = finish_dx(std::move(dext));
    }
    return dx;
  }

 private:
  SizedKernel train_pointwise_, other_pointwise_;
};

// conv2d_transpose: the data gradient of the conv that maps its output to its input,
// cropped to this shard's output rows and cols by that conv's padding (the plan's crops).
class TransposeConvLayer : public Conv2DLayer {
 public:
  using Conv2DLayer::Conv2DLayer;

 protected:
  ConvGeom transposed_geom(int n) const {
    const LayerSpec& s = spec();
    ConvGeom g;
    g.n = n;
    g.cin = s.out.c;
    g.hin = out_rect_.rows.size();
    g.win = out_rect_.cols.size();
    g.cout = s.in.c;
    set_window(g);
    return g;
  }
  Tensor forward_impl(const Tensor& x, ForwardMode mode) override {
    const Tensor& in = gather(x);
    const ConvGeom g = transposed_geom(x.n());
    if (g.hout() != in.h() || g.wout() != in.w())
      throw std::logic_error(fmt::format("{}: transposed conv reads {}x{} inputs, the plan gathered {}x{}", label(),
                                         g.hout(), g.wout(), in.h(), in.w()));
    Tensor y = make_output(x.n(), spec().out.c, out_rect_, "output");
    kernel(g).backward_data(in.data(), weight("kernel:0"), y.data());
    if (const float* b = weight("bias:0")) ctx_.backend.add_channel_bias(y.n(), y.c(), int64_t(y.h()) * y.w(), b, y.data());
    if (!keeps_ext() || mode == ForwardMode::Eval) ext_.release();
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    const Tensor& in = regather(x);
    ConvKernel& k = kernel(transposed_geom(x.n()));
    k.backward_weights(dy.data(), in.data(), weight_grad("kernel:0"), nullptr);
    if (float* db = weight_grad("bias:0")) {
      std::vector<double> sums(size_t(dy.c()));
      ctx_.backend.channel_sum(dy.n(), dy.c(), int64_t(dy.h()) * dy.w(), dy.data(), sums.data());
      const std::vector<float> grad(sums.begin(), sums.end());
      ctx_.backend.from_host(db, grad.data(), grad.size() * sizeof(float));
    }
    ext_.release();
    Tensor dx;
    if (need_dx) {
      Tensor dext = make_dext(x);
      k.forward(dy.data(), weight("kernel:0"), nullptr, dext.data());
      dx = finish_dx(std::move(dext));
    }
    return dx;
  }
};

// upsampling2d, zero_padding2d, cropping2d: by image coordinates (kernels/geometry.hpp's
// ResampleGeom) over the halo-extended input; nothing is kept for backward.
class ResampleLayer : public WindowedLayer {
 public:
  using WindowedLayer::WindowedLayer;

 protected:
  ResampleGeom geom(int n) const {
    const LayerSpec& s = spec();
    const Rect& need = halo_.needed();
    ResampleGeom g;
    g.mode = s.rows.kind == WindowKind::Bilinear ? Resample::Bilinear
             : s.rows.kind == WindowKind::Nearest ? Resample::Nearest
                                                   : Resample::Shift;
    g.n = n;
    g.c = s.in.c;
    auto axis = [](const Window1D& w, const Range& out, const Range& in) {
      ResampleAxis a;
      a.out = out.size();
      a.o0 = out.lo;
      a.in = in.size();
      a.i0 = in.lo;
      a.size = w.in;
      a.factor = w.stride;
      a.shift = w.pad_lo;
      return a;
    };
    g.rows = axis(s.rows, out_rect_.rows, need.rows);
    g.cols = axis(s.cols, out_rect_.cols, need.cols);
    return g;
  }
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    const Tensor& in = gather(x);
    Tensor y = make_output(x.n(), spec().out.c, out_rect_, "output");
    ctx_.backend.resample_forward(geom(x.n()), in.data(), y.data());
    ext_.release();
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    if (!need_dx) return Tensor();
    Tensor dext = make_dext(x);
    ctx_.backend.resample_backward(geom(x.n()), dy.data(), dext.data());
    return finish_dx(std::move(dext));
  }
};

enum class PoolOp { Max, Average };

class PoolLayer : public WindowedLayer {
 public:
  PoolLayer(const LayerContext& ctx, int index, PoolOp op) : WindowedLayer(ctx, index), op_(op) {}

 protected:
  bool is_max() const { return op_ == PoolOp::Max; }
  PoolGeom geom(const Tensor& in) const {
    PoolGeom g;
    g.n = in.n();
    g.c = in.c();
    g.hin = in.h();
    g.win = in.w();
    set_window(g);
    return g;
  }
  Tensor forward_impl(const Tensor& x, ForwardMode mode) override {
    const Tensor& in = gather(x);
    const PoolGeom g = geom(in);
    Tensor y = make_output(x.n(), spec().out.c, out_rect_, "output");
    if (is_max())
      ctx_.backend.max_pool_forward(g, in.data(), y.data());
    else
      ctx_.backend.avg_pool_forward(g, in.data(), y.data());
    // Average pooling's backward needs only shapes (keeps_ext is false); inference nothing.
    if (!keeps_ext() || mode == ForwardMode::Eval) ext_.release();
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (need_dx) {
      const Tensor* in = is_max() ? &regather(x) : nullptr;
      Tensor dext = make_dext(x);
      const PoolGeom g = geom(dext);
      if (is_max())
        ctx_.backend.max_pool_backward(g, in->data(), dy.data(), dext.data());
      else
        ctx_.backend.avg_pool_backward(g, dy.data(), dext.data());
      ext_.release();
      dx = finish_dx(std::move(dext));
    }
    ext_.release();
    return dx;
  }

 private:
  PoolOp op_;
};

// Statistics over the batch and all shards, as BatchNorm2d in training mode; moving
// averages as Keras.
class BatchNormLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  Tensor forward_impl(const Tensor& x, ForwardMode mode) override {
    if (mode == ForwardMode::Eval) return forward_inference(x);
    const int c = x.c();
    const int64_t hw = int64_t(x.h()) * x.w();
    const double count = double(ctx_.global_batch) * spec().in.h * spec().in.w;
    mean_.assign(c, 0.0);
    invstd_.assign(c, 0.0);
    std::vector<double> sq(c, 0.0);
    ctx_.backend.channel_sum(x.n(), c, hw, x.data(), mean_.data());
    ctx_.world.allreduce_sum_host(mean_.data(), c);
    for (double& m : mean_) m /= count;
    // Two passes (mean, then squared deviations) keep the variance exact in any sharding.
    ctx_.backend.channel_sq_dev_sum(x.n(), c, hw, x.data(), mean_.data(), sq.data());
    ctx_.world.allreduce_sum_host(sq.data(), c);
    const double eps = spec().config.number("epsilon");
    for (int i = 0; i < c; ++i) invstd_[i] = 1.0 / std::sqrt(sq[i] / count + eps);
    if (mode == ForwardMode::Train) update_moving_statistics(sq, count);
    Tensor y = Tensor(ctx_.backend.allocator(), x.n(), c, x.h(), x.w(), "output of " + label());
    ctx_.backend.bn_forward_apply(x.n(), c, hw, x.data(), mean_.data(), invstd_.data(), weight("gamma:0"),
                                  weight("beta:0"), y.data());
    return y;
  }
  // Keras's inference: the moving statistics normalise; nothing is kept or updated.
  Tensor forward_inference(const Tensor& x) {
    const int c = x.c();
    std::vector<float> mm(c), mv(c);
    ctx_.backend.to_host(mm.data(), ctx_.params.value(*ctx_.params.find(index_, "moving_mean:0")), c * sizeof(float));
    ctx_.backend.to_host(mv.data(), ctx_.params.value(*ctx_.params.find(index_, "moving_variance:0")),
                         c * sizeof(float));
    std::vector<double> mean(c), invstd(c);
    for (int i = 0; i < c; ++i) {
      mean[i] = mm[i];
      invstd[i] = 1.0 / std::sqrt(double(mv[i]) + spec().config.number("epsilon"));
    }
    Tensor y = Tensor(ctx_.backend.allocator(), x.n(), c, x.h(), x.w(), "output of " + label());
    ctx_.backend.bn_forward_apply(x.n(), c, int64_t(x.h()) * x.w(), x.data(), mean.data(), invstd.data(),
                                  weight("gamma:0"), weight("beta:0"), y.data());
    return y;
  }
  void update_moving_statistics(const std::vector<double>& sq, double count) {
    const int c = int(sq.size());
    const double momentum = spec().config.number("momentum");
    std::vector<float> mm(c), mv(c);
    const ParamRef* rm = ctx_.params.find(index_, "moving_mean:0");
    const ParamRef* rv = ctx_.params.find(index_, "moving_variance:0");
    ctx_.backend.to_host(mm.data(), ctx_.params.value(*rm), c * sizeof(float));
    ctx_.backend.to_host(mv.data(), ctx_.params.value(*rv), c * sizeof(float));
    for (int i = 0; i < c; ++i) {
      const double unbiased = count > 1 ? sq[i] / (count - 1) : sq[i] / count;
      mm[i] = float(momentum * mm[i] + (1 - momentum) * mean_[i]);
      mv[i] = float(momentum * mv[i] + (1 - momentum) * unbiased);
    }
    ctx_.backend.from_host(ctx_.params.value(*rm), mm.data(), c * sizeof(float));
    ctx_.backend.from_host(ctx_.params.value(*rv), mv.data(), c * sizeof(float));
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    const int c = x.c();
    const int64_t hw = int64_t(x.h()) * x.w();
    std::vector<double> sums(2 * size_t(c), 0.0);
    ctx_.backend.bn_backward_sums(x.n(), c, hw, dy.data(), x.data(), mean_.data(), invstd_.data(),
                                  sums.data(), sums.data() + c);
    // This shard's share of dgamma/dbeta; the step's gradient all-reduce sums the shards.
    std::vector<float> dbeta(sums.begin(), sums.begin() + c), dgamma(sums.begin() + c, sums.end());
    if (float* g = weight_grad("gamma:0")) ctx_.backend.from_host(g, dgamma.data(), c * sizeof(float));
    if (float* b = weight_grad("beta:0")) ctx_.backend.from_host(b, dbeta.data(), c * sizeof(float));
    Tensor dx;
    if (need_dx) {
      ctx_.world.allreduce_sum_host(sums.data(), sums.size());
      const double count = double(ctx_.global_batch) * spec().in.h * spec().in.w;
      dx = Tensor(ctx_.backend.allocator(), x.n(), c, x.h(), x.w(), "input gradient of " + label());
      ctx_.backend.bn_backward_apply(x.n(), c, hw, dy.data(), x.data(), mean_.data(), invstd_.data(),
                                     weight("gamma:0"), sums.data(), sums.data() + c, count, dx.data());
    }
    return dx;
  }

 private:
  std::vector<double> mean_, invstd_;
};

class ReLULayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    Tensor y(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "output of " + label());
    ctx_.backend.relu_forward(x.size(), x.data(), y.data());
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor& y, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (!need_dx) return dx;
    dx = Tensor(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "input gradient of " + label());
    ctx_.backend.relu_backward(y.size(), y.data(), dy.data(), dx.data());
    return dx;
  }
};

// leaky_relu, sigmoid, tanh: y = f(x); the backward reads y.
class ActivationLayer : public Layer {
 public:
  ActivationLayer(const LayerContext& ctx, int index, Activation f)
      : Layer(ctx, index), f_(f), alpha_(f == Activation::LeakyReLU ? float(spec().config.number("alpha")) : 0.f) {}

 protected:
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    Tensor y(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "output of " + label());
    ctx_.backend.activation_forward(f_, alpha_, x.size(), x.data(), y.data());
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor& y, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (!need_dx) return dx;
    dx = Tensor(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "input gradient of " + label());
    ctx_.backend.activation_backward(f_, alpha_, y.size(), y.data(), dy.data(), dx.data());
    return dx;
  }

 private:
  Activation f_;
  float alpha_;
};

// Mean over the whole image: partial sums from every shard of the sample group.
class GlobalAvgPoolLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  double pixels() const { return double(spec().in.h) * spec().in.w; }
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    std::vector<double> sums(size_t(x.n()) * x.c(), 0.0);
    ctx_.backend.global_avg_sum(x.n(), x.c(), int64_t(x.h()) * x.w(), x.data(), sums.data());
    ctx_.group.allreduce_sum_host(sums.data(), sums.size());
    std::vector<float> mean(sums.size());
    for (size_t i = 0; i < sums.size(); ++i) mean[i] = float(sums[i] / pixels());
    Tensor y(ctx_.backend.allocator(), x.n(), x.c(), 1, 1, "output of " + label());
    ctx_.backend.from_host(y.data(), mean.data(), mean.size() * sizeof(float));
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (!need_dx) return dx;
    dx = Tensor(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "input gradient of " + label());
    ctx_.backend.global_avg_backward(x.n(), x.c(), int64_t(x.h()) * x.w(), dy.data(), 1.0 / pixels(),
                                     dx.data());
    return dx;
  }
};

// Training only: the elements kernels/dropout.hpp's mask drops are zero, the rest scaled by
// 1 / (1 - rate); inference is the identity. The backward applies the same mask, made
// again from the step's position rather than kept.
class DropoutLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  DropoutMask mask() const {
    const StepPosition& at = *ctx_.position;
    const double rate = spec().config.number("rate");
    const Rect r = spec().spatial ? ctx_.plan.owned_input(index_, ctx_.rank) : Rect{{0, 1}, {0, 1}};
    DropoutMask m;
    m.key = dropout_key(at.seed, index_, at.step);
    m.first_image = at.first_image;
    m.row0 = r.rows.lo;
    m.col0 = r.cols.lo;
    m.rate = rate;
    m.scale = float(1.0 / (1.0 - rate));
    return m;
  }
  Tensor apply(const Tensor& x, const std::string& what) {
    Tensor y(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), what + " of " + label());
    ctx_.backend.dropout_apply(mask(), x.n(), x.c(), x.h(), x.w(), x.data(), y.data());
    return y;
  }
  Tensor forward_impl(const Tensor& x, ForwardMode mode) override {
    if (mode == ForwardMode::Eval || !ctx_.position) {
      Tensor y(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "output of " + label());
      ctx_.backend.copy(y.data(), x.data(), x.size());
      return y;
    }
    return apply(x, "output");
  }
  Tensor backward_impl(const Tensor&, const Tensor&, const Tensor& dy, bool need_dx) override {
    return need_dx ? apply(dy, "input gradient") : Tensor();
  }
};

// Max over the whole image: every shard's maxima are gathered over the sample group (each
// writes its slot of a zeroed array that is then summed), and the gradient goes to every
// element equal to the global max, shared among the ties of all shards.
class GlobalMaxPoolLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    const size_t planes = size_t(x.n()) * x.c();
    const int64_t hw = int64_t(x.h()) * x.w();
    const int shards = ctx_.group.size(), me = ctx_.group.rank();
    std::vector<double> mine(planes), all(planes * size_t(shards), 0.0);
    ctx_.backend.global_max(x.n(), x.c(), hw, x.data(), mine.data());
    std::copy(mine.begin(), mine.end(), all.begin() + size_t(me) * planes);
    ctx_.group.allreduce_sum_host(all.data(), all.size());
    max_.assign(planes, -std::numeric_limits<double>::infinity());
    for (int s = 0; s < shards; ++s)
      for (size_t p = 0; p < planes; ++p) max_[p] = std::max(max_[p], all[size_t(s) * planes + p]);
    ties_.assign(planes, 0.0);
    ctx_.backend.global_max_count(x.n(), x.c(), hw, x.data(), max_.data(), ties_.data());
    ctx_.group.allreduce_sum_host(ties_.data(), ties_.size());
    std::vector<float> out(max_.begin(), max_.end());
    Tensor y(ctx_.backend.allocator(), x.n(), x.c(), 1, 1, "output of " + label());
    ctx_.backend.from_host(y.data(), out.data(), out.size() * sizeof(float));
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (!need_dx) return dx;
    std::vector<float> g(max_.size());
    ctx_.backend.to_host(g.data(), dy.data(), g.size() * sizeof(float));
    std::vector<double> grads(g.size());
    for (size_t p = 0; p < g.size(); ++p) grads[p] = double(g[p]) / std::max(ties_[p], 1.0);
    dx = Tensor(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "input gradient of " + label());
    ctx_.backend.global_max_backward(x.n(), x.c(), int64_t(x.h()) * x.w(), x.data(), max_.data(), grads.data(),
                                     dx.data());
    return dx;
  }

 private:
  std::vector<double> max_, ties_;  // per (image, channel), over the whole image
};

// Replicated on every shard of a group (its input is the all-reduced global pool); only
// the group leader contributes its weight gradient, so the all-reduce counts it once.
class DenseLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    Tensor y(ctx_.backend.allocator(), x.n(), spec().out.c, 1, 1, "output of " + label());
    ctx_.backend.dense_forward(x.n(), x.c(), y.c(), x.data(), weight("kernel:0"), weight("bias:0"), y.data());
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor& y, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (need_dx) dx = Tensor(ctx_.backend.allocator(), x.n(), x.c(), 1, 1, "input gradient of " + label());
    float* dw = weight_grad("kernel:0");
    float* db = weight_grad("bias:0");
    ctx_.backend.dense_backward(x.n(), x.c(), y.c(), x.data(), weight("kernel:0"), dy.data(),
                                need_dx ? dx.data() : nullptr, dw, db);
    if (!ctx_.group_leader()) {
      ctx_.backend.fill_zero(dw, size_t(x.c()) * y.c());
      if (db) ctx_.backend.fill_zero(db, size_t(y.c()));
    }
    return dx;
  }
};

// Several inputs of one shard, pointwise: the halo of a reader is gathered by that reader.
class JoinLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  Tensor forward_impl(const Tensor&, ForwardMode) override { throw std::logic_error(label() + " joins inputs"); }
  Tensor backward_impl(const Tensor&, const Tensor&, const Tensor&, bool) override {
    throw std::logic_error(label() + " joins inputs");
  }
  Tensor like(const Tensor& x, int channels, const std::string& what) {
    return Tensor(ctx_.backend.allocator(), x.n(), channels, x.h(), x.w(), what + " of " + label());
  }
};

// The sum of the inputs, in their order; each input's gradient is the output's.
class AddLayer : public JoinLayer {
 public:
  using JoinLayer::JoinLayer;

 protected:
  Tensor forward_inputs(const LayerInputs& xs, ForwardMode) override {
    Tensor y = like(*xs[0], xs[0]->c(), "output");
    ctx_.backend.copy(y.data(), xs[0]->data(), y.size());
    for (size_t k = 1; k < xs.size(); ++k) ctx_.backend.add(y.data(), xs[k]->data(), y.size());
    return y;
  }
  std::vector<Tensor> backward_inputs(const LayerInputs& xs, const Tensor&, const Tensor& dy,
                                      const std::vector<bool>& need_dx) override {
    std::vector<Tensor> dx(xs.size());
    for (size_t k = 0; k < xs.size(); ++k) {
      if (!need_dx[k]) continue;
      dx[k] = like(dy, dy.c(), "input gradient");
      ctx_.backend.copy(dx[k].data(), dy.data(), dy.size());
    }
    return dx;
  }
};

// The inputs' channels one after the other: per image, each input is one block of the output.
class ConcatenateLayer : public JoinLayer {
 public:
  using JoinLayer::JoinLayer;

 protected:
  Tensor forward_inputs(const LayerInputs& xs, ForwardMode) override {
    Tensor y = like(*xs[0], spec().out.c, "output");
    for_each_block(y, [&](size_t k, size_t at_whole, size_t at_part, size_t n) {
      ctx_.backend.copy(y.data() + at_whole, xs[k]->data() + at_part, n);
    });
    return y;
  }
  std::vector<Tensor> backward_inputs(const LayerInputs& xs, const Tensor&, const Tensor& dy,
                                      const std::vector<bool>& need_dx) override {
    std::vector<Tensor> dx(xs.size());
    for (size_t k = 0; k < xs.size(); ++k)
      if (need_dx[k]) dx[k] = like(*xs[k], xs[k]->c(), "input gradient");
    for_each_block(dy, [&](size_t k, size_t at_whole, size_t at_part, size_t n) {
      if (need_dx[k]) ctx_.backend.copy(dx[k].data() + at_part, dy.data() + at_whole, n);
    });
    return dx;
  }

 private:
  // copy(input k, offset in the whole, offset in input k, floats) for each image's block of
  // each input.
  template <class Copy>
  void for_each_block(const Tensor& whole, Copy copy) const {
    const size_t plane = size_t(whole.h()) * whole.w(), image = size_t(whole.c()) * plane;
    size_t offset = 0;
    for (size_t k = 0; k < spec().ins.size(); ++k) {
      const size_t block = size_t(spec().ins[k].c) * plane;
      for (size_t b = 0; b < size_t(whole.n()); ++b) copy(k, b * image + offset, b * block, block);
      offset += block;
    }
  }
};

template <class L>
LayerFactory factory() {
  return [](const LayerContext& ctx, int index) -> std::unique_ptr<Layer> { return std::make_unique<L>(ctx, index); };
}

LayerFactory activation_factory(Activation f) {
  return [f](const LayerContext& ctx, int index) -> std::unique_ptr<Layer> {
    return std::make_unique<ActivationLayer>(ctx, index, f);
  };
}

LayerFactory pool_factory(PoolOp op) {
  return [op](const LayerContext& ctx, int index) -> std::unique_ptr<Layer> {
    return std::make_unique<PoolLayer>(ctx, index, op);
  };
}

std::map<std::string, LayerFactory>& kernels() {
  static std::map<std::string, LayerFactory> table = {
      {"conv2d", factory<Conv2DLayer>()},
      {"batch_norm", factory<BatchNormLayer>()},
      {"relu", factory<ReLULayer>()},
      {"max_pool2d", pool_factory(PoolOp::Max)},
      {"avg_pool2d", pool_factory(PoolOp::Average)},
      {"global_avg_pool", factory<GlobalAvgPoolLayer>()},
      {"dense", factory<DenseLayer>()},
      {"leaky_relu", activation_factory(Activation::LeakyReLU)},
      {"sigmoid", activation_factory(Activation::Sigmoid)},
      {"tanh", activation_factory(Activation::Tanh)},
      {"global_max_pool", factory<GlobalMaxPoolLayer>()},
      {"dropout", factory<DropoutLayer>()},
      {"add", factory<AddLayer>()},
      {"depthwise_conv2d",
       [](const LayerContext& ctx, int index) -> std::unique_ptr<Layer> {
         return std::make_unique<Conv2DLayer>(ctx, index, /*depthwise=*/true);
       }},
      {"separable_conv2d", factory<SeparableConvLayer>()},
      {"conv2d_transpose", factory<TransposeConvLayer>()},
      {"upsampling2d", factory<ResampleLayer>()},
      {"zero_padding2d", factory<ResampleLayer>()},
      {"cropping2d", factory<ResampleLayer>()},
      {"concatenate", factory<ConcatenateLayer>()},
  };
  return table;
}

}  // namespace

void register_layer_kernels(const std::string& type, LayerFactory factory) {
  if (!kernels().emplace(type, std::move(factory)).second)
    throw std::logic_error("layer kind '" + type + "' has kernels registered twice");
}

std::unique_ptr<Layer> make_layer(const LayerContext& ctx, int index) {
  const std::string& type = ctx.plan.model.layers[index].config.type();
  auto it = kernels().find(type);
  if (it == kernels().end())
    throw std::logic_error("layer kind '" + type + "' has no kernels registered (worker/layers.hpp)");
  return it->second(ctx, index);
}

Tensor forward_inference(const std::vector<std::unique_ptr<Layer>>& layers, Tensor x) {
  if (layers.empty()) return x;
  const ModelSpec& m = layers[0]->model();
  std::vector<Tensor> acts(layers.size() + 1);
  acts[0] = std::move(x);
  for (size_t l = 0; l < layers.size(); ++l) {
    acts[l + 1] = layers[l]->forward(inputs_of(m, int(l), acts), ForwardMode::Eval);
    for (int t : m.layers[l].inputs)
      if (m.last_reader(t) == int(l)) acts[t].release();
  }
  return std::move(acts.back());
}

LayerInputs inputs_of(const ModelSpec& model, int layer, const std::vector<Tensor>& tensors) {
  LayerInputs xs;
  for (int t : model.layers[layer].inputs) xs.push_back(&tensors[t]);
  return xs;
}

}  // namespace ht
