// Launchers of the .cu kernels: plain functions the backend calls (llm.c style: a kernel
// plus a launcher). None of them needs cuDNN. All run on the legacy default stream except
// where a stream is passed, and check the launch with CUDA_CHECK_LAUNCH.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/activation.hpp"
#include "kernels/dropout.hpp"
#include "kernels/geometry.hpp"
#include "kernels/loss_weights.hpp"

namespace ht::cuda {

// elementwise.cu
void launch_add(float* dst, const float* src, size_t count);
void launch_add_scaled(float* dst, const float* src, float alpha, size_t count);  // dst += alpha*src
void launch_scale(float* dst, float factor, size_t count);
void launch_relu_forward(size_t count, const float* x, float* y);
void launch_relu_backward(size_t count, const float* y, const float* dy, float* dx);
// Per plane p < planes of hw elements: the max (into out[p], device doubles), the count of
// elements equal to maxes[p], and dx = x == maxes[p] ? grads[p] : 0.
void launch_plane_max(int planes, int64_t hw, const float* x, double* out);
void launch_plane_count_equal(int planes, int64_t hw, const float* x, const double* maxes, double* out);
void launch_global_max_backward(int planes, int64_t hw, const float* x, const double* maxes, const double* grads,
                                float* dx);
void launch_dropout_apply(const DropoutMask& m, int n, int c, int h, int w, const float* x, float* y);
// kernels/activation.hpp's activation_value and activation_gradient; dx may alias dy.
void launch_activation_forward(Activation f, ActivationArgs a, size_t count, const float* x, float* y);
void launch_activation_backward(Activation f, ActivationArgs a, size_t count, const float* x, const float* y,
                                const float* dy, float* dx);
// Rectangles of `planes` planes [h, w] <-> packed [planes, rows, cols]. Also used to pad
// (unpack into a zeroed larger buffer) and crop (pack out of one) for cuDNN.
void launch_pack_rect(const float* src, int planes, int h, int w, int row0, int col0, int rows, int cols,
                      float* dst);
void launch_unpack_rect(const float* src, int planes, int h, int w, int row0, int col0, int rows, int cols,
                        float* dst, bool accumulate);
void launch_add_channel_bias(int n, int c, int64_t hw, const float* bias, float* y);
// resample.cu: upsampling and shifts by image coordinates; the backward overwrites dx.
void launch_resample_forward(const ResampleGeom& g, const float* x, float* y);
void launch_resample_backward(const ResampleGeom& g, const float* dy, float* dx);
// dx[p, i] = dy[p] * scale for every plane p of hw elements.
void launch_broadcast_planes(int planes, int64_t hw, const float* dy, double scale, float* dx);

// pixel.cu (kernels/cpu/pixel.hpp): y = a * b; y = x * v[p] (PerPlane) or v[p % c]
// (PerChannel) for planes p of [n, c, hw]; y = x * float(factors[i]) for n images of
// `image` elements (factors: device doubles).
void launch_multiply(size_t count, const float* a, const float* b, float* y);
void launch_multiply_planes(int n, int c, int64_t hw, const float* x, const float* v, PlaneFactor per, float* y);
void launch_scale_images(int n, int64_t image, const float* x, const double* factors, float* y);
// Layer norm over the c channels of each pixel; gamma and beta may be null (1 and 0). The
// backward writes dx unless null and, per block of pixels, partials [2][c][blocks] of the
// sums of dy * xhat (dgamma) and dy (dbeta); blocks = layer_norm_blocks(n, hw).
void launch_layer_norm_forward(int n, int c, int64_t hw, const float* x, double eps, const float* gamma,
                               const float* beta, float* y);
int layer_norm_blocks(int n, int64_t hw);
void launch_layer_norm_backward(int n, int c, int64_t hw, const float* x, const float* dy, double eps,
                                const float* gamma, float* dx, double* partials);
// n images of [rows, cols] -> [cols, rows]: [n, c, hw] <-> [n, hw, c].
void launch_transpose(int n, int64_t rows, int64_t cols, const float* in, float* out);

// pool.cu: asymmetric padding; max ignores padding, avg divides by pool_divisor (the
// in-image taps and the padding that counts).
void launch_max_pool_forward(const PoolGeom& g, const float* x, float* y);
void launch_max_pool_backward(const PoolGeom& g, const float* x, const float* dy, float* dx);
void launch_avg_pool_forward(const PoolGeom& g, const float* x, float* y);
void launch_avg_pool_backward(const PoolGeom& g, const float* dy, float* dx);

// reduce.cu: deterministic segmented sums in double. Segment s is reduced by `blocks`
// blocks into partials[s * blocks + b]; the split depends on the sizes only, so the result
// is bit-identical from run to run. The caller adds the partials in order.
int reduce_blocks(int64_t length);
void launch_channel_sum(int n, int c, int64_t hw, const float* x, int blocks, double* partials);
void launch_channel_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* mean, int blocks,
                               double* partials);
// Two sums per channel: partials [c][blocks] of dy and [c][blocks] of dy * xhat after them.
void launch_bn_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                             const double* invstd, int blocks, double* partials);
void launch_plane_sum(int planes, int64_t hw, const float* x, int blocks, double* partials);
// Per plane: the sum of a * b; of (x - mean[p])^2; and partials [2][planes][blocks] of dy
// and dy * (x - mean[p]) (instance and group norm; mean: device doubles per plane).
void launch_plane_dot(int planes, int64_t hw, const float* a, const float* b, int blocks, double* partials);
void launch_plane_sq_dev_sum(int planes, int64_t hw, const float* x, const double* mean, int blocks,
                             double* partials);
void launch_plane_backward_sums(int planes, int64_t hw, const float* dy, const float* x, const double* mean,
                                int blocks, double* partials);
// out[s] = float(sum of partials of segment s, in order).
void launch_finish_sums(int segments, int blocks, const double* partials, float* out);

// bn.cu (elementwise halves of batch norm; per-channel parameters in device doubles).
void launch_bn_forward_apply(int n, int c, int64_t hw, const float* x, const double* mean,
                             const double* invstd, const float* gamma, const float* beta, float* y);
void launch_bn_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x, const double* mean,
                              const double* invstd, const float* gamma, const double* sum_dy,
                              const double* sum_dy_xhat, double count, float* dx);
// norm_relu_pool.cu: batch norm + ReLU + a tiling max pool (kernels/geometry.hpp
// NormPoolShape); the backward sums' partials as launch_bn_backward_sums's.
void launch_bn_relu_max_pool_forward(const NormPoolShape& s, const float* x, const double* mean,
                                     const double* invstd, const float* gamma, const float* beta, float* y,
                                     uint8_t* argmax);
void launch_bn_relu_max_pool_backward_sums(const NormPoolShape& s, const float* dy, const uint8_t* argmax,
                                           const float* x, const double* mean, const double* invstd, int blocks,
                                           double* partials);
void launch_bn_relu_max_pool_backward_apply(const NormPoolShape& s, const float* dy, const uint8_t* argmax,
                                            const float* x, const double* mean, const double* invstd,
                                            const float* gamma, const double* sum_dy, const double* sum_dy_xhat,
                                            double count, float* dx);
// Per plane p: y = (x - mean[p]) * scale[p] + shift[p]; dx = k[p] * dy + a[p] * (x -
// mean[p]) + b[p] (device doubles per plane).
void launch_plane_affine(int planes, int64_t hw, const float* x, const double* mean, const double* scale,
                         const double* shift, float* y);
void launch_plane_backward_apply(int planes, int64_t hw, const float* dy, const float* x, const double* mean,
                                 const double* k, const double* a, const double* b, float* dx);

// dense.cu: y = x W + b with W (in, out), row-major; sums in double.
void launch_dense_forward(int n, int in, int out, const float* x, const float* w, const float* b, float* y);
void launch_dense_backward(int n, int in, int out, const float* x, const float* w, const float* dy, float* dx,
                           float* dw, float* db);

// loss.cu: per-row (softmax) or per-block (elementwise) loss sums in double, gradients
// scaled by grad_scale, each element weighted by w. grad may be null.
void launch_softmax_xent(int n, int k, const float* logits, const int32_t* labels, double grad_scale,
                         float* grad, double* row_loss, const LossWeights& w);
int loss_blocks(size_t count);
void launch_softmax_xent_pixels(int n, int k, int64_t hw, const float* logits, const float* classes,
                                double grad_scale, float* grad, int blocks, double* partials, const LossWeights& w);
void launch_sigmoid_bce(size_t count, const float* logits, const float* targets, double grad_scale,
                        float* grad, int blocks, double* partials, const LossWeights& w);
void launch_mse(size_t count, const float* pred, const float* targets, double grad_scale, float* grad,
                int blocks, double* partials);

// optim.cu: PyTorch semantics (see CudaBackend::adam_step).
void launch_sgd_step(size_t n, float* w, const float* g, float* v, float lr, float momentum);
// Scalars formed in double and cast once, as torch casts its Python floats.
struct AdamScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bias_correction2_sqrt;
};
void launch_adam_step(size_t n, float* w, const float* g, float* m, float* v, const AdamScalars& s);

// comm.cu: out[i] = sum over r in rank order of gathered[r * len + i], in float from zero.
void launch_sum_ranks(const float* gathered, int ranks, size_t len, float* out, cudaStream_t stream);

}  // namespace ht::cuda
