// Dropout's mask (SPEC section 7), and drop_path's (section 11): whether an element is kept is a function of the seed, the
// layer, the step, the image's position in the step's batch, the channel and the element's
// pixel in the whole image, so it is the same on every grid, every backend and after
// resume. Shared by the CPU and CUDA kernels and by the Python oracle's copy of it.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define HT_HOST_DEVICE __host__ __device__
#else
#define HT_HOST_DEVICE
#endif

namespace ht {

// splitmix64's finaliser.
HT_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct DropoutMask {
  uint64_t key = 0;         // dropout_key(seed, layer, step)
  int64_t first_image = 0;  // the batch position of the tensor's image 0
  int64_t row0 = 0, col0 = 0;  // the tensor's pixel (0, 0) in the whole image
  double rate = 0;
  float scale = 1;          // 1 / (1 - rate), applied to what is kept
};

HT_HOST_DEVICE inline uint64_t dropout_key(uint64_t seed, int layer, int64_t step) {
  return mix64(mix64(mix64(seed) ^ uint64_t(layer)) ^ uint64_t(step));
}

// Element (image, channel, row, col) of the tensor: kept or dropped.
HT_HOST_DEVICE inline bool dropout_keeps(const DropoutMask& m, int64_t image, int channel, int64_t row,
                                         int64_t col) {
  uint64_t h = mix64(m.key ^ uint64_t(m.first_image + image));
  h = mix64(h ^ uint64_t(channel));
  h = mix64(h ^ uint64_t(m.row0 + row));
  h = mix64(h ^ uint64_t(m.col0 + col));
  return double(h >> 11) * (1.0 / 9007199254740992.0) >= m.rate;  // uniform in [0, 1) vs rate
}

// Stochastic depth (drop_path): image `position` of the step's batch is kept whole or
// dropped whole, a function of the seed, layer and step alone (the same on every shard).
HT_HOST_DEVICE inline bool drop_path_keeps(uint64_t key, int64_t position, double rate) {
  return double(mix64(key ^ uint64_t(position)) >> 11) * (1.0 / 9007199254740992.0) >= rate;
}

}  // namespace ht
