// How DnnlConv2d's tensors reach oneDNN's primitives: each argument's reorder between the
// caller's plain layout and the primitive's, through a scratch arena (kernels/cpu/conv.hpp
// ScratchArena; thread_scratch() where the caller has none).
#pragma once

#include <dnnl.hpp>
#include <optional>

#include "kernels/cpu/conv.hpp"

namespace ht::cpu {

// The default arena: growable 64-byte-aligned buffers, one set per thread, shared by
// every DnnlConv2d without an arena of its own (tests, tools).
ScratchArena& thread_scratch();

// One tensor argument: the caller's plain layout and the primitive's layout, with the
// reorder between them when they differ. A port may be framed (the data gradient of
// DnnlConv2d::Impl): the primitive's tensor is larger, the user's sits in it at `offset`;
// an input's frame is zeroed, an output's dropped.
struct DnnlPort {
  dnnl::memory::desc user, prim;
  dnnl::memory::dims offset;    // empty: the same dims
  dnnl::memory::desc interior;  // framed: the user's part of prim
  std::optional<dnnl::reorder> to_prim, to_user;

  void init(const dnnl::engine& eng, const dnnl::memory::desc& u, const dnnl::memory::desc& p, bool output,
            const dnnl::memory::dims& frame_offset = {});
  // The arena bytes its reorder needs (the primitive's tensor), 0 without one.
  size_t extra_bytes() const { return to_prim || to_user ? prim.get_size() : 0; }
  // Memory the primitive reads: the user's buffer, or a reordered copy in `slot`.
  dnnl::memory in(const dnnl::engine& eng, dnnl::stream& s, const float* p, ScratchArena& arena, int slot) const;
  // Memory the primitive writes; finish() copies it to the user's buffer.
  dnnl::memory out(const dnnl::engine& eng, float* p, ScratchArena& arena, int slot) const;
  void finish(const dnnl::engine& eng, dnnl::stream& s, const dnnl::memory& pm, float* p) const;

 private:
  // Zeroes the framed tensor outside the user's interior.
  void zero_frame(float* base) const;
};

}  // namespace ht::cpu
