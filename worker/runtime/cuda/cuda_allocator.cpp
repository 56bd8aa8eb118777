#include "worker/runtime/cuda/cuda_allocator.hpp"

#include <utility>

#include "kernels/cuda/check.hpp"
#include "kernels/device_memory.hpp"

namespace ht::cuda {

CudaAllocator::CudaAllocator(std::string device_name, int device, uint64_t budget_bytes)
    : Allocator(std::move(device_name), budget_bytes), device_(device) {}

void* CudaAllocator::raw_allocate(size_t bytes) {
  CUDA_CHECK(cudaSetDevice(device_));
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls do not see it
    return nullptr;
  }
  CUDA_CHECK(status);
  return p;
}

void CudaAllocator::raw_deallocate(void* ptr) {
  // A failure here (a context already torn down at exit) leaves nothing to recover.
  if (cudaSetDevice(device_) == cudaSuccess) (void)cudaFree(ptr);
  (void)cudaGetLastError();
}

PinnedHostAllocator::PinnedHostAllocator(std::string name)
    : Allocator(std::move(name), 0, BlockCache::Reuse) {}

PinnedHostAllocator::~PinnedHostAllocator() { release_cached(); }

void* PinnedHostAllocator::raw_allocate(size_t bytes) {
  void* p = nullptr;
  if (cudaMallocHost(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

void PinnedHostAllocator::raw_deallocate(void* ptr) {
  (void)cudaFreeHost(ptr);
  (void)cudaGetLastError();
}

void* DeviceScratch::get(size_t bytes) {
  if (bytes <= bytes_) return ptr_;
  release();
  // Round up so slowly growing requests do not reallocate (and synchronize) every call;
  // near the budget the exact size may still fit.
  size_t rounded = size_t(round_device_scratch(bytes));
  try {
    ptr_ = alloc_.allocate(rounded, what_);
  } catch (const DeviceMemoryError&) {
    if (rounded == bytes) throw;
    rounded = bytes;
    ptr_ = alloc_.allocate(rounded, what_);
  }
  bytes_ = rounded;
  return ptr_;
}

void DeviceScratch::release() {
  if (ptr_) alloc_.deallocate(ptr_, bytes_);
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace ht::cuda
