#include "worker/runtime/tensor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include "kernels/cpu/host_memory.hpp"

namespace ht {

namespace {
std::string mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", double(bytes) / (1 << 20)); }
size_t block_size(size_t bytes) { return (bytes + 63) / 64 * 64; }
}  // namespace

// The cache (BlockCache::Reuse) keeps every block obtained from the system as a segment
// cut into pieces: an allocation takes the smallest free piece that holds it (best fit)
// and leaves the rest of it free; a freed piece merges with free neighbours of its segment.
// Only a segment with nothing in use goes back to the system.
struct Allocator::Cache {
  struct Piece {
    char* segment;
    size_t size;
    bool free;
  };
  std::map<char*, Piece> pieces;                   // every piece, by address
  std::set<std::pair<size_t, char*>> free_pieces;  // the free ones, by (size, address)
  std::map<char*, size_t> segments, unused;        // every segment's size; those wholly free

  void add_free(char* at, char* segment, size_t size) {
    pieces[at] = Piece{segment, size, true};
    free_pieces.emplace(size, at);
    if (at == segment && size == segments.at(segment)) unused.emplace(segment, size);
  }
  void take_free(std::map<char*, Piece>::iterator it) {
    free_pieces.erase({it->second.size, it->first});
    unused.erase(it->first);
  }
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
    // Wholly free segments give way before the reservation passes the highest use so far
    // or the budget: what a worker holds from the system stays near the peak the memory
    // model predicts (several shards share one host's memory). The limit has a margin of
    // a quarter of the peak (at most 512 MiB) for the pieces left between blocks: the demo
    // at 4096 x 4096 holds 1.19x its peak in blocks a step reuses whole.
    const uint64_t need = reserved_ - cached_ + block;  // the pieces in use and this one
    uint64_t limit = std::max<uint64_t>(peak_ + std::min<uint64_t>(peak_ / 4, uint64_t(512) << 20), need);
    if (budget_) limit = std::min<uint64_t>(limit, std::max<uint64_t>(budget_, need));
    // A wholly free segment more than twice the request is cut only when a segment of the
    // request's own would pass the limit: a small tensor left inside it keeps the large
    // tensor that used it from fitting there again next step, and the reservation grows.
    p = take_cached(block, /*spare_whole=*/reserved_ + block <= limit);
    if (!p) {
      trim_cache(limit - block);
      p = new_segment(block);
      if (!p && cached_) {
        release_cached();
        p = new_segment(block);
      }
    }
  } else {
    p = raw_allocate(bytes);
  }
  if (!p)
    throw DeviceMemoryError(fmt::format("{}: the system refused {} for {}", device_, mib(bytes), what));
  in_use_ += bytes;
  if (in_use_ > peak_) peak_ = in_use_;
  if (observer_) observer_->allocation(int64_t(bytes));
  return p;
}

void Allocator::pass_on(size_t bytes) {
  if (!observer_ || !bytes) return;
  observer_->allocation(-int64_t(bytes));
  observer_->allocation(int64_t(bytes));
}

void Allocator::deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  in_use_ -= bytes;
  if (observer_) observer_->allocation(-int64_t(bytes));
  if (cache_mode_ != BlockCache::Reuse) {
    raw_deallocate(ptr);
    return;
  }
  Cache& c = *cache_;
  auto it = c.pieces.find(static_cast<char*>(ptr));
  char* at = it->first;
  char* segment = it->second.segment;
  size_t size = it->second.size;
  cached_ += size;
  // Merge with the free neighbours within the segment.
  if (auto next = std::next(it); next != c.pieces.end() && next->second.free && next->second.segment == segment) {
    size += next->second.size;
    c.take_free(next);
    c.pieces.erase(next);
  }
  if (it != c.pieces.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->second.segment == segment) {
      at = prev->first;
      size += prev->second.size;
      c.take_free(prev);
      c.pieces.erase(it);
    }
  }
  c.add_free(at, segment, size);
}

void* Allocator::take_cached(size_t block, bool spare_whole) {
  Cache& c = *cache_;
  auto best = c.free_pieces.lower_bound({block, nullptr});
  if (spare_whole)
    while (best != c.free_pieces.end() && best->first > 2 * block && c.unused.count(best->second)) ++best;
  if (best == c.free_pieces.end()) return nullptr;
  char* at = best->second;
  auto it = c.pieces.find(at);
  const size_t size = it->second.size;
  char* segment = it->second.segment;
  c.take_free(it);
  it->second = Cache::Piece{segment, block, false};
  if (size > block) c.add_free(at + block, segment, size - block);
  cached_ -= block;
  return at;
}

void* Allocator::new_segment(size_t block) {
  char* p = static_cast<char*>(raw_allocate(block));
  if (!p) return nullptr;
  cache_->segments.emplace(p, block);
  cache_->pieces[p] = Cache::Piece{p, block, false};
  reserved_ += block;
  return p;
}

void Allocator::trim_cache(uint64_t keep_at_most) {
  // The largest wholly free segments go first.
  Cache& c = *cache_;
  while (reserved_ > keep_at_most && !c.unused.empty()) {
    auto largest = std::max_element(c.unused.begin(), c.unused.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; });
    char* segment = largest->first;
    const size_t size = largest->second;
    c.take_free(c.pieces.find(segment));
    c.pieces.erase(segment);
    c.segments.erase(segment);
    raw_deallocate(segment);
    cached_ -= size;
    reserved_ -= size;
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
    : moments_(std::move(o.moments_)),
      alloc_(o.alloc_), data_(o.data_), n_(o.n_), c_(o.c_), h_(o.h_), w_(o.w_) {
  o.data_ = nullptr;
  o.alloc_ = nullptr;
  o.n_ = o.c_ = o.h_ = o.w_ = 0;
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    release();
    std::swap(moments_, o.moments_);
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
  moments_.reset();
  if (data_) std::memset(data_, 0, bytes());
}

void Tensor::pass_on() {
  moments_.reset();
  if (data_ && alloc_) alloc_->pass_on(bytes());
}

void Tensor::release() {
  moments_.reset();
  if (data_ && alloc_) alloc_->deallocate(data_, bytes());
  data_ = nullptr;
  n_ = c_ = h_ = w_ = 0;
}

}  // namespace ht
