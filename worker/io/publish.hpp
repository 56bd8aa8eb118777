// Text files written whole or not at all: report pages, run.json, metrics.csv, scores.csv.
#pragma once

#include <string>

namespace ht {

// Writes `html` to `path` through a temporary file and a rename: a reader sees the old page
// or the whole new one. Throws ConfigError naming the path.
void publish_page(const std::string& path, const std::string& html);

}  // namespace ht
