// The pixels of a manifest's rows (SPEC section 13) in the file pixels every image becomes
// (model.input times data.downsample; for random crops the one size all the images share):
// every row's header is read and checked when it opens, its files are opened as the tiles
// ask, brought to that size by data.fit and to model.input's channels by data.channels.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/io/data_options.hpp"
#include "worker/io/image_files.hpp"
#include "worker/io/manifest.hpp"

namespace ht {

class ManifestImages {
 public:
  // ConfigError naming the CSV line and the file for a row whose image (or mask) is
  // missing, is no image, or whose size or channels cannot become model.input's.
  ManifestImages(const std::string& path, const DataReaderOptions& options);
  ~ManifestImages();

  const Manifest& manifest() const { return manifest_; }
  int height() const { return file_h_; }
  int width() const { return file_w_; }
  // Its targets as DataReader knows them (TargetKind::Labels also when there are none).
  TargetKind targets() const;
  // Rows [row0, row0 + rows) and columns [col0, col0 + cols) of image (or mask) `index`,
  // C channels last, as float (padding: data.pad_value, 0 for masks).
  void read(bool mask, int64_t index, int64_t row0, int64_t col0, int64_t rows, int64_t cols, int C, float* out);
  uint64_t bytes_decoded() const { return decoded_; }
  // The largest value image `index`'s samples can take (data.scale: auto).
  double full_scale(int64_t index) const { return image_info_[size_t(index)].full_scale(); }
  // Image `index`'s own size before data.fit, in file pixels (at data.level).
  std::pair<int, int> image_size(int64_t index) const {
    return {image_info_[size_t(index)].height, image_info_[size_t(index)].width};
  }
  // The rows whose files are decoded whole (image or target not streamed), and the most one
  // reader holds at once for one of them: the floats kept and the samples being decoded.
  struct WholeDecodes {
    int64_t images = 0;
    uint64_t bytes = 0;
    std::string largest;  // "CSV:LINE: FILE (what it is)"
  };
  WholeDecodes whole_decodes() const;
  // DataReader::integer_bits.
  int integer_bits() const;

 private:
  ImageFile& file_of(bool mask, int64_t index);
  // `rows` x `cols` of the file at (r_lo, c_lo) into `dst`, as model.input's C channels.
  void read_file(bool mask, int64_t index, const ImageInfo& info, int64_t r_lo, int64_t c_lo, int rows, int cols,
                 int C, float* dst);
  void read_resized(bool mask, int64_t index, const ImageInfo& info, int64_t row0, int64_t col0, int64_t rows,
                    int64_t cols, int C, float* out);
  [[noreturn]] void fail(const std::string& what) const;

  std::string path_;
  DataReaderOptions opt_;
  Manifest manifest_;
  std::vector<ImageInfo> image_info_, target_info_;
  int file_h_ = 0, file_w_ = 0;
  std::unique_ptr<ImageFile> image_file_, target_file_;  // the files open now
  int64_t image_index_ = -1, target_index_ = -1;
  uint64_t decoded_ = 0;
  std::vector<float> block_;      // a fitted read's part inside the image
  std::vector<float> converted_;  // data.channels: the file's channels before conversion
};

}  // namespace ht
