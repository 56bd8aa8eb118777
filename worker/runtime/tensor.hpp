// Host tensors and the counting allocator every allocation goes through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ht {


// Exceeding the device budget (`parallel.device_memory`): a clear error naming what was
// being allocated, never a crash.
class DeviceMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Counts bytes in use and the peak on one device (one rank's share of host memory on the
// CPU backend), and enforces a budget. Not thread-safe: one allocator per worker.
//
// With BlockCache::Reuse the blocks obtained from the system are kept as segments and
// cut into pieces (best fit; a freed piece merges with its free neighbours), as in
// PyTorch's caching allocator: a training step asks for the same sizes every step, so
// after the first step no memory comes from the system (on the host: no page faults, no
// mmap/munmap of 100 MB tensors), even where a size freed in one layer is asked for in
// pieces by the next. in_use() and peak() count what the owners asked for; reserved()
// counts the segments, cached() their free pieces. A segment with nothing in use is
// released when the reservation would pass the peak in use so far (plus a quarter, at
// most 512 MiB) or the budget, when the system refuses memory, by release_cached() and on
// destruction. A subclass that enables the cache must call release_cached() in its own
// destructor (the base destructor cannot reach the subclass's raw_deallocate).
enum class BlockCache { Off, Reuse };

// Sees every allocation (> 0 bytes) and free (< 0) an Allocator makes, in order.
class AllocationObserver {
 public:
  virtual ~AllocationObserver() = default;
  virtual void allocation(int64_t bytes) = 0;
};

class Allocator {
 public:
  explicit Allocator(std::string device, uint64_t budget_bytes = 0, BlockCache cache = BlockCache::Off);
  virtual ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // `what` names the owner (a layer, "optimizer state", ...) for the error message.
  void* allocate(size_t bytes, const std::string& what);
  void deallocate(void* ptr, size_t bytes);
  // `bytes` in use change owners (an input becomes its own gradient): nothing is freed or
  // allocated; the observer sees them freed and allocated again, as the step schedule
  // counts them (from one kind of memory to another).
  void pass_on(size_t bytes);
  // Returns every cached block to the system (state recycle, before a large allocation
  // elsewhere). Blocks in use are untouched.
  void release_cached();

  uint64_t in_use() const { return in_use_; }
  uint64_t peak() const { return peak_; }
  uint64_t reserved() const { return cache_mode_ == BlockCache::Reuse ? reserved_ : in_use_; }  // held from the system
  uint64_t cached() const { return cached_; }
  uint64_t budget() const { return budget_; }
  void set_budget(uint64_t bytes) { budget_ = bytes; }
  void reset_peak() { peak_ = in_use_; }
  const std::string& device() const { return device_; }
  void set_observer(AllocationObserver* observer) { observer_ = observer; }  // null: none

 protected:
  virtual void* raw_allocate(size_t bytes);
  virtual void raw_deallocate(void* ptr);

 private:
  // The smallest free piece that holds `block` (with spare_whole, not a wholly free segment
  // more than twice it), cut to size; or null.
  void* take_cached(size_t block, bool spare_whole);
  void* new_segment(size_t block);   // from the system, or null
  void trim_cache(uint64_t keep_at_most);  // releases wholly free segments

  std::string device_;
  AllocationObserver* observer_ = nullptr;
  uint64_t budget_ = 0;  // 0: unlimited
  uint64_t in_use_ = 0, peak_ = 0;
  BlockCache cache_mode_;
  uint64_t reserved_ = 0;  // the segments' bytes
  uint64_t cached_ = 0;    // their free pieces' bytes
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

// Each channel's mean and sum of squared deviations about it (ComputeBackend::channel_moments).
struct ChannelMoments {
  std::vector<double> mean, m2;
};

// A float32 NCHW tensor owning its memory through an Allocator. Move-only.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Allocator& alloc, int n, int c, int h, int w, const std::string& what);
  Tensor(Tensor&&) noexcept;
  Tensor& operator=(Tensor&&) noexcept;
  ~Tensor();

  float* data() { return data_; }
  const float* data() const { return data_; }
  int n() const { return n_; }
  int c() const { return c_; }
  int h() const { return h_; }
  int w() const { return w_; }
  size_t size() const { return size_t(n_) * c_ * h_ * w_; }
  size_t bytes() const { return size() * sizeof(float); }
  bool empty() const { return data_ == nullptr; }
  void zero();
  void release();  // frees now
  void pass_on();  // Allocator::pass_on of its memory
  // Its values' channel moments as the kernel that wrote them made them
  // (ConvKernel::forward_with_moments), or null. They hold because no layer's forward
  // writes its inputs (a backward writing over an activation first passes its memory on);
  // zero, release and pass_on drop them.
  const ChannelMoments* moments() const { return moments_.get(); }
  void set_moments(ChannelMoments m) { moments_ = std::make_unique<ChannelMoments>(std::move(m)); }

 private:
  std::unique_ptr<ChannelMoments> moments_;
  Allocator* alloc_ = nullptr;
  float* data_ = nullptr;
  int n_ = 0, c_ = 0, h_ = 0, w_ = 0;
};

}  // namespace ht
