// The small models the memory-model tests plan: layer configs by type, and a 64 x 48
// classifier with a batch norm + ReLU + pool block; and what one operation of a step
// schedule allocates.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "orchestrator/config.hpp"
#include "orchestrator/layer_kind.hpp"
#include "orchestrator/step_schedule.hpp"

namespace ht::testing {

inline LayerConfig layer(const std::string& type, const std::vector<std::pair<std::string, LayerValue>>& values = {}) {
  return make_layer_config(type, values);
}
inline LayerConfig conv(int filters, int kernel = 3) {
  return layer("conv2d",
               {{"filters", int64_t(filters)}, {"kernel", int64_t(kernel)}, {"padding", Padding{PaddingMode::Same, 0}}});
}
inline LayerConfig max_pool() { return layer("max_pool2d", {{"pool", int64_t(2)}, {"stride", int64_t(2)}}); }
inline LayerConfig dense(int units) { return layer("dense", {{"units", int64_t(units)}}); }

// 64 x 48 x 1 -> conv 8, BN, relu, pool, conv 16, relu, global pool, dense 2.
inline Config classifier() {
  Config c;
  c.name = "mem";
  c.source_path = "mem.yaml";
  c.model.height = 64;
  c.model.width = 48;
  c.model.channels = 1;
  LayerConfig d = dense(2);
  c.model.layers = {conv(8), layer("batch_norm"), layer("relu"), max_pool(), conv(16),
                    layer("relu"), layer("global_avg_pool"), d};
  c.model.loss = LossType::SoftmaxCrossEntropy;
  c.training.batch_size = 4;
  c.parallel.device_memory = 1ull << 30;
  c.parallel.devices_per_node = 2;
  return c;
}

// The bytes operation (a, l) of the schedule allocates (+) and frees (-), in order.
inline std::vector<int64_t> events_of(const StepSchedule& s, StepAction a, int l) {
  for (const StepOp& op : s.ops)
    if (op.action == a && op.index == l) {
      std::vector<int64_t> bytes;
      for (const MemoryEvent& e : op.events) bytes.push_back(e.bytes);
      return bytes;
    }
  ADD_FAILURE() << step_action_name(a) << " " << l << " not in the schedule";
  return {};
}

}  // namespace ht::testing
