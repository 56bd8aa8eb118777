#include "worker/io/synthetic_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "orchestrator/files.hpp"
#include "worker/io/h5.hpp"

namespace ht {

namespace {

constexpr int kChunk = 256;
constexpr double kNoise = 0.15;

// Counter-based randomness: every pixel's noise depends only on (seed, index), so the
// output does not depend on the band size or the order of writing.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
double unit(uint64_t bits) { return double(bits >> 11) * 0x1.0p-53; }  // [0, 1)

// Own generator instead of <random> distributions, whose output differs between
// standard libraries: the same seed must give the same file everywhere.
struct Rng {
  uint64_t state;
  uint64_t next() { return splitmix64(state += 0x9E3779B97F4A7C15ull); }
  double uniform() { return unit(next()); }
  uint64_t below(uint64_t n) { return next() % n; }
};

struct Blob {
  double cy, cx, sigma, amplitude;
};

std::vector<Blob> make_blobs(const SyntheticOptions& o, int64_t index, int count) {
  Rng rng{splitmix64(o.seed ^ splitmix64(uint64_t(index) + 1))};
  double base = std::max(1.0, std::min(o.height, o.width) / 16.0);
  std::vector<Blob> blobs(static_cast<size_t>(count));
  for (Blob& b : blobs) {
    b.cy = rng.uniform() * o.height;
    b.cx = rng.uniform() * o.width;
    b.sigma = base * (0.75 + 0.5 * rng.uniform());
    b.amplitude = 0.6 + 0.3 * rng.uniform();
  }
  return blobs;
}

// Balanced labels (i % classes) in a seeded order.
std::vector<int32_t> make_labels(const SyntheticOptions& o) {
  std::vector<int32_t> labels(static_cast<size_t>(o.count));
  for (int64_t i = 0; i < o.count; ++i) labels[size_t(i)] = int32_t(i % o.classes);
  Rng rng{splitmix64(o.seed ^ 0x1abe15ull)};
  for (int64_t i = o.count - 1; i > 0; --i) std::swap(labels[size_t(i)], labels[rng.below(uint64_t(i) + 1)]);
  return labels;
}

hid_t file_type(PixelType t) {
  switch (t) {
    case PixelType::UInt8: return H5T_STD_U8LE;
    case PixelType::UInt16: return H5T_STD_U16LE;
    default: return H5T_IEEE_F32LE;
  }
}

void validate(const SyntheticOptions& o) {
  auto positive = [](int64_t v, const char* what) {
    if (v < 1) throw ConfigError(fmt::format("make-data: {} must be >= 1, found {}", what, v));
  };
  positive(o.count, "--count");
  positive(o.height, "--height");
  positive(o.width, "--width");
  positive(o.channels, "--channels");
  if (o.targets == TargetKind::Labels) positive(o.classes, "--classes");
  if (o.images_name.empty()) throw ConfigError("make-data: the images dataset name is empty");
}

size_t pixel_bytes(PixelType t) { return t == PixelType::UInt8 ? 1 : t == PixelType::UInt16 ? 2 : 4; }

// What writing `o` takes, checked before any buffer is sized by it: host memory for one
// band of chunk rows (and the labels), disk for the file.
void check_resources(const SyntheticOptions& o, const std::string& path) {
  const uint64_t H = uint64_t(o.height), W = uint64_t(o.width), C = uint64_t(o.channels);
  const uint64_t rows = std::min<uint64_t>(H, kChunk);
  const uint64_t band = saturating_product({rows, W, C, 4 + pixel_bytes(o.dtype)});
  const uint64_t memory = band + saturating_product({uint64_t(o.count), 4}) + 16 * W + rows * W;
  const uint64_t have = physical_memory_bytes();
  if (memory > have / 2)
    throw ConfigError(fmt::format(
        "make-data: --width {} x --channels {} needs {} of memory for one band of {} rows (plus the labels of "
        "--count {}); this machine has {}",
        o.width, o.channels, format_size(memory), rows, o.count, format_size(have)));
  const uint64_t image = saturating_product({H, W, C, pixel_bytes(o.dtype)});
  const uint64_t mask = o.targets == TargetKind::Masks ? saturating_product({H, W}) : 0;
  const uint64_t file = saturating_product({uint64_t(o.count), image + mask});
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  const auto space = std::filesystem::space(dir, ec);
  if (!ec && file > space.available)
    throw ConfigError(fmt::format(
        "make-data: --count {} x --height {} x --width {} x --channels {} needs {} on disk; {} has {} free",
        o.count, o.height, o.width, o.channels, format_size(file), dir.string(), format_size(space.available)));
}

// Fills one band of rows [r0, r1) of image `index`: pixels as [rows][W][C] in [0,1] and the
// mask as [rows][W].
void render_band(const SyntheticOptions& o, int64_t index, const std::vector<Blob>& blobs,
                 int r0, int r1, std::vector<float>& pixels, std::vector<uint8_t>* mask) {
  const int W = o.width, C = o.channels;
  std::vector<float> signal(static_cast<size_t>(W)), peak(static_cast<size_t>(W));
  uint64_t noise_seed = splitmix64(o.seed ^ 0x5eed0015eull);
  for (int y = r0; y < r1; ++y) {
    std::fill(signal.begin(), signal.end(), 0.f);
    std::fill(peak.begin(), peak.end(), 0.f);
    for (const Blob& b : blobs) {
      double dy = y + 0.5 - b.cy, reach = 4 * b.sigma;
      if (std::abs(dy) > reach) continue;
      int x0 = std::max(0, int(std::floor(b.cx - reach)));
      int x1 = std::min(W, int(std::ceil(b.cx + reach)) + 1);
      double inv = 1.0 / (2 * b.sigma * b.sigma);
      for (int x = x0; x < x1; ++x) {
        double dx = x + 0.5 - b.cx;
        float g = float(std::exp(-(dx * dx + dy * dy) * inv));
        signal[size_t(x)] += float(b.amplitude) * g;
        peak[size_t(x)] = std::max(peak[size_t(x)], g);
      }
    }
    size_t row = size_t(y - r0);
    for (int x = 0; x < W; ++x) {
      for (int c = 0; c < C; ++c) {
        uint64_t key = ((uint64_t(index) * C + c) * o.height + y) * uint64_t(W) + x;
        float v = signal[size_t(x)] + float(kNoise * unit(splitmix64(noise_seed ^ (key * 0xD6E8FEB86659FD93ull))));
        pixels[(row * W + x) * C + c] = std::min(1.f, std::max(0.f, v));
      }
      if (mask) (*mask)[row * W + x] = peak[size_t(x)] >= 0.5f ? 1 : 0;
    }
  }
}

void write_images(hid_t file, const SyntheticOptions& o, const std::vector<int32_t>& labels) {
  const int H = o.height, W = o.width, C = o.channels;
  const int ch = std::min(H, kChunk), cw = std::min(W, kChunk);
  const bool masks = o.targets == TargetKind::Masks;
  h5::Hid images = h5::create_dataset(file, o.images_name, file_type(o.dtype),
                                      {o.count, H, W, C}, {1, ch, cw, C});
  h5::Hid mask_ds;
  std::string mask_name = o.targets_name.empty() ? "masks" : o.targets_name;
  if (masks) mask_ds = h5::create_dataset(file, mask_name, H5T_STD_U8LE, {o.count, H, W, 1}, {1, ch, cw, 1});

  std::vector<float> pixels(size_t(ch) * W * C);
  std::vector<uint8_t> mask(masks ? size_t(ch) * W : 0);
  std::vector<uint16_t> u16(o.dtype == PixelType::UInt16 ? pixels.size() : 0);
  std::vector<uint8_t> u8(o.dtype == PixelType::UInt8 ? pixels.size() : 0);
  for (int64_t n = 0; n < o.count; ++n) {
    int count = masks ? 1 + int(splitmix64(o.seed ^ (uint64_t(n) * 31 + 7)) % 4) : labels[size_t(n)] + 1;
    std::vector<Blob> blobs = make_blobs(o, n, count);
    for (int r0 = 0; r0 < H; r0 += ch) {  // one chunk row: whole chunks, written once
      int r1 = std::min(H, r0 + ch);
      render_band(o, n, blobs, r0, r1, pixels, masks ? &mask : nullptr);
      size_t used = size_t(r1 - r0) * W * C;
      h5::Shape start{n, r0, 0, 0}, count4{1, r1 - r0, W, C};
      if (o.dtype == PixelType::UInt16) {
        for (size_t i = 0; i < used; ++i) u16[i] = uint16_t(std::lround(pixels[i] * 65535.0));
        h5::write_hyperslab(images, start, count4, H5T_NATIVE_UINT16, u16.data());
      } else if (o.dtype == PixelType::UInt8) {
        for (size_t i = 0; i < used; ++i) u8[i] = uint8_t(std::lround(pixels[i] * 255.0));
        h5::write_hyperslab(images, start, count4, H5T_NATIVE_UINT8, u8.data());
      } else {
        h5::write_hyperslab(images, start, count4, H5T_NATIVE_FLOAT, pixels.data());
      }
      if (masks) h5::write_hyperslab(mask_ds, start, {1, r1 - r0, W, 1}, H5T_NATIVE_UINT8, mask.data());
    }
  }
  images.close();
  mask_ds.close();
}

}  // namespace

SyntheticOptions synthetic_options(const Config& config) {
  SyntheticOptions o;
  const SynthesizeConfig s = config.data.synthesize.value_or(SynthesizeConfig{});
  o.count = s.count;
  o.height = s.height;
  o.width = s.width;
  o.channels = s.channels;
  o.classes = s.classes;
  o.targets = s.masks ? TargetKind::Masks : TargetKind::Labels;
  o.seed = config.seed;
  o.images_name = config.data.images;
  o.targets_name = config.data.targets;
  return o;
}

void write_synthetic_dataset(const std::string& path, const SyntheticOptions& options) {
  validate(options);
  h5::quiet();
  std::error_code ec;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw ConfigError(fmt::format("make-data: cannot create directory {}: {}", parent.string(), ec.message()));
  check_resources(options, path);

  const std::string temp = h5::temp_path(path);
  try {
    h5::Hid file;
    try {
      file = h5::create_file(temp);
    } catch (const h5::H5Error& e) {
      throw ConfigError(fmt::format("make-data: cannot create {}: {}", path, e.what()));
    }
    std::vector<int32_t> labels = make_labels(options);
    if (options.targets == TargetKind::Labels) {
      std::string name = options.targets_name.empty() ? "labels" : options.targets_name;
      h5::write_dataset(file, name, {options.count}, labels.data());
    }
    write_images(file, options, labels);
    // Provenance, so `h5dump -A` says how the file was made.
    h5::write_attr_string(file, "generator", "halotrain make-data");
    h5::write_attr_int64(file, "seed", int64_t(options.seed));
    if (options.targets == TargetKind::Labels) h5::write_attr_int64(file, "classes", options.classes);
    file.close();
    h5::commit_file(temp, path);
  } catch (const ConfigError&) {
    std::remove(temp.c_str());
    throw;
  } catch (const std::exception& e) {
    std::remove(temp.c_str());
    throw ConfigError(fmt::format("make-data: writing {} failed: {}", path, e.what()));
  }
}

}  // namespace ht
