#include "worker/io/image_streams.hpp"

#include <cerrno>
#include <cstring>

namespace ht::image_streams {

namespace {

void on_png_error(png_structp p, png_const_charp msg) {
  auto* self = static_cast<PngReader*>(png_get_error_ptr(p));
  std::snprintf(self->error, sizeof self->error, "%s", msg);
  longjmp(png_jmpbuf(p), 1);
}
void on_png_warning(png_structp, png_const_charp) {}

void on_jpeg_error(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegReader::Error*>(c->err);
  (*c->err->format_message)(c, e->message);
  longjmp(e->jump, 1);
}
void on_jpeg_message(j_common_ptr) {}

}  // namespace

void PngReader::close() {
  if (png) png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
  png = nullptr;
  info = nullptr;
  if (file) std::fclose(file);
  file = nullptr;
}

bool PngReader::open(bool indices, ImageInfo* out) {
  close();
  file = std::fopen(path.c_str(), "rb");
  if (!file) {
    std::snprintf(error, sizeof error, "cannot be opened: %s", std::strerror(errno));
    return false;
  }
  png = png_create_read_struct(PNG_LIBPNG_VER_STRING, this, on_png_error, on_png_warning);
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

bool PngReader::read_rows(png_bytep* rows, int n) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_rows(png, rows, nullptr, png_uint_32(n));
  next_row += n;
  return true;
}

bool PngReader::read_image(png_bytep* rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  next_row = png_get_image_height(png, info);
  return true;
}

void JpegReader::close() {
  if (created) jpeg_destroy_decompress(&cinfo);
  created = false;
  if (file) std::fclose(file);
  file = nullptr;
}

bool JpegReader::open(ImageInfo* out) {
  close();
  file = std::fopen(path.c_str(), "rb");
  if (!file) {
    std::snprintf(err.message, sizeof err.message, "cannot be opened: %s", std::strerror(errno));
    return false;
  }
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_jpeg_error;
  err.mgr.output_message = on_jpeg_message;
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
  // A progressive file's scans each cover the whole image: libjpeg holds all of it.
  out->streamed = !jpeg_has_multiple_scans(&cinfo);
  next_row = 0;
  return true;
}

bool JpegReader::read_row(uint8_t* row) {
  if (setjmp(err.jump)) return false;
  JSAMPROW rows[1] = {row};
  if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
    std::snprintf(err.message, sizeof err.message, "ends before row %lld", static_cast<long long>(next_row));
    return false;
  }
  ++next_row;
  return true;
}

}  // namespace ht::image_streams
