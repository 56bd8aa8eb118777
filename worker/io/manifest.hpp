// A CSV manifest of image files (SPEC section 13): one row per image, a header naming the
// columns `image` (a path relative to the CSV) and, for training and evaluation, `label`
// (a class id) or `mask` / `class_map` (a path). Other columns are ignored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ht {

// Whether `path` names a manifest rather than an HDF5 file (by its .csv name).
bool is_manifest(const std::string& path);

struct ManifestRow {
  int line = 0;        // 1-based line of the CSV, for messages
  std::string image;   // resolved against the CSV's directory
  std::string target;  // mask or class map path (resolved), empty for labels
  int64_t label = 0;
};

struct Manifest {
  std::string path;
  enum class Targets { None, Labels, Masks, ClassMaps } targets = Targets::None;
  std::vector<ManifestRow> rows;
};

// What a resumed run must find unchanged (SPEC section 13): every row and each of its files'
// size and modification time, as JSON.
std::string manifest_identity(const Manifest& manifest);
// "" when `now` is `before`, else what changed, in a user's words ("line 4: b.dcm: 123 ->
// 456 bytes", "2 rows added at the end"), at most a few items.
std::string manifest_changes(const std::string& before, const std::string& now);

// Reads `path`; `key` (data.train, ...) for messages. ConfigError naming the file, the line
// and the column for a missing file, no header, no `image` column, two target columns, a
// row with too few fields, a label that is not an integer, an empty path.
Manifest read_manifest(const std::string& path, const std::string& key);

}  // namespace ht
