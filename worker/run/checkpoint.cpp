#include "worker/run/checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include "orchestrator/config_io.hpp"
#include "orchestrator/files.hpp"
#include "orchestrator/layer_kind.hpp"
#include "worker/io/finite.hpp"
#include "worker/io/keras_h5.hpp"
#include "worker/runtime/log.hpp"

namespace fs = std::filesystem;

namespace ht {

namespace {

std::string fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char ch : text) h = (h ^ ch) * 0x100000001b3ull;
  return fmt::format("{:016x}", h);
}

std::string hash_prefix(const ModelSpec& model) {
  return fmt::format("input {} {} {}; loss {};", model.input.h, model.input.w, model.input.c, to_string(model.loss));
}

}  // namespace

// The text is format 1's (fixed fields, at the defaults of the kinds that lack them), so a
// model of the built-in kinds keeps its hash across versions in both directions; the keys
// of other kinds that are part of the model follow as key=value.
std::string model_hash(const ModelSpec& model) {
  static const std::vector<std::string> kFixed = {"filters", "kernel", "stride", "dilation",
                                                  "padding", "bias",   "pool",   "units"};
  std::string text = hash_prefix(model);
  for (const LayerSpec& l : model.layers) {
    const LayerConfig& c = l.config;
    // The fixed fields as format 1 wrote them: integers (a square window's one side), flags as 0/1.
    auto get = [&](const char* key, int64_t def) -> std::string {
      const LayerValue* v = c.find(key);
      if (!v) return std::to_string(def);
      if (const bool* b = std::get_if<bool>(v)) return std::to_string(int(*b));
      return describe_value(*v);
    };
    const LayerValue* p = c.find("padding");
    const Padding pad = p && std::holds_alternative<Padding>(*p) ? std::get<Padding>(*p) : Padding{};
    const std::string pad_value =
        pad.is_uniform() ? std::to_string(pad.top) : fmt::format("{},{},{},{}", pad.top, pad.bottom, pad.left, pad.right);
    text += fmt::format(" {} {} f{} k{} s{} d{} p{}:{} b{} pool{} u{}", c.type(), c.name, get("filters", 0),
                        get("kernel", 1), get("stride", 1), get("dilation", 1), to_string(pad.mode), pad_value,
                        get("bias", 1) != "0", get("pool", 2), get("units", 0));
    for (const LayerKey& key : l.kind().keys) {
      if (!key.in_model_hash || std::find(kFixed.begin(), kFixed.end(), key.name) != kFixed.end()) continue;
      const LayerValue& value = *c.find(key.name);
      if (!key.hash_default && key.default_value && value == *key.default_value) continue;
      text += fmt::format(" {}={}", key.name, describe_value(value));
    }
    // A layer that reads another than the one before it (graphs): which ones.
    const int index = int(&l - model.layers.data());
    if (l.inputs != std::vector<int>{index}) {
      std::vector<std::string> names;
      for (int t : l.inputs) names.push_back(t == 0 ? kInputName : model.layers[t - 1].config.name);
      text += fmt::format(" in={}", fmt::join(names, ","));
    }
    if (!c.trainable) text += " frozen";  // its weights are buffers, not trained ones
    text += ";";
  }
  return fnv1a(text);
}

namespace {

std::string short_name(const std::string& stored) { return stored.substr(stored.rfind('/') + 1); }

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("({})", fmt::join(s, ", ")); }

// Reads one tensor through `read` and refuses it when it holds NaN or Inf: a weight that
// is not finite never enters training, whatever file it came from.
template <class Read>
auto finite_reader(const std::string& what, Read read) {
  return [what, read](const std::vector<int64_t>& start, const std::vector<int64_t>& count, float* dst) {
    read(start, count, dst);
    int64_t n = 1;
    for (int64_t c : count) n *= c;
    const size_t bad = first_non_finite(dst, size_t(n));
    if (bad < size_t(n))
      throw ConfigError(fmt::format("{} holds {} (at element {} of the block read from offset ({})); every "
                                    "weight must be finite",
                                    what, non_finite_name(dst[bad]), bad, fmt::join(start, ", ")));
  };
}

}  // namespace

namespace {
void refuse_non_finite(const std::string& what, const float* data, const std::vector<int64_t>& shape, int64_t step,
                       const std::string& dir) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bad = first_non_finite(data, size_t(n));
  if (bad == size_t(n)) return;
  throw TrainingDiverged(fmt::format(
      "step {}: {} holds {} (element {}) after the optimizer step; not writing a checkpoint (those already in "
      "{} are untouched); lower training.optimizer.lr, raise training.optimizer.epsilon or check data.scale",
      step, what, non_finite_name(data[bad]), bad, dir));
}
}  // namespace

std::string save_checkpoint(const Config& config, const ModelSpec& model, ParamStore& params,
                            OptimizerState& optimizer, ComputeBackend& backend, const TrainingProgress& progress,
                            const std::string& file_name) {
  const fs::path dir = fs::path(config.run_dir) / "checkpoints";
  const std::string path =
      (dir / (file_name.empty() ? fmt::format("ckpt-{}.h5", progress.step) : file_name)).string();

  // Host copies in Keras layout; they live until the file is written.
  std::vector<std::vector<float>> host;
  host.reserve(params.refs().size() + 2);
  std::vector<KerasLayerWeights> layers(model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) layers[l].layer = model.layers[l].config.name;
  for (const ParamRef& r : params.refs()) {
    host.push_back(params.to_keras(r));
    KerasLayerWeights& kl = layers[r.layer];
    kl.weight_names.push_back(r.weight);
    kl.shapes.push_back(r.keras_shape);
    kl.data.push_back(host.back().data());
  }
  HalotrainState state;
  state.step = progress.step;
  state.epoch = progress.epoch;
  state.cursor = progress.cursor;
  state.config_text = config.text;
  state.model_hash = model_hash(model);
  state.monitors = progress.monitors;
  state.data_identity = progress.data_identity;
  const int64_t n = int64_t(params.trainable_count());
  const bool adam = config.training.optimizer.type == OptimizerType::Adam;
  auto add_slot = [&](const std::string& name, Tensor& t) {
    if (t.empty()) return;
    host.emplace_back(t.size());
    backend.to_host(host.back().data(), t.data(), t.bytes());
    state.slots.push_back({name, {n}, host.back().data()});
  };
  add_slot(adam ? "adam_m" : "sgd_velocity", optimizer.m);
  add_slot("adam_v", optimizer.v);
  // Nothing that is not finite is ever checkpointed: such a file would resume into NaN.
  for (size_t l = 0; l < layers.size(); ++l)
    for (size_t i = 0; i < layers[l].data.size(); ++i)
      refuse_non_finite(fmt::format("weight {}/{}", layers[l].layer, layers[l].weight_names[i]), layers[l].data[i],
                        layers[l].shapes[i], progress.step, dir.string());
  for (const auto& s : state.slots)
    refuse_non_finite(fmt::format("optimizer slot {}", s.name), s.data, s.shape, progress.step, dir.string());
  try {
    write_checkpoint(path, layers, state);
  } catch (const std::runtime_error& e) {
    // The storage refused (disk full, quota, file size limit): nothing the program can
    // mend, and nothing lost: the temporary file is gone and older checkpoints untouched.
    // HDF5's error stack names the system's reason once; that is what the user needs.
    std::string reason = e.what();
    const std::string key = "error message = '";
    if (const size_t at = reason.find(key); at != std::string::npos) {
      const size_t from = at + key.size();
      reason = reason.substr(from, reason.find('\'', from) - from);
    }
    throw ConfigError(fmt::format("cannot write checkpoint {}: {}; the checkpoints already in {} are intact: "
                                  "free space (or raise the file size limit) and run again to resume from "
                                  "the newest",
                                  path, reason, dir.string()));
  }
  return path;
}

void load_init_weights(const Config& config, const ModelSpec& model, ParamStore& params) {
  const std::string& path = config.training.init_weights;
  load_keras_weights(path, fmt::format("training.init_weights {}", path), config.training.init_by_name, model, params);
}

void load_keras_weights(const std::string& path, const std::string& where, bool by_name, const ModelSpec& model,
                        ParamStore& params) {
  if (const std::string problem = input_file_problem(path); !problem.empty())
    throw ConfigError(fmt::format("{}: {}", where, problem));
  KerasWeightsFile file(path);

  // Our layers with weights, in model order, and their weights in Keras order.
  std::vector<int> ours;
  std::map<int, std::vector<const ParamRef*>> refs;
  for (const ParamRef& r : params.refs()) {
    if (refs[r.layer].empty()) ours.push_back(r.layer);
    refs[r.layer].push_back(&r);
  }
  std::vector<std::string> theirs;
  for (const auto& name : file.layer_names())
    if (!file.weight_names(name).empty()) theirs.push_back(name);

  std::vector<std::pair<int, std::string>> pairs;  // (our layer, their layer)
  if (by_name) {
    std::vector<std::string> skipped;
    for (int l : ours) {
      const std::string& name = model.layers[l].config.name;
      if (std::find(theirs.begin(), theirs.end(), name) != theirs.end())
        pairs.emplace_back(l, name);
      else
        skipped.push_back(name);
    }
    if (!skipped.empty())
      log().warn("{}: no weights for {} (kept their initial values)", where, fmt::join(skipped, ", "));
  } else {
    if (theirs.size() != ours.size())
      throw ConfigError(fmt::format(
          "{}: the file has {} layers with weights, the model has {}; use init_by_name: true to load "
          "matching names only",
          where, theirs.size(), ours.size()));
    for (size_t i = 0; i < ours.size(); ++i) pairs.emplace_back(ours[i], theirs[i]);
  }

  // Check every shape before loading anything, then stream one tensor at a time.
  for (const auto& [l, their] : pairs) {
    const auto& stored = file.weight_names(their);
    const auto& mine = refs[l];
    const std::string& name = model.layers[l].config.name;
    if (stored.size() != mine.size())
      throw ConfigError(fmt::format("{}: layer {} (file's {}) has {} weights in the file, the model expects {}",
                                    where, name, their, stored.size(), mine.size()));
    for (size_t i = 0; i < mine.size(); ++i) {
      const auto shape = file.shape(their, stored[i]);
      if (shape != mine[i]->keras_shape)
        throw ConfigError(fmt::format("{}: layer {} weight {}: the model expects {}, the file's {}/{} is {}",
                                      where, name, mine[i]->weight, shape_text(mine[i]->keras_shape), their,
                                      short_name(stored[i]), shape_text(shape)));
    }
    if (their != name) log().info("{}: loading file layer {} into {}", where, their, name);
  }
  for (const auto& match : pairs) {
    const std::string& their = match.second;
    const auto& stored = file.weight_names(their);
    for (size_t i = 0; i < stored.size(); ++i)
      params.load_keras(*refs[match.first][i],
                        finite_reader(fmt::format("{}: layer {} weight {}", where, their, short_name(stored[i])),
                                      [&](const auto& start, const auto& count, float* dst) {
                                        file.read(their, stored[i], start, count, dst);
                                      }));
  }
  log().info("{}: loaded {} layers", where, pairs.size());
}

}  // namespace ht

namespace ht {

std::string checkpoint_problem(const std::string& path) {
  try {
    KerasWeightsFile f(path);
    if (!f.has_halotrain()) return "it has no /halotrain state (a plain Keras weights file)";
    if (!f.verify_checksum()) return "its checksum does not verify (torn or corrupted)";
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

bool is_plain_keras_weights(const std::string& path) {
  try {
    KerasWeightsFile f(path);
    return !f.has_halotrain() && !f.layer_names().empty();
  } catch (const std::exception&) {
    return false;
  }
}

TrainingProgress load_checkpoint(const std::string& path, const Config& config, const ModelSpec& model,
                                 ParamStore& params, OptimizerState& optimizer, ComputeBackend& backend,
                                 bool verbose) {
  KerasWeightsFile file(path);
  const HalotrainState state = file.read_state();
  const std::string hash = model_hash(model);
  if (state.model_hash != hash)
    throw ConfigError(fmt::format(
        "checkpoint {} was written for another model (model hash {}, this config's is {}): the layers and "
        "model.input cannot change on resume; set checkpoint.resume: never or use a new run_dir",
        path, state.model_hash, hash));
  if (verbose) {
    // Allowed changes (steps, learning rate, checkpoint.*, ...) are logged, key by key.
    try {
      const Config before = parse_config(state.config_text, path);
      std::istringstream a(to_yaml(before)), b(to_yaml(config));
      std::string la, lb;
      while (std::getline(a, la) && std::getline(b, lb))
        if (la != lb) log().info("resume: config changed since {}: '{}' -> '{}'", path, la, lb);
    } catch (const std::exception&) {
      log().info("resume: the config stored in {} no longer parses; not comparing", path);
    }
  }
  for (const ParamRef& r : params.refs()) {
    const auto shape = file.shape(r.layer_name, r.weight);
    if (shape != r.keras_shape)
      throw ConfigError(fmt::format("checkpoint {}: layer {} weight {} is {}, the model expects {}", path,
                                    r.layer_name, r.weight, shape_text(shape), shape_text(r.keras_shape)));
    params.load_keras(r, finite_reader(fmt::format("checkpoint {}: layer {} weight {}", path, r.layer_name, r.weight),
                                       [&](const auto& start, const auto& count, float* dst) {
                                         file.read(r.layer_name, r.weight, start, count, dst);
                                       }));
  }
  const bool adam = config.training.optimizer.type == OptimizerType::Adam;
  auto load_slot = [&](const std::string& name, Tensor& t) {
    if (t.empty()) return;
    try {
      const auto shape = file.slot_shape(name);
      if (shape.size() == 1 && size_t(shape[0]) == t.size()) {
        params.load_flat(t.data(), t.size(), [&](const auto& start, const auto& count, float* dst) {
          file.read_slot(name, start, count, dst);
        });
        return;
      }
    } catch (const std::exception&) {
    }
    if (verbose) log().warn("resume: {} has no optimizer slot '{}'; it starts from zero", path, name);
  };
  load_slot(adam ? "adam_m" : "sgd_velocity", optimizer.m);
  load_slot("adam_v", optimizer.v);
  TrainingProgress p;
  p.step = state.step;
  p.epoch = state.epoch;
  p.cursor = state.cursor;
  p.monitors = state.monitors;
  p.data_identity = state.data_identity;
  return p;
}

}  // namespace ht
