// Losses: each returns per-row or per-block sums of the per-element loss in double and
// writes d(sum)/dx * grad_scale. Formulas are the numerically stable ones PyTorch uses.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

// One thread per image: k (classes) is small.
__global__ void softmax_xent_kernel(int n, int k, const float* logits, const int32_t* labels,
                                    double grad_scale, float* grad, double* row_loss, LossWeights w) {
  HT_GRID_STRIDE(r, n) {
    const float* z = logits + r * k;
    double zmax = z[0];
    for (int j = 1; j < k; ++j) zmax = fmax(zmax, double(z[j]));
    double denom = 0.0;
    for (int j = 0; j < k; ++j) denom += exp(double(z[j]) - zmax);
    const double log_denom = log(denom);
    const int label = labels[r];
    const double c = w.of_class(label);
    row_loss[r] = c * (log_denom - (double(z[label]) - zmax));
    if (grad)
      for (int j = 0; j < k; ++j) {
        const double p = exp(double(z[j]) - zmax - log_denom);
        grad[r * k + j] = float(c * (p - (j == label ? 1.0 : 0.0)) * grad_scale);
      }
  }
}

// loss = c (max(x, 0) - x t + log(1 + exp(-|x|)) + (p - 1) t softplus(-x));
// d/dx = c (sigmoid(x) - t + (p - 1) t (sigmoid(x) - 1)), c the target's class weight and
// p pos_weight (kernels/cpu/loss.cpp says why this form).
struct SigmoidBce {
  const float* logits;
  const float* targets;
  double grad_scale;
  float* grad;
  LossWeights w;
  __device__ void operator()(int, int64_t e, double* acc) const {
    const double x = logits[e], t = targets[e], c = w.of_target(t), p = w.pos_weight;
    const double sp = fmax(x, 0.0) + log1p(exp(-fabs(x)));
    acc[0] += c * (fmax(x, 0.0) - x * t + log1p(exp(-fabs(x))) + (p - 1.0) * t * (sp - x));
    if (grad) {
      const double s = x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
      grad[e] = float(c * ((s - t) + (p - 1.0) * t * (s - 1.0)) * grad_scale);
    }
  }
};

// Per pixel e of n * hw: -log softmax over the k channels at stride hw; the data reader
// has checked that every class id is in [0, k).
struct PixelSoftmax {
  int k;
  int64_t hw;
  const float* logits;
  const float* classes;
  double grad_scale;
  float* grad;
  LossWeights w;
  __device__ void operator()(int, int64_t e, double* acc) const {
    const int64_t image = e / hw, p = e % hw;
    const float* z = logits + image * k * hw + p;
    const int label = int(classes[e]);
    double zmax = z[0];
    for (int j = 1; j < k; ++j) zmax = fmax(zmax, double(z[j * hw]));
    double denom = 0.0;
    for (int j = 0; j < k; ++j) denom += exp(double(z[j * hw]) - zmax);
    const double log_denom = log(denom), c = w.of_class(label);
    acc[0] += c * (log_denom - (double(z[label * hw]) - zmax));
    if (grad)
      for (int j = 0; j < k; ++j) {
        const double prob = exp(double(z[j * hw]) - zmax - log_denom);
        grad[image * k * hw + j * hw + p] = float(c * (prob - (j == label ? 1.0 : 0.0)) * grad_scale);
      }
  }
};

struct SquaredError {
  const float* pred;
  const float* targets;
  double grad_scale;
  float* grad;
  __device__ void operator()(int, int64_t e, double* acc) const {
    const double d = double(pred[e]) - double(targets[e]);
    acc[0] += d * d;
    if (grad) grad[e] = float(2.0 * d * grad_scale);
  }
};

}  // namespace

void launch_softmax_xent(int n, int k, const float* logits, const int32_t* labels, double grad_scale,
                         float* grad, double* row_loss, const LossWeights& w) {
  if (!n) return;
  softmax_xent_kernel<<<grid_for(size_t(n)), kThreads>>>(n, k, logits, labels, grad_scale, grad, row_loss, w);
  CUDA_CHECK_LAUNCH();
}

int loss_blocks(size_t count) { return reduce_blocks(int64_t(count)); }

void launch_sigmoid_bce(size_t count, const float* logits, const float* targets, double grad_scale,
                        float* grad, int blocks, double* partials, const LossWeights& w) {
  segment_reduce<1>(1, int64_t(count), blocks, SigmoidBce{logits, targets, grad_scale, grad, w}, partials);
}

void launch_softmax_xent_pixels(int n, int k, int64_t hw, const float* logits, const float* classes,
                                double grad_scale, float* grad, int blocks, double* partials, const LossWeights& w) {
  segment_reduce<1>(1, int64_t(n) * hw, blocks, PixelSoftmax{k, hw, logits, classes, grad_scale, grad, w},
                    partials);
}

void launch_mse(size_t count, const float* pred, const float* targets, double grad_scale, float* grad,
                int blocks, double* partials) {
  segment_reduce<1>(1, int64_t(count), blocks, SquaredError{pred, targets, grad_scale, grad}, partials);
}

}  // namespace ht::cuda
