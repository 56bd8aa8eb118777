#include "worker/layers/layers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "orchestrator/layer_kind.hpp"
#include "orchestrator/step_schedule.hpp"

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
  return r && r->trainable && !frozen() ? ctx_.params.grad(*r) : nullptr;
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
  const int n = mode == ForwardMode::Eval ? std::max(xs[0]->n(), 1) : ctx_.local_batch;
  for (size_t k = 0; k < xs.size(); ++k) {
    const Rect in = ctx_.plan.owned_tensor(spec().inputs[k], ctx_.rank);
    check_shape(*xs[k], n, spec().ins[k].c, in.rows.size(), in.cols.size(), "input", label());
  }
  if (!ctx_.plan.layers[index_].gathers) return forward_inputs(xs, mode);
  Tensor y = forward_inputs(gather_inputs(xs), mode);
  if (mode == ForwardMode::Eval) gathered_.clear();
  return y;
}

std::vector<Tensor> Layer::backward(const LayerInputs& xs, const Tensor& y, const Tensor& dy,
                                    const std::vector<bool>& need_dx) {
  check_output(y, dy);
  if (need_dx.size() != xs.size()) throw std::logic_error(label() + ": one need_dx per input expected");
  std::vector<Tensor> dx;
  if (ctx_.plan.layers[index_].gathers) {
    LayerInputs whole = xs;
    for (size_t k = 0, g = 0; k < xs.size(); ++k)
      if (!input_replicated(k)) whole[k] = &gathered_.at(g++);
    dx = backward_inputs(whole, y, dy, need_dx);
    crop_to_owned(dx);
    gathered_.clear();
  } else {
    dx = backward_inputs(xs, y, dy, need_dx);
    // A replicated input read by every shard: its gradient is the sum of theirs.
    if (!replicated())
      for (size_t k = 0; k < dx.size(); ++k)
        if (input_replicated(k) && !dx[k].empty())
          collective([&] { ctx_.group.allreduce_sum(dx[k].data(), dx[k].size()); });
  }
  // Every shard of a group computed the same weight gradients: they count once.
  if (replicated() && !ctx_.group_leader()) zero_weight_gradients();
  return dx;
}

void Layer::check_output(const Tensor& y, const Tensor& dy) const {
  // y is gone where no backward reads it (step_schedule.hpp read_by_backward).
  if (y.empty() && !spec().kind().traits.backward_reads_output) return;
  check_shape(dy, y.n(), y.c(), y.h(), y.w(), "output gradient", label());
}

Tensor Layer::backward_in_place(const Tensor& x, const Tensor& y, Tensor dy) {
  check_output(y, dy);
  // x is gone where the backward does not read it (LayerTraits::backward_reads_inputs).
  if (spec().kind().traits.backward_reads_inputs) check_shape(x, dy.n(), dy.c(), dy.h(), dy.w(), "input", label());
  if (!::ht::backward_in_place(ctx_.plan, index_))
    throw std::logic_error(label() + ": its input gradient cannot take the output gradient's memory");
  backward_over(x, y, dy);
  // As backward: a replicated input's gradient is the sum of every shard's, and every
  // shard of a group computed the same weight gradients.
  if (!replicated() && input_replicated())
    collective([&] { ctx_.group.allreduce_sum(dy.data(), dy.size()); });
  if (replicated() && !ctx_.group_leader()) zero_weight_gradients();
  return dy;
}

void Layer::backward_over(const Tensor&, const Tensor&, Tensor&) {
  throw std::logic_error(label() + ": its kind writes no input gradient over the output gradient");
}

Tensor Layer::forward_chain(const Tensor&, int, ForwardMode) {
  throw std::logic_error(label() + ": its kind heads no fused chain");
}

void Layer::check_chain_input(const Tensor& x) const {
  const Rect in = ctx_.plan.owned_input(index_, ctx_.rank);
  if (x.n() != ctx_.local_batch || x.c() != spec().in.c || x.h() != in.rows.size() || x.w() != in.cols.size())
    throw std::logic_error(label() + ": the fused chain's input is not the plan's");
}

Tensor Layer::backward_chain(Tensor&, Tensor&, Tensor, int, bool, bool) {
  throw std::logic_error(label() + ": its kind heads no fused chain");
}

void Layer::release_saved() {
  gathered_.clear();
  release_kept();
}

LayerInputs Layer::gather_inputs(const LayerInputs& xs) {
  gathered_.clear();
  gathered_.reserve(xs.size());
  LayerInputs whole = xs;
  for (size_t k = 0; k < xs.size(); ++k) {
    if (input_replicated(k)) continue;
    const Tensor& x = *xs[k];
    const Shape3& s = spec().ins[k];
    const Rect own = ctx_.plan.owned_tensor(spec().inputs[k], ctx_.rank);
    Tensor& g = gathered_.emplace_back(ctx_.backend.allocator(), x.n(), s.c, s.h, s.w, "gathered input of " + label());
    // Each shard writes its part into zeros and the group sums them: x + 0 is exact.
    ctx_.backend.fill_zero(g.data(), g.size());
    ctx_.backend.unpack_rect(x.data(), x.n(), s.c, s.h, s.w, own.rows.lo, own.cols.lo, own.rows.size(),
                             own.cols.size(), g.data(), ComputeBackend::Unpack::Overwrite);
    collective([&] { ctx_.group.allreduce_sum(g.data(), g.size()); });
    whole[k] = &g;
  }
  return whole;
}

void Layer::crop_to_owned(std::vector<Tensor>& dx) {
  for (size_t k = 0; k < dx.size(); ++k) {
    if (dx[k].empty() || input_replicated(k)) continue;
    const Rect own = ctx_.plan.owned_tensor(spec().inputs[k], ctx_.rank);
    Tensor part(ctx_.backend.allocator(), dx[k].n(), dx[k].c(), own.rows.size(), own.cols.size(),
                "input gradient of " + label());
    ctx_.backend.pack_rect(dx[k].data(), dx[k].n(), dx[k].c(), dx[k].h(), dx[k].w(), own.rows.lo, own.cols.lo,
                           own.rows.size(), own.cols.size(), part.data());
    dx[k] = std::move(part);
  }
}

void Layer::zero_weight_gradients() {
  for (const ParamRef& r : ctx_.params.refs())
    if (r.layer == index_ && r.trainable) ctx_.backend.fill_zero(ctx_.params.grad(r), r.count);
}

void Layer::sum_over_image(double* values, size_t count) {
  if (!input_replicated()) collective([&] { ctx_.group.allreduce_sum_host(values, count); });
}

void Layer::sum_over_batch(double* values, size_t count) {
  if (input_replicated() && !ctx_.group_leader()) std::fill(values, values + count, 0.0);
  collective([&] { ctx_.world.allreduce_sum_host(values, count); });
}

namespace {

class ReLULayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    Tensor y(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "output of " + label());
    ctx_.backend.relu_forward(x.size(), x.data(), y.data());
    return y;
  }
  Tensor backward_impl(const Tensor&, const Tensor& y, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (!need_dx) return dx;
    dx = Tensor(ctx_.backend.allocator(), y.n(), y.c(), y.h(), y.w(), "input gradient of " + label());
    ctx_.backend.relu_backward(y.size(), y.data(), dy.data(), dx.data());
    return dx;
  }
  void backward_over(const Tensor&, const Tensor& y, Tensor& dy) override {
    ctx_.backend.relu_backward(y.size(), y.data(), dy.data(), dy.data());
  }
};

// The activations of kernels/activation.hpp: y = f(x); the backward reads x or y
// (gradient_reads), the other one may be gone.
class ActivationLayer : public Layer {
 public:
  ActivationLayer(const LayerContext& ctx, int index, Activation f) : Layer(ctx, index), f_(f) {
    const LayerConfig& c = spec().config;
    switch (f) {
      case Activation::LeakyReLU: args_.alpha = float(c.number("alpha")); break;
      case Activation::Clip: args_ = {float(c.number("min")), float(c.number("max"))}; break;
      case Activation::HardSigmoid: args_ = {float(c.number("alpha")), float(c.number("beta"))}; break;
      default: break;
    }
  }

 protected:
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    Tensor y(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "output of " + label());
    ctx_.backend.activation_forward(f_, args_, x.size(), x.data(), y.data());
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor& y, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (!need_dx) return dx;
    dx = Tensor(ctx_.backend.allocator(), dy.n(), dy.c(), dy.h(), dy.w(), "input gradient of " + label());
    ctx_.backend.activation_backward(f_, args_, dy.size(), read(x, y), read(y, x), dy.data(), dx.data());
    return dx;
  }
  void backward_over(const Tensor& x, const Tensor& y, Tensor& dy) override {
    ctx_.backend.activation_backward(f_, args_, dy.size(), read(x, y), read(y, x), dy.data(), dy.data());
  }
  // The tensor the gradient reads, or where it is gone the other one, which it does not read.
  static const float* read(const Tensor& t, const Tensor& other) {
    if (t.empty() && other.empty()) throw std::logic_error("an activation's backward without its input or output");
    return t.empty() ? other.data() : t.data();
  }

 private:
  Activation f_;
  ActivationArgs args_;
};

// gelu's form is a key of the kind.
LayerFactory gelu_factory() {
  return [](const LayerContext& ctx, int index) -> std::unique_ptr<Layer> {
    const bool tanh = ctx.plan.model.layers[index].config.choice("approximate") == "tanh";
    return std::make_unique<ActivationLayer>(ctx, index, tanh ? Activation::GELUTanh : Activation::GELU);
  };
}

// Mean over the whole image: partial sums from every shard of the sample group.
class GlobalAvgPoolLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  double pixels() const { return double(spec().in.h) * spec().in.w; }
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    std::vector<double> sums(size_t(x.n()) * x.c(), 0.0);
    ctx_.backend.global_avg_sum(x.n(), x.c(), int64_t(x.h()) * x.w(), x.data(), sums.data());
    sum_over_image(sums.data(), sums.size());
    std::vector<float> mean(sums.size());
    for (size_t i = 0; i < sums.size(); ++i) mean[i] = float(sums[i] / pixels());
    Tensor y(ctx_.backend.allocator(), x.n(), x.c(), 1, 1, "output of " + label());
    ctx_.backend.from_host(y.data(), mean.data(), mean.size() * sizeof(float));
    return y;
  }
  // x is gone (LayerTraits::backward_reads_inputs): its shape is this rank's part of the input.
  Tensor backward_impl(const Tensor&, const Tensor&, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (!need_dx) return dx;
    const Rect in = ctx_.plan.owned_tensor(spec().inputs[0], ctx_.rank);
    dx = make_output(dy.n(), dy.c(), in, "input gradient");
    ctx_.backend.global_avg_backward(dx.n(), dx.c(), int64_t(dx.h()) * dx.w(), dy.data(), 1.0 / pixels(),
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
    const Rect r = ctx_.plan.owned_input(index_, ctx_.rank);
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
  void backward_over(const Tensor&, const Tensor&, Tensor& dy) override {
    ctx_.backend.dropout_apply(mask(), dy.n(), dy.c(), dy.h(), dy.w(), dy.data(), dy.data());
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
    // A replicated input (the tail) is whole on this rank: nothing to gather.
    const bool split = !input_replicated();
    const int shards = split ? ctx_.group.size() : 1, me = split ? ctx_.group.rank() : 0;
    std::vector<double> mine(planes), all(planes * size_t(shards), 0.0);
    ctx_.backend.global_max(x.n(), x.c(), hw, x.data(), mine.data());
    std::copy(mine.begin(), mine.end(), all.begin() + size_t(me) * planes);
    if (split) collective([&] { ctx_.group.allreduce_sum_host(all.data(), all.size()); });
    max_.assign(planes, -std::numeric_limits<double>::infinity());
    for (int s = 0; s < shards; ++s)
      for (size_t p = 0; p < planes; ++p) max_[p] = std::max(max_[p], all[size_t(s) * planes + p]);
    ties_.assign(planes, 0.0);
    ctx_.backend.global_max_count(x.n(), x.c(), hw, x.data(), max_.data(), ties_.data());
    if (split) collective([&] { ctx_.group.allreduce_sum_host(ties_.data(), ties_.size()); });
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
// the group leader's weight gradient counts (Layer::backward).
class DenseLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  Tensor forward_impl(const Tensor& x, ForwardMode) override {
    Tensor y(ctx_.backend.allocator(), x.n(), spec().out.c, 1, 1, "output of " + label());
    ctx_.backend.dense_forward(x.n(), x.c(), y.c(), x.data(), weight("kernel:0"), weight("bias:0"), y.data());
    return y;
  }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    Tensor dx;
    if (need_dx) dx = Tensor(ctx_.backend.allocator(), x.n(), x.c(), 1, 1, "input gradient of " + label());
    float* dw = weight_grad("kernel:0");
    float* db = weight_grad("bias:0");
    ctx_.backend.dense_backward(x.n(), x.c(), dy.c(), x.data(), weight("kernel:0"), dy.data(),
                                need_dx ? dx.data() : nullptr, dw, db);
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
    std::vector<Tensor> dx(xs.size());  // the inputs are gone (LayerTraits): their shapes from dy's
    for (size_t k = 0; k < xs.size(); ++k)
      if (need_dx[k]) dx[k] = like(dy, spec().ins[k].c, "input gradient");
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

}  // namespace

std::map<std::string, LayerFactory> basic_layer_kernels() {
  return {{"batch_norm", batch_norm_factory()},
          {"relu", layer_factory<ReLULayer>()},
          {"global_avg_pool", layer_factory<GlobalAvgPoolLayer>()},
          {"dense", layer_factory<DenseLayer>()},
          {"leaky_relu", layer_factory<ActivationLayer>(Activation::LeakyReLU)},
          {"sigmoid", layer_factory<ActivationLayer>(Activation::Sigmoid)},
          {"tanh", layer_factory<ActivationLayer>(Activation::Tanh)},
          {"relu6", layer_factory<ActivationLayer>(Activation::ReLU6)},
          {"clip", layer_factory<ActivationLayer>(Activation::Clip)},
          {"silu", layer_factory<ActivationLayer>(Activation::SiLU)},
          {"hard_sigmoid", layer_factory<ActivationLayer>(Activation::HardSigmoid)},
          {"hard_swish", layer_factory<ActivationLayer>(Activation::HardSwish)},
          {"gelu", gelu_factory()},
          {"global_max_pool", layer_factory<GlobalMaxPoolLayer>()},
          {"dropout", layer_factory<DropoutLayer>()},
          {"add", layer_factory<AddLayer>()},
          {"concatenate", layer_factory<ConcatenateLayer>()}};
}

Tensor forward_inference(const std::vector<std::unique_ptr<Layer>>& layers, const StepSchedule& schedule, Tensor x,
                         const std::function<void(const StepOp&)>& on_op) {
  if (layers.empty()) return x;
  const ModelSpec& m = layers[0]->model();
  std::vector<Tensor> acts(layers.size() + 1);
  acts[0] = std::move(x);
  for (const StepOp& op : schedule.ops) {
    if (op.action != StepAction::Forward && op.action != StepAction::Free) continue;
    if (on_op) on_op(op);
    if (op.action == StepAction::Forward)
      acts[op.index + 1] = layers[op.index]->forward(inputs_of(m, op.index, acts), ForwardMode::Eval);
    else
      acts[op.index].release();
  }
  return std::move(acts.back());
}

LayerInputs inputs_of(const ModelSpec& model, int layer, const std::vector<Tensor>& tensors) {
  LayerInputs xs;
  for (int t : model.layers[layer].inputs) xs.push_back(&tensors[t]);
  return xs;
}

}  // namespace ht
