// The kernels of every layer kind, by type: the built-in tables and what was registered.
#include <fmt/format.h>

#include <stdexcept>

#include "worker/layers/layers.hpp"
#include "worker/layers/window_layers.hpp"

namespace ht {

namespace {

std::map<std::string, LayerFactory>& kernels() {
  static std::map<std::string, LayerFactory> table = [] {
    std::map<std::string, LayerFactory> t = basic_layer_kernels();
    t.merge(window_layer_kernels());
    t.merge(pixel_layer_kernels());
    return t;
  }();
  return table;
}

}  // namespace

void register_layer_kernels(const std::string& type, LayerFactory factory) {
  if (!kernels().emplace(type, std::move(factory)).second)
    throw std::logic_error("layer kind '" + type + "' has kernels registered twice");
}

void check_layer_kernels(const ModelSpec& model) {
  for (const LayerSpec& layer : model.layers)
    if (!kernels().count(layer.config.type()))
      throw ConfigError(fmt::format("layer '{}': its kind '{}' has no kernels in this build of halotrain "
                                    "(worker/layers/layers.hpp register_layer_kernels)",
                                    layer.config.name, layer.config.type()));
}

std::unique_ptr<Layer> make_layer(const LayerContext& ctx, int index) {
  const std::string& type = ctx.plan.model.layers[index].config.type();
  auto it = kernels().find(type);
  if (it == kernels().end())
    throw std::logic_error("layer kind '" + type + "' has no kernels registered (worker/layers/layers.hpp)");
  return it->second(ctx, index);
}

}  // namespace ht
