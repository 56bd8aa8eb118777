// Host memory for tensors and kernel scratch: 64-byte aligned, and large blocks on
// transparent huge pages where the kernel allows them (madvise mode). A first touch of
// fresh memory costs one page fault per page, and on virtual machines a fault is dear
// (measured on the 2-core benchmark VM: 400 MiB first touch 1.9-2.2 s on 4 KiB pages,
// 0.5-1.2 s with MADV_HUGEPAGE; a second pass 28 ms either way).
#pragma once

#include <cstddef>

namespace ht::cpu {

// nullptr when the system refuses. Free with host_free.
void* host_alloc(size_t bytes);
void host_free(void* ptr);

}  // namespace ht::cpu
