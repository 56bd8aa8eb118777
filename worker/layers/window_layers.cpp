// The layers that read a window of their input, halo included: convolutions (plain,
// depthwise, separable, transposed), pools, and the layers that read by image coordinates
// (upsampling, zero padding, cropping).
#include "worker/layers/window_layers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "orchestrator/layer_kind.hpp"

namespace ht {

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
  void release_kept() override { ext_.release(); }

 protected:
  // Under keep the extended input waits for backward when the backward reads it (the
  // kind's WindowUse); otherwise it is dropped after forward and gathered again for
  // backward, by every rank alike (the step schedule follows the same traits).
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
  // The extended input's gradient, for a batch of dy's. Backward never reads x's sizes: x is
  // gone where the extended input was kept in its place (step_schedule.hpp reads_extended_only).
  Tensor make_dext(const Tensor& dy) {
    const Rect& need = halo_.needed();
    return Tensor(ctx_.backend.allocator(), dy.n(), spec().in.c, need.rows.size(), need.cols.size(),
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
    g.groups = depthwise_ ? in.c() : s.config.integer("groups");
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
    if (mode != ForwardMode::Eval && statistics_wanted()) {
      // The batch norm's channel_moments of y, with the same bits, summed where the kernel
      // can as it writes y: the batch norm need not read y for them.
      ChannelMoments m{std::vector<double>(size_t(g.cout)), std::vector<double>(size_t(g.cout))};
      if (kernel(g).forward_with_moments(in.data(), weight(kernel_name_), weight("bias:0"), y.data(), m.mean.data(),
                                         m.m2.data()))
        y.set_moments(std::move(m));
    } else {
      kernel(g).forward(in.data(), weight(kernel_name_), weight("bias:0"), y.data());
    }
    if (!keeps_ext() || mode == ForwardMode::Eval) ext_.release();
    return y;
  }

 public:
  // Conv + ReLU or ReLU6 (orchestrator/step_schedule.hpp conv_heads_chains): the
  // activation's output, the ReLU in the kernel's pass where it can; the conv's own output
  // is never made.
  Tensor forward_chain(const Tensor& x, int tail, ForwardMode mode) override {
    if (mode == ForwardMode::Eval) throw std::logic_error(label() + ": a fused chain is for training");
    check_chain_input(x);
    const Tensor& in = gather(x);
    const ConvGeom g = geom(in);
    Tensor y(ctx_.backend.allocator(), x.n(), spec().out.c, out_rect_.rows.size(), out_rect_.cols.size(),
             fmt::format("output of {} (rank {})", model().layers[size_t(tail)].config.name, ctx_.rank));
    check_output(g, y);
    if (chain_ends_in_relu6(tail)) {
      kernel(g).forward(in.data(), weight(kernel_name_), weight("bias:0"), y.data());
      ctx_.backend.activation_forward(Activation::ReLU6, {}, y.size(), y.data(), y.data());
    } else if (!kernel(g).forward_relu(in.data(), weight(kernel_name_), weight("bias:0"), y.data())) {
      ctx_.backend.relu_forward(y.size(), y.data(), y.data());
    }
    if (!keeps_ext()) ext_.release();
    return y;
  }
  // The activation's backward over dy (its gradient passes where 0 < y, or 0 < y < 6: y
  // stands for the conv's output), y freed, then the conv's.
  Tensor backward_chain(Tensor& x, Tensor& y, Tensor dy, int tail, bool need_dx, bool) override {
    if (y.size() != dy.size() || dy.c() != spec().out.c)
      throw std::logic_error(label() + ": the fused chain's output or its gradient does not match its forward");
    if (chain_ends_in_relu6(tail))
      ctx_.backend.activation_backward(Activation::ReLU6, {}, y.size(), y.data(), y.data(), dy.data(), dy.data());
    else
      ctx_.backend.relu_backward(y.size(), y.data(), dy.data(), dy.data());
    y.release();
    return backward_impl(x, Tensor(), dy, need_dx);
  }

 protected:
  // Whether a training batch norm reads this layer's output as its shard's tile, taking its
  // statistics from it (not frozen: a frozen one normalises with its moving statistics).
  bool statistics_wanted() const {
    for (int r : model().readers[size_t(index_) + 1]) {
      const LayerSpec& reader = model().layers[size_t(r)];
      if (reader.config.type() == "batch_norm" && reader.config.trainable && !ctx_.plan.layers[size_t(r)].gathers &&
          !(ctx_.frozen && !ctx_.frozen->empty() && (*ctx_.frozen)[size_t(r)]))
        return true;
    }
    return false;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    const Tensor& in = regather(x);
    float* dw = weight_grad(kernel_name_);
    Tensor dext;
    kernel(geom(in)).backward(in.data(), dy.data(), weight(kernel_name_), dw, dw ? weight_grad("bias:0") : nullptr,
                              [&]() -> float* {
                                ext_.release();  // the data gradient needs only dy: free the extended input first
                                if (!need_dx) return nullptr;
                                dext = make_dext(dy);
                                return dext.data();
                              });
    return need_dx ? finish_dx(std::move(dext)) : Tensor();
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
    if (float* dw = weight_grad("pointwise_kernel:0"))
      p.backward_weights(inner.data(), dy.data(), dw, weight_grad("bias:0"));
    Tensor dinner = make_output(dy.n(), inner.c(), out_rect_, "depthwise output gradient");
    p.backward_data(dy.data(), weight("pointwise_kernel:0"), dinner.data());
    inner.release();
    ConvKernel& d = kernel(geom(in));
    if (float* dw = weight_grad("depthwise_kernel:0")) d.backward_weights(in.data(), dinner.data(), dw, nullptr);
    ext_.release();
    Tensor dx;
    if (need_dx) {
      Tensor dext = make_dext(dy);
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
    ConvKernel& k = kernel(transposed_geom(dy.n()));
    if (float* dw = weight_grad("kernel:0")) k.backward_weights(dy.data(), in.data(), dw, nullptr);
    if (float* db = weight_grad("bias:0")) {
      std::vector<double> sums(size_t(dy.c()));
      ctx_.backend.channel_sum(dy.n(), dy.c(), int64_t(dy.h()) * dy.w(), dy.data(), sums.data());
      const std::vector<float> grad(sums.begin(), sums.end());
      ctx_.backend.from_host(db, grad.data(), grad.size() * sizeof(float));
    }
    ext_.release();
    Tensor dx;
    if (need_dx) {
      Tensor dext = make_dext(dy);
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
      a.scale = w.scale;
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
    Tensor dext = make_dext(dy);
    ctx_.backend.resample_backward(geom(dy.n()), dy.data(), dext.data());
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
    if (!is_max() && spec().config.flag("count_include_pad")) {  // the declared padding, not ceil mode's overhang
      g.count_top = pad_top_;
      g.count_bottom = std::max(0, pad_bottom_ - spec().rows.ceil_extra);
      g.count_left = pad_left_;
      g.count_right = std::max(0, pad_right_ - spec().cols.ceil_extra);
    }
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
      Tensor dext = make_dext(dy);
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

}  // namespace

std::map<std::string, LayerFactory> window_layer_kernels() {
  return {{"conv2d", layer_factory<Conv2DLayer>()},
          {"depthwise_conv2d", layer_factory<Conv2DLayer>(/*depthwise=*/true)},
          {"separable_conv2d", layer_factory<SeparableConvLayer>()},
          {"conv2d_transpose", layer_factory<TransposeConvLayer>()},
          {"max_pool2d", layer_factory<PoolLayer>(PoolOp::Max)},
          {"avg_pool2d", layer_factory<PoolLayer>(PoolOp::Average)},
          {"upsampling2d", layer_factory<ResampleLayer>()},
          {"resize", layer_factory<ResampleLayer>()},
          {"zero_padding2d", layer_factory<ResampleLayer>()},
          {"cropping2d", layer_factory<ResampleLayer>()}};
}

}  // namespace ht
