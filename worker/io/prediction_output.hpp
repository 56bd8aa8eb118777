// Where `halotrain predict` writes (SPEC sections 8 and 13): an HDF5 file whose dataset
// `predictions` holds every image, or a directory with one tiled, compressed BigTIFF per
// input image (uint8 probabilities 0-255, and float32 ones on request), cropped back to the
// image's own size where data.fit padded it; a classifier's scores as a CSV. Rank 0 writes;
// outputs arrive as tiles of rows in any order. Nothing is published until it is whole: each
// file is written under a temporary name and renamed when complete.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ht {

// What the outputs are: [N, H', W', C] probabilities of a fully convolutional model, or
// [N, K] of a classifier, and for a directory each image's name and own extent.
struct PredictionLayout {
  std::vector<int64_t> shape;
  std::vector<std::string> names;            // per image: its file name as the user gave it ("" when none)
  std::vector<std::pair<int, int>> extents;  // per image: rows and columns of the output that are its own
  bool float32 = false;                      // a directory: also NAME-float32.tif
};

// Whether `output` names a directory (an existing one, or a path ending in '/').
bool is_prediction_directory(const std::string& output);

class PredictionSink {
 public:
  virtual ~PredictionSink() = default;
  // Image `index`, output rows [row0, row0 + rows) x cols [col0, col0 + cols), from
  // [C][rows][cols] raw outputs (turned into probabilities here).
  virtual void write_tile(int64_t index, int row0, int col0, int C, int rows, int cols, const float* chw) = 0;
  // Images [first, first + n) of a classifier, [n][K] raw outputs.
  virtual void write_rows(int64_t first, int n, int K, const float* raw) = 0;
  // Publishes what is not yet published; ConfigError naming the file when a write failed.
  virtual void commit() = 0;
};

// ConfigError "--output PATH: ..." when it cannot be created; `input` names the data file
// (a directory's outputs of an HDF5 input are INPUT-STEM-<index>.tif).
std::unique_ptr<PredictionSink> open_prediction_output(const std::string& output, const std::string& input,
                                                       const PredictionLayout& layout);

// SPEC section 8: probabilities, the sigmoid of a single output, the softmax of several.
void output_probabilities(float* v, int k);

}  // namespace ht
