// Device memory for one GPU through the counting allocator: plain cudaMalloc (never
// managed memory, which can hang a GPU when oversubscribed); the budget
// (parallel.device_memory) is enforced by the base class before any call here.
#pragma once

#include <string>

#include "worker/runtime/tensor.hpp"

namespace ht::cuda {

class CudaAllocator : public Allocator {
 public:
  CudaAllocator(std::string device_name, int device, uint64_t budget_bytes);

 protected:
  // nullptr when the device itself is out of memory: the base class then throws a
  // DeviceMemoryError that names the owner.
  void* raw_allocate(size_t bytes) override;
  // Never throws: it runs from destructors, also while a failed job unwinds.
  void raw_deallocate(void* ptr) override;

 private:
  int device_;
};

// Page-locked host memory (the offload pool): copies to and from it run at full PCIe speed
// and can overlap compute. Freed blocks are cached: pinning is slow.
class PinnedHostAllocator : public Allocator {
 public:
  explicit PinnedHostAllocator(std::string name);
  ~PinnedHostAllocator() override;

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* ptr) override;
};

// A device buffer that grows on demand and is reused between calls (reduction partials,
// cuDNN workspace, padded copies). Contents are not kept when it grows.
class DeviceScratch {
 public:
  DeviceScratch(Allocator& alloc, std::string what) : alloc_(alloc), what_(std::move(what)) {}
  ~DeviceScratch() { release(); }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  void* get(size_t bytes);
  template <class T>
  T* get_as(size_t count) {
    return static_cast<T*>(get(count * sizeof(T)));
  }
  size_t capacity() const { return bytes_; }
  void release();

 private:
  Allocator& alloc_;
  std::string what_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ht::cuda
