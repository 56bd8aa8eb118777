// Image files read in place (SPEC section 13): a rank's tile of a tiled TIFF decodes only
// the TIFF tiles under it, a strip TIFF only its strips; the values are the file's.
#include <gtest/gtest.h>
#include <png.h>
#include <tiffio.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "orchestrator/config.hpp"
#include "worker/io/data_reader.hpp"
#include "worker/io/image_files.hpp"

namespace fs = std::filesystem;
using namespace ht;

namespace {

constexpr int kSide = 4096, kTile = 256;

uint8_t pattern(int64_t y, int64_t x) { return uint8_t((y * 7 + x * 3) % 251); }

// A side x side 8-bit gray, deflate-compressed BigTIFF open for writing (nullptr on failure).
TIFF* open_gray_tiff(const std::string& path, int side) {
  TIFF* t = TIFFOpen(path.c_str(), "w8");  // BigTIFF
  if (!t) return nullptr;
  TIFFSetField(t, TIFFTAG_IMAGEWIDTH, side);
  TIFFSetField(t, TIFFTAG_IMAGELENGTH, side);
  TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, 1);
  TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(t, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_MINISBLACK);
  TIFFSetField(t, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  TIFFSetField(t, TIFFTAG_COMPRESSION, COMPRESSION_ADOBE_DEFLATE);
  return t;
}

// A kSide x kSide 8-bit gray TIFF, tiled (kTile x kTile) or in strips of `strip_rows`.
void write_tiff(const std::string& path, bool tiled, int strip_rows = 16) {
  TIFF* t = open_gray_tiff(path, kSide);
  ASSERT_NE(t, nullptr);
  std::vector<uint8_t> buf;
  if (tiled) {
    TIFFSetField(t, TIFFTAG_TILEWIDTH, kTile);
    TIFFSetField(t, TIFFTAG_TILELENGTH, kTile);
    buf.resize(size_t(kTile) * kTile);
    for (int y0 = 0; y0 < kSide; y0 += kTile)
      for (int x0 = 0; x0 < kSide; x0 += kTile) {
        for (int y = 0; y < kTile; ++y)
          for (int x = 0; x < kTile; ++x) buf[size_t(y) * kTile + x] = pattern(y0 + y, x0 + x);
        ASSERT_GE(TIFFWriteTile(t, buf.data(), uint32_t(x0), uint32_t(y0), 0, 0), 0);
      }
  } else {
    TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, strip_rows);
    buf.resize(kSide);
    for (int y = 0; y < kSide; ++y) {
      for (int x = 0; x < kSide; ++x) buf[size_t(x)] = pattern(y, x);
      ASSERT_GE(TIFFWriteScanline(t, buf.data(), uint32_t(y), 0), 0);
    }
  }
  TIFFClose(t);
}

class ImageFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("ht_images_" + std::to_string(getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string file(const std::string& name) const { return (dir / name).string(); }
  // A manifest of one image with a label, and a reader of it as model.input [kSide, kSide, 1].
  DataReader reader_of(const std::string& image) const {
    std::ofstream(file("m.csv")) << "image,label\n" << fs::path(image).filename().string() << ",1\n";
    DataReaderOptions o;
    o.height = o.width = kSide;
    o.channels = 1;
    o.classes = 2;
    return DataReader(file("m.csv"), o);
  }
  fs::path dir;
};

// Bytes of float32 the reader decodes for `rect`: every file block of `block_rows` x
// `block_cols` it touches, whole.
uint64_t decoded_bytes(const Rect& r, int block_rows, int block_cols) {
  const int64_t rows = (r.rows.hi - 1) / block_rows - r.rows.lo / block_rows + 1;
  const int64_t cols = (r.cols.hi - 1) / block_cols - r.cols.lo / block_cols + 1;
  return uint64_t(rows * block_rows) * uint64_t(cols * block_cols) * sizeof(float);
}

void expect_pattern(const Rect& r, const std::vector<float>& out) {
  const int cols = r.cols.size();
  for (int y = 0; y < r.rows.size(); y += 97)
    for (int x = 0; x < cols; x += 89)
      ASSERT_EQ(out[size_t(y) * cols + x], float(pattern(r.rows.lo + y, r.cols.lo + x))) << "row " << y << " col " << x;
}

TEST_F(ImageFilesTest, ATiledTiffRankDecodesOnlyTheTilesUnderItsTile) {
  write_tiff(file("tiled.tif"), true);
  const ImageInfo info = probe_image(file("tiled.tif"));
  EXPECT_EQ(info.height, kSide);
  EXPECT_EQ(info.width, kSide);
  EXPECT_EQ(info.channels, 1);
  // A 2x2 grid (tile-aligned shards) and a 3x3 one (shards across TIFF tiles).
  for (int grid : {2, 3}) {
    for (int i = 0; i < grid; ++i)
      for (int j = 0; j < grid; ++j) {
        DataReader reader = reader_of(file("tiled.tif"));
        const Rect r{{kSide * i / grid, kSide * (i + 1) / grid}, {kSide * j / grid, kSide * (j + 1) / grid}};
        std::vector<float> out(size_t(r.area()));
        reader.read_image_tile(0, r, 1.f, out.data());
        EXPECT_EQ(reader.bytes_read(), decoded_bytes(r, kTile, kTile)) << "grid " << grid << " shard " << i << "," << j;
        EXPECT_LT(reader.bytes_read(), uint64_t(kSide) * kSide * sizeof(float) / 2);
        expect_pattern(r, out);
      }
  }
}

TEST_F(ImageFilesTest, AStripTiffRankDecodesOnlyItsStrips) {
  write_tiff(file("strips.tif"), false, 16);
  DataReader reader = reader_of(file("strips.tif"));
  const Rect r{{1000, 2050}, {2048, 4096}};
  std::vector<float> out(size_t(r.area()));
  reader.read_image_tile(0, r, 1.f, out.data());
  // Whole strips (every column) of the rows it needs.
  EXPECT_EQ(reader.bytes_read(), decoded_bytes(Rect{r.rows, {0, kSide}}, 16, kSide));
  expect_pattern(r, out);
}

TEST_F(ImageFilesTest, HeadersThatClaimTooMuchAreRefusedBeforeAnyAllocation) {
  // A classic TIFF whose header says 2^21 x 2^21 pixels in one strip of 100 bytes.
  const std::string path = file("huge.tif");
  std::string bytes = std::string("II*\0", 4) + std::string("\x08\0\0\0", 4);
  auto u16 = [&](uint16_t v) { bytes += char(v & 0xff), bytes += char(v >> 8); };
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes += char((v >> (8 * i)) & 0xff);
  };
  const std::vector<std::array<uint32_t, 3>> entries = {  // tag, type (3 short, 4 long), value
      {256, 4, 1u << 21}, {257, 4, 1u << 21}, {258, 3, 8}, {259, 3, 1}, {262, 3, 1},
      {273, 4, 8},        {277, 3, 1},        {278, 4, 1u << 21}, {279, 4, 100}};
  u16(uint16_t(entries.size()));
  for (const auto& [tag, type, value] : entries) {
    u16(uint16_t(tag));
    u16(uint16_t(type));
    u32(1);
    if (type == 3) {
      u16(uint16_t(value));
      u16(0);
    } else {
      u32(value);
    }
  }
  u32(0);
  std::ofstream(path, std::ios::binary) << bytes;
  try {
    probe_image(path);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("more than halotrain reads"), std::string::npos) << e.what();
  }
}

// A PNG is a stream: rows are decoded in order, and a read that starts above the last one
// starts the stream again. A mirrored view reads its bands in the file's order too, so the
// rows under a rank's tile are decoded once (the rows above it are decoded and dropped).
TEST_F(ImageFilesTest, AMirroredPngTileDecodesItsStreamOnce) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = image.height = kSide;
  image.format = PNG_FORMAT_GRAY;
  std::vector<uint8_t> pixels(size_t(kSide) * kSide);
  for (int y = 0; y < kSide; ++y)
    for (int x = 0; x < kSide; ++x) pixels[size_t(y) * kSide + x] = pattern(y, x);
  ASSERT_NE(png_image_write_to_file(&image, file("g.png").c_str(), 0, pixels.data(), 0, nullptr), 0);
  DataReader reader = reader_of(file("g.png"));
  const Rect r{{kSide / 2, kSide}, {0, kSide / 2}};
  std::vector<float> out(size_t(r.area()));
  SampleView mirrored;
  mirrored.flip_rows = true;  // the view's bottom half is the file's top half
  reader.read_image_tile(0, r, 1.f, out.data(), mirrored);
  EXPECT_EQ(reader.bytes_read(), uint64_t(kSide / 2) * kSide * sizeof(float));  // rows [0, kSide/2), once
  for (int y = 0; y < r.rows.size(); y += 61)
    for (int x = 0; x < r.cols.size(); x += 67)
      ASSERT_EQ(out[size_t(y) * r.cols.size() + x], float(pattern(kSide - 1 - (r.rows.lo + y), x)));
  const Rect low{{0, kSide / 2}, {0, kSide / 2}};  // the file's bottom half, mirrored: rows above it skipped
  DataReader again = reader_of(file("g.png"));
  again.read_image_tile(0, low, 1.f, out.data(), mirrored);
  EXPECT_EQ(again.bytes_read(), uint64_t(kSide) * kSide * sizeof(float));
}

// SPEC section 13's promise at the size it is for: a 40000 x 40000 tiled BigTIFF (1.6 G
// pixels; its tiles written precompressed, seven patterns in turn) read by the data reader
// alone on a 2x2 grid. Each rank decodes exactly the TIFF tiles under its shard, and the
// reader's buffers beside the shard's own output stay within one band of tiles: the
// process's peak resident memory grows by the output buffer and at most 64 MiB.
TEST_F(ImageFilesTest, A40000SquareTiffRankReadsOnlyItsTilesWithinOneBand) {
  constexpr int kBig = 40000, kBigTile = 512, kVariants = 7;
  auto value = [](int64_t y, int64_t x) {
    const int64_t variant = ((y / kBigTile) * 3 + x / kBigTile) % kVariants;
    return uint8_t((variant * 37 + (y % kBigTile) * 7 + (x % kBigTile) * 3) % 251);
  };
  const std::string path = file("big.tif");
  {
    TIFF* t = open_gray_tiff(path, kBig);
    ASSERT_NE(t, nullptr);
    TIFFSetField(t, TIFFTAG_TILEWIDTH, kBigTile);
    TIFFSetField(t, TIFFTAG_TILELENGTH, kBigTile);
    std::vector<std::vector<uint8_t>> packed(kVariants);
    std::vector<uint8_t> tile(size_t(kBigTile) * kBigTile);
    for (int v = 0; v < kVariants; ++v) {
      for (int y = 0; y < kBigTile; ++y)
        for (int x = 0; x < kBigTile; ++x) tile[size_t(y) * kBigTile + x] = uint8_t((v * 37 + y * 7 + x * 3) % 251);
      uLongf n = compressBound(uLong(tile.size()));
      packed[size_t(v)].resize(n);
      ASSERT_EQ(compress2(packed[size_t(v)].data(), &n, tile.data(), uLong(tile.size()), 6), Z_OK);
      packed[size_t(v)].resize(n);
    }
    const int tiles = (kBig + kBigTile - 1) / kBigTile;
    for (int ty = 0; ty < tiles; ++ty)
      for (int tx = 0; tx < tiles; ++tx) {
        std::vector<uint8_t>& p = packed[size_t((ty * 3 + tx) % kVariants)];
        ASSERT_GT(TIFFWriteRawTile(t, TIFFComputeTile(t, uint32_t(tx * kBigTile), uint32_t(ty * kBigTile), 0, 0),
                                   p.data(), tmsize_t(p.size())),
                  0);
      }
    TIFFClose(t);
  }
  std::ofstream(file("m.csv")) << "image,label\nbig.tif,1\n";
  DataReaderOptions o;
  o.height = o.width = kBig;
  o.channels = 1;
  o.classes = 2;
  std::vector<float> out(size_t(kBig / 2) * (kBig / 2));
  std::fill(out.begin(), out.end(), -1.f);  // resident before the reads
  auto status_bytes = [](const std::string& key) {  // a "VmRSS:  123 kB" line of /proc/self/status
    std::ifstream f("/proc/self/status");
    for (std::string line; std::getline(f, line);)
      if (line.rfind(key, 0) == 0) return uint64_t(std::stoull(line.substr(key.size()))) * 1024;
    return uint64_t(0);
  };
  std::ofstream("/proc/self/clear_refs") << "5";  // the peak (VmHWM) starts again from now
  const uint64_t before = status_bytes("VmRSS:");
  ASSERT_GT(before, uint64_t(out.size() * sizeof(float)));
  ASSERT_LE(status_bytes("VmHWM:"), before + (uint64_t(4) << 20)) << "the peak was not reset";
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      DataReader reader(file("m.csv"), o);
      const Rect r{{kBig * i / 2, kBig * (i + 1) / 2}, {kBig * j / 2, kBig * (j + 1) / 2}};
      reader.read_image_tile(0, r, 1.f, out.data());
      // The tiles under the shard, whole (libtiff decodes the edge tiles at their full size).
      EXPECT_EQ(reader.bytes_read(), decoded_bytes(r, kBigTile, kBigTile)) << "shard " << i << "," << j;
      for (int64_t y = 0; y < r.rows.size(); y += 997)
        for (int64_t x = 0; x < r.cols.size(); x += 1009)
          ASSERT_EQ(out[size_t(y) * r.cols.size() + size_t(x)], float(value(r.rows.lo + y, r.cols.lo + x)))
              << "shard " << i << "," << j << " row " << y << " col " << x;
    }
  const uint64_t grown = status_bytes("VmHWM:") - before;
  std::cout << "peak resident memory beside the shard's output: " << (grown >> 20) << " MiB\n";
  EXPECT_LT(grown, uint64_t(64) << 20) << "the reader's buffers beside the shard's output";
}

}  // namespace
