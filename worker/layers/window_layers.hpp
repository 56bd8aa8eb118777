// The kernels of the windowed layer kinds (window_layers.cpp) and of the newer pointwise
// ones (pixel_layers.cpp), for the table of every kind (layer_registry.cpp).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "worker/layers/layers.hpp"

namespace ht {

// conv2d, depthwise_conv2d, separable_conv2d, conv2d_transpose, max_pool2d, avg_pool2d,
// upsampling2d, resize, zero_padding2d, cropping2d.
std::map<std::string, LayerFactory> window_layer_kernels();

// The kinds of SPEC section 11 that are not windowed (pixel_layers.cpp): multiply,
// layer_norm, scale, drop_path, flatten, channel_shuffle, channel_slice, instance_norm,
// group_norm.
std::map<std::string, LayerFactory> pixel_layer_kernels();

}  // namespace ht
