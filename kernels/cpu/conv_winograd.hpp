// Where DnnlConv2d runs oneDNN's Winograd F(4x4, 3x3) kernels instead of its direct ones,
// and on which convolution its data gradient runs there (the measurements behind both are
// in conv_winograd.cpp). Pure geometry: DnnlConv2d still falls back to the direct kernels
// where oneDNN refuses a problem or asks for too much scratchpad.
#pragma once

#include <optional>

#include "kernels/geometry.hpp"

namespace ht::cpu {

// The passes (kConvForward, ...) to build on Winograd: 3x3 stride-1 convolutions with at
// least 32 channels in and out and pads of at most 1, on AVX-512, each pass where oneDNN
// can block its tiles well (the data gradient where winograd_data_problem has one).
unsigned winograd_passes(const ConvGeom& g);

// The convolution whose data gradient, on Winograd, gives g's: g itself, or g with the
// pads of each axis made equal (the larger of the two) and dx grown at its bottom and right
// edges by the fewest rows and columns, at most an eighth, that block well. g's dy sits in
// its output at (pad_top - g.pad_top, pad_left - g.pad_left), zeros around it; g's dx is
// its dx's top-left corner. nullopt where no size near blocks well.
std::optional<ConvGeom> winograd_data_problem(const ConvGeom& g);

}  // namespace ht::cpu
