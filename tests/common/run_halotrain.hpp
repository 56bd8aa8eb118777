// Runs the real `halotrain` binary of this build for end-to-end tests.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "worker/runtime/backend.hpp"

namespace ht::testing {

struct RunResult {
  int code;
  std::string output;  // stdout and stderr together
};

// The binary of this build, or $HALOTRAIN_BIN (a test bundle run on another machine,
// scripts/gpu-check).
inline std::string halotrain_binary() {
  const char* env = std::getenv("HALOTRAIN_BIN");
  return env && *env ? env : HALOTRAIN_BINARY;
}

// `args` go through the shell unquoted: tests pass plain paths and values.
inline RunResult run_halotrain(const std::string& args) {
  const std::string cmd = halotrain_binary() + " " + args + " 2>&1";
  RunResult r{0, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed: " + cmd};
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// "" when a CUDA device answers here, else why not (the message users would see).
inline std::string why_no_cuda() {
  try {
    BackendOptions o;
    o.kind = Backend::CUDA;
    o.name = "probe";
    make_backend(o);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace ht::testing
