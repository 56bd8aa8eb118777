// A config read from YAML and written back. Above the layer kinds: the model section is
// checked against them (config_model.cpp), and each layer is written with its kind's keys.
#pragma once

#include <string>
#include <vector>

#include "orchestrator/config.hpp"

namespace ht {

// Parses and validates `path` with `--set key.path=value` overrides applied in order.
// Throws ConfigError with one clear message on any problem.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Same, from YAML text already in memory; `source_name` is used in messages.
Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});

// The config with every default filled in, as YAML (logged once at start).
std::string to_yaml(const Config& config);

}  // namespace ht
