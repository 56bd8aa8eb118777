// Sizes the device backends allocate by and the memory model predicts with: one home, so
// the two cannot drift apart.
#pragma once

#include <cstdint>

namespace ht {

// The CUDA backend's cuDNN workspace: shared by every convolution of a backend, at most
// this large (it is the largest any algorithm chosen under the limit asked for).
constexpr uint64_t kConvWorkspaceLimit = uint64_t(256) << 20;

// A device scratch buffer grows to this rounding of the bytes asked for (4 KiB steps below
// 1 MiB, 1 MiB steps above), so slowly growing requests do not reallocate every call.
constexpr uint64_t round_device_scratch(uint64_t bytes) {
  const uint64_t unit = bytes < (uint64_t(1) << 20) ? 4096 : uint64_t(1) << 20;
  return (bytes + unit - 1) / unit * unit;
}

}  // namespace ht
