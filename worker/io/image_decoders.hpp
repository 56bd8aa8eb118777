// The decoders behind ImageFile (worker/io/image_files.hpp) that read through a library of
// their own rather than row or tile by row or tile: DICOM (GDCM: a compressed frame decoded
// whole, an uncompressed one read by rows where they lie) and
// whole-slide images (OpenSlide, regions of a pyramid level). Shared by image_files.cpp:
// the messages and the size check every format's header goes through.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/io/image_info.hpp"

namespace ht::image_decoders {

// ConfigError "PATH: why".
[[noreturn]] void fail(const std::string& path, const std::string& why);
// A header that claims more samples than could be decoded into this process is refused
// before anything is allocated.
void check_size(const std::string& path, int64_t h, int64_t w, int64_t c);

// libtiff's last error message on this thread (its handlers are installed on the first
// call, warnings dropped): clear it before a call, read it after one fails. Shared with
// predict's BigTIFF writer.
std::string& tiff_error();

// DICOM: the header without the pixels, and the whole frame as float HWC: the stored bits,
// inverted for MONOCHROME1 or an INVERSE presentation LUT, then rescaled.
// An uncompressed frame (little-endian transfer syntaxes, samples interleaved) is streamed:
// its values lie at info.data_offset, read by read_dicom_rows without GDCM.
ImageInfo probe_dicom(const std::string& path);
std::vector<float> decode_dicom(const std::string& path, const ImageInfo& info);
// Rows [row0, row0 + rows) x cols [col0, col0 + cols) of a streamed frame, through `file`
// (open on `path`), as float HWC; `buffer` holds one row's stored samples.
void read_dicom_rows(const std::string& path, const ImageInfo& info, int fd, int64_t row0, int64_t col0, int rows,
                     int cols, std::vector<char>& buffer, float* out);

// OpenSlide's name for the vendor of `path` when it reads the file better than libtiff
// (JPEG 2000 SVS, NDPI over 4 GB, MRXS); "" for a plain tiled TIFF and anything else.
std::string slide_vendor(const std::string& path);

// One pyramid level of an open slide.
class Slide {
 public:
  Slide(const std::string& path, int level, ImageInfo* out);  // fills `out`
  ~Slide();
  Slide(const Slide&) = delete;
  Slide& operator=(const Slide&) = delete;
  // The block as RGB float HWC: premultiplied ARGB un-premultiplied as openslide-python
  // does, a transparent pixel as `transparent`.
  void read(int64_t row0, int64_t col0, int rows, int cols, float transparent, float* out);

 private:
  std::string path_;
  int level_;
  void* slide_ = nullptr;        // openslide_t, closed by the destructor
  std::vector<uint32_t> argb_;  // the last region read, as OpenSlide gives it
};

}  // namespace ht::image_decoders
