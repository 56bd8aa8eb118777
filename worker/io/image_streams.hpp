// The image formats decoded as a stream of rows, in order (worker/io/image_files.cpp reads
// them): PNG through libpng (an interlaced file is decoded whole) and JPEG through libjpeg.
// A reader goes forward only; opening it again starts the stream at row 0. Each call that
// can fail returns false with its message set (libpng and libjpeg report errors by longjmp,
// caught here).
#pragma once

#include <png.h>
// clang-format off
#include <csetjmp>
#include <cstdio>  // before jpeglib.h, which needs FILE
#include <jpeglib.h>
// clang-format on

#include <cstdint>
#include <string>

#include "worker/io/image_info.hpp"

namespace ht::image_streams {

struct PngReader {
  std::string path;
  FILE* file = nullptr;
  png_structp png = nullptr;
  png_infop info = nullptr;
  int64_t next_row = 0;  // the next row the stream gives
  char error[256] = {};

  ~PngReader() { close(); }
  void close();
  // Opens the stream and reads the header, with the transforms that give one byte or one
  // host-order 16-bit word per sample, alpha dropped, palettes expanded unless `indices`.
  bool open(bool indices, ImageInfo* out);
  // The next `n` rows into `rows` (row pointers).
  bool read_rows(png_bytep* rows, int n);
  bool read_image(png_bytep* rows);  // every row (an interlaced file)
};

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

  ~JpegReader() { close(); }
  void close();
  bool open(ImageInfo* out);  // gray or RGB; a progressive file is marked not streamed
  bool read_row(uint8_t* row);
};

}  // namespace ht::image_streams
