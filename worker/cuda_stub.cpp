// Without CUDA the factory still knows the `cuda` backend and says why it cannot run.
#ifndef HALOTRAIN_HAVE_CUDA
#include <stdexcept>

#include "worker/backend.hpp"

namespace ht {
std::unique_ptr<ComputeBackend> make_cuda_backend(const BackendOptions&) {
  throw std::runtime_error("backend: cuda is not available: halotrain was built without CUDA; use backend: cpu");
}
}  // namespace ht
#endif
