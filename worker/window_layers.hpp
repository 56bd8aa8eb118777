// The kernels of the windowed layer kinds (window_layers.cpp) and of the newer pointwise
// ones (pixel_layers.cpp), for layers.cpp's table, and the factory they make layers with.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "worker/layers.hpp"

namespace ht {

// A factory making L(ctx, index, args...).
template <class L, class... Args>
LayerFactory layer_factory(Args... args) {
  return [args...](const LayerContext& ctx, int index) -> std::unique_ptr<Layer> {
    return std::make_unique<L>(ctx, index, args...);
  };
}

// conv2d, depthwise_conv2d, separable_conv2d, conv2d_transpose, max_pool2d, avg_pool2d,
// upsampling2d, resize, zero_padding2d, cropping2d.
std::map<std::string, LayerFactory> window_layer_kernels();

// The kinds of SPEC section 11 that are not windowed (pixel_layers.cpp): multiply,
// layer_norm, scale, drop_path, flatten, channel_shuffle, channel_slice, instance_norm,
// group_norm.
std::map<std::string, LayerFactory> pixel_layer_kernels();

}  // namespace ht
