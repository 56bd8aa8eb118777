#include "worker/io/publish.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "orchestrator/config.hpp"
#include "worker/io/h5.hpp"

namespace ht {

void publish_page(const std::string& path, const std::string& html) {
  const std::string temp = h5::temp_path(path);
  std::ofstream out(temp, std::ios::binary | std::ios::trunc);
  out << html;
  out.close();
  if (!out) {
    const std::string reason = std::strerror(errno);
    std::remove(temp.c_str());
    throw ConfigError(fmt::format("{}: cannot write it: {}", path, reason));
  }
  try {
    h5::commit_file(temp, path);
  } catch (const std::exception& e) {
    std::remove(temp.c_str());
    throw ConfigError(fmt::format("{}: {}", path, e.what()));
  }
}

}  // namespace ht
