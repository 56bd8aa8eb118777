#include "worker/io/prediction_output.hpp"

#include <fmt/format.h>
#include <hdf5.h>
#include <tiffio.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "orchestrator/config.hpp"
#include "orchestrator/files.hpp"
#include "worker/io/h5.hpp"
#include "worker/io/image_decoders.hpp"
#include "worker/io/publish.hpp"

namespace fs = std::filesystem;

namespace ht {

void output_probabilities(float* v, int k) {
  if (k == 1) {
    v[0] = float(1.0 / (1.0 + std::exp(-double(v[0]))));
    return;
  }
  const double top = *std::max_element(v, v + k);
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += std::exp(double(v[i]) - top);
  for (int i = 0; i < k; ++i) v[i] = float(std::exp(double(v[i]) - top) / sum);
}

bool is_prediction_directory(const std::string& output) {
  std::error_code ec;
  return (!output.empty() && output.back() == '/') || fs::is_directory(output, ec);
}

namespace {

// [C][rows][cols] raw outputs as [rows][cols][C] probabilities.
std::vector<float> probabilities_hwc(int C, int rows, int cols, const float* chw) {
  std::vector<float> hwc(size_t(C) * rows * cols);
  const size_t plane = size_t(rows) * cols;
  for (size_t p = 0; p < plane; ++p) {
    float* out = hwc.data() + p * C;
    for (int c = 0; c < C; ++c) out[c] = chw[size_t(c) * plane + p];
    output_probabilities(out, C);
  }
  return hwc;
}

// --- one HDF5 file: dataset `predictions`, hyperslabs as they come -------------------------

class H5Predictions : public PredictionSink {
 public:
  H5Predictions(const std::string& path, const std::vector<int64_t>& shape) : path_(path), temp_(h5::temp_path(path)) {
    h5::quiet();
    try {
      file_ = h5::create_file(temp_);
      std::vector<int64_t> chunk = shape;
      chunk[0] = shape.size() == 2 ? std::min<int64_t>(shape[0], 4096) : 1;
      if (shape.size() == 4) {
        chunk[1] = std::min<int64_t>(shape[1], 256);
        chunk[2] = std::min<int64_t>(shape[2], 256);
      }
      data_ = h5::create_dataset(file_, "predictions", H5T_IEEE_F32LE, shape, chunk);
    } catch (const std::exception& e) {
      std::remove(temp_.c_str());
      throw ConfigError(fmt::format("--output {}: cannot create it: {}", path, e.what()));
    }
  }
  ~H5Predictions() override {
    if (committed_) return;
    data_ = h5::Hid();
    file_ = h5::Hid();
    std::remove(temp_.c_str());
  }

  void write_tile(int64_t index, int row0, int col0, int C, int rows, int cols, const float* chw) override {
    write({index, row0, col0, 0}, {1, rows, cols, C}, probabilities_hwc(C, rows, cols, chw).data());
  }
  void write_rows(int64_t first, int n, int K, const float* raw) override {
    std::vector<float> v(raw, raw + size_t(n) * K);
    for (int i = 0; i < n; ++i) output_probabilities(v.data() + size_t(i) * K, K);
    write({first, 0}, {n, K}, v.data());
  }
  void commit() override {
    // Checked closes: a flush that fails (disk full) throws, and the destructor removes
    // the temporary file instead of publishing a short one.
    try {
      data_.close();
      file_.close();
    } catch (const h5::H5Error& e) {
      throw ConfigError(fmt::format("--output {}: writing it failed: {}", path_, e.reason()));
    }
    h5::commit_file(temp_, path_);
    committed_ = true;
  }

 private:
  // A failed write (disk full, quota) is the user's to mend: exit 1 naming the file.
  void write(const std::vector<int64_t>& start, const std::vector<int64_t>& count, const float* data) {
    try {
      h5::write_hyperslab(data_, start, count, H5T_NATIVE_FLOAT, data);
    } catch (const h5::H5Error& e) {
      throw ConfigError(fmt::format("--output {}: writing it failed: {}", path_, e.reason()));
    }
  }

  std::string path_, temp_;
  h5::Hid file_, data_;
  bool committed_ = false;
};

// --- a directory: one tiled BigTIFF per image, a CSV for a classifier ----------------------

constexpr int kTiffTile = 256;

// One tiled, deflate-compressed BigTIFF being written under a temporary name.
class TiffWriter {
 public:
  TiffWriter(const std::string& path, int rows, int cols, int C, bool float32)
      : path_(path), temp_(h5::temp_path(path)) {
    image_decoders::tiff_error().clear();
    tiff_ = TIFFOpen(temp_.c_str(), "w8");
    if (!tiff_) fail("cannot create it");
    TIFFSetField(tiff_, TIFFTAG_IMAGEWIDTH, uint32_t(cols));
    TIFFSetField(tiff_, TIFFTAG_IMAGELENGTH, uint32_t(rows));
    TIFFSetField(tiff_, TIFFTAG_SAMPLESPERPIXEL, uint16_t(C));
    TIFFSetField(tiff_, TIFFTAG_BITSPERSAMPLE, uint16_t(float32 ? 32 : 8));
    TIFFSetField(tiff_, TIFFTAG_SAMPLEFORMAT, uint16_t(float32 ? SAMPLEFORMAT_IEEEFP : SAMPLEFORMAT_UINT));
    TIFFSetField(tiff_, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_MINISBLACK);
    TIFFSetField(tiff_, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
    TIFFSetField(tiff_, TIFFTAG_COMPRESSION, COMPRESSION_ADOBE_DEFLATE);
    TIFFSetField(tiff_, TIFFTAG_TILEWIDTH, uint32_t(kTiffTile));
    TIFFSetField(tiff_, TIFFTAG_TILELENGTH, uint32_t(kTiffTile));
    if (C > 1) {  // the channels past the first are unnamed samples, not colours
      std::vector<uint16_t> extra(size_t(C - 1), EXTRASAMPLE_UNSPECIFIED);
      TIFFSetField(tiff_, TIFFTAG_EXTRASAMPLES, uint16_t(extra.size()), extra.data());
    }
  }
  ~TiffWriter() {
    if (tiff_) TIFFClose(tiff_);
    if (!committed_) std::remove(temp_.c_str());
  }
  TiffWriter(const TiffWriter&) = delete;
  TiffWriter& operator=(const TiffWriter&) = delete;

  void write_tile(int tile_row, int tile_col, const void* data, size_t bytes) {
    image_decoders::tiff_error().clear();
    const uint32_t tile = TIFFComputeTile(tiff_, uint32_t(tile_col * kTiffTile), uint32_t(tile_row * kTiffTile), 0, 0);
    if (TIFFWriteEncodedTile(tiff_, tile, const_cast<void*>(data), tmsize_t(bytes)) < 0) fail("writing it failed");
  }
  void commit() {
    image_decoders::tiff_error().clear();
    const bool flushed = TIFFFlush(tiff_) == 1;
    TIFFClose(tiff_);
    tiff_ = nullptr;
    if (!flushed) fail("writing it failed");
    try {
      h5::commit_file(temp_, path_);
    } catch (const std::exception& e) {
      throw ConfigError(fmt::format("--output: {}: {}", path_, e.what()));
    }
    committed_ = true;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    const std::string& why = image_decoders::tiff_error();
    throw ConfigError(fmt::format("--output: {}: {}{}", path_, what, why.empty() ? "" : ": " + why));
  }
  std::string path_, temp_;
  TIFF* tiff_ = nullptr;
  bool committed_ = false;
};

class DirectoryPredictions : public PredictionSink {
 public:
  DirectoryPredictions(const std::string& dir, const std::string& input, const PredictionLayout& layout)
      : dir_(dir), layout_(layout) {
    if (const std::string problem = writable_directory_problem(dir); !problem.empty())
      throw ConfigError(fmt::format("--output {}: {}", dir, problem));
    const int64_t N = layout.shape[0];
    const bool images = layout.shape.size() == 4;  // a TIFF per image; else one scores.csv
    published_.assign(size_t(N), false);
    const std::string stem = fs::path(input).stem().string();
    const int digits = int(std::to_string(std::max<int64_t>(N - 1, 0)).size());
    std::map<std::string, int64_t> taken;  // every file name an image writes, without .tif
    for (int64_t i = 0; i < N; ++i) {
      std::string name = layout.names.empty() ? "" : layout.names[size_t(i)];
      fs::path p = fs::path(name).lexically_normal();
      if (name.empty())
        p = fmt::format("{}-{:0{}}", stem, i, digits);
      else if (p.is_absolute() || *p.begin() == "..")  // an image outside the CSV's folder
        p = p.filename();
      p.replace_extension();
      stems_.push_back(p.string());
      if (!images) continue;
      for (const std::string& file : {p.string(), p.string() + "-float32"}) {
        if (file != p.string() && !layout.float32) continue;
        const auto [at, fresh] = taken.emplace(file, i);
        if (!fresh)
          throw ConfigError(fmt::format("--output {}: images {} ({}) and {} ({}) would both write {}.tif; give "
                                        "them different names",
                                        dir, at->second, layout.names.empty() ? "" : layout.names[size_t(at->second)],
                                        i, name, file));
      }
    }
    if (layout.shape.size() == 2) scores_.assign(size_t(N) * size_t(layout.shape[1]), NAN);
  }

  void write_tile(int64_t index, int row0, int col0, int C, int rows, int cols, const float* chw) override {
    const auto [own_rows, own_cols] = extent(index);
    const int r_hi = std::min(row0 + rows, own_rows), c_hi = std::min(col0 + cols, own_cols);
    if (r_hi <= row0 || c_hi <= col0) return;  // all of it is padding (also after the image is published)
    if (published_[size_t(index)]) throw std::logic_error("predict: pixels of an image already written");
    Image& image = open(index, C);
    const std::vector<float> p = probabilities_hwc(C, rows, cols, chw);
    for (int tr = row0 / kTiffTile; tr <= (r_hi - 1) / kTiffTile; ++tr)
      for (int tc = col0 / kTiffTile; tc <= (c_hi - 1) / kTiffTile; ++tc) {
        Pending& tile = image.pending[{tr, tc}];
        if (tile.u8.empty()) {
          tile.u8.assign(size_t(kTiffTile) * kTiffTile * C, 0);
          if (image.f32) tile.f32.assign(size_t(kTiffTile) * kTiffTile * C, 0.f);
        }
        const int y0 = std::max(row0, tr * kTiffTile), y1 = std::min(r_hi, (tr + 1) * kTiffTile);
        const int x0 = std::max(col0, tc * kTiffTile), x1 = std::min(c_hi, (tc + 1) * kTiffTile);
        for (int y = y0; y < y1; ++y) {
          const float* src = p.data() + (size_t(y - row0) * cols + size_t(x0 - col0)) * C;
          const size_t at = (size_t(y - tr * kTiffTile) * kTiffTile + size_t(x0 - tc * kTiffTile)) * C;
          const size_t n = size_t(x1 - x0) * C;
          for (size_t k = 0; k < n; ++k) tile.u8[at + k] = uint8_t(std::lround(std::clamp(src[k], 0.f, 1.f) * 255.f));
          if (image.f32) std::copy(src, src + n, tile.f32.begin() + ptrdiff_t(at));
        }
        tile.filled += int64_t(y1 - y0) * (x1 - x0);
        const int64_t area = int64_t(std::min(kTiffTile, own_rows - tr * kTiffTile)) *
                             std::min(kTiffTile, own_cols - tc * kTiffTile);
        if (tile.filled < area) continue;
        image.u8->write_tile(tr, tc, tile.u8.data(), tile.u8.size());
        if (image.f32) image.f32->write_tile(tr, tc, tile.f32.data(), tile.f32.size() * sizeof(float));
        image.pending.erase({tr, tc});
        ++image.tiles_written;
      }
    if (image.tiles_written == image.tiles) {  // whole: published now, its memory freed
      image.u8->commit();
      if (image.f32) image.f32->commit();
      open_.erase(index);
      published_[size_t(index)] = true;
    }
  }

  void write_rows(int64_t first, int n, int K, const float* raw) override {
    for (int i = 0; i < n; ++i) {
      float* row = scores_.data() + size_t(first + i) * K;
      std::copy(raw + size_t(i) * K, raw + size_t(i + 1) * K, row);
      output_probabilities(row, K);
    }
  }

  void commit() override {
    if (layout_.shape.size() == 4) {
      if (!open_.empty() || std::count(published_.begin(), published_.end(), false) > 0)
        throw std::logic_error("predict: an image's output is not whole at the end");
      return;
    }
    const int K = int(layout_.shape[1]);
    std::string csv = "image";
    for (int k = 0; k < K; ++k) csv += K == 1 ? ",score" : fmt::format(",class_{}", k);
    csv += "\n";
    for (size_t i = 0; i < stems_.size(); ++i) {
      const std::string& name = layout_.names.empty() || layout_.names[i].empty() ? stems_[i] : layout_.names[i];
      csv += csv_field(name);
      for (int k = 0; k < K; ++k) csv += fmt::format(",{:.9g}", scores_[i * size_t(K) + size_t(k)]);
      csv += "\n";
    }
    publish_page((fs::path(dir_) / "scores.csv").string(), csv);  // written whole, then renamed
  }

 private:
  struct Pending {
    std::vector<uint8_t> u8;
    std::vector<float> f32;
    int64_t filled = 0;  // pixels of the image's own written into it
  };
  struct Image {
    std::unique_ptr<TiffWriter> u8, f32;
    std::map<std::pair<int, int>, Pending> pending;  // TIFF tiles that are not whole yet
    int64_t tiles = 0, tiles_written = 0;
  };

  Image& open(int64_t index, int C) {
    auto it = open_.find(index);
    if (it != open_.end()) return it->second;
    Image& image = open_[index];
    const auto [rows, cols] = extent(index);
    image.tiles = int64_t((rows + kTiffTile - 1) / kTiffTile) * ((cols + kTiffTile - 1) / kTiffTile);
    const fs::path base = fs::path(dir_) / stems_[size_t(index)];
    std::error_code ec;
    fs::create_directories(base.parent_path(), ec);
    image.u8 = std::make_unique<TiffWriter>(base.string() + ".tif", rows, cols, C, false);
    if (layout_.float32) image.f32 = std::make_unique<TiffWriter>(base.string() + "-float32.tif", rows, cols, C, true);
    return image;
  }

  // The output rows and columns of image `index` that are its own (the rest is padding).
  std::pair<int, int> extent(int64_t index) const {
    return layout_.extents.empty() ? std::pair<int, int>{int(layout_.shape[1]), int(layout_.shape[2])}
                                   : layout_.extents[size_t(index)];
  }

  static std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }

  std::string dir_;
  PredictionLayout layout_;
  std::vector<std::string> stems_;  // per image: its output's path under dir_, without .tif
  std::map<int64_t, Image> open_;
  std::vector<bool> published_;  // per image: its files are whole and renamed
  std::vector<float> scores_;  // a classifier's [N][K] probabilities
};

}  // namespace

std::unique_ptr<PredictionSink> open_prediction_output(const std::string& output, const std::string& input,
                                                       const PredictionLayout& layout) {
  if (is_prediction_directory(output)) return std::make_unique<DirectoryPredictions>(output, input, layout);
  if (layout.float32)
    throw ConfigError(fmt::format("--float32 asks for float32 BigTIFFs beside the uint8 ones, with --output DIR/; "
                                  "{} is an HDF5 file, whose predictions are float32 already",
                                  output));
  return std::make_unique<H5Predictions>(output, layout.shape);
}

}  // namespace ht
