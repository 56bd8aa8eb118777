#include "worker/io/convert_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ostream>
#include <vector>

#include "orchestrator/model_spec.hpp"
#include "worker/io/data_reader.hpp"
#include "worker/io/h5.hpp"
#include "worker/io/manifest.hpp"

namespace ht {

void convert_data(const Config& config, const std::string& out, std::ostream& progress) {
  if (!is_manifest(config.data.train))
    throw ConfigError(fmt::format("convert-data: data.train {} is not a manifest (.csv); it is already the HDF5 "
                                  "layout halotrain reads",
                                  config.data.train));
  const ModelSpec spec = build_model_spec(config);
  // The fitted file pixels, in the files' own values: no downsampling, scale or normalisation.
  DataReaderOptions o = data_reader_options(config, spec);
  o.height *= config.data.downsample;
  o.width *= config.data.downsample;
  o.downsample = 1;
  o.scale_auto = false;
  o.mean.clear();
  o.std.clear();
  DataReader reader(config.data.train, o);
  const int64_t n = reader.count();
  const int H = reader.height(), W = reader.width(), C = reader.channels();
  const int bits = reader.integer_bits();
  const hid_t image_type = bits == 8 ? H5T_STD_U8LE : bits == 16 ? H5T_STD_U16LE : H5T_IEEE_F32LE;
  const std::string temp = h5::temp_path(out);
  h5::quiet();
  try {
    h5::Hid file;
    try {
      file = h5::create_file(temp);
    } catch (const h5::H5Error& e) {
      throw ConfigError(fmt::format("convert-data: cannot create {}: {}", out, e.reason()));
    }
    const int band = std::clamp(int((uint64_t(16) << 20) / (uint64_t(W) * C * sizeof(float))), 1, H);
    const int tile = std::min({H, W, 256});
    h5::Hid images = h5::create_dataset(file, config.data.images, image_type, {n, H, W, C},
                                        {1, std::min(H, tile), std::min(W, tile), C});
    const bool masks = reader.target_kind() == TargetKind::Masks;
    h5::Hid targets;
    std::vector<int32_t> labels;
    if (masks)
      targets = h5::create_dataset(file, config.data.targets, H5T_STD_U8LE, {n, H, W, 1},
                                   {1, std::min(H, tile), std::min(W, tile), 1});
    std::vector<float> chw(size_t(band) * W * C), hwc(chw.size()), mask(size_t(band) * W);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) {
      for (int r0 = 0; r0 < H; r0 += band) {
        const int rows = std::min(band, H - r0);
        const Rect rect{{r0, r0 + rows}, {0, W}};
        reader.read_image_tile(i, rect, 1.f, chw.data());
        const size_t plane = size_t(rows) * W;
        for (size_t p = 0; p < plane; ++p)
          for (int c = 0; c < C; ++c) hwc[p * C + size_t(c)] = chw[size_t(c) * plane + p];
        h5::write_hyperslab(images, {i, r0, 0, 0}, {1, rows, W, C}, H5T_NATIVE_FLOAT, hwc.data());
        if (masks) {
          reader.read_mask_tile(i, rect, mask.data());
          h5::write_hyperslab(targets, {i, r0, 0, 0}, {1, rows, W, 1}, H5T_NATIVE_FLOAT, mask.data());
        }
      }
      if (!masks) labels.push_back(reader.read_label(i));
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      progress << fmt::format("\rconvert-data: {}/{} images  ETA {:.0f}s", i + 1, n,
                              seconds / double(i + 1) * double(n - i - 1))
               << std::flush;
    }
    progress << "\n";
    if (!masks) h5::write_dataset(file, config.data.targets, {n}, labels.data());
    h5::write_attr_string(file, "generator", "halotrain convert-data");
    h5::write_attr_string(file, "manifest", config.data.train);
    images.close();
    targets.close();
    file.close();
    h5::commit_file(temp, out);
  } catch (const ConfigError&) {
    std::remove(temp.c_str());
    throw;
  } catch (const std::exception& e) {
    std::remove(temp.c_str());
    throw ConfigError(fmt::format("convert-data: writing {} failed: {}", out, e.what()));
  }
  progress << fmt::format("wrote {}: {} images of {}x{}x{} as {}{}\n", out, n, H, W, C,
                          bits == 8 ? "uint8" : bits == 16 ? "uint16" : "float32",
                          bits == 0 && config.data.scale_auto
                              ? " (data.scale: auto maps float32 by 1: set data.scale for this file)"
                              : "");
}

}  // namespace ht
