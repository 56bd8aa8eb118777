#include "worker/io/image_decoders.hpp"

#include <fmt/format.h>
#include <gdcmAttribute.h>
#include <gdcmImageReader.h>
#include <gdcmReader.h>
#include <gdcmTrace.h>
#include <openslide/openslide.h>
#include <tiffio.h>

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "orchestrator/config.hpp"

namespace ht::image_decoders {

namespace {
void tiff_error_handler(const char* module, const char* format, va_list args) {
  char buf[512];
  std::vsnprintf(buf, sizeof buf, format, args);
  tiff_error() = module ? fmt::format("{}: {}", module, buf) : std::string(buf);
}
void tiff_warning_handler(const char*, const char*, va_list) {}
}  // namespace

std::string& tiff_error() {
  static const bool handlers = [] {
    TIFFSetErrorHandler(tiff_error_handler);
    TIFFSetWarningHandler(tiff_warning_handler);
    return true;
  }();
  (void)handlers;
  thread_local std::string message;
  return message;
}

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw ConfigError(fmt::format("{}: {}", path, why));
}

void check_size(const std::string& path, int64_t h, int64_t w, int64_t c) {
  if (h < 1 || w < 1 || c < 1) fail(path, fmt::format("the header says {}x{} with {} channels: an empty image", w, h, c));
  if (h > (int64_t(1) << 31) - 1 || w > (int64_t(1) << 31) - 1 || double(h) * double(w) * double(c) > double(int64_t(1) << 40))
    fail(path, fmt::format("the header says {}x{} with {} channels: more than halotrain reads (2^40 samples)", w, h, c));
}

// A vendor OpenSlide reads better than libtiff (JPEG 2000 SVS, NDPI over 4 GB, MRXS); a
// plain tiled TIFF ("generic-tiff") stays with libtiff.
std::string slide_vendor(const std::string& path) {
  const char* vendor = openslide_detect_vendor(path.c_str());
  return vendor && std::strcmp(vendor, "generic-tiff") != 0 ? vendor : "";
}

Slide::Slide(const std::string& path, int level, ImageInfo* out) : path_(path), level_(level) {
  openslide_t* s = openslide_open(path.c_str());
  if (!s) fail(path, "OpenSlide cannot open it");
  std::unique_ptr<openslide_t, void (*)(openslide_t*)> closes(s, openslide_close);  // until it is ours
  if (const char* e = openslide_get_error(s)) fail(path, fmt::format("OpenSlide: {}", e));
  const int32_t levels = openslide_get_level_count(s);
  if (level >= levels)
    fail(path, fmt::format("data.level {} asks for pyramid level {}, but the slide has {} (levels 0 to {})", level,
                           level, levels, levels - 1));
  int64_t w = 0, h = 0;
  openslide_get_level_dimensions(s, level, &w, &h);
  check_size(path, h, w, 3);
  out->format = ImageFormat::Slide;
  out->height = int(h);
  out->width = int(w);
  out->channels = 3;
  out->bits = 8;
  out->vendor = slide_vendor(path);
  slide_ = closes.release();
}

Slide::~Slide() {
  if (slide_) openslide_close(static_cast<openslide_t*>(slide_));
}

// OpenSlide's region coordinates are level 0's.
void Slide::read(int64_t row0, int64_t col0, int rows, int cols, float transparent, float* out) {
  openslide_t* s = static_cast<openslide_t*>(slide_);
  const double ds = openslide_get_level_downsample(s, level_);
  argb_.resize(size_t(rows) * size_t(cols));
  openslide_read_region(s, argb_.data(), int64_t(std::llround(double(col0) * ds)),
                        int64_t(std::llround(double(row0) * ds)), level_, cols, rows);
  if (const char* e = openslide_get_error(s)) fail(path_, fmt::format("OpenSlide: {}", e));
  for (size_t p = 0; p < argb_.size(); ++p) {
    const uint32_t v = argb_[p];
    const uint32_t a = v >> 24;
    for (int c = 0; c < 3; ++c) {
      const uint32_t x = (v >> (16 - 8 * c)) & 0xff;
      out[3 * p + size_t(c)] = a == 0 ? transparent : a == 255 ? float(x) : float((x * 255 + a / 2) / a);
    }
  }
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

namespace {
// Where an uncompressed frame's values start when GDCM stopped at `position`, checked
// against the element's header and the file's size; 0 when it is not laid out so.
int64_t uncompressed_values_at(const std::string& path, int64_t position, const ImageInfo& info);
}  // namespace

ImageInfo probe_dicom(const std::string& path) {
  quiet_gdcm();
  gdcm::Reader r;
  r.SetFileName(path.c_str());
  const gdcm::Tag pixel_data(0x7fe0, 0x0010);
  // Up to the pixel data, its values skipped (not read into memory).
  if (!r.ReadUpToTag(pixel_data, {pixel_data})) fail(path, "GDCM cannot read its DICOM header");
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
  bool interleaved = true;
  if (spp == 3 && has<0x0028, 0x0006>(ds)) {
    gdcm::Attribute<0x0028, 0x0006> planar;
    planar.Set(ds);
    interleaved = planar.GetValue() == 0;
  }
  const gdcm::TransferSyntax ts = r.GetFile().GetHeader().GetDataSetTransferSyntax();
  // Gray or RGB samples as stored (YBR and the like go through GDCM, which converts them).
  const bool plain = spp == 1 || photometric == "RGB";
  if (plain && interleaved && (ts == gdcm::TransferSyntax::ImplicitVRLittleEndian ||
                      ts == gdcm::TransferSyntax::ExplicitVRLittleEndian))
    info.data_offset = uncompressed_values_at(path, int64_t(r.GetStreamCurrentPosition()), info);
  info.streamed = info.data_offset > 0;
  return info;
}

namespace {

// One stored sample as the value halotrain reads: the stored bits, sign-extended, inverted
// on the stored range (MONOCHROME1, INVERSE), then rescaled.
float dicom_value(const char* p, const ImageInfo& info) {
  const int64_t top = (int64_t(1) << info.bits_stored) - 1;
  int64_t v;
  if (info.bits == 16) {
    uint16_t u;
    std::memcpy(&u, p, 2);
    v = u;
  } else {
    v = uint8_t(*p);
  }
  v &= top;  // only the stored bits count
  if (info.is_signed && (v >> (info.bits_stored - 1)) & 1) v -= int64_t(1) << info.bits_stored;
  if (info.invert) v = info.is_signed ? -1 - v : top - v;
  return float(double(v) * info.slope + info.intercept);
}

int64_t uncompressed_values_at(const std::string& path, int64_t position, const ImageInfo& info) {
  // GDCM stops after the Pixel Data element's header: (7FE0,0010), then "OW"/"OB", 2 reserved
  // bytes and a 4-byte length (explicit VR), or the 4-byte length alone (implicit VR).
  if (position < 12) return 0;
  std::ifstream f(path, std::ios::binary);
  f.seekg(0, std::ios::end);
  const int64_t size = int64_t(f.tellg());
  unsigned char h[12];
  f.seekg(position - 12);
  if (!f.read(reinterpret_cast<char*>(h), 12)) return 0;
  const unsigned char tag[4] = {0xe0, 0x7f, 0x10, 0x00};
  const bool explicit_vr = std::memcmp(h, tag, 4) == 0 && h[6] == 0 && h[7] == 0 &&
                           (std::memcmp(h + 4, "OW", 2) == 0 || std::memcmp(h + 4, "OB", 2) == 0);
  const bool implicit_vr = std::memcmp(h + 4, tag, 4) == 0;
  if (!explicit_vr && !implicit_vr) return 0;
  const uint64_t length = uint64_t(h[8]) | uint64_t(h[9]) << 8 | uint64_t(h[10]) << 16 | uint64_t(h[11]) << 24;
  const uint64_t need = uint64_t(info.height) * uint64_t(info.width) * uint64_t(info.channels) * uint64_t(info.bits / 8);
  if (length == 0xffffffffu || length < need || uint64_t(position) + need > uint64_t(size))
    fail(path, fmt::format("its pixel data holds {} bytes, fewer than the {}x{}x{} the header says",
                           std::min<uint64_t>(length, uint64_t(std::max<int64_t>(size - position, 0))), info.height,
                           info.width, info.channels));
  return position;
}

}  // namespace

void read_dicom_rows(const std::string& path, const ImageInfo& info, int fd, int64_t row0, int64_t col0, int rows,
                     int cols, std::vector<char>& buffer, float* out) {
  const size_t bytes = size_t(info.bits / 8), C = size_t(info.channels);
  buffer.resize(size_t(cols) * C * bytes);
  for (int r = 0; r < rows; ++r) {
    const int64_t at = info.data_offset + ((row0 + r) * int64_t(info.width) + col0) * int64_t(C * bytes);
    size_t got = 0;
    while (got < buffer.size()) {
      const ssize_t n = ::pread(fd, buffer.data() + got, buffer.size() - got, off_t(at + int64_t(got)));
      if (n <= 0) fail(path, fmt::format("reading its pixel data failed at byte {}: {}", at + int64_t(got),
                                         n == 0 ? "the file ends" : std::strerror(errno)));
      got += size_t(n);
    }
    float* o = out + size_t(r) * cols * C;
    for (size_t i = 0; i < size_t(cols) * C; ++i) o[i] = dicom_value(buffer.data() + i * bytes, info);
  }
}


std::vector<float> decode_dicom(const std::string& path, const ImageInfo& info) {
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
  std::vector<float> whole(n);
  for (size_t i = 0; i < n; ++i) whole[i] = dicom_value(raw.data() + bytes * i, info);
  return whole;
}

}  // namespace ht::image_decoders
