// `halotrain make-data`: a synthetic, learnable dataset in the data format of SPEC section 4.
#pragma once

#include <cstdint>
#include <string>

#include "orchestrator/config.hpp"
#include "worker/io/data_reader.hpp"

namespace ht {

struct SyntheticOptions {
  int64_t count = 16;
  int height = 1024, width = 768, channels = 1;
  int classes = 2;                          // labels in [0, classes)
  TargetKind targets = TargetKind::Labels;  // Masks: [N, H, W, 1] uint8 instead of labels
  uint64_t seed = 1234;
  PixelType dtype = PixelType::Float32;     // uint8/uint16 store round(v * 255/65535)
  std::string images_name = "images";
  std::string targets_name;                 // empty: "labels" or "masks"
};

// From `data.synthesize` (and data.images/targets) of a config, seeded by `seed`.
SyntheticOptions synthetic_options(const Config& config);

// Writes the dataset: pixel values in [0, 1] (before integer scaling) = uniform noise
// (amplitude 0.15) plus bright Gaussian blobs. With labels, an image of class k holds k+1
// blobs, so the class shows in the mean brightness (learnable by conv + global pool +
// dense). With masks, an image holds 1-4 blobs and the mask is 1 where a blob's normalised
// profile is >= 0.5 (learnable per pixel). Deterministic given `seed`. `images` and
// `masks` are chunked [1, min(H,256), min(W,256), C] and written one chunk row at a time,
// so a 5928 x 4728 image never sits in memory whole. Written to `path.tmp-<pid>`,
// then renamed: a crash never leaves a half-written file under `path`. Creates missing
// parent directories. Throws ConfigError for bad options or an unwritable path.
void write_synthetic_dataset(const std::string& path, const SyntheticOptions& options);

}  // namespace ht
