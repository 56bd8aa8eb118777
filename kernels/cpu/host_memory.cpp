#include "kernels/cpu/host_memory.hpp"

#include <sys/mman.h>

#include <cstdlib>

namespace ht::cpu {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kHugeFrom = size_t(8) << 20;  // below this, rounding to 2 MiB wastes too much
}  // namespace

void* host_alloc(size_t bytes) {
  if (bytes >= kHugeFrom) {
    const size_t len = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, len);
    if (p) (void)madvise(p, len, MADV_HUGEPAGE);  // advice only: fine if refused
    return p;
  }
  return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
}

void host_free(void* ptr) { std::free(ptr); }

}  // namespace ht::cpu
