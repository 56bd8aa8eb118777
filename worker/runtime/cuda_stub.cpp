// Without CUDA the factories still know the `cuda` backend and say why it cannot run.
#ifndef HALOTRAIN_HAVE_CUDA
#include "worker/runtime/backend.hpp"

namespace ht {
namespace {
[[noreturn]] void built_without_cuda() {
  throw BackendUnavailable("backend: cuda is not available: halotrain was built without CUDA; use backend: cpu");
}
}  // namespace

std::unique_ptr<ComputeBackend> make_cuda_backend(const BackendOptions&) { built_without_cuda(); }
MemoryOps cuda_memory_ops() { built_without_cuda(); }
}  // namespace ht
#endif
