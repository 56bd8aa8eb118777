// Upsampling (nearest, bilinear) and shifts (zero padding, cropping) on NCHW tensors, by
// image coordinates (kernels/geometry.hpp's ResampleGeom), so that a shard's part of the
// output is exactly that part of the whole image's.
#pragma once

#include "kernels/geometry.hpp"

namespace ht::cpu {

// Throws std::invalid_argument when a field is out of range or an output reads outside
// the local input.
void validate(const ResampleGeom& g);

// y (overwritten) from x; dx (overwritten) the adjoint from dy.
template <class T>
void resample_forward(const ResampleGeom& g, const T* x, T* y);
template <class T>
void resample_backward(const ResampleGeom& g, const T* dy, T* dx);

}  // namespace ht::cpu
