// What an image file's header says (SPEC section 13), shared by the readers of every
// format (worker/io/image_files.hpp) and the decoders behind them (image_decoders.hpp,
// image_streams.hpp).
#pragma once

#include <cstdint>
#include <string>

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

}  // namespace ht
