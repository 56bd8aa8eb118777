#include "orchestrator/files.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "orchestrator/config_error.hpp"

namespace ht {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) throw ConfigError(fmt::format("{}: cannot be read: {}", path, std::strerror(errno)));
  return text.str();
}

std::string input_file_problem(const std::string& path) {
  if (path.empty()) return "is empty: no file given";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return errno == ENOENT ? "does not exist" : fmt::format("cannot be read: {}", std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return "is a directory, expected a regular file";
  if (S_ISFIFO(st.st_mode)) return "is a FIFO (named pipe), expected a regular file";
  if (S_ISSOCK(st.st_mode)) return "is a socket, expected a regular file";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "is a device, expected a regular file";
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  if (::access(path.c_str(), R_OK) != 0) return fmt::format("cannot be read: {}", std::strerror(errno));
  return "";
}

std::string writable_directory_problem(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st)) return "exists and is not a directory";
  if (!fs::exists(st)) {
    fs::create_directories(dir, ec);
    if (ec) return fmt::format("cannot be created: {}", ec.message());
    if (!fs::is_directory(dir, ec)) return "cannot be created";
  }
  // access(W_OK) alone says yes for root on pseudo file systems that refuse every file:
  // a probe file is the only honest answer.
  const std::string probe = (fs::path(dir) / fmt::format(".write-probe-{}", long(::getpid()))).string();
  FILE* f = std::fopen(probe.c_str(), "w");
  if (!f) return fmt::format("cannot be written: {}", std::strerror(errno));
  std::fclose(f);
  ::unlink(probe.c_str());
  return "";
}

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return UINT64_MAX;
  return uint64_t(pages) * uint64_t(page);
}

uint64_t saturating_product(std::initializer_list<uint64_t> factors) {
  uint64_t p = 1;
  for (uint64_t f : factors) {
    if (f != 0 && p > UINT64_MAX / f) return UINT64_MAX;
    p *= f;
  }
  return p;
}

}  // namespace ht
