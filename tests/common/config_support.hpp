// Helpers for the config tests: the smallest valid config, where a needle sits in a
// YAML text, and the message a bad config throws.
#pragma once

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "orchestrator/config.hpp"
#include "orchestrator/config_io.hpp"

namespace ht::testing {

// The smallest valid config; tests append sections to it.
inline const char* kMinimal = R"(data:
  train: d.h5
model:
  input: [32, 24, 1]
  layers:
    - {type: conv2d, filters: 4}
    - {type: relu}
    - {type: max_pool2d}
training:
  steps: 3
)";

// 1-based line of the first line containing `needle`.
inline int line_of(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (line.find(needle) != std::string::npos) return n;
  ADD_FAILURE() << "no line contains " << needle;
  return -1;
}

inline std::string at(const std::string& text, const std::string& needle) {
  return "cfg.yaml:" + std::to_string(line_of(text, needle)) + ": ";
}

// The message of the ConfigError that parsing throws; fails the test when none is thrown.
inline std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "cfg.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for:\n" << yaml;
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

}  // namespace ht::testing
