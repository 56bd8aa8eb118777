#include "worker/run/device_state.hpp"

#include "orchestrator/conv_geometry.hpp"

namespace ht {

DeviceState::DeviceState(const BackendOptions& options, const DeviceWorldFactory& make_device_world, Comm& host_world,
                         const ShardPlan& plan, int rank, Gradients gradients, std::vector<uint64_t>* halo_sent) {
  backend = make_backend(options);
  if (make_device_world) device_world = make_device_world(*backend);
  world = device_world ? device_world.get() : &host_world;
  if (halo_sent) {
    counting = std::make_unique<CountingComm>(*world, *halo_sent);
    world = counting.get();
  }
  group = world->split(plan.group_of(rank));
  params = std::make_unique<ParamStore>(plan.model, *backend, gradients);
}

void DeviceState::make_layers(const LayerContext& context, ConvUse use) {
  layers.clear();
  for (int l = 0; l < int(context.plan.model.layers.size()); ++l) layers.push_back(make_layer(context, l));
  backend->reserve_conv_scratch(shard_convs(context.plan, context.rank, context.local_batch, use));
}

}  // namespace ht
