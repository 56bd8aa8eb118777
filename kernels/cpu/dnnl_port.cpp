#include "kernels/cpu/dnnl_port.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/host_memory.hpp"

namespace ht::cpu {

using dnnl::memory;

namespace {

class ThreadScratch : public ScratchArena {
 public:
  void* get(int slot, size_t bytes) override {
    bytes = std::max<size_t>(bytes, 64);
    if (slot >= int(bufs_.size())) bufs_.resize(slot + 1);
    Buf& b = bufs_[slot];
    if (b.bytes < bytes) {
      b.ptr.reset();
      b.ptr.reset(static_cast<char*>(host_alloc(bytes)));
      if (!b.ptr) throw std::bad_alloc();
      b.bytes = bytes;
    }
    return b.ptr.get();
  }

 private:
  struct Free {
    void operator()(char* p) const { host_free(p); }
  };
  struct Buf {
    std::unique_ptr<char, Free> ptr;
    size_t bytes = 0;
  };
  std::vector<Buf> bufs_;
};

}  // namespace

ScratchArena& thread_scratch() {
  static thread_local ThreadScratch s;
  return s;
}

void DnnlPort::init(const dnnl::engine& eng, const memory::desc& u, const memory::desc& p, bool output,
                    const memory::dims& frame_offset) {
  user = u;
  prim = p;
  offset = frame_offset;
  to_prim.reset();
  to_user.reset();
  if (!offset.empty()) {
    interior = p.submemory_desc(u.dims(), offset);
    if (output) {
      to_user = dnnl::reorder(dnnl::reorder::primitive_desc(eng, interior, eng, u));
      return;
    }
    // zero_frame's layouts: NCHW with at most an inner block of channels (what oneDNN's
    // convolutions take).
    const auto& d = p.data;
    const auto& blk = d.format_desc.blocking;
    if (d.format_kind != dnnl_blocked || d.ndims != 4 || blk.inner_nblks > 1 ||
        (blk.inner_nblks == 1 && blk.inner_idxs[0] != 1))
      throw std::logic_error("DnnlConv2d: a framed tensor in a layout other than channel blocks");
    to_prim = dnnl::reorder(dnnl::reorder::primitive_desc(eng, u, eng, interior));
    return;
  }
  if (u == p) return;
  if (output)
    to_user = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p, eng, u));
  else
    to_prim = dnnl::reorder(dnnl::reorder::primitive_desc(eng, u, eng, p));
}

memory DnnlPort::in(const dnnl::engine& eng, dnnl::stream& s, const float* p, ScratchArena& arena, int slot) const {
  memory um(user, eng, const_cast<float*>(p));
  if (!to_prim) return um;
  memory pm(prim, eng, arena.get(slot, prim.get_size()));
  if (!offset.empty()) {
    zero_frame(static_cast<float*>(pm.get_data_handle()));
    memory inside(interior, eng, pm.get_data_handle());
    to_prim->execute(s, um, inside);
    return pm;
  }
  to_prim->execute(s, um, pm);
  return pm;
}

// The frame's layout (checked by init) is NCHW with at most an inner block of channels:
// each (n, channel block, h, w) holds one contiguous block.
void DnnlPort::zero_frame(float* base) const {
  const dnnl_memory_desc_t& d = prim.data;
  const auto& blk = d.format_desc.blocking;
  const memory::dim inner = blk.inner_nblks ? blk.inner_blks[0] : 1;
  const memory::dim n = d.padded_dims[0], cb = d.padded_dims[1] / inner, h = d.padded_dims[2],
                    w = d.padded_dims[3];
  const memory::dims& in = user.dims();
  const memory::dim top = offset[2], bottom = offset[2] + in[2], left = offset[3], right = offset[3] + in[3];
  const auto* st = blk.strides;
  const bool rows_dense = st[3] == inner && st[2] == w * inner;
  for (memory::dim i = 0; i < n; ++i)
    for (memory::dim c = 0; c < cb; ++c) {
      float* plane = base + d.offset0 + i * st[0] + c * st[1];
      auto zero = [&](memory::dim y, memory::dim x0, memory::dim x1) {
        if (rows_dense) {
          std::memset(plane + y * st[2] + x0 * inner, 0, sizeof(float) * size_t((x1 - x0) * inner));
          return;
        }
        for (memory::dim x = x0; x < x1; ++x) std::memset(plane + y * st[2] + x * st[3], 0, sizeof(float) * inner);
      };
      for (memory::dim y = 0; y < h; ++y) {
        if (y < top || y >= bottom) {
          zero(y, 0, w);
        } else {
          zero(y, 0, left);
          zero(y, right, w);
        }
      }
    }
}

memory DnnlPort::out(const dnnl::engine& eng, float* p, ScratchArena& arena, int slot) const {
  if (!to_user) return memory(user, eng, p);
  return memory(prim, eng, arena.get(slot, prim.get_size()));
}

void DnnlPort::finish(const dnnl::engine& eng, dnnl::stream& s, const memory& pm, float* p) const {
  if (!to_user) return;
  memory um(user, eng, p);
  memory src = offset.empty() ? pm : memory(interior, eng, pm.get_data_handle());
  to_user->execute(s, src, um);
}

}  // namespace ht::cpu
