// 3x3 convolutions at stride 1 with few channels (internal to kernels/cpu): the first
// layers of a model that reads grey or colour images at full resolution, where oneDNN pads
// the channels to its 8- or 16-wide blocks and reorders every tensor into them and out.
// These kernels read and write plain NCHW. Forward and backward data keep a block of
// output channels x output columns in vector registers while every input channel and tap
// is added in, so each output element is stored once; the weight gradient keeps each tap's
// sums as vectors over the output channels. Each task (an image, a band of output rows)
// first copies its input rows into a zero-padded band in the caller's scratch, so no tap
// needs a bounds test. Built for AVX2 and AVX-512 (isa.hpp); where the CPU or oneDNN's cap
// (dnnl_isa.hpp) is below AVX2 they serve nothing.
#pragma once

#include <cstddef>

#include "kernels/cpu/conv.hpp"

namespace ht::cpu {

// The vector width these kernels run at: "avx512", "avx2" (the CPU's widest that oneDNN's
// cap allows; both give the same bits) or "none" (below AVX2: they serve nothing).
const char* small_conv_isa();

// Which of g's passes (ConvPasses bits) these kernels serve on this CPU; 0 where none.
unsigned small_conv_passes(const ConvGeom& g);

// Floats of scratch one call of `pass` (one ConvPasses bit) needs when it runs `threads`
// OpenMP threads.
size_t small_conv_scratch_floats(const ConvGeom& g, unsigned pass, int threads);

// The semantics of conv.hpp's conv2d_*; `scratch` holds small_conv_scratch_floats(g, pass,
// omp_get_max_threads()) floats, 64-byte aligned.
class MomentsByBlocks;  // norm.hpp

// Whether small_conv_forward's bands of output rows hold whole blocks of norm.hpp's
// MomentsByBlocks (4 rows of at least 256 columns), so that y's channel moments can be
// summed in the pass that writes y.
bool small_conv_moments_in_pass(const ConvGeom& g);

// With `moments` (over y), each band of output rows goes into it as soon as it is written;
// with `relu`, ReLU'd first (elementwise.hpp relu_forward's bits).
void small_conv_forward(const ConvGeom& g, const float* x, const float* w, const float* bias, float* y,
                        float* scratch, MomentsByBlocks* moments = nullptr, bool relu = false);
void small_conv_backward_data(const ConvGeom& g, const float* dy, const float* w, float* dx, float* scratch);
void small_conv_backward_weights(const ConvGeom& g, const float* x, const float* dy, float* dw, float* dbias,
                                 float* scratch);

}  // namespace ht::cpu
