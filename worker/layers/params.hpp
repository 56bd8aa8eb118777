// Every weight of the model in three contiguous arenas: trainable values, their gradients,
// and non-trainable buffers (BN moving statistics). One arena means one all-reduce and one
// optimizer call per step. Layouts are PyTorch's (conv OIHW), except dense (in, out) as
// Keras; checkpoints convert to Keras layouts.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "orchestrator/model_spec.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {

// Reads the box [start, start + count) (one entry per dimension) of a tensor into host
// memory at `dst`, row-major float32: a block of a file's dataset, or of a host array.
using BoxReader = std::function<void(const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                                     float* dst)>;

struct ParamRef {
  int layer = 0;
  std::string layer_name;
  std::string weight;  // Keras name: "kernel:0", "moving_mean:0", ...
  std::vector<int64_t> keras_shape;
  bool trainable = true;
  WeightLayout layout = WeightLayout::Keras;
  WeightInit init = WeightInit::Zeros;
  size_t offset = 0;  // into values/grads (trainable) or buffers
  size_t count = 0;
};

// Training keeps a gradient per trainable weight; inference has none.
enum class Gradients { Kept, None };

class ParamStore {
 public:
  ParamStore(const ModelSpec& model, ComputeBackend& backend, Gradients gradients = Gradients::Kept);

  const std::vector<ParamRef>& refs() const { return refs_; }
  const ParamRef* find(int layer, const std::string& weight) const;
  float* value(const ParamRef& r);
  float* grad(const ParamRef& r);  // trainable only

  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  Tensor& buffers() { return buffers_; }
  size_t trainable_count() const { return trainable_; }

  // Keras defaults: glorot_uniform kernels, zero biases, gamma 1, beta 0, moving mean 0,
  // moving variance 1; deterministic from `seed`, identical on every rank.
  void initialize(uint64_t seed);

  // Host copy of one weight in Keras layout (conv kernels transposed from OIHW), and back.
  std::vector<float> to_keras(const ParamRef& r);
  void from_keras(const ParamRef& r, const float* keras_data);

  // Loading streams one tensor at a time: every host byte between a file and the arena
  // comes from staging_allocator(), at most one tensor's worth at once, freed on return.
  // On host memory (CPU backend) weights are read in place and conv kernels transposed
  // from the staged copy straight into the arena; on a device a staged block goes over
  // with one copy.
  //
  // One weight whose Keras-layout values `read` gives (its keras_shape must match).
  void load_keras(const ParamRef& r, const BoxReader& read);
  // `count` floats of this backend's memory at `dst` (an optimizer slot) from a 1-D
  // `read`, staged in pieces no larger than the largest weight.
  void load_flat(float* dst, size_t count, const BoxReader& read);
  Allocator& staging_allocator() { return staging_; }

 private:
  ComputeBackend& backend_;
  Allocator staging_{"host (load staging)"};
  std::vector<ParamRef> refs_;
  size_t trainable_ = 0, buffer_count_ = 0;
  Tensor values_, grads_, buffers_;
};

// splitmix64: a tiny, portable generator, so Python test oracles can reproduce shuffles.
struct SplitMix64 {
  uint64_t state;
  explicit SplitMix64(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
};

}  // namespace ht
