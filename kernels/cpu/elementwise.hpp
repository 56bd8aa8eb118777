// Element-wise kernels, global average pooling and the rectangle copies used to pack and
// unpack halos. All tensors NCHW contiguous.
#pragma once

#include <cstddef>

#include "kernels/activation.hpp"
#include "kernels/dropout.hpp"

namespace ht::cpu {

template <class T>
void relu_forward(size_t n, const T* x, T* y);
// dx = dy where y > 0, else 0 (torch's threshold_backward on the output). dx may alias dy.
template <class T>
void relu_backward(size_t n, const T* y, const T* dy, T* dx);

// y = f(x) (kernels/activation.hpp: activation_value).
template <class T>
void activation_forward(Activation f, ActivationArgs a, size_t n, const T* x, T* y);
// dx = dy * f'(x) from the input x and output y (activation_gradient). dx may alias dy.
template <class T>
void activation_backward(Activation f, ActivationArgs a, size_t n, const T* x, const T* y, const T* dy, T* dx);

// sums[i] += sum over hw of x[i], i < n*c (the caller divides by the global H*W).
template <class T>
void global_avg_sum(int n, int c, long hw, const T* x, double* sums);
// dx[i][*] = dy[i] * scale (overwrite), i < n*c; scale is 1/(global H*W).
template <class T>
void global_avg_backward(int n, int c, long hw, const T* dy, double scale, T* dx);

// y = x * scale where dropout_keeps(m, ...) else 0, over [n, c, h, w] (forward, and the
// backward with dy for x).
template <class T>
void dropout_apply(const DropoutMask& m, int n, int c, int h, int w, const T* x, T* y);

// Global max pooling of one shard, plane p < n*c: maxes[p] = max over hw of x[p] (-inf for
// hw == 0); counts[p] = how many elements equal maxes[p] (the caller's global max, which
// may be another shard's); dx[p][j] = x[p][j] == maxes[p] ? grads[p] : 0, where grads is
// dy over the global count (ties share the gradient, as torch's amax and TF's reduce_max).
template <class T>
void global_max(int n, int c, long hw, const T* x, double* maxes);
template <class T>
void global_max_count(int n, int c, long hw, const T* x, const double* maxes, double* counts);
template <class T>
void global_max_backward(int n, int c, long hw, const T* x, const double* maxes, const double* grads, T* dx);

// Rectangle rows [row0, row0+rows) x cols [col0, col0+cols) of every (n, c) plane of a
// [n][c][h][w] tensor, to/from a packed [n][c][rows][cols] buffer.
template <class T>
void pack_rect(const T* src, int n, int c, int src_h, int src_w, int row0, int col0, int rows,
               int cols, T* packed);
// dst rectangle = packed.
template <class T>
void unpack_rect(const T* packed, int n, int c, int dst_h, int dst_w, int row0, int col0, int rows,
                 int cols, T* dst);
// dst rectangle += packed (the backward of a halo exchange sums into the owner).
template <class T>
void unpack_add_rect(const T* packed, int n, int c, int dst_h, int dst_w, int row0, int col0,
                     int rows, int cols, T* dst);

}  // namespace ht::cpu
