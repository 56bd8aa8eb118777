// What a rank holds on its device, set up the same way for training and for inference: the
// backend, the comms on it, the parameters and the layers. Destroyed in reverse order of
// creation, so the layers and parameters go before the comms, and the comms (whose
// staging is the backend's memory) before the backend. Recycling destroys it and builds
// it again.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "orchestrator/shard_plan.hpp"
#include "worker/comm/comm.hpp"
#include "worker/comm/counting_comm.hpp"
#include "worker/layers/layers.hpp"
#include "worker/layers/params.hpp"
#include "worker/run/launcher.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {

struct DeviceState {
  // The backend, the device world the launcher's factory makes on it (NCCL; none on the
  // CPU), the sample group's comm and the parameters. With `halo_sent` (training) the
  // world the layers use counts the bytes each peer is sent into it.
  DeviceState(const BackendOptions& options, const DeviceWorldFactory& make_device_world, Comm& host_world,
              const ShardPlan& plan, int rank, Gradients gradients, std::vector<uint64_t>* halo_sent = nullptr);
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;

  // Every layer of the plan's model, then the convolutions' scratch for `use`. Whatever the
  // step holds besides (the optimizer state) is allocated before, as the schedule's hold
  // counts it.
  void make_layers(const LayerContext& context, ConvUse use);

  std::unique_ptr<ComputeBackend> backend;
  std::unique_ptr<Comm> device_world;
  std::unique_ptr<CountingComm> counting;
  Comm* world = nullptr;  // what the layers and the step use: counting, device_world or the host world
  std::unique_ptr<Comm> group;
  std::unique_ptr<ParamStore> params;
  std::vector<std::unique_ptr<Layer>> layers;
};

}  // namespace ht
