// Batch norm, ReLU and a max pool whose windows tile the plane (kernel == stride, no
// padding), fused into one pass forward and two backward: the step schedule's fused chain
// (orchestrator/step_schedule.hpp FusedChain). Neither the normalised tensor nor the ReLU's
// output is written; the forward keeps one byte per window, the position of its maximum.
// Statistics come from the caller (norm.hpp channel_sum, channel_sq_dev_sum and the
// reduction over ranks), as for the unfused batch norm.
#pragma once

#include <cstdint>

#include "kernels/geometry.hpp"

namespace ht::cpu {

using ::ht::kNoArgmax;      // kernels/geometry.hpp: shared with the CUDA kernels
using ::ht::NormPoolShape;

// y = max_pool(relu((x - mean) * invstd * gamma + beta)) with the same bits as
// bn_forward_apply, relu_forward and max_pool_forward in turn (the first maximum in
// row-major order wins; NaN propagates); argmax[window] = its maximum's position
// dy * kw + dx in the window, or kNoArgmax. Null gamma is 1, null beta 0.
template <class T>
void bn_relu_max_pool_forward(const NormPoolShape& s, const T* x, const double* mean, const double* invstd,
                              const T* gamma, const T* beta, T* y, uint8_t* argmax);

// The batch-norm backward's sums (norm.hpp bn_backward_sums) for the gradient that the pool
// and ReLU pass down, which is dy at each window's maximum and 0 elsewhere: sum_dy[c] += sum
// of dy; sum_dy_xhat[c] += sum of dy * (x - mean) * invstd. Only the maxima are read. The
// order of the additions differs from bn_backward_sums over the unfused gradient: equal
// within float rounding, not to the bit.
template <class T>
void bn_relu_max_pool_backward_sums(const NormPoolShape& s, const T* dy, const uint8_t* argmax, const T* x,
                                    const double* mean, const double* invstd, double* sum_dy, double* sum_dy_xhat);

// dx = gamma*invstd*(g - sum_dy/count - xhat*sum_dy_xhat/count), g the gradient passed down
// (norm.hpp bn_backward_apply, with the same bits for the same sums).
template <class T>
void bn_relu_max_pool_backward_apply(const NormPoolShape& s, const T* dy, const uint8_t* argmax, const T* x,
                                     const double* mean, const double* invstd, const T* gamma, const double* sum_dy,
                                     const double* sum_dy_xhat, double count, T* dx);

}  // namespace ht::cpu
