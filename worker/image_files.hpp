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

namespace ht {

enum class ImageFormat { PNG, JPEG, TIFF, DICOM, Slide };
const char* to_string(ImageFormat f);  // "PNG", "JPEG", "TIFF", "DICOM", "slide"

// What a file's header says, read without its pixels.
struct ImageInfo {
  ImageFormat format = ImageFormat::PNG;
  int height = 0, width = 0, channels = 0;
  int bits = 8;           // per sample as stored: 1..16 (integers), 32 (float)
  bool floating = false;  // samples are IEEE floats (TIFF)
  bool streamed = true;   // read a band at a time; false: decoded whole on first read (cached)
                          // (interlaced PNG, progressive JPEG, a compressed DICOM frame)
  bool is_signed = false;  // two's complement samples (TIFF SampleFormat 2, DICOM PixelRepresentation 1)
  // DICOM: the range `bits` covers, the inversion and the rescale applied to each value.
  int bits_stored = 0;
  bool invert = false;
  double slope = 1, intercept = 0;
  int64_t data_offset = 0;  // DICOM, uncompressed (streamed): where the pixel values start in the file
  std::string vendor;  // a slide's, as OpenSlide names it ("aperio", "hamamatsu", ...)
  std::string describe() const;  // "DICOM 3328x2560, 1 channel, 12 of 16 bits, MONOCHROME1"
  // The largest value a sample can take, for data.scale: auto (1 for floats; a signed
  // TIFF's 2^(bits-1), so its values scale into [-1, 1)).
  double full_scale() const;
};

// Reads the header of `path` at pyramid `level` (TIFF; 0 elsewhere). ConfigError naming the
// file and what is wrong: missing, unknown format, unsupported layout or compression, sizes
// larger than halotrain reads. `indices`: a palette PNG gives its indices (masks, class
// maps), not colours.
ImageInfo probe_image(const std::string& path, int level = 0, bool indices = false);

// One open image file. Not shareable between threads.
class ImageFile {
 public:
  // `transparent`: the value a slide's transparent pixels read as (data.pad_value).
  ImageFile(const std::string& path, int level = 0, bool indices = false, float transparent = 0.f);
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
