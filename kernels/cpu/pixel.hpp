// Kernels of the layers that work pixel by pixel on NCHW tensors beyond the activations:
// products (squeeze-excitation, layer scale, stochastic depth), layer norm over the
// channels of a pixel, and the channels-last order of a flatten. Reductions return double.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/geometry.hpp"

namespace ht::cpu {

// y = a * b, elementwise.
template <class T>
void multiply(size_t n, const T* a, const T* b, T* y);

using ::ht::PlaneFactor;  // kernels/geometry.hpp: shared with the CUDA kernels
// y[p, i] = x[p, i] * v[p] (PerPlane) or v[p % c] (PerChannel), planes p < n * c of hw.
template <class T>
void multiply_planes(int n, int c, int64_t hw, const T* x, const T* v, PlaneFactor per, T* y);

// out[p] = the sum over plane p of a * b, p < n * c: the gradient of a per-plane factor.
// Summed in T in short blocks and the blocks in double, as the batch-norm sums.
template <class T>
void plane_dot(int n, int c, int64_t hw, const T* a, const T* b, double* out);

// y[i, :] = x[i, :] * factors[i] for n images of `image` elements each.
template <class T>
void scale_images(int n, int64_t image, const T* x, const double* factors, T* y);

// Layer norm over the c channels of each pixel of [n, c, hw] (biased variance, epsilon
// inside the square root; statistics in double); gamma and beta may be null (1 and 0).
template <class T>
void layer_norm_forward(int n, int c, int64_t hw, const T* x, double eps, const T* gamma, const T* beta, T* y);
// dx (null: not made) and the weight gradients' sums dgamma[c] = sum dy * xhat and
// dbeta[c] = sum dy over the n * hw pixels, added in a fixed order (any thread count gives
// the same bits).
template <class T>
void layer_norm_backward(int n, int c, int64_t hw, const T* x, const T* dy, double eps, const T* gamma, T* dx,
                         double* dgamma, double* dbeta);

// [n, c, hw] -> [n, hw, c] (Keras's flatten order), and back.
template <class T>
void to_channels_last(int n, int c, int64_t hw, const T* x, T* y);
template <class T>
void from_channels_last(int n, int c, int64_t hw, const T* y, T* x);

}  // namespace ht::cpu
