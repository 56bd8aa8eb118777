// One throwing check macro per library (CUDA_CHECK, CUDNN_CHECK, NCCL_CHECK). The message
// reads like a backtrace line: file:line, the call as written, the library's own words.
// Only the CUDA runtime is required here: cuDNN and NCCL are included when present, so the
// cuDNN-free .cu files also build where cuDNN is missing (the sm_37 check build).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#if __has_include(<cudnn.h>)
#include <cudnn.h>
#define HT_HAVE_CUDNN_HEADER 1
#endif
#if __has_include(<nccl.h>)
#include <nccl.h>
#define HT_HAVE_NCCL_HEADER 1
#endif

namespace ht::cuda {

// Thrown by every check macro.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const char* library, const char* call, const std::string& message,
                              const char* file, int line) {
  throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + library + " call `" + call +
                  "` failed: " + message);
}

#ifdef HT_HAVE_CUDNN_HEADER
inline std::string cudnn_message(cudnnStatus_t status) {
  std::string m = cudnnGetErrorString(status);
#if CUDNN_MAJOR >= 9
  // cuDNN 9 keeps a detailed reason for the last failure (which engine, which constraint).
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  if (detail[0]) m += std::string(" (") + detail + ")";
#endif
  return m;
}
#endif

#ifdef HT_HAVE_NCCL_HEADER
inline std::string nccl_message(ncclResult_t result) {
  std::string m = ncclGetErrorString(result);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char* detail = ncclGetLastError(nullptr);
  if (detail && detail[0]) m += std::string(" (") + detail + ")";
#endif
  return m;
}
#endif

}  // namespace ht::cuda

#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    cudaError_t ht_status_ = (call);                                                       \
    if (ht_status_ != cudaSuccess)                                                         \
      ::ht::cuda::fail("CUDA", #call, cudaGetErrorString(ht_status_), __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUDNN_CHECK(call)                                                                          \
  do {                                                                                             \
    cudnnStatus_t ht_status_ = (call);                                                             \
    if (ht_status_ != CUDNN_STATUS_SUCCESS)                                                        \
      ::ht::cuda::fail("cuDNN", #call, ::ht::cuda::cudnn_message(ht_status_), __FILE__, __LINE__); \
  } while (0)

#define NCCL_CHECK(call)                                                                         \
  do {                                                                                           \
    ncclResult_t ht_status_ = (call);                                                            \
    if (ht_status_ != ncclSuccess)                                                               \
      ::ht::cuda::fail("NCCL", #call, ::ht::cuda::nccl_message(ht_status_), __FILE__, __LINE__); \
  } while (0)
