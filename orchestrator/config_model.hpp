// Reads the `model:` section of a config (config_model.cpp). Internal to config*.cpp.
#pragma once

#include "orchestrator/config.hpp"
#include "orchestrator/config_yaml.hpp"

namespace ht {

// model.input, model.layers (each checked against its kind's keys, named, linked) and model.loss.
void read_model(const cfg::MapReader& root, ModelConfig& m);

}  // namespace ht
