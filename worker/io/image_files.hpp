// Image files read in place (SPEC section 13): PNG, JPEG, TIFF and BigTIFF, DICOM and
// whole-slide images, by their content, through the libraries Debian ships (libpng,
// libjpeg, libtiff, GDCM, OpenSlide: a file OpenSlide knows by its vendor goes to it first,
// a plain tiled TIFF to libtiff). A reader returns a
// block of rows and columns as float, channels last, in the file's own values: DICOM's
// MONOCHROME1 and Presentation LUT Shape INVERSE inverted on the stored values, then its
// rescale slope and intercept applied; nothing else (no VOI LUT, no gamma).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/io/image_info.hpp"

namespace ht {

// Reads the header of `path` at pyramid `level` (TIFF; 0 elsewhere). ConfigError naming the
// file and what is wrong: missing, unknown format, unsupported layout or compression, sizes
// larger than halotrain reads. `indices`: a palette PNG gives its indices (masks, class
// maps), not colours.
ImageInfo probe_image(const std::string& path, int level = 0, bool indices = false);

// One open image file. Not shareable between threads.
class ImageFile {
 public:
  // `transparent`: the value a slide's transparent pixels read as (data.pad_value).
  // `known`: the header as probe_image read it already (a manifest probes every row at
  // start), so it is not read again.
  ImageFile(const std::string& path, int level = 0, bool indices = false, float transparent = 0.f,
            const ImageInfo* known = nullptr);
  ~ImageFile();
  const ImageInfo& info() const;
  // Rows [row0, row0 + rows) and columns [col0, col0 + cols) of the image, inside it, as
  // [rows][cols][channels] float. ConfigError naming the file for a decoding failure.
  void read(int64_t row0, int64_t col0, int rows, int cols, float* out);
  uint64_t bytes_decoded() const;  // pixels decoded so far, as float32

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ht
