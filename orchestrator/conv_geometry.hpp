// The convolutions one shard runs, as worker/layers/window_layers.cpp sets them up: the memory
// model sizes the CPU backend's oneDNN scratch from them, and the worker reserves that
// scratch before its first step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/geometry.hpp"
#include "orchestrator/config.hpp"
#include "orchestrator/shard_plan.hpp"

namespace ht {

// One convolution a shard runs, and which of the kernel's passes (kernels/cpu/conv.hpp's
// ConvPasses) it calls.
struct ShardConv {
  ConvGeom geom;
  unsigned passes = 0;
};
enum class ConvUse { Training, Inference };

// Images per (micro-)batch on one rank: batch_size / accumulate / groups, rounded up.
int local_batch(const Config& config, const ShardPlan& plan);
int local_batch(const Config& config, int groups);

// Layer l's convolutions on `rank` at `batch` images: a conv2d's or depthwise_conv2d's
// over its halo-extended input; a separable conv's depthwise one and its 1x1 pointwise
// one; a transposed conv's (whose forward is the kernel's backward data). None for other
// kinds. Inference runs forwards only; training skips the data gradient of the image.
std::vector<ShardConv> layer_convs(const ShardPlan& plan, int layer, int rank, int batch, ConvUse use);
// Every layer's, in layer order.
std::vector<ShardConv> shard_convs(const ShardPlan& plan, int rank, int batch, ConvUse use);

// The CPU backend's oneDNN scratch on `rank`: per slot the largest request of any of its
// convolutions at the local batch, with the threads each worker runs (kernels/cpu/
// threads.hpp); 0 on the CUDA backend (its workspace is counted apart).
uint64_t conv_scratch_bytes(const Config& config, const ShardPlan& plan, int rank, ConvUse use);

// The CPU threads of each rank: parallel.threads, or for auto this machine's share for the
// `in_process` ranks of one process (the ranks on the node under mpirun or srun). The
// launcher starts the workers with it and the memory model sizes oneDNN's scratchpads
// with it, so a set value makes the plan the same wherever it is computed.
int threads_per_rank(const Config& config, int in_process);

// Fixes oneDNN's instruction set for this process at parallel.cpu_isa (before oneDNN's
// first use: conv_scratch_bytes calls it) and returns the one it dispatches to. ConfigError
// when this machine's oneDNN does not reach a set one.
std::string use_cpu_isa(const Config& config);

}  // namespace ht
