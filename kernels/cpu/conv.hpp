// 2-D convolution on NCHW tensors: plain loops (float and double; the double path is
// the numerical reference) and a oneDNN float path with cached primitives.
#pragma once

#include <cstddef>
#include <algorithm>
#include <functional>
#include <memory>

#include "kernels/geometry.hpp"

namespace ht::cpu {

// Geometry of one convolution. Padding may be asymmetric (TensorFlow `same` puts the odd
// pixel at bottom/right; a shard's halo makes it anything). Output size uses floor.
using ::ht::ConvGeom;  // kernels/geometry.hpp: shared with the CUDA kernels

// Throws std::invalid_argument when a field is out of range or the output is empty.
void validate(const ConvGeom& g);

// Cross-correlation as torch.nn.functional.conv2d. w is [cout][cin][kh][kw]; bias may be
// null. All outputs are overwritten.
template <class T>
void conv2d_forward(const ConvGeom& g, const T* x, const T* w, const T* bias, T* y);
template <class T>
void conv2d_backward_data(const ConvGeom& g, const T* dy, const T* w, T* dx);
// dbias may be null.
template <class T>
void conv2d_backward_weights(const ConvGeom& g, const T* x, const T* dy, T* dw, T* dbias);

// True when the float loops above run on AVX2 or AVX-512 on this CPU (chosen at run
// time; the build itself targets baseline x86-64).
bool conv_loops_vectorised();

// Scratch memory a DnnlConv2d works in: reorder buffers for the blocked layouts oneDNN
// prefers, and oneDNN's own scratchpad (user mode), in four slots. The worker's arena
// takes them from its counting allocator, sized before the first step by
// dnnl_conv_scratch() so that the memory model knows them to the byte.
enum ScratchSlot { kScratchA, kScratchB, kScratchC, kScratchPad, kScratchSlots };
struct ConvScratch {
  size_t slot[kScratchSlots] = {};
  size_t total() const { return slot[0] + slot[1] + slot[2] + slot[3]; }
  void include(const ConvScratch& o) {  // each slot the larger of the two
    for (int i = 0; i < kScratchSlots; ++i) slot[i] = std::max(slot[i], o.slot[i]);
  }
};
class ScratchArena {
 public:
  virtual ~ScratchArena() = default;
  // At least `bytes` of 64-byte-aligned memory for `slot`. Its contents stay until a
  // request for more bytes of the same slot (DnnlConv2d::backward reads dy's reorder,
  // written by one pass, in the next).
  virtual void* get(int slot, size_t bytes) = 0;
};
// Which of a conv's three passes a caller runs (a bit set).
enum ConvPasses : unsigned { kConvForward = 1, kConvBackwardData = 2, kConvBackwardWeights = 4, kConvAllPasses = 7 };
// Every slot's largest request of a DnnlConv2d of `g` over `passes`, with and without
// bias, when its caller runs `threads` OpenMP threads (oneDNN sizes its scratchpad by
// them). Thread-safe; results are cached.
ConvScratch dnnl_conv_scratch(const ConvGeom& g, unsigned passes, int threads);

// The fast float path. Primitives are built on first use and rebuilt when the calling
// thread's OpenMP thread count changes. Inputs and outputs are plain NCHW / OIHW; when
// oneDNN prefers a blocked layout the data is reordered through the scratch arena (by
// default one per thread, shared by all instances). Same semantics as the plain loops;
// not safe to call one instance from two threads at once. 3x3 stride-1 convolutions with
// at most 16 input channels run the passes where they measured faster on the
// register-blocked kernels of conv_small.hpp, and with one input channel the weight
// gradient runs the loops above: faster there than oneDNN's padded 16-channel blocks.
// With 32 channels and more in and out they run oneDNN's Winograd kernels where it has them.
// Which kernels a DnnlConv2d runs: for each pass the fastest measured for its geometry
// (the default), or oneDNN's direct ones alone (what the benchmarks hold the others against).
enum class ConvKernels { Fastest, OneDnnOnly };

class DnnlConv2d {
 public:
  explicit DnnlConv2d(const ConvGeom& g, ScratchArena* arena = nullptr, ConvKernels kernels = ConvKernels::Fastest);
  ~DnnlConv2d();
  DnnlConv2d(DnnlConv2d&&) noexcept;
  DnnlConv2d& operator=(DnnlConv2d&&) noexcept;

  const ConvGeom& geom() const { return g_; }
  void forward(const float* x, const float* w, const float* bias, float* y);
  // forward, then a ReLU over y in the pass that writes it: relu_forward's bits for every
  // number, but that on oneDNN's kernels an output of -0 comes out +0 (equal to it) and a
  // NaN, which relu_forward passes, may come out 0 (the small-channel kernels use
  // relu_forward's test).
  void forward_relu(const float* x, const float* w, const float* bias, float* y);
  // forward, and where it runs on conv_small.hpp's kernels in bands that hold whole moment
  // blocks (small_conv_moments_in_pass), y's channel moments summed band by band as each is
  // written (norm.hpp channel_moments of y, to the bit): returns whether it made them.
  bool forward_with_moments(const float* x, const float* w, const float* bias, float* y, double* mean, double* m2);
  void backward_data(const float* dy, const float* w, float* dx);
  void backward_weights(const float* x, const float* dy, float* dw, float* dbias);
  // Both backward passes as backward_weights (when dw is not null) and then
  // backward_data into dx_buffer() (called between them, so a caller can free what only
  // the weight gradient reads before dx exists; null: no dx). Where both passes take dy in
  // the same blocked layout it is reordered once: a pass over dy fewer (2x32x768x768:
  // 11 ms of a 2-thread AVX-512 step's ~600). Same results as the two calls.
  void backward(const float* x, const float* dy, const float* w, float* dw, float* dbias,
                const std::function<float*()>& dx_buffer);

  // dnnl_conv_scratch() of this geometry at the calling thread's thread count.
  ConvScratch scratch_need(unsigned passes) const;
  // The passes whose oneDNN primitives are built on its Winograd kernels (3x3 stride 1, 32
  // channels and more in and out, on CPUs where oneDNN has them); a pass's primitive is
  // built by its first call or by scratch_need.
  unsigned on_winograd() const;

 private:
  struct Impl;
  bool weights_on_loops() const;  // the weight gradient on the float loops above
  void run_forward(const float* x, const float* w, const float* bias, float* y, bool relu);
  ConvGeom g_;
  ConvKernels kernels_;
  unsigned small_ = 0;  // the passes conv_small.hpp's kernels run
  std::unique_ptr<Impl> impl_;
};

}  // namespace ht::cpu
