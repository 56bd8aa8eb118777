#include "worker/io/data_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "orchestrator/files.hpp"
#include "worker/io/finite.hpp"
#include "worker/io/h5.hpp"
#include "worker/io/manifest_images.hpp"

namespace ht {

const char* to_string(PixelType t) {
  switch (t) {
    case PixelType::Float32: return "float32";
    case PixelType::UInt8: return "uint8";
    case PixelType::UInt16: return "uint16";
  }
  return "?";
}

DataReaderOptions data_reader_options(const Config& config, const ModelSpec& spec) {
  DataReaderOptions o;
  o.images = config.data.images;
  o.targets = config.data.targets;
  o.height = config.model.height;
  o.width = config.model.width;
  o.channels = config.model.channels;
  o.downsample = config.data.downsample;
  o.larger_ok = config.data.augment.crops();
  o.fit = config.data.fit;
  o.pad_value = config.data.pad_value;
  o.level = config.data.level;
  o.scale_auto = config.data.scale_auto;
  o.convert_channels = config.data.channels > 0;
  o.mean = config.data.mean;
  o.std = config.data.std;
  const bool spatial_out = spec.spatial_output();
  if (config.model.loss == LossType::SoftmaxCrossEntropy) {
    o.expect = spatial_out ? TargetKind::Masks : TargetKind::Labels;  // per pixel: class maps
    o.classes = spec.output().c;
  } else if (spatial_out) {
    o.expect = TargetKind::Masks;  // a full-resolution output is compared with masks
  } else {
    o.expect = TargetKind::Labels;
  }
  return o;
}

namespace {
// Host bytes kept per image of a file: its label and its place in the epoch's permutation.
constexpr uint64_t kIndexBytesPerImage = 2 * sizeof(int64_t);
}  // namespace

struct DataReader::Impl {
  std::string path;
  DataReaderOptions opt;
  h5::Hid file, images, masks;
  int64_t count = 0;
  int file_h = 0, file_w = 0;  // the images as stored
  int masks_rank = 4;          // [N, H, W, 1], or [N, H, W] class maps
  int view_h = 0, view_w = 0;  // after downsampling
  uint64_t bytes_read = 0;
  PixelType pixel = PixelType::Float32;
  TargetKind kind = TargetKind::Labels;
  std::vector<int64_t> labels;
  std::vector<float> buffer;  // HWC staging for multi-channel tiles
  // A manifest's image files (SPEC section 13) instead of HDF5 datasets.
  std::unique_ptr<ManifestImages> manifest;

  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(fmt::format("{}: {}", path, what));
  }

  void check_file() const {
    if (path.empty()) throw ConfigError(fmt::format("{} is empty: no data file given", opt.key));
    if (is_manifest(path)) return;  // read_manifest says what is wrong with it
    std::string why = h5::why_not_readable(path);
    if (why == "does not exist") {
      std::error_code ec;
      fail(fmt::format("data file does not exist ({}; working directory {})", opt.key,
                       std::filesystem::current_path(ec).string()));
    }
    if (why == "is not an HDF5 file")
      fail(fmt::format("is not an HDF5 file ({}); make one with `halotrain make-data`", opt.key));
    if (!why.empty()) fail(fmt::format("{} ({})", why, opt.key));
  }

  std::string listing() const {
    auto names = h5::child_names(file);
    return names.empty() ? "nothing" : fmt::format("{}", fmt::join(names, ", "));
  }

  h5::Hid dataset(const std::string& name, const char* key) const {
    if (name.empty() || !h5::is_dataset(file, name))
      fail(fmt::format("no dataset '{}' ({}); the file holds: {}", name, key, listing()));
    return h5::open_dataset(file, name);
  }

  std::string input_shape() const {
    return fmt::format("[{}, {}, {}]", opt.height, opt.width, opt.channels);
  }

  void open_images() {
    images = dataset(opt.images, "data.images");
    h5::Shape s = h5::dataset_shape(images);
    if (s.size() != 4)
      fail(fmt::format("dataset '{}' is {} (rank {}), expected [N, H, W, C] with model.input {}",
                       opt.images, h5::shape_string(s), s.size(), input_shape()));
    const int f = opt.downsample;
    if (s[3] != opt.channels || (f == 1 && !opt.larger_ok && (s[1] != opt.height || s[2] != opt.width)))
      fail(fmt::format("dataset '{}' is {} but model.input is {}", opt.images, h5::shape_string(s),
                       input_shape()));
    if (s[1] % f != 0 || s[2] % f != 0)
      fail(fmt::format("data.downsample {} does not divide the {}x{} images of dataset '{}' (every side must be a "
                       "multiple of it)",
                       f, s[1], s[2], opt.images));
    file_h = int(s[1]);
    file_w = int(s[2]);
    view_h = file_h / f;
    view_w = file_w / f;
    const std::string after = f > 1 ? fmt::format(" (after data.downsample {})", f) : "";
    if (opt.larger_ok && (view_h < opt.height || view_w < opt.width))
      fail(fmt::format("data.augment.crop [{}, {}] is larger than the {}x{} images{} of dataset '{}'", opt.height,
                       opt.width, view_h, view_w, after, opt.images));
    if (!opt.larger_ok && (view_h != opt.height || view_w != opt.width))
      fail(fmt::format("dataset '{}' is {}: {}x{}{}, but model.input is {}", opt.images, h5::shape_string(s),
                       view_h, view_w, after, input_shape()));
    if (s[0] < 1) fail(fmt::format("dataset '{}' is {}: it holds no images", opt.images, h5::shape_string(s)));
    // A header can declare any count; the per-image index (labels, the epoch's order) is
    // host memory, so the count is checked before anything is sized by it.
    check_index_memory(s[0], fmt::format("dataset '{}'", opt.images));
    count = s[0];
    h5::Hid type = h5::type_id(H5_CHECK(H5Dget_type(images)));
    std::string name = h5::type_name(type);
    if (name == "float32") pixel = PixelType::Float32;
    else if (name == "uint8") pixel = PixelType::UInt8;
    else if (name == "uint16") pixel = PixelType::UInt16;
    else fail(fmt::format("dataset '{}' has dtype {}, expected float32, uint8 or uint16", opt.images, name));
  }

  void open_targets() {
    h5::Hid ds = dataset(opt.targets, "data.targets");
    h5::Shape s = h5::dataset_shape(ds);
    h5::Hid type = h5::type_id(H5_CHECK(H5Dget_type(ds)));
    h5::TypeClass tc = h5::type_class(type);
    std::string labels_shape = fmt::format("[{}]", count);
    std::string masks_shape = fmt::format("[{}, {}, {}, 1]", count, file_h, file_w);
    // Class maps for a per-pixel softmax may also be [N, H, W] (SPEC section 7).
    const bool class_maps = opt.expect == TargetKind::Masks && opt.classes > 0;
    masks_rank = int(s.size());
    kind = s.size() == 4 || (class_maps && s.size() == 3) ? TargetKind::Masks : TargetKind::Labels;
    if (s.size() != 1 && s.size() != 4 && !(class_maps && s.size() == 3))
      fail(fmt::format("dataset '{}' is {}, expected labels {} or masks {}", opt.targets,
                       h5::shape_string(s), labels_shape, masks_shape));
    if (opt.expect && *opt.expect != kind)
      fail(fmt::format("dataset '{}' is {} ({}) but model.loss needs {} {}", opt.targets,
                       h5::shape_string(s), to_string(kind), to_string(*opt.expect),
                       *opt.expect == TargetKind::Labels ? labels_shape : masks_shape));
    if (kind == TargetKind::Labels) {
      if (s[0] != count)
        fail(fmt::format("dataset '{}' is {} but '{}' holds {} images, expected {}", opt.targets,
                         h5::shape_string(s), opt.images, count, labels_shape));
      if (tc != h5::TypeClass::SignedInt && tc != h5::TypeClass::UnsignedInt)
        fail(fmt::format("dataset '{}' has dtype {}, expected integer class ids", opt.targets,
                         h5::type_name(type)));
      labels.resize(size_t(count));
      h5::read_dataset(ds, labels.data(), count);  // small: one integer per image
    } else {
      if (s[0] != count || s[1] != file_h || s[2] != file_w || (s.size() == 4 && s[3] != 1))
        fail(fmt::format("dataset '{}' is {}, expected masks {}", opt.targets, h5::shape_string(s),
                         masks_shape));
      if (tc == h5::TypeClass::String || tc == h5::TypeClass::Other)
        fail(fmt::format("dataset '{}' has dtype {}, expected {}", opt.targets, h5::type_name(type),
                         class_maps ? fmt::format("class ids in [0, {})", opt.classes) : "numbers in {0, 1}"));
      // A box average of class ids is no class: only two classes (a threshold) downsample.
      if (class_maps && opt.classes > 2 && opt.downsample > 1)
        fail(fmt::format("data.downsample {} averages the masks in '{}', but class maps of {} classes cannot be "
                         "averaged; use data.downsample: 1 with model.loss softmax_cross_entropy over more than 2 "
                         "classes",
                         opt.downsample, opt.targets, opt.classes));
      masks = std::move(ds);
    }
  }

  void check_index_memory(int64_t n, const std::string& what) const {
    const uint64_t index_bytes = saturating_product({uint64_t(n), kIndexBytesPerImage});
    const uint64_t limit = physical_memory_bytes() / 8;
    if (index_bytes > limit)
      fail(fmt::format("{} declares {} images; their index (labels and shuffle order, {} bytes per image) would "
                       "need {} of host memory, more than an eighth of this machine's {}; split the data into "
                       "smaller files",
                       what, n, kIndexBytesPerImage, format_size(index_bytes), format_size(physical_memory_bytes())));
  }

  // A manifest: every row's header is read now, so a wrong size, channel count or format is
  // named before training starts; the pixels are read in place as the tiles ask.
  void open_manifest() {
    manifest = std::make_unique<ManifestImages>(path, opt);
    const Manifest& m = manifest->manifest();
    count = int64_t(m.rows.size());
    check_index_memory(count, "the manifest");
    pixel = PixelType::Float32;
    file_h = manifest->height();
    file_w = manifest->width();
    const int f = opt.downsample;
    const std::string after = f > 1 ? fmt::format(" (data.downsample {})", f) : "";
    if (file_h % f != 0 || file_w % f != 0)
      fail(fmt::format("data.downsample {} does not divide the {}x{} images (every side must be a multiple of it)",
                       f, file_h, file_w));
    view_h = file_h / f;
    view_w = file_w / f;
    if (opt.larger_ok && (view_h < opt.height || view_w < opt.width))
      fail(fmt::format("data.augment.crop [{}, {}] is larger than the {}x{} images{}", opt.height, opt.width, view_h,
                       view_w, after));
    kind = manifest->targets();
    if (kind == TargetKind::Labels && !opt.targets.empty())
      for (const ManifestRow& r : m.rows) labels.push_back(r.label);
  }

  // Rows [row0, row0 + rows) and columns [col0, col0 + cols) of image (or mask) `index` in
  // the file's pixels, C channels last, as float: an HDF5 hyperslab, or a manifest file's
  // block as data.fit places the image (padding: data.pad_value, 0 for masks).
  void read_block(bool mask, int64_t index, int64_t row0, int64_t col0, int64_t rows, int64_t cols, int C,
                  float* out) {
    if (!manifest) {
      if (mask && masks_rank == 3)  // class maps [N, H, W]
        h5::read_hyperslab(masks, {index, row0, col0}, {1, rows, cols}, H5T_NATIVE_FLOAT, out);
      else
        h5::read_hyperslab(mask ? masks : images, {index, row0, col0, 0}, {1, rows, cols, C}, H5T_NATIVE_FLOAT, out);
      bytes_read += uint64_t(rows) * cols * C * sizeof(float);
      return;
    }
    const uint64_t before = manifest->bytes_decoded();
    manifest->read(mask, index, row0, col0, rows, cols, C, out);
    bytes_read += manifest->bytes_decoded() - before;
  }

  // data.scale: auto: 1 / the largest value of the image's integer type (1 for floats).
  float auto_scale(int64_t index) const {
    if (manifest) return float(1.0 / manifest->full_scale(index));
    return pixel == PixelType::UInt8 ? 1.f / 255.f : pixel == PixelType::UInt16 ? 1.f / 65535.f : 1.f;
  }

  void check_tile(int64_t index, const Rect& r, const SampleView& v) const {
    if (index < 0 || index >= count)
      throw std::out_of_range(fmt::format("{}: image index {} outside [0, {})", path, index, count));
    if (r.empty() || r.rows.lo < 0 || r.cols.lo < 0 || r.rows.hi > opt.height || r.cols.hi > opt.width)
      throw std::out_of_range(fmt::format("{}: tile rows [{}, {}) cols [{}, {}) outside the {}x{} image",
                                          path, r.rows.lo, r.rows.hi, r.cols.lo, r.cols.hi,
                                          opt.height, opt.width));
    if (v.top < 0 || v.left < 0 || v.top + opt.height > view_h || v.left + opt.width > view_w)
      throw std::out_of_range(fmt::format("{}: a {}x{} view at ({}, {}) outside the {}x{} image", path,
                                          opt.height, opt.width, v.top, v.left, view_h, view_w));
  }

  // Reads `rect` of the view `v` of image `index` of `ds` (C channels) as [C][rows][cols]:
  // the file block under it, in bands of rows, box-averaged by the downsample factor and
  // mirrored. `check` sees every file value with its file row and column.
  template <class Check>
  void read_view(bool mask, int64_t index, int C, const Rect& rect, const SampleView& v, float* out,
                 const Check& check) {
    const int rows = rect.rows.size(), cols = rect.cols.size(), f = opt.downsample;
    const int64_t row0 = int64_t(f) * (v.top + (v.flip_rows ? opt.height - rect.rows.hi : rect.rows.lo));
    const int64_t col0 = int64_t(f) * (v.left + (v.flip_cols ? opt.width - rect.cols.hi : rect.cols.lo));
    const int64_t file_cols = int64_t(cols) * f;
    const uint64_t band_row_bytes = uint64_t(file_cols) * f * C * sizeof(float);
    const int band = int(std::clamp<uint64_t>((uint64_t(8) << 20) / band_row_bytes, 1, uint64_t(rows)));
    buffer.resize(size_t(band) * f * file_cols * C);
    const size_t plane = size_t(rows) * cols;
    const double box = double(f) * f;
    // Bands in the file's order of rows, also when mirrored, so a PNG or JPEG stream is
    // decoded once rather than started again for every band.
    for (int src_lo = 0; src_lo < rows; src_lo += band) {
      const int nb = std::min(band, rows - src_lo);
      const int64_t first_row = row0 + int64_t(src_lo) * f;
      read_block(mask, index, first_row, col0, int64_t(nb) * f, file_cols, C, buffer.data());
      for (int i = 0; i < nb; ++i) {
        const int src = src_lo + i, r = v.flip_rows ? rows - 1 - src : src;
        for (int j = 0; j < cols; ++j) {
          const int q = v.flip_cols ? cols - 1 - j : j;
          for (int c = 0; c < C; ++c) {
            double sum = 0;
            for (int dy = 0; dy < f; ++dy)
              for (int dx = 0; dx < f; ++dx) {
                const float x = buffer[(size_t(i * f + dy) * file_cols + size_t(j) * f + dx) * C + c];
                check(x, first_row + i * f + dy, col0 + int64_t(j) * f + dx);
                sum += x;
              }
            out[size_t(c) * plane + size_t(r) * cols + q] = f == 1 ? float(sum) : float(sum / box);
          }
        }
      }
    }
  }
};

DataReader::DataReader(const std::string& path, const DataReaderOptions& options)
    : impl_(std::make_unique<Impl>()) {
  h5::quiet();
  Impl& m = *impl_;
  m.path = path;
  m.opt = options;
  m.check_file();
  if (is_manifest(path)) {
    m.open_manifest();
    return;
  }
  try {
    m.file = h5::open_file(path);
    m.open_images();
    if (!options.targets.empty()) m.open_targets();
  } catch (const h5::H5Error& e) {
    throw ConfigError(fmt::format("{}: cannot read the data file ({}): {}", path, options.key, e.reason()));
  }
}

DataReader::~DataReader() = default;
DataReader::DataReader(DataReader&&) noexcept = default;
DataReader& DataReader::operator=(DataReader&&) noexcept = default;

const std::string& DataReader::path() const { return impl_->path; }
int64_t DataReader::count() const { return impl_->count; }
bool DataReader::has_masks() const { return impl_->kind == TargetKind::Masks; }
TargetKind DataReader::target_kind() const { return impl_->kind; }
PixelType DataReader::pixel_type() const { return impl_->pixel; }
int DataReader::height() const { return impl_->opt.height; }
int DataReader::width() const { return impl_->opt.width; }
int DataReader::channels() const { return impl_->opt.channels; }
int DataReader::view_height() const { return impl_->view_h; }
int DataReader::view_width() const { return impl_->view_w; }
uint64_t DataReader::bytes_read() const { return impl_->bytes_read; }
std::string DataReader::identity() const {
  return impl_->manifest ? manifest_identity(impl_->manifest->manifest()) : "";
}

int DataReader::integer_bits() const { return impl_->manifest ? impl_->manifest->integer_bits() : 0; }

std::string DataReader::image_name(int64_t index) const {
  const Impl& m = *impl_;
  if (!m.manifest) return "";
  const std::filesystem::path image(m.manifest->manifest().rows.at(size_t(index)).image);
  const std::filesystem::path relative = image.lexically_relative(std::filesystem::path(m.path).parent_path());
  return relative.empty() ? image.filename().string() : relative.string();
}

std::pair<int, int> DataReader::image_extent(int64_t index) const {
  const Impl& m = *impl_;
  if (!m.manifest || m.opt.fit != DataFit::Pad) return {m.opt.height, m.opt.width};
  const auto [h, w] = m.manifest->image_size(index);
  const int d = m.opt.downsample;
  return {std::min(m.opt.height, (h + d - 1) / d), std::min(m.opt.width, (w + d - 1) / d)};
}

void DataReader::read_image_tile(int64_t index, const Rect& rect, float scale, float* out, const SampleView& view) {
  h5::quiet();
  Impl& m = *impl_;
  m.check_tile(index, rect, view);
  const int rows = rect.rows.size(), cols = rect.cols.size(), C = m.opt.channels;
  const size_t n = size_t(rows) * cols * C;
  const size_t plane = size_t(rows) * cols;
  if (m.opt.scale_auto) scale = m.auto_scale(index);
  try {
    if (m.opt.downsample == 1 && !view.flip_rows && !view.flip_cols && C == 1 && !m.manifest) {
      // The common case: HDF5 converts uint8/uint16 to float during the read, and with one
      // channel HWC is CHW, so the block lands in `out` as it is.
      h5::read_hyperslab(m.images, {index, view.top + rect.rows.lo, view.left + rect.cols.lo, 0}, {1, rows, cols, 1},
                         H5T_NATIVE_FLOAT, out);
      m.bytes_read += n * sizeof(float);
    } else {
      m.read_view(false, index, C, rect, view, out, [](float, int64_t, int64_t) {});
    }
  } catch (const h5::H5Error& e) {
    throw ConfigError(fmt::format("{}: reading image {} of '{}' failed: {}", m.path, index, m.opt.images, e.reason()));
  }
  if (scale != 1.f)
    for (size_t i = 0; i < n; ++i) out[i] *= scale;
  if (!m.opt.mean.empty() || !m.opt.std.empty())
    for (int c = 0; c < C; ++c) {
      const double mean = m.opt.mean.empty() ? 0.0 : m.opt.mean[size_t(c)];
      const double std = m.opt.std.empty() ? 1.0 : m.opt.std[size_t(c)];
      float* p = out + size_t(c) * plane;
      for (size_t i = 0; i < plane; ++i) p[i] = float((double(p[i]) - mean) / std);
    }
  // A NaN or Inf pixel (in the file, or made by data.scale) would surface steps later as a
  // NaN loss; it is named here, where it is read.
  const size_t bad = first_non_finite(out, n);
  if (bad < n) {
    const size_t c = bad / plane, p = bad % plane;
    m.fail(fmt::format("dataset '{}' image {} has {} at row {}, col {}, channel {} (after data.scale {}): every "
                       "pixel must be finite",
                       m.opt.images, index, non_finite_name(out[bad]), rect.rows.lo + int64_t(p / cols), rect.cols.lo + int64_t(p % cols),
                       c, scale));
  }
}

int32_t DataReader::read_label(int64_t index) const {
  const Impl& m = *impl_;
  if (m.kind != TargetKind::Labels)
    throw std::logic_error(fmt::format("{}: '{}' holds masks, not labels", m.path, m.opt.targets));
  if (index < 0 || index >= m.count)
    throw std::out_of_range(fmt::format("{}: label index {} outside [0, {})", m.path, index, m.count));
  int64_t v = m.labels[size_t(index)];
  if (m.manifest && m.opt.classes > 0 && v >= m.opt.classes)
    throw ConfigError(fmt::format("{}:{}: label {} is not a class id in [0, {}) (the model's output has {} classes)",
                                  m.path, m.manifest->manifest().rows[size_t(index)].line, v, m.opt.classes, m.opt.classes));
  if (m.opt.classes > 0 && (v < 0 || v >= m.opt.classes))
    m.fail(fmt::format("dataset '{}'[{}] = {} is not a class id in [0, {}) (the model's output has {} classes)",
                       m.opt.targets, index, v, m.opt.classes, m.opt.classes));
  if (v < 0 || v > INT32_MAX)
    m.fail(fmt::format("dataset '{}'[{}] = {} is not a class id (expected 0, 1, ...)", m.opt.targets, index, v));
  return int32_t(v);
}

void DataReader::read_mask_tile(int64_t index, const Rect& rect, float* out, const SampleView& view) {
  h5::quiet();
  Impl& m = *impl_;
  if (m.kind != TargetKind::Masks || !m.masks)
    throw std::logic_error(fmt::format("{}: '{}' holds labels, not masks", m.path, m.opt.targets));
  m.check_tile(index, rect, view);
  const bool class_maps = m.opt.expect == TargetKind::Masks && m.opt.classes > 0;
  // A manifest's mask is named by its file (rows and columns are the fitted image's).
  const std::string what = m.manifest ? fmt::format("mask {} (line {})", m.manifest->manifest().rows[size_t(index)].target,
                                                    m.manifest->manifest().rows[size_t(index)].line)
                                      : fmt::format("dataset '{}' image {}", m.opt.targets, index);
  const auto binary = [&](float v, int64_t row, int64_t col) {
    if (class_maps && !(v >= 0.f && v < float(m.opt.classes) && v == float(int(v))))
      m.fail(fmt::format("{} has {} at row {}, col {}: class maps must hold class ids in [0, {}) for the {}-channel "
                         "softmax output",
                         what, v, row, col, m.opt.classes, m.opt.classes));
    if (!class_maps && v != 0.f && v != 1.f)
      m.fail(fmt::format("{} has {} at row {}, col {}: masks must be 0 or 1", what, v, row, col));
  };
  try {
    m.read_view(true, index, 1, rect, view, out, binary);
  } catch (const h5::H5Error& e) {
    throw ConfigError(fmt::format("{}: reading mask {} of '{}' failed: {}", m.path, index, m.opt.targets, e.reason()));
  }
  if (m.opt.downsample > 1)
    for (size_t i = 0; i < size_t(rect.area()); ++i) out[i] = out[i] >= 0.5f ? 1.f : 0.f;
}

}  // namespace ht
