// Reads training data one tile at a time: an HDF5 file (SPEC section 4) through hyperslabs,
// `images` [N, H, W, C] (float32, uint8 or uint16) and `labels` [N] or `masks` [N, H, W, 1];
// or a CSV manifest of image files (section 13: PNG, TIFF, DICOM; worker/io/image_files.hpp),
// each read in place and brought to model.input's size by data.fit.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "orchestrator/config.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/shard_plan.hpp"
#include "worker/io/data_options.hpp"

namespace ht {

enum class PixelType { Float32, UInt8, UInt16 };
const char* to_string(PixelType t);  // "float32", "uint8", "uint16"

// Options for a run: model.input, data.images/targets, `classes` = units of the last layer
// for softmax_cross_entropy, masks expected for sigmoid_bce, data.downsample, and larger
// images allowed when data.augment.crop is set.
DataReaderOptions data_reader_options(const Config& config, const ModelSpec& spec);

// Where one model-input-sized image comes from: the window at (top, left) of the file's
// image after box-averaging by DataReaderOptions::downsample, then mirrored. The default
// is the whole image as it is.
struct SampleView {
  int top = 0, left = 0;   // in downsampled pixels
  bool flip_rows = false;  // vertical flip
  bool flip_cols = false;  // horizontal flip
};

// One open data file. Validates everything it can at open (existence, HDF5, shapes,
// dtypes) and throws ConfigError naming the file, the dataset, expected and found; label
// and mask VALUES are checked as they are read. Not shareable between threads (it keeps a
// conversion buffer): each worker opens its own.
class DataReader {
 public:
  DataReader(const std::string& path, const DataReaderOptions& options);
  ~DataReader();
  DataReader(DataReader&&) noexcept;
  DataReader& operator=(DataReader&&) noexcept;

  const std::string& path() const;
  int64_t count() const;  // N
  bool has_masks() const;
  TargetKind target_kind() const;
  PixelType pixel_type() const;
  int height() const;  // model.input's: what every view is
  int width() const;
  int channels() const;
  int view_height() const;  // the file's image after downsampling: where crops may lie
  int view_width() const;
  uint64_t bytes_read() const;  // pixels and mask values read from the file so far, as float32
  // A manifest's identity (worker/io/manifest.hpp manifest_identity); "" for an HDF5 file.
  std::string identity() const;
  // A manifest whose images read as integers (before data.scale): the bits that hold every
  // value, 8 or 16; 0 when some value may not be such an integer (floats, a DICOM rescale,
  // RGB made gray, data.fit: resize, a fractional pad value), or for an HDF5 file.
  int integer_bits() const;
  // Image `index` as a user names it: a manifest row's image path relative to the CSV, ""
  // for an HDF5 file.
  std::string image_name(int64_t index) const;
  // The rows and columns of image `index`'s view that are the image's own: smaller than
  // height() x width() where data.fit: pad padded it (in model.input pixels, rounded up).
  std::pair<int, int> image_extent(int64_t index) const;

  // Writes image `index`'s pixels in `rect` (rows/cols of the view, model.input-sized) to
  // `out` as [C][rows][cols] float, multiplied by `scale` (with data.scale: auto, by the
  // image's own 1 / its integer range instead), then normalised by data.mean and data.std. Reads only the file's block
  // under that rectangle (downsample x larger), in bands. Throws std::out_of_range for an
  // index, rect or view outside the image (a caller bug, not a data problem).
  void read_image_tile(int64_t index, const Rect& rect, float scale, float* out, const SampleView& view = {});
  // Label of image `index` (all labels are cached at open); ConfigError when the value
  // lies outside [0, classes).
  int32_t read_label(int64_t index) const;
  // Writes mask `index` in `rect` of the view to `out` as [rows][cols] of 0/1 (a
  // downsampled mask is 1 where at least half its box is); ConfigError for a file value
  // other than 0 or 1.
  void read_mask_tile(int64_t index, const Rect& rect, float* out, const SampleView& view = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ht
