// Losses. Each returns the SUM of per-element losses (in double) over its inputs and, when
// grad is not null, writes grad = d(sum)/d(input) * grad_scale. The caller picks
// grad_scale (1/batch, 1/pixels, ...) and divides the reduced sum for reporting. Weights
// (kernels/loss_weights.hpp) multiply each element's loss and gradient; the default weighs
// nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/loss_weights.hpp"

namespace ht::cpu {

// logits [n][k], labels [n] in [0, k) (else std::out_of_range). Loss -log softmax[label],
// times the label's class weight.
template <class T>
double softmax_xent(int n, int k, const T* logits, const int32_t* labels, double grad_scale,
                    T* grad, const LossWeights& w = LossWeights());
// Per pixel of [n][k][hw] logits against class maps [n][hw] (class ids as values, in
// [0, k); else std::out_of_range): -log softmax over the k channels at that pixel, times
// the pixel's class weight.
template <class T>
double softmax_xent_pixels(int n, int k, int64_t hw, const T* logits, const T* classes, double grad_scale,
                           T* grad, const LossWeights& w = LossWeights());
// Per element, c = the target's class weight and p = pos_weight:
// c (p t softplus(-x) + (1 - t) softplus(x)), stable for any x; grad c (sigmoid(x) (p t + 1 - t) - p t).
// Unweighted that is max(x,0) - x*t + log1p(exp(-|x|)), grad sigmoid(x) - t, bit for bit.
template <class T>
double sigmoid_bce(size_t count, const T* logits, const T* targets, double grad_scale, T* grad,
                   const LossWeights& w = LossWeights());
// Per element (p - t)^2; grad 2 (p - t).
template <class T>
double mse(size_t count, const T* pred, const T* target, double grad_scale, T* grad);

}  // namespace ht::cpu
