// `halotrain convert-data CONFIG OUT.h5` (SPEC section 13): data.train, a manifest, written
// as an HDF5 file of section 4 for users who train many epochs from a slow disk.
#pragma once

#include <iosfwd>
#include <string>

#include "orchestrator/config.hpp"

namespace ht {

// The images after data.fit, data.level and data.channels, at model.input's size times
// data.downsample, in the files' own values (data.scale, mean and std still apply when
// training from OUT); uint8 or uint16 where every value is still such an integer, else
// float32; chunked; labels, masks or class maps as the manifest has them. Written to a
// temporary file and renamed. Progress and its ETA go to `progress`. ConfigError naming
// the file for what cannot be converted.
void convert_data(const Config& config, const std::string& out, std::ostream& progress);

}  // namespace ht
