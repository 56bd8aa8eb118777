#include "worker/io/manifest_images.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "orchestrator/config.hpp"

namespace ht {

namespace {

std::string shape_of(const DataReaderOptions& o) { return fmt::format("[{}, {}, {}]", o.height, o.width, o.channels); }

// data.fit: crop: where the target window starts in an image of `image_size` (0: padded).
int64_t fit_offset(DataFit fit, int64_t image_size, int64_t target) {
  return fit == DataFit::Crop && image_size > target ? (image_size - target) / 2 : 0;
}

// data.fit: resize. An output pixel i of n (one axis) covers source pixels [i*m/n,
// ceil((i+1)*m/n)) of m and is their mean (torch's adaptive average pooling, which
// F.interpolate(mode='area') is); a mask takes source pixel floor(i * float(m/n)), as
// torch's mode='nearest' computes it in float.
int64_t area_lo(int64_t i, int64_t m, int64_t n) { return i * m / n; }
int64_t area_hi(int64_t i, int64_t m, int64_t n) { return ((i + 1) * m + n - 1) / n; }
int64_t nearest(int64_t i, int64_t m, int64_t n) {
  const float scale = float(m) / float(n);
  return std::min<int64_t>(int64_t(std::floor(float(i) * scale)), m - 1);
}

// data.channels: gray repeated into R, G and B; RGB to gray as ITU-R 601-2 luma (PIL's "L").
void convert_channels(const float* in, int from, float* out, int to, size_t pixels) {
  for (size_t p = 0; p < pixels; ++p) {
    const float* s = in + p * size_t(from);
    if (to == 3)
      out[3 * p] = out[3 * p + 1] = out[3 * p + 2] = s[0];
    else
      out[p] = float(0.299 * double(s[0]) + 0.587 * double(s[1]) + 0.114 * double(s[2]));
  }
}

}  // namespace

ManifestImages::ManifestImages(const std::string& path, const DataReaderOptions& options)
    : path_(path), opt_(options), manifest_(read_manifest(path, options.key)) {
  const Manifest& m = manifest_;
  const int f = opt_.downsample;
  const std::string after = f > 1 ? fmt::format(" (data.downsample {})", f) : "";
  auto at = [&](const ManifestRow& r) { return fmt::format("{}:{}: {}", path_, r.line, r.image); };
  for (const ManifestRow& r : m.rows) {
    ImageInfo info;
    try {
      info = probe_image(r.image, opt_.level);
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("{}:{}: {}", path_, r.line, e.what()));
    }
    const bool converts = opt_.convert_channels && (info.channels == 1 || info.channels == 3) &&
                          (opt_.channels == 1 || opt_.channels == 3);
    if (info.channels != opt_.channels && !converts)
      throw ConfigError(fmt::format("{}: {} has {} channel{}; model.input {} has {}{}", at(r), info.describe(),
                                    info.channels, info.channels == 1 ? "" : "s", shape_of(opt_), opt_.channels,
                                    opt_.convert_channels ? " (data.channels converts gray and RGB only)"
                                                         : "; data.channels converts gray and RGB images"));
    image_info_.push_back(info);
  }
  // The file's pixels every image becomes: f x model.input, or (random crops) the one size
  // all the images share.
  file_h_ = opt_.height * f;
  file_w_ = opt_.width * f;
  if (opt_.larger_ok) {
    file_h_ = image_info_[0].height;
    file_w_ = image_info_[0].width;
  }
  for (size_t i = 0; i < m.rows.size(); ++i) {
    const ImageInfo& info = image_info_[i];
    const ManifestRow& r = m.rows[i];
    const bool same = info.height == file_h_ && info.width == file_w_;
    if (opt_.larger_ok && !same)
      throw ConfigError(fmt::format("{}: is {}x{} (H x W) and {} is {}x{}: data.augment.crop takes its windows from "
                                    "images of one size",
                                    at(r), info.height, info.width, m.rows[0].image, file_h_, file_w_));
    if (opt_.fit == DataFit::Error && !same)
      throw ConfigError(fmt::format("{}: is {}x{} (H x W), but model.input {} needs {}x{}{}; set data.fit: pad or "
                                    "crop to bring every image to that size",
                                    at(r), info.height, info.width, shape_of(opt_), file_h_, file_w_, after));
    if (opt_.fit == DataFit::Pad && (info.height > file_h_ || info.width > file_w_))
      throw ConfigError(fmt::format("{}: is {}x{} (H x W), larger than the {}x{} data.fit: pad brings images to{}; "
                                    "use data.fit: crop",
                                    at(r), info.height, info.width, file_h_, file_w_, after));
  }
  if (opt_.targets.empty()) return;
  if (m.targets == Manifest::Targets::None)
    fail("the manifest has no target column: expected 'label' (class ids), 'mask' or 'class_map' (paths) beside "
         "'image'");
  const TargetKind kind = targets();
  if (opt_.expect && *opt_.expect != kind)
    fail(fmt::format("its column '{}' holds {}, but model.loss needs {} (a '{}' column)",
                     kind == TargetKind::Labels ? "label" : m.targets == Manifest::Targets::Masks ? "mask" : "class_map",
                     to_string(kind), to_string(*opt_.expect),
                     *opt_.expect == TargetKind::Labels ? "label" : opt_.classes > 0 ? "class_map" : "mask"));
  if (kind == TargetKind::Labels) return;
  const bool class_maps = opt_.expect == TargetKind::Masks && opt_.classes > 0;
  if (class_maps && opt_.classes > 2 && opt_.downsample > 1)
    fail(fmt::format("data.downsample {} averages the masks, but class maps of {} classes cannot be averaged; use "
                     "data.downsample: 1",
                     opt_.downsample, opt_.classes));
  for (size_t i = 0; i < m.rows.size(); ++i) {
    const ManifestRow& r = m.rows[i];
    ImageInfo info;
    try {
      info = probe_image(r.target, opt_.level, /*indices=*/true);
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("{}:{}: {}", path_, r.line, e.what()));
    }
    if (info.channels != 1)
      throw ConfigError(fmt::format("{}:{}: {}: a mask has one channel; found {} ({})", path_, r.line, r.target,
                                    info.channels, info.describe()));
    if (info.height != image_info_[i].height || info.width != image_info_[i].width)
      throw ConfigError(fmt::format("{}:{}: {} is {}x{} (H x W) but its image {} is {}x{}", path_, r.line, r.target,
                                    info.height, info.width, r.image, image_info_[i].height, image_info_[i].width));
    target_info_.push_back(info);
  }
}

ManifestImages::~ManifestImages() = default;

ManifestImages::WholeDecodes ManifestImages::whole_decodes() const {
  // The floats kept (HWC) and, while it decodes, the file's samples (1, 2 or 4 bytes each).
  auto bytes = [](const ImageInfo& info) -> uint64_t {
    if (info.streamed) return 0;
    const uint64_t sample = info.bits <= 8 ? 1 : info.bits <= 16 ? 2 : 4;
    return uint64_t(info.height) * uint64_t(info.width) * uint64_t(info.channels) * (sizeof(float) + sample);
  };
  WholeDecodes w;
  for (size_t i = 0; i < image_info_.size(); ++i) {
    const uint64_t image = bytes(image_info_[i]), target = i < target_info_.size() ? bytes(target_info_[i]) : 0;
    if (image + target == 0) continue;
    ++w.images;
    if (image + target <= w.bytes) continue;
    w.bytes = image + target;
    const ManifestRow& r = manifest_.rows[i];
    w.largest = image >= target ? fmt::format("{}:{}: {} ({})", path_, r.line, r.image, image_info_[i].describe())
                                : fmt::format("{}:{}: {} ({})", path_, r.line, r.target, target_info_[i].describe());
  }
  return w;
}

void ManifestImages::fail(const std::string& what) const { throw ConfigError(fmt::format("{}: {}", path_, what)); }

TargetKind ManifestImages::targets() const {
  return manifest_.targets == Manifest::Targets::Masks || manifest_.targets == Manifest::Targets::ClassMaps
             ? TargetKind::Masks
             : TargetKind::Labels;
}

ImageFile& ManifestImages::file_of(bool mask, int64_t index) {
  std::unique_ptr<ImageFile>& f = mask ? target_file_ : image_file_;
  int64_t& open = mask ? target_index_ : image_index_;
  if (!f || open != index) {
    const ManifestRow& r = manifest_.rows[size_t(index)];
    f.reset();
    open = -1;
    try {
      f = std::make_unique<ImageFile>(mask ? r.target : r.image, opt_.level, mask, float(opt_.pad_value),
                                      mask ? &target_info_[size_t(index)] : &image_info_[size_t(index)]);
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("{}:{}: {}", path_, r.line, e.what()));
    }
    open = index;
  }
  return *f;
}

void ManifestImages::read_file(bool mask, int64_t index, const ImageInfo& info, int64_t r_lo, int64_t c_lo, int rows,
                               int cols, int C, float* dst) {
  ImageFile& file = file_of(mask, index);
  const uint64_t before = file.bytes_decoded();
  if (info.channels == C) {
    file.read(r_lo, c_lo, rows, cols, dst);
  } else {
    converted_.resize(size_t(rows) * size_t(cols) * size_t(info.channels));
    file.read(r_lo, c_lo, rows, cols, converted_.data());
    convert_channels(converted_.data(), info.channels, dst, C, size_t(rows) * size_t(cols));
  }
  decoded_ += file.bytes_decoded() - before;
}

void ManifestImages::read(bool mask, int64_t index, int64_t row0, int64_t col0, int64_t rows, int64_t cols, int C,
                          float* out) {
  const ImageInfo& info = (mask ? target_info_ : image_info_)[size_t(index)];
  if (opt_.fit == DataFit::Resize && (info.height != file_h_ || info.width != file_w_)) {
    read_resized(mask, index, info, row0, col0, rows, cols, C, out);
    return;
  }
  const int64_t oy = fit_offset(opt_.fit, info.height, file_h_), ox = fit_offset(opt_.fit, info.width, file_w_);
  const int64_t r_lo = std::max<int64_t>(row0 + oy, 0), r_hi = std::min<int64_t>(row0 + rows + oy, info.height);
  const int64_t c_lo = std::max<int64_t>(col0 + ox, 0), c_hi = std::min<int64_t>(col0 + cols + ox, info.width);
  if (r_lo >= r_hi || c_lo >= c_hi || r_hi - r_lo < rows || c_hi - c_lo < cols)
    std::fill(out, out + size_t(rows) * cols * C, mask ? 0.f : float(opt_.pad_value));
  if (r_lo >= r_hi || c_lo >= c_hi) return;
  const int inside_rows = int(r_hi - r_lo), inside_cols = int(c_hi - c_lo);
  const size_t pixels = size_t(inside_rows) * inside_cols;
  float* dst = out;
  if (inside_rows != rows || inside_cols != cols) {
    block_.resize(pixels * C);
    dst = block_.data();
  }
  read_file(mask, index, info, r_lo, c_lo, inside_rows, inside_cols, C, dst);
  if (dst == out) return;
  for (int r = 0; r < inside_rows; ++r)
    std::copy(block_.begin() + ptrdiff_t(size_t(r) * inside_cols * C),
              block_.begin() + ptrdiff_t(size_t(r + 1) * inside_cols * C),
              out + (size_t(r_lo - oy - row0 + r) * cols + size_t(c_lo - ox - col0)) * C);
}

void ManifestImages::read_resized(bool mask, int64_t index, const ImageInfo& info, int64_t row0, int64_t col0,
                                  int64_t rows, int64_t cols, int C, float* out) {
  const int64_t m_r = info.height, m_c = info.width, n_r = file_h_, n_c = file_w_;
  const int64_t r_lo = mask ? nearest(row0, m_r, n_r) : area_lo(row0, m_r, n_r);
  const int64_t r_hi = mask ? nearest(row0 + rows - 1, m_r, n_r) + 1 : area_hi(row0 + rows - 1, m_r, n_r);
  const int64_t c_lo = mask ? nearest(col0, m_c, n_c) : area_lo(col0, m_c, n_c);
  const int64_t c_hi = mask ? nearest(col0 + cols - 1, m_c, n_c) + 1 : area_hi(col0 + cols - 1, m_c, n_c);
  const int64_t src_cols = c_hi - c_lo;
  block_.resize(size_t(r_hi - r_lo) * size_t(src_cols) * C);
  read_file(mask, index, info, r_lo, c_lo, int(r_hi - r_lo), int(src_cols), C, block_.data());
  auto src = [&](int64_t y, int64_t x, int c) {
    return block_[(size_t(y - r_lo) * size_t(src_cols) + size_t(x - c_lo)) * C + c];
  };
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      for (int c = 0; c < C; ++c) {
        float v;
        if (mask) {
          v = src(nearest(row0 + i, m_r, n_r), nearest(col0 + j, m_c, n_c), c);
        } else {
          const int64_t y0 = area_lo(row0 + i, m_r, n_r), y1 = area_hi(row0 + i, m_r, n_r);
          const int64_t x0 = area_lo(col0 + j, m_c, n_c), x1 = area_hi(col0 + j, m_c, n_c);
          double sum = 0;
          for (int64_t y = y0; y < y1; ++y)
            for (int64_t x = x0; x < x1; ++x) sum += double(src(y, x, c));
          v = float(sum / double((y1 - y0) * (x1 - x0)));
        }
        out[(size_t(i) * size_t(cols) + size_t(j)) * C + c] = v;
      }
}

int ManifestImages::integer_bits() const {
  int bits = 8;
  for (const ImageInfo& info : image_info_) {
    if (info.floating || (info.channels == 3 && opt_.channels == 1)) return 0;
    if (info.is_signed || (info.format == ImageFormat::DICOM && (info.slope != 1 || info.intercept != 0))) return 0;
    if (opt_.fit == DataFit::Resize && (info.height != file_h_ || info.width != file_w_)) return 0;
    bits = std::max(bits, (info.format == ImageFormat::DICOM ? info.bits_stored : info.bits) > 8 ? 16 : 8);
  }
  const double pad = opt_.pad_value, top = bits == 8 ? 255.0 : 65535.0;
  if (opt_.fit != DataFit::Error && (pad != std::floor(pad) || pad < 0 || pad > top)) return 0;
  return bits;
}

}  // namespace ht
