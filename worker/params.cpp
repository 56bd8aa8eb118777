#include "worker/params.hpp"

#include <cmath>

namespace ht {

ParamStore::ParamStore(const ModelSpec& model, ComputeBackend& backend) : backend_(backend) {
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const LayerSpec& layer = model.layers[l];
    for (const WeightSpec& w : layer.weights) {
      ParamRef r;
      r.layer = int(l);
      r.layer_name = layer.config.name;
      r.weight = w.name;
      r.keras_shape = w.keras_shape;
      r.trainable = w.trainable;
      r.count = size_t(w.elements());
      size_t& cursor = w.trainable ? trainable_ : buffer_count_;
      r.offset = cursor;
      cursor += r.count;
      refs_.push_back(r);
    }
  }
  Allocator& a = backend.allocator();
  values_ = Tensor(a, 1, 1, 1, int(trainable_), "parameters");
  grads_ = Tensor(a, 1, 1, 1, int(trainable_), "gradients");
  buffers_ = Tensor(a, 1, 1, 1, int(buffer_count_), "batch-norm moving statistics");
  if (trainable_) backend.fill_zero(grads_.data(), trainable_);
}

const ParamRef* ParamStore::find(int layer, const std::string& weight) const {
  for (const auto& r : refs_)
    if (r.layer == layer && r.weight == weight) return &r;
  return nullptr;
}

float* ParamStore::value(const ParamRef& r) {
  return (r.trainable ? values_.data() : buffers_.data()) + r.offset;
}

float* ParamStore::grad(const ParamRef& r) { return grads_.data() + r.offset; }

void ParamStore::initialize(uint64_t seed) {
  SplitMix64 rng(seed ^ 0x5eed5eed5eedull);
  for (const ParamRef& r : refs_) {
    std::vector<float> host(r.count, 0.0f);
    if (r.weight == "kernel:0") {
      // glorot_uniform: limit = sqrt(6 / (fan_in + fan_out)); Keras shapes put
      // (receptive field..., in, out).
      int64_t receptive = 1;
      for (size_t i = 0; i + 2 < r.keras_shape.size(); ++i) receptive *= r.keras_shape[i];
      const double fan_in = double(r.keras_shape[r.keras_shape.size() - 2] * receptive);
      const double fan_out = double(r.keras_shape.back() * receptive);
      const double limit = std::sqrt(6.0 / (fan_in + fan_out));
      for (float& v : host) v = float((2.0 * rng.uniform() - 1.0) * limit);
      from_keras(r, host.data());
      continue;
    }
    if (r.weight == "gamma:0" || r.weight == "moving_variance:0") std::fill(host.begin(), host.end(), 1.0f);
    backend_.from_host(value(r), host.data(), r.count * sizeof(float));
  }
}

namespace {
// Keras conv kernel (kh, kw, cin, cout) <-> OIHW [cout][cin][kh][kw].
bool is_conv_kernel(const ParamRef& r) { return r.weight == "kernel:0" && r.keras_shape.size() == 4; }
}  // namespace

std::vector<float> ParamStore::to_keras(const ParamRef& r) {
  std::vector<float> internal(r.count);
  backend_.to_host(internal.data(), value(r), r.count * sizeof(float));
  if (!is_conv_kernel(r)) return internal;
  const int64_t kh = r.keras_shape[0], kw = r.keras_shape[1], ci = r.keras_shape[2], co = r.keras_shape[3];
  std::vector<float> keras(r.count);
  for (int64_t o = 0; o < co; ++o)
    for (int64_t i = 0; i < ci; ++i)
      for (int64_t y = 0; y < kh; ++y)
        for (int64_t x = 0; x < kw; ++x)
          keras[((y * kw + x) * ci + i) * co + o] = internal[((o * ci + i) * kh + y) * kw + x];
  return keras;
}

void ParamStore::from_keras(const ParamRef& r, const float* keras) {
  if (!is_conv_kernel(r)) {
    backend_.from_host(value(r), keras, r.count * sizeof(float));
    return;
  }
  const int64_t kh = r.keras_shape[0], kw = r.keras_shape[1], ci = r.keras_shape[2], co = r.keras_shape[3];
  std::vector<float> internal(r.count);
  for (int64_t o = 0; o < co; ++o)
    for (int64_t i = 0; i < ci; ++i)
      for (int64_t y = 0; y < kh; ++y)
        for (int64_t x = 0; x < kw; ++x)
          internal[((o * ci + i) * kh + y) * kw + x] = keras[((y * kw + x) * ci + i) * co + o];
  backend_.from_host(value(r), internal.data(), r.count * sizeof(float));
}

}  // namespace ht
