#include "worker/image_files.hpp"

#include <fmt/format.h>
#include <png.h>
#include <tiffio.h>
// clang-format off
#include <cstdio>  // before jpeglib.h, which needs FILE
#include <jpeglib.h>
// clang-format on

#include <gdcmAttribute.h>
#include <gdcmImageReader.h>
#include <gdcmReader.h>
#include <gdcmTrace.h>
#include <openslide/openslide.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "orchestrator/config.hpp"

namespace ht {

namespace fs = std::filesystem;

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
  return s + fmt::format("{} bits", bits);
}

double ImageInfo::full_scale() const {
  if (floating) return 1.0;
  const int b = format == ImageFormat::DICOM ? bits_stored : bits;
  return double((uint64_t(1) << b) - 1);
}

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw ConfigError(fmt::format("{}: {}", path, why));
}

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

// A header that claims more samples than could be decoded into this process is refused
// before anything is allocated.
void check_size(const std::string& path, int64_t h, int64_t w, int64_t c) {
  if (h < 1 || w < 1 || c < 1) fail(path, fmt::format("the header says {}x{} with {} channels: an empty image", w, h, c));
  if (h > (int64_t(1) << 31) - 1 || w > (int64_t(1) << 31) - 1 || double(h) * double(w) * double(c) > double(int64_t(1) << 40))
    fail(path, fmt::format("the header says {}x{} with {} channels: more than halotrain reads (2^40 samples)", w, h, c));
}

// --- PNG (libpng): rows decoded in order; an interlaced file is decoded whole -----------

struct PngReader {
  std::string path;
  FILE* file = nullptr;
  png_structp png = nullptr;
  png_infop info = nullptr;
  int64_t next_row = 0;  // the next row the stream gives
  char error[256] = {};

  static void on_error(png_structp p, png_const_charp msg) {
    auto* self = static_cast<PngReader*>(png_get_error_ptr(p));
    std::snprintf(self->error, sizeof self->error, "%s", msg);
    longjmp(png_jmpbuf(p), 1);
  }
  static void on_warning(png_structp, png_const_charp) {}

  void close() {
    if (png) png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    png = nullptr;
    info = nullptr;
    if (file) std::fclose(file);
    file = nullptr;
  }
  ~PngReader() { close(); }

  // Opens the stream and reads the header, with the transforms that give one byte or one
  // host-order 16-bit word per sample, alpha dropped, palettes expanded unless `indices`.
  // False with `error` set on a libpng error.
  bool open(bool indices, ImageInfo* out) {
    close();
    file = std::fopen(path.c_str(), "rb");
    if (!file) {
      std::snprintf(error, sizeof error, "cannot be opened: %s", std::strerror(errno));
      return false;
    }
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, this, on_error, on_warning);
    info = png ? png_create_info_struct(png) : nullptr;
    if (!png || !info) {
      std::snprintf(error, sizeof error, "libpng could not start");
      return false;
    }
    if (setjmp(png_jmpbuf(png))) return false;
    png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
    png_init_io(png, file);
    png_read_info(png, info);
    const int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (color == PNG_COLOR_TYPE_PALETTE && !indices) png_set_palette_to_rgb(png);
    if (depth < 8) png_set_packing(png);  // 1, 2, 4-bit samples as bytes of the same value
    if (depth == 16) png_set_swap(png);   // network order to the host's
    if (color & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    out->format = ImageFormat::PNG;
    out->height = int(png_get_image_height(png, info));
    out->width = int(png_get_image_width(png, info));
    out->channels = int(png_get_channels(png, info));
    out->bits = depth;
    out->streamed = png_get_interlace_type(png, info) == PNG_INTERLACE_NONE;
    next_row = 0;
    return true;
  }

  // The next `n` rows into `rows` (row pointers); false with `error` set on a libpng error.
  bool read_rows(png_bytep* rows, int n) {
    if (setjmp(png_jmpbuf(png))) return false;
    png_read_rows(png, rows, nullptr, png_uint_32(n));
    next_row += n;
    return true;
  }
  bool read_image(png_bytep* rows) {
    if (setjmp(png_jmpbuf(png))) return false;
    png_read_image(png, rows);
    next_row = png_get_image_height(png, info);
    return true;
  }
};

// --- JPEG (libjpeg): scanlines decoded in order ------------------------------------------

struct JpegReader {
  struct Error {
    jpeg_error_mgr mgr;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
  };
  std::string path;
  FILE* file = nullptr;
  jpeg_decompress_struct cinfo{};
  Error err{};
  bool created = false;
  int64_t next_row = 0;

  static void on_error(j_common_ptr c) {
    auto* e = reinterpret_cast<Error*>(c->err);
    (*c->err->format_message)(c, e->message);
    longjmp(e->jump, 1);
  }
  static void on_message(j_common_ptr) {}

  void close() {
    if (created) jpeg_destroy_decompress(&cinfo);
    created = false;
    if (file) std::fclose(file);
    file = nullptr;
  }
  ~JpegReader() { close(); }

  // False with err.message set on a libjpeg error.
  bool open(ImageInfo* out) {
    close();
    file = std::fopen(path.c_str(), "rb");
    if (!file) {
      std::snprintf(err.message, sizeof err.message, "cannot be opened: %s", std::strerror(errno));
      return false;
    }
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = on_error;
    err.mgr.output_message = on_message;
    if (setjmp(err.jump)) return false;
    jpeg_create_decompress(&cinfo);
    created = true;
    jpeg_stdio_src(&cinfo, file);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.num_components != 1 && cinfo.num_components != 3) {
      std::snprintf(err.message, sizeof err.message, "has %d components (CMYK?); halotrain reads gray or RGB JPEGs",
                    cinfo.num_components);
      return false;
    }
    cinfo.out_color_space = cinfo.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    out->format = ImageFormat::JPEG;
    out->height = int(cinfo.output_height);
    out->width = int(cinfo.output_width);
    out->channels = int(cinfo.output_components);
    out->bits = 8;
    next_row = 0;
    return true;
  }
  bool read_row(uint8_t* row) {
    if (setjmp(err.jump)) return false;
    JSAMPROW rows[1] = {row};
    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
      std::snprintf(err.message, sizeof err.message, "ends before row %lld", static_cast<long long>(next_row));
      return false;
    }
    ++next_row;
    return true;
  }
};

// --- TIFF (libtiff): the strips or tiles under a block ------------------------------------

thread_local std::string tiff_error;

void tiff_error_handler(const char* module, const char* format, va_list args) {
  char buf[512];
  std::vsnprintf(buf, sizeof buf, format, args);
  tiff_error = module ? fmt::format("{}: {}", module, buf) : std::string(buf);
}
void tiff_warning_handler(const char*, const char*, va_list) {}

struct TiffCloser {
  void operator()(TIFF* t) const {
    if (t) TIFFClose(t);
  }
};
using TiffPtr = std::unique_ptr<TIFF, TiffCloser>;

TiffPtr open_tiff(const std::string& path, int level, ImageInfo* out) {
  static const bool handlers = [] {
    TIFFSetErrorHandler(tiff_error_handler);
    TIFFSetWarningHandler(tiff_warning_handler);
    return true;
  }();
  (void)handlers;
  tiff_error.clear();
  TiffPtr t(TIFFOpen(path.c_str(), "r"));
  if (!t) fail(path, fmt::format("libtiff cannot open it: {}", tiff_error));
  const int levels = TIFFNumberOfDirectories(t.get());
  if (level >= levels)
    fail(path, fmt::format("data.level {} asks for pyramid level {}, but the file has {} (levels 0 to {})", level,
                           level, levels, levels - 1));
  if (level > 0 && !TIFFSetDirectory(t.get(), tdir_t(level))) fail(path, fmt::format("libtiff: {}", tiff_error));
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
  if (planar != PLANARCONFIG_CONTIG && spp > 1)
    fail(path, "stores its channels in separate planes (PlanarConfiguration 2); halotrain reads interleaved ones");
  const bool ok = (format == SAMPLEFORMAT_UINT && (bps == 8 || bps == 16 || bps == 1)) ||
                  (format == SAMPLEFORMAT_IEEEFP && bps == 32);
  if (!ok)
    fail(path, fmt::format("has {}-bit {} samples; halotrain reads 1, 8 and 16-bit unsigned integers and 32-bit "
                           "floats",
                           bps, format == SAMPLEFORMAT_INT ? "signed" : format == SAMPLEFORMAT_IEEEFP ? "float" : "unsigned"));
  // Extra samples beyond gray or RGB (alpha) are dropped.
  out->format = ImageFormat::TIFF;
  out->height = int(h);
  out->width = int(w);
  out->channels = spp >= 3 ? 3 : 1;
  out->bits = bps;
  out->floating = format == SAMPLEFORMAT_IEEEFP;
  if (compression == COMPRESSION_JPEG && photometric == PHOTOMETRIC_YCBCR) out->channels = 3;
  return t;
}

// --- Whole-slide images (OpenSlide) ---------------------------------------------------

struct SlideCloser {
  void operator()(openslide_t* s) const {
    if (s) openslide_close(s);
  }
};
using SlidePtr = std::unique_ptr<openslide_t, SlideCloser>;

// A vendor OpenSlide reads better than libtiff (JPEG 2000 SVS, NDPI over 4 GB, MRXS); a
// plain tiled TIFF ("generic-tiff") stays with libtiff.
std::string slide_vendor(const std::string& path) {
  const char* vendor = openslide_detect_vendor(path.c_str());
  return vendor && std::strcmp(vendor, "generic-tiff") != 0 ? vendor : "";
}

SlidePtr open_slide(const std::string& path, int level, ImageInfo* out) {
  SlidePtr s(openslide_open(path.c_str()));
  if (!s) fail(path, "OpenSlide cannot open it");
  if (const char* e = openslide_get_error(s.get())) fail(path, fmt::format("OpenSlide: {}", e));
  const int32_t levels = openslide_get_level_count(s.get());
  if (level >= levels)
    fail(path, fmt::format("data.level {} asks for pyramid level {}, but the slide has {} (levels 0 to {})", level,
                           level, levels, levels - 1));
  int64_t w = 0, h = 0;
  openslide_get_level_dimensions(s.get(), level, &w, &h);
  check_size(path, h, w, 3);
  out->format = ImageFormat::Slide;
  out->height = int(h);
  out->width = int(w);
  out->channels = 3;
  out->bits = 8;
  out->vendor = slide_vendor(path);
  return s;
}

// --- DICOM (GDCM) ---------------------------------------------------------------------

template <uint16_t G, uint16_t E>
bool has(const gdcm::DataSet& ds) {
  return ds.FindDataElement(gdcm::Tag(G, E)) && !ds.GetDataElement(gdcm::Tag(G, E)).IsEmpty();
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  while (!s.empty() && s.front() == ' ') s.erase(s.begin());
  return s;
}

// GDCM reports what it corrects on stderr; a file it cannot read is said once, by us.
void quiet_gdcm() {
  static const bool quiet = [] {
    gdcm::Trace::WarningOff();
    gdcm::Trace::DebugOff();
    gdcm::Trace::ErrorOff();
    return true;
  }();
  (void)quiet;
}

ImageInfo probe_dicom(const std::string& path) {
  quiet_gdcm();
  gdcm::Reader r;
  r.SetFileName(path.c_str());
  if (!r.ReadUpToTag(gdcm::Tag(0x7fe0, 0x0010))) fail(path, "GDCM cannot read its DICOM header");
  const gdcm::DataSet& ds = r.GetFile().GetDataSet();
  auto need = [&](bool present, const char* what) {
    if (!present) fail(path, fmt::format("its DICOM header has no {}: not an image", what));
  };
  need(has<0x0028, 0x0010>(ds), "Rows (0028,0010)");
  need(has<0x0028, 0x0011>(ds), "Columns (0028,0011)");
  ImageInfo info;
  info.format = ImageFormat::DICOM;
  info.streamed = false;
  gdcm::Attribute<0x0028, 0x0010> rows;
  gdcm::Attribute<0x0028, 0x0011> cols;
  rows.Set(ds);
  cols.Set(ds);
  info.height = rows.GetValue();
  info.width = cols.GetValue();
  int spp = 1;
  if (has<0x0028, 0x0002>(ds)) {
    gdcm::Attribute<0x0028, 0x0002> a;
    a.Set(ds);
    spp = a.GetValue();
  }
  if (has<0x0028, 0x0008>(ds)) {
    gdcm::Attribute<0x0028, 0x0008> frames;
    frames.Set(ds);
    if (frames.GetValue() > 1)
      fail(path, fmt::format("holds {} frames; halotrain reads single-frame DICOM images", frames.GetValue()));
  }
  check_size(path, info.height, info.width, spp);
  if (spp != 1 && spp != 3) fail(path, fmt::format("has {} samples per pixel; halotrain reads 1 (gray) or 3 (RGB)", spp));
  info.channels = spp;
  gdcm::Attribute<0x0028, 0x0100> allocated;
  gdcm::Attribute<0x0028, 0x0101> stored;
  gdcm::Attribute<0x0028, 0x0103> representation;
  need(has<0x0028, 0x0100>(ds), "Bits Allocated (0028,0100)");
  allocated.Set(ds);
  info.bits = allocated.GetValue();
  info.bits_stored = info.bits;
  if (has<0x0028, 0x0101>(ds)) {
    stored.Set(ds);
    info.bits_stored = stored.GetValue();
  }
  if (has<0x0028, 0x0103>(ds)) {
    representation.Set(ds);
    info.is_signed = representation.GetValue() == 1;
  }
  if ((info.bits != 8 && info.bits != 16) || info.bits_stored < 1 || info.bits_stored > info.bits)
    fail(path, fmt::format("has {} bits allocated, {} stored; halotrain reads 8 or 16 allocated", info.bits,
                           info.bits_stored));
  std::string photometric = "MONOCHROME2";
  if (has<0x0028, 0x0004>(ds)) {
    gdcm::Attribute<0x0028, 0x0004> p;
    p.Set(ds);
    photometric = trimmed(std::string(p.GetValue()));
  }
  if (spp == 1 && photometric != "MONOCHROME1" && photometric != "MONOCHROME2")
    fail(path, fmt::format("has photometric interpretation {} with one sample; expected MONOCHROME1 or MONOCHROME2",
                           photometric));
  bool invert = photometric == "MONOCHROME1";
  if (has<0x2050, 0x0020>(ds)) {
    gdcm::Attribute<0x2050, 0x0020> shape;
    shape.Set(ds);
    if (trimmed(std::string(shape.GetValue())) == "INVERSE") invert = !invert;
  }
  info.invert = invert && spp == 1;
  if (has<0x0028, 0x1053>(ds)) {
    gdcm::Attribute<0x0028, 0x1053> s;
    s.Set(ds);
    info.slope = s.GetValue();
  }
  if (has<0x0028, 0x1052>(ds)) {
    gdcm::Attribute<0x0028, 0x1052> i;
    i.Set(ds);
    info.intercept = i.GetValue();
  }
  return info;
}

}  // namespace

ImageInfo probe_image(const std::string& path, int level, bool indices) {
  std::error_code ec;
  if (fs::exists(path, ec) && !slide_vendor(path).empty()) {
    ImageInfo info;
    open_slide(path, level, &info);
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
    case ImageFormat::DICOM: return probe_dicom(path);
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
  SlidePtr slide;
  float transparent = 0.f;
  std::vector<uint32_t> argb;
  // DICOM, and interlaced PNG: the whole image, decoded once, as float HWC
  std::vector<float> whole;

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
      return float(v);
    }
    return float(*p);
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
    if (!jpeg->created || jpeg->next_row > row0) {  // scanlines go forward only: start again
      ImageInfo again;
      if (!jpeg->open(&again)) fail(path, fmt::format("libjpeg: {}", jpeg->err.message));
    }
    row_bytes.resize(size_t(info.width) * C);
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
  void copy_chunk(const std::vector<uint8_t>& chunk, int64_t y0, int64_t x0, int64_t ch, int64_t cw, int spp,
                  int64_t row0, int64_t col0, int rows, int cols, float* out) const {
    const int C = info.channels, bps = bytes_per_sample();
    const int64_t r_lo = std::max(row0, y0), r_hi = std::min(row0 + rows, y0 + ch);
    const int64_t c_lo = std::max(col0, x0), c_hi = std::min(col0 + cols, x0 + cw);
    const size_t packed_row = size_t((cw * spp + 7) / 8);
    for (int64_t y = r_lo; y < r_hi; ++y)
      for (int64_t x = c_lo; x < c_hi; ++x)
        for (int c = 0; c < C; ++c) {
          float v;
          if (info.bits == 1) {
            const size_t bit = size_t((x - x0) * spp + c);
            v = float((chunk[size_t(y - y0) * packed_row + bit / 8] >> (7 - bit % 8)) & 1);
          } else {
            v = sample(chunk.data() + ((size_t(y - y0) * cw + size_t(x - x0)) * spp + c) * size_t(bps));
          }
          out[(size_t(y - row0) * cols + size_t(x - col0)) * C + c] = v;
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
    if (got < 0) fail(path, fmt::format("libtiff cannot decode {} {}: {}", tiled ? "tile" : "strip", index, tiff_error));
    decoded += uint64_t(rows) * uint64_t(cols) * uint64_t(spp) * sizeof(float);
    return c;
  }

  void read_tiff(int64_t row0, int64_t col0, int rows, int cols, float* out) {
    TIFF* t = tiff.get();
    uint16_t spp = 1;
    TIFFGetFieldDefaulted(t, TIFFTAG_SAMPLESPERPIXEL, &spp);
    // JPEG-in-TIFF as RGB: the decoder gives 3 samples whatever the file says.
    uint16_t compression = COMPRESSION_NONE, photometric = 0;
    TIFFGetFieldDefaulted(t, TIFFTAG_COMPRESSION, &compression);
    TIFFGetField(t, TIFFTAG_PHOTOMETRIC, &photometric);
    if (compression == COMPRESSION_JPEG && photometric == PHOTOMETRIC_YCBCR) spp = 3;
    tiff_error.clear();
    std::map<uint32_t, std::vector<uint8_t>> kept;
    if (TIFFIsTiled(t)) {
      uint32_t tw = 0, th = 0;
      TIFFGetField(t, TIFFTAG_TILEWIDTH, &tw);
      TIFFGetField(t, TIFFTAG_TILELENGTH, &th);
      for (int64_t y = row0 / th * th; y < row0 + rows; y += th)
        for (int64_t x = col0 / tw * tw; x < col0 + cols; x += tw) {
          const ttile_t tile = TIFFComputeTile(t, uint32_t(x), uint32_t(y), 0, 0);
          const std::vector<uint8_t>& c = chunk_of(tile, true, th, tw, spp, kept);
          copy_chunk(c, y, x, th, tw, spp, row0, col0, rows, cols, out);
        }
    } else {
      uint32_t rps = 0;
      TIFFGetFieldDefaulted(t, TIFFTAG_ROWSPERSTRIP, &rps);
      rps = std::min<uint32_t>(rps, uint32_t(info.height));
      for (int64_t y = row0 / rps * rps; y < row0 + rows; y += rps) {
        const tstrip_t strip = TIFFComputeStrip(t, uint32_t(y), 0);
        const int64_t strip_rows = std::min<int64_t>(rps, info.height - y);
        const std::vector<uint8_t>& c = chunk_of(strip, false, strip_rows, info.width, spp, kept);
        copy_chunk(c, y, 0, strip_rows, info.width, spp, row0, col0, rows, cols, out);
      }
    }
    chunks = std::move(kept);
  }

  // OpenSlide's region, premultiplied ARGB, as RGB (un-premultiplied as openslide-python
  // does; a transparent pixel reads as `transparent`). Its coordinates are level 0's.
  void read_slide(int64_t row0, int64_t col0, int rows, int cols, float* out) {
    const double ds = openslide_get_level_downsample(slide.get(), level);
    argb.resize(size_t(rows) * size_t(cols));
    openslide_read_region(slide.get(), argb.data(), int64_t(std::llround(double(col0) * ds)),
                          int64_t(std::llround(double(row0) * ds)), level, cols, rows);
    if (const char* e = openslide_get_error(slide.get())) fail(path, fmt::format("OpenSlide: {}", e));
    for (size_t p = 0; p < argb.size(); ++p) {
      const uint32_t v = argb[p];
      const uint32_t a = v >> 24;
      for (int c = 0; c < 3; ++c) {
        const uint32_t x = (v >> (16 - 8 * c)) & 0xff;
        out[3 * p + size_t(c)] = a == 0 ? transparent : a == 255 ? float(x) : float((x * 255 + a / 2) / a);
      }
    }
    decoded += uint64_t(argb.size()) * 3 * sizeof(float);
  }

  void read_dicom(int64_t row0, int64_t col0, int rows, int cols, float* out) {
    if (whole.empty()) {
      quiet_gdcm();
      gdcm::ImageReader r;
      r.SetFileName(path.c_str());
      if (!r.Read()) fail(path, "GDCM cannot read it as a DICOM image");
      const gdcm::Image& image = r.GetImage();
      const unsigned long length = image.GetBufferLength();
      std::vector<char> raw(length);
      if (!image.GetBuffer(raw.data()))
        fail(path, fmt::format("GDCM cannot decode its pixel data (transfer syntax {})",
                               gdcm::TransferSyntax::GetTSString(image.GetTransferSyntax())));
      const size_t n = size_t(info.height) * info.width * info.channels;
      const size_t bytes = size_t(info.bits / 8);
      if (raw.size() < n * bytes)
        fail(path, fmt::format("its pixel data holds {} bytes, fewer than the {}x{}x{} the header says", raw.size(),
                               info.height, info.width, info.channels));
      whole.resize(n);
      const int64_t top = (int64_t(1) << info.bits_stored) - 1;
      const int64_t mask = (int64_t(1) << info.bits_stored) - 1;
      for (size_t i = 0; i < n; ++i) {
        int64_t v;
        if (bytes == 2) {
          uint16_t u;
          std::memcpy(&u, raw.data() + 2 * i, 2);
          v = u;
        } else {
          v = uint8_t(raw[i]);
        }
        v &= mask;  // only the stored bits count
        if (info.is_signed && (v >> (info.bits_stored - 1)) & 1) v -= int64_t(1) << info.bits_stored;
        // MONOCHROME1, or an INVERSE presentation LUT: inverted on the stored range first.
        if (info.invert) v = info.is_signed ? -1 - v : top - v;
        whole[i] = float(double(v) * info.slope + info.intercept);
      }
      decoded += n * sizeof(float);
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

ImageFile::ImageFile(const std::string& path, int level, bool indices, float transparent)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  m.level = level;
  m.indices = indices;
  m.transparent = transparent;
  m.info = probe_image(path, level, indices);
  if (m.info.format == ImageFormat::Slide) {
    ImageInfo again;
    m.slide = open_slide(path, level, &again);
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
    case ImageFormat::Slide: m.read_slide(row0, col0, rows, cols, out); break;
  }
}

}  // namespace ht
