#include "worker/tensor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <unordered_map>
#include <utility>

#include "kernels/cpu/host_memory.hpp"

namespace ht {

namespace {
std::string mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", double(bytes) / (1 << 20)); }
size_t block_size(size_t bytes) { return (bytes + 63) / 64 * 64; }
}  // namespace

// Free blocks by rounded size; a multimap so trimming can start from the largest. Blocks
// handed out with more than the owner's rounded size, by address.
struct Allocator::Cache {
  std::multimap<size_t, void*> blocks;
  std::unordered_map<void*, size_t> larger;
};

Allocator::Allocator(std::string device, uint64_t budget_bytes, BlockCache cache)
    : device_(std::move(device)), budget_(budget_bytes), cache_mode_(cache), cache_(std::make_unique<Cache>()) {}

Allocator::~Allocator() { release_cached(); }

void* Allocator::allocate(size_t bytes, const std::string& what) {
  if (bytes == 0) return nullptr;
  if (budget_ && in_use_ + bytes > budget_)
    throw DeviceMemoryError(fmt::format(
        "{}: out of device memory allocating {} for {}: {} in use, budget {} "
        "(parallel.device_memory); use a larger grid or parallel.activations",
        device_, mib(bytes), what, mib(in_use_), mib(budget_)));
  void* p = nullptr;
  if (cache_mode_ == BlockCache::Reuse) {
    const size_t block = block_size(bytes);
    size_t got = block;
    p = take_cached(block, &got);
    if (p && got != block) cache_->larger.emplace(p, got);
    if (!p) {
      // Cached blocks of other sizes give way before the reservation passes the highest use
      // so far or the budget: what a worker holds from the system stays at the peak the
      // memory model predicts (several shards share one host's memory).
      // The limit has a margin of an eighth of the peak (at most 512 MiB): the blocks alive
      // at the peak are not those alive elsewhere in the step, and without it one of them
      // is released and faulted in again on every step.
      const uint64_t need = in_use_ + slack_ + block;
      uint64_t limit = std::max<uint64_t>(peak_ + std::min<uint64_t>(peak_ / 8, uint64_t(512) << 20), need);
      if (budget_) limit = std::min<uint64_t>(limit, std::max<uint64_t>(budget_, need));
      trim_cache(limit - need);
      p = raw_allocate(block);
      if (!p && cached_) {
        release_cached();
        p = raw_allocate(block);
      }
    }
  } else {
    p = raw_allocate(bytes);
  }
  if (!p)
    throw DeviceMemoryError(fmt::format("{}: the system refused {} for {}", device_, mib(bytes), what));
  if (cache_mode_ == BlockCache::Reuse) slack_ += held_block(p, bytes) - bytes;
  in_use_ += bytes;
  if (in_use_ > peak_) peak_ = in_use_;
  return p;
}

void Allocator::deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  if (cache_mode_ == BlockCache::Reuse) {
    const size_t block = held_block(ptr, bytes);
    cache_->larger.erase(ptr);
    slack_ -= block - bytes;
    cache_->blocks.emplace(block, ptr);
    cached_ += block;
  } else {
    raw_deallocate(ptr);
  }
  in_use_ -= bytes;
}

void* Allocator::take_cached(size_t block, size_t* got) {
  // The exact size, else the smallest block of at most twice it.
  auto it = cache_->blocks.lower_bound(block);
  if (it == cache_->blocks.end() || it->first > 2 * block) return nullptr;
  void* p = it->second;
  *got = it->first;
  cached_ -= it->first;
  cache_->blocks.erase(it);
  return p;
}

size_t Allocator::held_block(void* ptr, size_t bytes) const {
  auto it = cache_->larger.find(ptr);
  return it == cache_->larger.end() ? block_size(bytes) : it->second;
}

void Allocator::trim_cache(uint64_t keep_at_most) {
  while (cached_ > keep_at_most && !cache_->blocks.empty()) {
    auto it = std::prev(cache_->blocks.end());
    raw_deallocate(it->second);
    cached_ -= it->first;
    cache_->blocks.erase(it);
  }
}

void Allocator::release_cached() { trim_cache(0); }

void* Allocator::raw_allocate(size_t bytes) {
  // 64-byte aligned (vector loads, oneDNN); large blocks on huge pages.
  return cpu::host_alloc(block_size(bytes));
}

void Allocator::raw_deallocate(void* ptr) { cpu::host_free(ptr); }

Tensor::Tensor(Allocator& alloc, int n, int c, int h, int w, const std::string& what)
    : alloc_(&alloc), n_(n), c_(c), h_(h), w_(w) {
  data_ = static_cast<float*>(alloc.allocate(bytes(), what));
}

Tensor::Tensor(Tensor&& o) noexcept
    : alloc_(o.alloc_), data_(o.data_), n_(o.n_), c_(o.c_), h_(o.h_), w_(o.w_) {
  o.data_ = nullptr;
  o.alloc_ = nullptr;
  o.n_ = o.c_ = o.h_ = o.w_ = 0;
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    release();
    std::swap(alloc_, o.alloc_);
    std::swap(data_, o.data_);
    std::swap(n_, o.n_);
    std::swap(c_, o.c_);
    std::swap(h_, o.h_);
    std::swap(w_, o.w_);
  }
  return *this;
}

Tensor::~Tensor() { release(); }

void Tensor::zero() {
  if (data_) std::memset(data_, 0, bytes());
}

void Tensor::release() {
  if (data_ && alloc_) alloc_->deallocate(data_, bytes());
  data_ = nullptr;
  n_ = c_ = h_ = w_ = 0;
}

size_t first_non_finite(const float* data, size_t n) {
  // NaN and Inf have an exponent of all ones. Blocks are OR-reduced (the compiler
  // vectorises that) and only a block with a hit is searched.
  auto bad = [data](size_t i) {
    uint32_t bits;
    std::memcpy(&bits, data + i, sizeof bits);
    return (bits & 0x7f800000u) == 0x7f800000u;
  };
  constexpr size_t kBlock = 4096;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    bool hit = false;
    for (size_t i = b; i < e; ++i) hit |= bad(i);
    if (!hit) continue;
    for (size_t i = b; i < e; ++i)
      if (bad(i)) return i;
  }
  return n;
}

const char* non_finite_name(float value) {
  if (std::isnan(value)) return "NaN";
  return value > 0 ? "+inf" : "-inf";
}

}  // namespace ht
