// Without CUDA the NCCL comm's factory still exists and says why it cannot run.
#ifndef HALOTRAIN_HAVE_CUDA
#include "worker/comm/comm.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {

std::unique_ptr<Comm> make_nccl_world_comm(ComputeBackend&) {
  throw BackendUnavailable("backend: cuda is not available: halotrain was built without CUDA; use backend: cpu");
}

}  // namespace ht
#endif
