#include "worker/io/image_files.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <tiffio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "orchestrator/config.hpp"
#include "worker/io/image_decoders.hpp"
#include "worker/io/image_streams.hpp"

namespace ht {

namespace fs = std::filesystem;

namespace {

using image_decoders::check_size;
using image_decoders::tiff_error;
using image_decoders::fail;
using image_streams::JpegReader;
using image_streams::PngReader;

// The format by the file's first bytes, not its name.
ImageFormat sniff(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, "does not exist");
  if (!fs::is_regular_file(path, ec)) fail(path, "is not a regular file");
  std::ifstream f(path, std::ios::binary);
  unsigned char b[132] = {};
  f.read(reinterpret_cast<char*>(b), sizeof b);
  const std::streamsize n = f.gcount();
  if (!f && n == 0) fail(path, "cannot be read");
  if (n >= 8 && std::memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageFormat::PNG;
  if (n >= 4 && (std::memcmp(b, "II*\0", 4) == 0 || std::memcmp(b, "MM\0*", 4) == 0 ||
                 std::memcmp(b, "II+\0", 4) == 0 || std::memcmp(b, "MM\0+", 4) == 0))
    return ImageFormat::TIFF;
  if (n >= 132 && std::memcmp(b + 128, "DICM", 4) == 0) return ImageFormat::DICOM;
  if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::JPEG;
  fail(path, "is not an image halotrain reads: expected PNG, JPEG, TIFF/BigTIFF or DICOM (read by content, not name)");
}

// --- TIFF (libtiff): the strips or tiles under a block ------------------------------------

struct TiffCloser {
  void operator()(TIFF* t) const {
    if (t) TIFFClose(t);
  }
};
using TiffPtr = std::unique_ptr<TIFF, TiffCloser>;

TiffPtr open_tiff(const std::string& path, int level, ImageInfo* out) {
  tiff_error().clear();
  TiffPtr t(TIFFOpen(path.c_str(), "r"));
  if (!t) fail(path, fmt::format("libtiff cannot open it: {}", tiff_error()));
  const int levels = TIFFNumberOfDirectories(t.get());
  if (level >= levels)
    fail(path, fmt::format("data.level {} asks for pyramid level {}, but the file has {} (levels 0 to {})", level,
                           level, levels, levels - 1));
  if (level > 0 && !TIFFSetDirectory(t.get(), tdir_t(level))) fail(path, fmt::format("libtiff: {}", tiff_error()));
  uint32_t w = 0, h = 0;
  uint16_t spp = 1, bps = 1, format = SAMPLEFORMAT_UINT, planar = PLANARCONFIG_CONTIG, photometric = 0,
           compression = COMPRESSION_NONE;
  TIFFGetField(t.get(), TIFFTAG_IMAGEWIDTH, &w);
  TIFFGetField(t.get(), TIFFTAG_IMAGELENGTH, &h);
  TIFFGetFieldDefaulted(t.get(), TIFFTAG_SAMPLESPERPIXEL, &spp);
  TIFFGetFieldDefaulted(t.get(), TIFFTAG_BITSPERSAMPLE, &bps);
  TIFFGetFieldDefaulted(t.get(), TIFFTAG_SAMPLEFORMAT, &format);
  TIFFGetFieldDefaulted(t.get(), TIFFTAG_PLANARCONFIG, &planar);
  TIFFGetFieldDefaulted(t.get(), TIFFTAG_COMPRESSION, &compression);
  TIFFGetField(t.get(), TIFFTAG_PHOTOMETRIC, &photometric);
  check_size(path, h, w, spp);
  if (!TIFFIsCODECConfigured(compression))
    fail(path, fmt::format("its compression (TIFF scheme {}) is one this libtiff does not decode", compression));
  // JPEG-in-TIFF stored as YCbCr is read as RGB.
  if (compression == COMPRESSION_JPEG && photometric == PHOTOMETRIC_YCBCR)
    TIFFSetField(t.get(), TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);
  else if (photometric == PHOTOMETRIC_YCBCR)
    fail(path, "is YCbCr without JPEG compression; halotrain reads gray or RGB TIFFs");
  if (photometric == PHOTOMETRIC_PALETTE) fail(path, "is a palette TIFF; halotrain reads gray or RGB TIFFs");
  if (planar != PLANARCONFIG_CONTIG && compression == COMPRESSION_JPEG && spp > 1)
    fail(path, "is JPEG-compressed with its channels in separate planes; halotrain reads such files interleaved");
  const bool ok = (format == SAMPLEFORMAT_UINT && (bps == 8 || bps == 16 || bps == 1)) ||
                  (format == SAMPLEFORMAT_INT && (bps == 8 || bps == 16)) ||
                  (format == SAMPLEFORMAT_IEEEFP && bps == 32);
  if (!ok)
    fail(path, fmt::format("has {}-bit {} samples; halotrain reads 1, 8 and 16-bit unsigned, 8 and 16-bit signed "
                           "integers and 32-bit floats",
                           bps, format == SAMPLEFORMAT_INT ? "signed" : format == SAMPLEFORMAT_IEEEFP ? "float" : "unsigned"));
  // Extra samples beyond gray or RGB (alpha) are dropped.
  out->format = ImageFormat::TIFF;
  out->height = int(h);
  out->width = int(w);
  out->channels = spp >= 3 ? 3 : 1;
  out->bits = bps;
  out->floating = format == SAMPLEFORMAT_IEEEFP;
  out->is_signed = format == SAMPLEFORMAT_INT;
  if (compression == COMPRESSION_JPEG && photometric == PHOTOMETRIC_YCBCR) out->channels = 3;
  return t;
}

}  // namespace

ImageInfo probe_image(const std::string& path, int level, bool indices) {
  std::error_code ec;
  if (fs::exists(path, ec) && !image_decoders::slide_vendor(path).empty()) {
    ImageInfo info;
    image_decoders::Slide(path, level, &info);
    return info;
  }
  const ImageFormat format = sniff(path);
  if (format != ImageFormat::TIFF && level > 0)
    fail(path, fmt::format("data.level {} asks for a pyramid level; a {} file has one level", level, to_string(format)));
  switch (format) {
    case ImageFormat::PNG: {
      PngReader p;
      p.path = path;
      ImageInfo info;
      if (!p.open(indices, &info)) fail(path, fmt::format("libpng cannot read it: {}", p.error));
      check_size(path, info.height, info.width, info.channels);
      return info;
    }
    case ImageFormat::JPEG: {
      JpegReader j;
      j.path = path;
      ImageInfo info;
      if (!j.open(&info)) fail(path, fmt::format("libjpeg cannot read it: {}", j.err.message));
      check_size(path, info.height, info.width, info.channels);
      return info;
    }
    case ImageFormat::TIFF: {
      ImageInfo info;
      open_tiff(path, level, &info);
      return info;
    }
    case ImageFormat::DICOM: return image_decoders::probe_dicom(path);
    case ImageFormat::Slide: break;  // by vendor, above
  }
  fail(path, "unknown format");
}

struct ImageFile::Impl {
  std::string path;
  int level = 0;
  bool indices = false;
  ImageInfo info;
  uint64_t decoded = 0;
  // PNG, JPEG
  std::unique_ptr<PngReader> png;
  std::unique_ptr<JpegReader> jpeg;
  std::vector<uint8_t> row_bytes;  // one row (streamed) or the whole image (interlaced)
  // TIFF
  TiffPtr tiff;
  // slides
  std::unique_ptr<image_decoders::Slide> slide;
  float transparent = 0.f;
  // A compressed DICOM frame, an interlaced PNG, a progressive JPEG: the whole image,
  // decoded once, as float HWC
  std::vector<float> whole;
  // An uncompressed DICOM frame: the file, and one row's stored samples
  int dicom_fd = -1;
  std::vector<char> dicom_row;
  ~Impl() {
    if (dicom_fd >= 0) ::close(dicom_fd);
  }

  int bytes_per_sample() const { return info.floating ? 4 : info.bits == 16 ? 2 : 1; }

  float sample(const uint8_t* p) const {
    if (info.floating) {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    if (info.bits == 16) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return info.is_signed ? float(int16_t(v)) : float(v);
    }
    return info.is_signed ? float(int8_t(*p)) : float(*p);
  }

  void read_png(int64_t row0, int64_t col0, int rows, int cols, float* out) {
    const int C = info.channels, bps = bytes_per_sample();
    const size_t row_size = size_t(info.width) * C * bps;
    if (!info.streamed) {
      if (whole.empty()) {
        ImageInfo again;
        if (!png->open(indices, &again)) fail(path, fmt::format("libpng: {}", png->error));
        std::vector<uint8_t> all(row_size * size_t(info.height));
        std::vector<png_bytep> pointers(size_t(info.height));
        for (int r = 0; r < info.height; ++r) pointers[size_t(r)] = all.data() + size_t(r) * row_size;
        if (!png->read_image(pointers.data())) fail(path, fmt::format("libpng cannot decode it: {}", png->error));
        whole.resize(size_t(info.height) * info.width * C);
        for (size_t i = 0; i < whole.size(); ++i) whole[i] = sample(all.data() + i * size_t(bps));
        decoded += whole.size() * sizeof(float);
      }
      copy_from_whole(row0, col0, rows, cols, out);
      return;
    }
    if (!png->png || png->next_row > row0) {  // a stream goes forward only: start again
      ImageInfo again;
      if (!png->open(indices, &again)) fail(path, fmt::format("libpng: {}", png->error));
    }
    row_bytes.resize(row_size);
    png_bytep pointer = row_bytes.data();
    decoded += uint64_t(row0 - png->next_row) * info.width * C * sizeof(float);  // decoded to be dropped
    while (png->next_row < row0)
      if (!png->read_rows(&pointer, 1)) fail(path, fmt::format("libpng cannot decode it: {}", png->error));
    for (int r = 0; r < rows; ++r) {
      if (!png->read_rows(&pointer, 1)) fail(path, fmt::format("libpng cannot decode it: {}", png->error));
      float* o = out + size_t(r) * cols * C;
      const uint8_t* src = row_bytes.data() + size_t(col0) * C * bps;
      for (int i = 0; i < cols * C; ++i) o[i] = sample(src + size_t(i) * bps);
    }
    decoded += uint64_t(rows) * info.width * C * sizeof(float);
  }

  void read_jpeg(int64_t row0, int64_t col0, int rows, int cols, float* out) {
    const int C = info.channels;
    if (!info.streamed) {  // progressive: decoded whole once, as libjpeg must anyway
      if (whole.empty()) {
        ImageInfo again;
        if (!jpeg->open(&again)) fail(path, fmt::format("libjpeg: {}", jpeg->err.message));
        whole.resize(size_t(info.height) * info.width * C);
        row_bytes.resize(size_t(info.width) * C);
        for (int64_t r = 0; r < info.height; ++r) {
          if (!jpeg->read_row(row_bytes.data()))
            fail(path, fmt::format("libjpeg cannot decode it: {}", jpeg->err.message));
          std::copy(row_bytes.begin(), row_bytes.end(), whole.begin() + r * info.width * C);
        }
        jpeg->close();
        decoded += whole.size() * sizeof(float);
      }
      copy_from_whole(row0, col0, rows, cols, out);
      return;
    }
    if (!jpeg->created || jpeg->next_row > row0) {  // scanlines go forward only: start again
      ImageInfo again;
      if (!jpeg->open(&again)) fail(path, fmt::format("libjpeg: {}", jpeg->err.message));
    }
    row_bytes.resize(size_t(info.width) * C);
    decoded += uint64_t(row0 - jpeg->next_row) * info.width * C * sizeof(float);  // decoded to be dropped
    while (jpeg->next_row < row0)
      if (!jpeg->read_row(row_bytes.data())) fail(path, fmt::format("libjpeg cannot decode it: {}", jpeg->err.message));
    for (int r = 0; r < rows; ++r) {
      if (!jpeg->read_row(row_bytes.data())) fail(path, fmt::format("libjpeg cannot decode it: {}", jpeg->err.message));
      float* o = out + size_t(r) * cols * C;
      const uint8_t* src = row_bytes.data() + size_t(col0) * C;
      for (int i = 0; i < cols * C; ++i) o[i] = float(src[i]);
    }
    decoded += uint64_t(rows) * info.width * C * sizeof(float);
  }

  // The samples of one decoded strip or tile (`chunk`, `cw` wide, starting at (y0, x0)) that
  // lie in the block go to `out`. 1-bit samples are unpacked (MSB first).
  // What a chunk holds per pixel: `spp` samples, of which `count` go to the output's
  // channels from `first` on (interleaved: all of them; a separate plane: its one).
  struct Samples {
    int spp, first, count;
  };
  void copy_chunk(const std::vector<uint8_t>& chunk, int64_t y0, int64_t x0, int64_t ch, int64_t cw,
                  const Samples& samples, int64_t row0, int64_t col0, int rows, int cols, float* out) const {
    const int C = info.channels, bps = bytes_per_sample(), spp = samples.spp;
    const int64_t r_lo = std::max(row0, y0), r_hi = std::min(row0 + rows, y0 + ch);
    const int64_t c_lo = std::max(col0, x0), c_hi = std::min(col0 + cols, x0 + cw);
    const size_t packed_row = size_t((cw * spp + 7) / 8);
    for (int64_t y = r_lo; y < r_hi; ++y)
      for (int64_t x = c_lo; x < c_hi; ++x)
        for (int c = 0; c < samples.count; ++c) {
          float v;
          if (info.bits == 1) {
            const size_t bit = size_t((x - x0) * spp + c);
            v = float((chunk[size_t(y - y0) * packed_row + bit / 8] >> (7 - bit % 8)) & 1);
          } else {
            v = sample(chunk.data() + ((size_t(y - y0) * cw + size_t(x - x0)) * spp + c) * size_t(bps));
          }
          out[(size_t(y - row0) * cols + size_t(x - col0)) * C + samples.first + c] = v;
        }
  }

  // The strips or tiles the last read decoded: a band's next band often starts inside them.
  std::map<uint32_t, std::vector<uint8_t>> chunks;

  // Chunk `index` (a strip or tile), decoded once while consecutive reads need it.
  const std::vector<uint8_t>& chunk_of(uint32_t index, bool tiled, int64_t rows, int64_t cols, int spp,
                                       std::map<uint32_t, std::vector<uint8_t>>& kept) {
    auto old = chunks.find(index);
    if (old != chunks.end()) return kept[index] = std::move(old->second);
    std::vector<uint8_t>& c = kept[index];
    TIFF* t = tiff.get();
    c.resize(size_t(tiled ? TIFFTileSize(t) : TIFFStripSize(t)));
    const tmsize_t got = tiled ? TIFFReadEncodedTile(t, index, c.data(), tmsize_t(c.size()))
                               : TIFFReadEncodedStrip(t, index, c.data(), tmsize_t(c.size()));
    if (got < 0) fail(path, fmt::format("libtiff cannot decode {} {}: {}", tiled ? "tile" : "strip", index, tiff_error()));
    decoded += uint64_t(rows) * uint64_t(cols) * uint64_t(spp) * sizeof(float);
    return c;
  }

  void read_tiff(int64_t row0, int64_t col0, int rows, int cols, float* out) {
    TIFF* t = tiff.get();
    uint16_t spp = 1, planar = PLANARCONFIG_CONTIG;
    TIFFGetFieldDefaulted(t, TIFFTAG_SAMPLESPERPIXEL, &spp);
    TIFFGetFieldDefaulted(t, TIFFTAG_PLANARCONFIG, &planar);
    // JPEG-in-TIFF as RGB: the decoder gives 3 samples whatever the file says.
    uint16_t compression = COMPRESSION_NONE, photometric = 0;
    TIFFGetFieldDefaulted(t, TIFFTAG_COMPRESSION, &compression);
    TIFFGetField(t, TIFFTAG_PHOTOMETRIC, &photometric);
    if (compression == COMPRESSION_JPEG && photometric == PHOTOMETRIC_YCBCR) spp = 3;
    // Channels in separate planes: a chunk per plane, one sample per pixel.
    const bool separate = planar == PLANARCONFIG_SEPARATE && spp > 1;
    const int planes = separate ? info.channels : 1, chunk_spp = separate ? 1 : spp;
    tiff_error().clear();
    std::map<uint32_t, std::vector<uint8_t>> kept;
    for (int plane = 0; plane < planes; ++plane) {
      const Samples in_chunk{chunk_spp, separate ? plane : 0, separate ? 1 : info.channels};
      if (TIFFIsTiled(t)) {
        uint32_t tw = 0, th = 0;
        TIFFGetField(t, TIFFTAG_TILEWIDTH, &tw);
        TIFFGetField(t, TIFFTAG_TILELENGTH, &th);
        for (int64_t y = row0 / th * th; y < row0 + rows; y += th)
          for (int64_t x = col0 / tw * tw; x < col0 + cols; x += tw) {
            const ttile_t tile = TIFFComputeTile(t, uint32_t(x), uint32_t(y), 0, tsample_t(plane));
            const std::vector<uint8_t>& c = chunk_of(tile, true, th, tw, chunk_spp, kept);
            copy_chunk(c, y, x, th, tw, in_chunk, row0, col0, rows, cols, out);
          }
      } else {
        uint32_t rps = 0;
        TIFFGetFieldDefaulted(t, TIFFTAG_ROWSPERSTRIP, &rps);
        rps = std::min<uint32_t>(rps, uint32_t(info.height));
        for (int64_t y = row0 / rps * rps; y < row0 + rows; y += rps) {
          const tstrip_t strip = TIFFComputeStrip(t, uint32_t(y), tsample_t(plane));
          const int64_t strip_rows = std::min<int64_t>(rps, info.height - y);
          const std::vector<uint8_t>& c = chunk_of(strip, false, strip_rows, info.width, chunk_spp, kept);
          copy_chunk(c, y, 0, strip_rows, info.width, in_chunk, row0, col0, rows, cols, out);
        }
      }
    }
    chunks = std::move(kept);
  }

  void read_dicom(int64_t row0, int64_t col0, int rows, int cols, float* out) {
    if (info.streamed) {  // uncompressed: the block's rows read where they lie
      if (dicom_fd < 0 && (dicom_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC)) < 0)
        fail(path, fmt::format("cannot be opened: {}", std::strerror(errno)));
      image_decoders::read_dicom_rows(path, info, dicom_fd, row0, col0, rows, cols, dicom_row, out);
      decoded += uint64_t(rows) * uint64_t(cols) * uint64_t(info.channels) * sizeof(float);
      return;
    }
    if (whole.empty()) {
      whole = image_decoders::decode_dicom(path, info);
      decoded += whole.size() * sizeof(float);
    }
    copy_from_whole(row0, col0, rows, cols, out);
  }

  void copy_from_whole(int64_t row0, int64_t col0, int rows, int cols, float* out) const {
    const int C = info.channels;
    for (int r = 0; r < rows; ++r)
      std::memcpy(out + size_t(r) * cols * C, whole.data() + (size_t(row0 + r) * info.width + size_t(col0)) * C,
                  size_t(cols) * C * sizeof(float));
  }
};

ImageFile::ImageFile(const std::string& path, int level, bool indices, float transparent, const ImageInfo* known)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  m.level = level;
  m.indices = indices;
  m.transparent = transparent;
  m.info = known ? *known : probe_image(path, level, indices);
  if (m.info.format == ImageFormat::Slide) {
    ImageInfo again;
    m.slide = std::make_unique<image_decoders::Slide>(path, level, &again);
  } else if (m.info.format == ImageFormat::PNG) {
    m.png = std::make_unique<PngReader>();
    m.png->path = path;
  } else if (m.info.format == ImageFormat::JPEG) {
    m.jpeg = std::make_unique<JpegReader>();
    m.jpeg->path = path;
  } else if (m.info.format == ImageFormat::TIFF) {
    ImageInfo again;
    m.tiff = open_tiff(path, level, &again);
  }
}

ImageFile::~ImageFile() = default;
const ImageInfo& ImageFile::info() const { return impl_->info; }
uint64_t ImageFile::bytes_decoded() const { return impl_->decoded; }

void ImageFile::read(int64_t row0, int64_t col0, int rows, int cols, float* out) {
  Impl& m = *impl_;
  if (row0 < 0 || col0 < 0 || rows < 0 || cols < 0 || row0 + rows > m.info.height || col0 + cols > m.info.width)
    throw std::out_of_range(fmt::format("{}: rows [{}, {}) cols [{}, {}) outside the {}x{} image", m.path, row0,
                                        row0 + rows, col0, col0 + cols, m.info.height, m.info.width));
  if (rows == 0 || cols == 0) return;
  switch (m.info.format) {
    case ImageFormat::PNG: m.read_png(row0, col0, rows, cols, out); break;
    case ImageFormat::JPEG: m.read_jpeg(row0, col0, rows, cols, out); break;
    case ImageFormat::TIFF: m.read_tiff(row0, col0, rows, cols, out); break;
    case ImageFormat::DICOM: m.read_dicom(row0, col0, rows, cols, out); break;
    case ImageFormat::Slide:
      m.slide->read(row0, col0, rows, cols, m.transparent, out);
      m.decoded += uint64_t(rows) * uint64_t(cols) * 3 * sizeof(float);
      break;
  }
}

}  // namespace ht
