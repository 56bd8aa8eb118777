// How a data file is read (worker/io/data_reader.hpp): what the model needs of its images and
// targets, and how a manifest's image files become model.input (SPEC sections 4 and 13).
// Apart from the reader so the manifest's images (worker/io/manifest_images.hpp) need not
// include it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "orchestrator/config.hpp"

namespace ht {

enum class TargetKind { Labels, Masks };
inline const char* to_string(TargetKind k) { return k == TargetKind::Labels ? "labels" : "masks"; }

struct DataReaderOptions {
  std::string images = "images";   // dataset names (data.images / data.targets)
  std::string targets = "labels";  // empty: the file's targets are not read (prediction)
  int height = 0, width = 0, channels = 0;  // model.input [H, W, C] the images must match
  int downsample = 1;        // the file's images are downsample x larger; read box-averaged
  bool larger_ok = false;    // random crops: the (downsampled) images may be larger than model.input
  int classes = 0;                          // labels must lie in [0, classes); 0: unchecked
  std::optional<TargetKind> expect;         // what the loss needs; nullopt: either
  std::string key = "data.train";           // the config key naming the file, for messages
  // Manifests (SPEC section 13): how an image of another size becomes model.input's, the
  // value of padded pixels (in the file's units, before data.scale), the pyramid level.
  DataFit fit = DataFit::Error;
  double pad_value = 0;
  int level = 0;
  bool scale_auto = false;  // data.scale: auto: each image's integer range to [0, 1]
  std::vector<double> mean, std;  // per channel, after the scale: (x - mean) / std
  bool convert_channels = false;  // data.channels: gray and RGB images become model.input's channels
};

}  // namespace ht
