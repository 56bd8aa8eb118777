#include "worker/io/image_info.hpp"

#include <fmt/format.h>

namespace ht {

const char* to_string(ImageFormat f) {
  switch (f) {
    case ImageFormat::PNG: return "PNG";
    case ImageFormat::JPEG: return "JPEG";
    case ImageFormat::TIFF: return "TIFF";
    case ImageFormat::DICOM: return "DICOM";
    case ImageFormat::Slide: return "slide";
  }
  return "?";
}

std::string ImageInfo::describe() const {
  std::string s = fmt::format("{} {}x{}, {} channel{}, ", to_string(format), width, height, channels,
                              channels == 1 ? "" : "s");
  if (format == ImageFormat::Slide) return s + fmt::format("{} (OpenSlide)", vendor);
  if (floating) return s + "float32";
  if (format == ImageFormat::DICOM) {
    s += fmt::format("{} of {} bits{}", bits_stored, bits, is_signed ? " signed" : "");
    if (invert) s += ", inverted";
    if (slope != 1 || intercept != 0) s += fmt::format(", rescale {} x + {}", slope, intercept);
    return s;
  }
  return s + fmt::format("{} bits{}", bits, is_signed ? " signed" : "");
}

double ImageInfo::full_scale() const {
  if (floating) return 1.0;
  const int b = format == ImageFormat::DICOM ? bits_stored : bits;
  // A signed TIFF's range is [-2^(b-1), 2^(b-1) - 1]: scaled into [-1, 1).
  if (is_signed && format != ImageFormat::DICOM) return double(uint64_t(1) << (b - 1));
  return double((uint64_t(1) << b) - 1);
}

}  // namespace ht
