// The batch norm layer, and its half of a fused batch norm + ReLU or ReLU6 (+ max pool) chain
// (orchestrator/step_schedule.hpp fused_chains).
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "worker/layers/layers.hpp"

namespace ht {

namespace {

// Statistics over the batch and all shards, as BatchNorm2d in training mode (on a channel
// vector: over the batch alone, each image once); moving averages as Keras.
class BatchNormLayer : public Layer {
 public:
  using Layer::Layer;

  // Batch norm + ReLU (or ReLU6): the activation's output. Batch norm + ReLU + max pool (kernels/geometry.hpp
  // NormPoolShape): the pooled output and an argmax byte per window. The normalised tensor,
  // and with a pool the ReLU's output, are never made.
  Tensor forward_chain(const Tensor& x, int tail, ForwardMode mode) override {
    check_chain_input(x);
    if (mode == ForwardMode::Eval) throw std::logic_error(label() + ": a fused chain is for training");
    const LayerSpec& last = model().layers[size_t(tail)];
    const std::string what = fmt::format("output of {} (rank {})", last.config.name, ctx_.rank);
    if (!pools(tail)) {
      set_statistics(x, mode);
      Tensor y(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), what);
      const int64_t hw = int64_t(x.h()) * x.w();
      if (chain_ends_in_relu6(tail)) {  // the two layers' kernels, the activation in place
        ctx_.backend.bn_forward_apply(x.n(), x.c(), hw, x.data(), mean_.data(), invstd_.data(), weight("gamma:0"),
                                      weight("beta:0"), y.data());
        ctx_.backend.activation_forward(Activation::ReLU6, {}, y.size(), y.data(), y.data());
        return y;
      }
      ctx_.backend.bn_relu_forward(x.n(), x.c(), hw, x.data(), mean_.data(), invstd_.data(), weight("gamma:0"),
                                   weight("beta:0"), y.data());
      return y;
    }
    const NormPoolShape s = chain_shape(x, tail);
    const Rect out = ctx_.plan.owned_output(tail, ctx_.rank);
    if (out.rows.size() != s.ho() || out.cols.size() != s.wo())
      throw std::logic_error(fmt::format("{}: the fused {} makes {}x{}, the plan says {}x{}", label(),
                                         last.config.name, s.ho(), s.wo(), out.rows.size(), out.cols.size()));
    set_statistics(x, mode);
    Tensor y(ctx_.backend.allocator(), x.n(), x.c(), s.ho(), s.wo(), what);
    // A recompute writes the same argmax bytes again, into the forward's.
    if (mode == ForwardMode::Train)
      argmax_ = Tensor(ctx_.backend.allocator(), 1, 1, 1, int((s.y_size() + sizeof(float) - 1) / sizeof(float)),
                       fmt::format("argmax of {} (rank {})", last.config.name, ctx_.rank));
    else if (argmax_.empty())
      throw std::logic_error(label() + ": a fused chain recomputed without its forward");
    ctx_.backend.bn_relu_max_pool_forward(s, x.data(), mean_.data(), invstd_.data(), weight("gamma:0"),
                                          weight("beta:0"), y.data(), argmax());
    return y;
  }
  Tensor backward_chain(Tensor& x, Tensor& y, Tensor dy, int tail, bool need_dx, bool dx_over_x) override {
    check_chain_input(x);
    if (!pools(tail)) {  // the ReLU's and the batch norm's backward in two passes, dx over dy
      if (dy.n() != x.n() || dy.c() != x.c() || dy.h() != x.h() || dy.w() != x.w() || y.size() != dy.size())
        throw std::logic_error(label() + ": the fused chain's output or its gradient does not match its input");
      const int64_t hw = int64_t(x.h()) * x.w();
      if (chain_ends_in_relu6(tail)) {
        // Its gradient passes where 0 < x < 6, which is where 0 < y < 6: y stands for x.
        ctx_.backend.activation_backward(Activation::ReLU6, {}, y.size(), y.data(), y.data(), dy.data(), dy.data());
        plain_gradients(x, dy, need_dx ? dy.data() : nullptr);
        if (!need_dx) dy.release();
        return dy;
      }
      gradients(
          x.c(), need_dx,
          [&](double* sum_dy, double* sum_dy_xhat) {
            ctx_.backend.bn_relu_backward_sums(x.n(), x.c(), hw, dy.data(), y.data(), x.data(), mean_.data(),
                                               invstd_.data(), sum_dy, sum_dy_xhat);
          },
          [&](const double* sum_dy, const double* sum_dy_xhat, double count) {
            ctx_.backend.bn_relu_backward_apply(x.n(), x.c(), hw, dy.data(), y.data(), x.data(), mean_.data(),
                                                invstd_.data(), weight("gamma:0"), sum_dy, sum_dy_xhat, count,
                                                dy.data());
          });
      if (!need_dx) dy.release();
      return dy;
    }
    const NormPoolShape s = chain_shape(x, tail);
    if (dy.n() != s.n || dy.c() != s.c || dy.h() != s.ho() || dy.w() != s.wo() || argmax_.empty())
      throw std::logic_error(label() + ": the fused chain's output gradient or argmax does not match its forward");
    Tensor dx;
    float* dxp = nullptr;  // the apply reads each x before it writes dx there: in place is exact
    if (need_dx && dx_over_x) {
      x.pass_on();
      dxp = x.data();
    } else if (need_dx) {
      dx = Tensor(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "input gradient of " + label());
      dxp = dx.data();
    }
    gradients(
        x.c(), need_dx,
        [&](double* sum_dy, double* sum_dy_xhat) {
          ctx_.backend.bn_relu_max_pool_backward_sums(s, dy.data(), argmax(), x.data(), mean_.data(),
                                                      invstd_.data(), sum_dy, sum_dy_xhat);
        },
        [&](const double* sum_dy, const double* sum_dy_xhat, double count) {
          ctx_.backend.bn_relu_max_pool_backward_apply(s, dy.data(), argmax(), x.data(), mean_.data(),
                                                       invstd_.data(), weight("gamma:0"), sum_dy, sum_dy_xhat,
                                                       count, dxp);
        });
    return need_dx && dx_over_x ? std::move(x) : std::move(dx);
  }

 protected:
  Tensor forward_impl(const Tensor& x, ForwardMode mode) override {
    set_statistics(x, mode);
    Tensor y = Tensor(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "output of " + label());
    ctx_.backend.bn_forward_apply(x.n(), x.c(), int64_t(x.h()) * x.w(), x.data(), mean_.data(), invstd_.data(),
                                  weight("gamma:0"), weight("beta:0"), y.data());
    return y;
  }
  void release_kept() override { argmax_.release(); }
  // mean_ and invstd_ for this forward. Training: the batch's, summed over every rank, and
  // the moving statistics updated (not on a recompute). Inference and a frozen batch norm:
  // Keras's, the moving statistics (kept for the backward of a frozen one, which
  // normalises this way in training).
  void set_statistics(const Tensor& x, ForwardMode mode) {
    const int c = x.c();
    mean_.assign(c, 0.0);
    invstd_.assign(c, 0.0);
    const double eps = spec().config.number("epsilon");
    if (mode == ForwardMode::Eval || frozen()) {
      std::vector<float> mm(c), mv(c);
      ctx_.backend.to_host(mm.data(), ctx_.params.value(*ctx_.params.find(index_, "moving_mean:0")),
                           c * sizeof(float));
      ctx_.backend.to_host(mv.data(), ctx_.params.value(*ctx_.params.find(index_, "moving_variance:0")),
                           c * sizeof(float));
      for (int i = 0; i < c; ++i) {
        mean_[i] = mm[i];
        invstd_[i] = 1.0 / std::sqrt(double(mv[i]) + eps);
      }
      return;
    }
    const int64_t hw = int64_t(x.h()) * x.w();
    const double count = double(ctx_.global_batch) * spec().in.h * spec().in.w;
    // This shard's moments in one pass, then Chan's merge over the ranks in two sums: the
    // mean, then each shard's squared deviations moved to it. As exact as two passes over
    // the whole image, in any sharding.
    const double local = double(x.n()) * double(hw);
    std::vector<double> local_mean(c), sq(c);
    if (const ChannelMoments* made = x.moments(); made && made->mean.size() == size_t(c)) {
      local_mean = made->mean;  // by the kernel that wrote x, in that pass: the same bits
      sq = made->m2;
    } else {
      ctx_.backend.channel_moments(x.n(), c, hw, x.data(), local_mean.data(), sq.data());
    }
    for (int i = 0; i < c; ++i) mean_[i] = local_mean[i] * local;
    sum_over_batch(mean_.data(), c);
    for (double& m : mean_) m /= count;
    for (int i = 0; i < c; ++i) sq[i] += local * (local_mean[i] - mean_[i]) * (local_mean[i] - mean_[i]);
    sum_over_batch(sq.data(), c);
    for (int i = 0; i < c; ++i) invstd_[i] = 1.0 / std::sqrt(sq[i] / count + eps);
    if (mode == ForwardMode::Train) update_moving_statistics(sq, count);
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
    Tensor dx;
    if (need_dx) dx = Tensor(ctx_.backend.allocator(), x.n(), x.c(), x.h(), x.w(), "input gradient of " + label());
    plain_gradients(x, dy, need_dx ? dx.data() : nullptr);
    return dx;
  }
  void backward_over(const Tensor& x, const Tensor&, Tensor& dy) override { plain_gradients(x, dy, dy.data()); }
  // The weight gradients, and the input gradient into dx unless it is null. dx may be dy:
  // the sums read dy before the last pass writes dx, element by element.
  void plain_gradients(const Tensor& x, const Tensor& dy, float* dx) {
    const int64_t hw = int64_t(x.h()) * x.w();
    gradients(
        x.c(), dx != nullptr,
        [&](double* sum_dy, double* sum_dy_xhat) {
          ctx_.backend.bn_backward_sums(x.n(), x.c(), hw, dy.data(), x.data(), mean_.data(), invstd_.data(), sum_dy,
                                        sum_dy_xhat);
        },
        [&](const double* sum_dy, const double* sum_dy_xhat, double count) {
          ctx_.backend.bn_backward_apply(x.n(), x.c(), hw, dy.data(), x.data(), mean_.data(), invstd_.data(),
                                         weight("gamma:0"), sum_dy, sum_dy_xhat, count, dx);
        });
  }
  // The backward around its two passes: sums(sum_dy, sum_dy_xhat) over this shard, then
  // apply(sum_dy, sum_dy_xhat, count) with the sums over every rank. A frozen batch norm's
  // statistics are constants: dx = gamma * invstd * dy, apply with zero sums.
  template <class Sums, class Apply>
  void gradients(int c, bool want_dx, Sums sums, Apply apply) {
    std::vector<double> s(2 * size_t(c), 0.0);
    if (frozen()) {
      if (want_dx) apply(s.data(), s.data() + c, 1.0);
      return;
    }
    sums(s.data(), s.data() + c);
    // This shard's share of dgamma/dbeta; the step's gradient all-reduce sums the shards.
    std::vector<float> dbeta(s.begin(), s.begin() + c), dgamma(s.begin() + c, s.end());
    if (float* g = weight_grad("gamma:0")) ctx_.backend.from_host(g, dgamma.data(), c * sizeof(float));
    if (float* b = weight_grad("beta:0")) ctx_.backend.from_host(b, dbeta.data(), c * sizeof(float));
    if (!want_dx) return;
    sum_over_batch(s.data(), s.size());
    apply(s.data(), s.data() + c, double(ctx_.global_batch) * spec().in.h * spec().in.w);
  }

 private:
  bool pools(int tail) const { return tail == index_ + 2; }  // else the chain ends at its activation
  NormPoolShape chain_shape(const Tensor& x, int tail) const {
    const LayerSpec& pool = model().layers[size_t(tail)];
    return NormPoolShape{x.n(), x.c(), x.h(), x.w(), pool.rows.kernel, pool.cols.kernel};
  }
  uint8_t* argmax() { return reinterpret_cast<uint8_t*>(argmax_.data()); }

  std::vector<double> mean_, invstd_;
  Tensor argmax_;  // a fused chain's: one byte per window of its pool
};

}  // namespace

LayerFactory batch_norm_factory() { return layer_factory<BatchNormLayer>(); }

}  // namespace ht
