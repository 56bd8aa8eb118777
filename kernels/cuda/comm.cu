// The summation half of the NCCL allreduce: after an all-gather every rank holds every
// rank's vector and adds them in rank order, so all ranks get the same bits every run.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"

namespace ht::cuda {
namespace {

__global__ void sum_ranks_kernel(const float* gathered, int ranks, size_t len, float* out) {
  HT_GRID_STRIDE(i, len) {
    // float, from zero, in rank order: the same bits as the MPI and local comms.
    float acc = 0.f;
    for (int r = 0; r < ranks; ++r) acc += gathered[size_t(r) * len + i];
    out[i] = acc;
  }
}

}  // namespace

void launch_sum_ranks(const float* gathered, int ranks, size_t len, float* out, cudaStream_t stream) {
  if (!len) return;
  sum_ranks_kernel<<<grid_for(len), kThreads, 0, stream>>>(gathered, ranks, len, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ht::cuda
