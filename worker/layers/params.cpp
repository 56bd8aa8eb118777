#include "worker/layers/params.hpp"

#include <algorithm>
#include <cmath>

namespace ht {

ParamStore::ParamStore(const ModelSpec& model, ComputeBackend& backend, Gradients gradients) : backend_(backend) {
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const LayerSpec& layer = model.layers[l];
    for (const WeightSpec& w : layer.weights) {
      ParamRef r;
      r.layer = int(l);
      r.layer_name = layer.config.name;
      r.weight = w.name;
      r.keras_shape = w.keras_shape;
      r.trainable = w.trainable;
      r.layout = w.layout;
      r.init = w.init;
      r.count = size_t(w.elements());
      size_t& cursor = w.trainable ? trainable_ : buffer_count_;
      r.offset = cursor;
      cursor += r.count;
      refs_.push_back(r);
    }
  }
  Allocator& a = backend.allocator();
  values_ = Tensor(a, 1, 1, 1, int(trainable_), "parameters");
  if (gradients == Gradients::Kept) grads_ = Tensor(a, 1, 1, 1, int(trainable_), "gradients");
  buffers_ = Tensor(a, 1, 1, 1, int(buffer_count_), "batch-norm moving statistics");
  if (!grads_.empty()) backend.fill_zero(grads_.data(), trainable_);
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
    if (r.init == WeightInit::GlorotUniform) {
      // limit = sqrt(6 / (fan_in + fan_out)); Keras shapes put (receptive field..., in, out).
      int64_t receptive = 1;
      for (size_t i = 0; i + 2 < r.keras_shape.size(); ++i) receptive *= r.keras_shape[i];
      const double fan_in = double(r.keras_shape[r.keras_shape.size() - 2] * receptive);
      const double fan_out = double(r.keras_shape.back() * receptive);
      const double limit = std::sqrt(6.0 / (fan_in + fan_out));
      for (float& v : host) v = float((2.0 * rng.uniform() - 1.0) * limit);
      from_keras(r, host.data());
      continue;
    }
    if (r.init == WeightInit::Ones) std::fill(host.begin(), host.end(), 1.0f);
    backend_.from_host(value(r), host.data(), r.count * sizeof(float));
  }
}

namespace {

// Keras conv kernel (kh, kw, cin, cout) <-> OIHW [cout][cin][kh][kw].
bool is_conv_kernel(const ParamRef& r) { return r.layout == WeightLayout::ConvKernel; }

// Keras (kh, kw, cin, m) <-> [cin * m][kh][kw]: with o = c * m + j, Keras's element
// (y, x, c, j) is at (y * kw + x) * cin * m + o, the device's at o * kh * kw + y * kw + x.
bool is_depthwise_kernel(const ParamRef& r) { return r.layout == WeightLayout::DepthwiseKernel; }
void depthwise_to_device(const ParamRef& r, const float* keras, float* device) {
  const int64_t taps = r.keras_shape[0] * r.keras_shape[1], outs = int64_t(r.count) / taps;
  for (int64_t o = 0; o < outs; ++o)
    for (int64_t t = 0; t < taps; ++t) device[o * taps + t] = keras[t * outs + o];
}

// Copies the box [start, start + count) of the row-major array `src` of `shape` to `dst`.
void copy_box(const float* src, const std::vector<int64_t>& shape, const std::vector<int64_t>& start,
              const std::vector<int64_t>& count, float* dst) {
  if (shape.empty()) {
    *dst = *src;
    return;
  }
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < count.size(); ++d) rows *= count[d];
  const int64_t row = count.back();
  if (rows == 0 || row == 0) return;
  std::vector<int64_t> at(shape.size() - 1, 0);  // row index within the box
  for (int64_t k = 0; k < rows; ++k, dst += row) {
    int64_t offset = 0;
    for (size_t d = 0; d < at.size(); ++d) offset = offset * shape[d] + start[d] + at[d];
    offset = offset * shape.back() + start.back();
    std::copy(src + offset, src + offset + row, dst);
    for (size_t d = at.size(); d-- > 0;) {
      if (++at[d] < count[d]) break;
      at[d] = 0;
    }
  }
}

Tensor staging_buffer(Allocator& a, size_t count) { return Tensor(a, 1, 1, 1, int(count), "load staging"); }

}  // namespace

std::vector<float> ParamStore::to_keras(const ParamRef& r) {
  std::vector<float> internal(r.count);
  backend_.to_host(internal.data(), value(r), r.count * sizeof(float));
  if (is_depthwise_kernel(r)) {
    std::vector<float> keras(r.count);
    const int64_t taps = r.keras_shape[0] * r.keras_shape[1], outs = int64_t(r.count) / taps;
    for (int64_t o = 0; o < outs; ++o)
      for (int64_t t = 0; t < taps; ++t) keras[t * outs + o] = internal[o * taps + t];
    return keras;
  }
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
  load_keras(r, [&](const std::vector<int64_t>& start, const std::vector<int64_t>& count, float* dst) {
    copy_box(keras, r.keras_shape, start, count, dst);
  });
}

void ParamStore::load_keras(const ParamRef& r, const BoxReader& read) {
  if (r.count == 0) return;
  const bool host = backend_.kind() == Backend::CPU;  // the CPU backend's arena is host memory
  float* dst = value(r);
  const std::vector<int64_t>& shape = r.keras_shape;
  if (is_depthwise_kernel(r)) {  // a few taps per channel: read whole, rearranged on the host
    std::vector<float> keras(r.count), device(r.count);
    read(std::vector<int64_t>(shape.size(), 0), shape, keras.data());
    depthwise_to_device(r, keras.data(), device.data());
    backend_.from_host(dst, device.data(), r.count * sizeof(float));
    return;
  }
  // A conv kernel with one input and one output channel has the same layout on both sides.
  if (!is_conv_kernel(r) || shape[2] * shape[3] == 1) {
    const std::vector<int64_t> origin(shape.size(), 0);
    if (host) return read(origin, shape, dst);
    Tensor staged = staging_buffer(staging_, r.count);
    read(origin, shape, staged.data());
    backend_.from_host(dst, staged.data(), r.count * sizeof(float));
    return;
  }
  const int64_t kh = shape[0], kw = shape[1], ci = shape[2], co = shape[3], taps = kh * kw;
  // Output channels [o0, o0 + no) x input channels [i0, i0 + ni): read into `in` as Keras
  // lays them out, written to `out` as OIHW, where the block is contiguous when ni == ci
  // or no == 1.
  auto transpose = [&](int64_t o0, int64_t no, int64_t i0, int64_t ni, float* in, float* out) {
    read({0, 0, i0, o0}, {kh, kw, ni, no}, in);
    for (int64_t o = 0; o < no; ++o)
      for (int64_t i = 0; i < ni; ++i)
        for (int64_t t = 0; t < taps; ++t) out[(o * ni + i) * taps + t] = in[(t * ni + i) * no + o];
  };
  Tensor staged = staging_buffer(staging_, r.count);
  if (host) return transpose(0, co, 0, ci, staged.data(), dst);
  // A device takes the block from the other half of the staging: whole output channels
  // per block, or runs of input channels when one output channel fills more than half
  // (ci * co >= 2 here, so a half holds at least one channel's taps).
  const int64_t half = int64_t(r.count) / 2;
  float *in = staged.data(), *out = in + half;
  auto send = [&](int64_t offset, int64_t n) { backend_.from_host(dst + offset, out, size_t(n) * sizeof(float)); };
  if (ci * taps <= half) {
    const int64_t step = half / (ci * taps);
    for (int64_t o0 = 0; o0 < co; o0 += step) {
      const int64_t no = std::min(step, co - o0);
      transpose(o0, no, 0, ci, in, out);
      send(o0 * ci * taps, no * ci * taps);
    }
    return;
  }
  const int64_t step = half / taps;
  for (int64_t o = 0; o < co; ++o)
    for (int64_t i0 = 0; i0 < ci; i0 += step) {
      const int64_t ni = std::min(step, ci - i0);
      transpose(o, 1, i0, ni, in, out);
      send((o * ci + i0) * taps, ni * taps);
    }
}

void ParamStore::load_flat(float* dst, size_t count, const BoxReader& read) {
  if (count == 0) return;
  if (backend_.kind() == Backend::CPU) return read({0}, {int64_t(count)}, dst);
  size_t piece = 1;
  for (const ParamRef& r : refs_) piece = std::max(piece, r.count);
  piece = std::min(piece, count);
  Tensor staged = staging_buffer(staging_, piece);
  for (size_t at = 0; at < count; at += piece) {
    const size_t n = std::min(piece, count - at);
    read({int64_t(at)}, {int64_t(n)}, staged.data());
    backend_.from_host(dst + at, staged.data(), n * sizeof(float));
  }
}

}  // namespace ht
