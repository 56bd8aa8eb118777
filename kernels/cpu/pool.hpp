// Max and average pooling on NCHW tensors, asymmetric padding (ceil mode is padding
// beyond the declared one, which never wins a max nor counts in an average).
#pragma once

#include <cstddef>

#include "kernels/geometry.hpp"

namespace ht::cpu {

using ::ht::PoolGeom;  // kernels/geometry.hpp: shared with the CUDA kernels

// Throws std::invalid_argument when a field is out of range or the output is empty.
void validate(const PoolGeom& g);

// Padding never wins a max (it is -inf, as in PyTorch); a window wholly in padding gives
// -inf and no gradient. NaN propagates. dx is overwritten; each window's gradient goes to
// its FIRST maximal element in row-major scan order, as PyTorch's CPU kernel.
template <class T>
void max_pool_forward(const PoolGeom& g, const T* x, T* y);
template <class T>
void max_pool_backward(const PoolGeom& g, const T* x, const T* dy, T* dx);

// Average over the window's elements inside the image, divided by pool_divisor (the taps
// inside the image, and the padding that counts: count_include_pad).
template <class T>
void avg_pool_forward(const PoolGeom& g, const T* x, T* y);
template <class T>
void avg_pool_backward(const PoolGeom& g, const T* dy, T* dx);

}  // namespace ht::cpu
