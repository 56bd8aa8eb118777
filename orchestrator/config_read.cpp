// The schema of SPEC section 3: reads a YAML tree into Config, validating as it goes.
// The model section is read in config_model.cpp; generic reading and --set handling live
// in config_yaml.cpp; output in config_emit.cpp.
#include "orchestrator/config_io.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <system_error>

#include "kernels/cpu/dnnl_isa.hpp"
#include "kernels/loss_weights.hpp"
#include "orchestrator/config_model.hpp"
#include "orchestrator/config_yaml.hpp"
#include "orchestrator/files.hpp"

namespace ht {

using cfg::Item;
using cfg::kIntMax;
using cfg::MapReader;
using cfg::peek;

namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

const std::vector<std::string> kAdamKeys = {"type", "lr", "beta1", "beta2", "epsilon"};
const std::vector<std::string> kSgdKeys = {"type", "lr", "momentum"};

// Signal names Slurm's --signal takes that make sense for a graceful stop.
const std::vector<std::string> kSignals = {"USR1", "USR2", "TERM", "INT", "HUP", "ALRM"};

const char* kTimeFormats = "a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)";

void read_augment(const Item& it, AugmentConfig& a) {
  if (!it.present || it.node.IsNull()) return;
  MapReader r(it, {"flip", "crop"});
  if (Item flip = r["flip"]; flip.present && !flip.node.IsNull()) {
    if (!flip.node.IsSequence()) flip.expected("a list of horizontal and/or vertical");
    for (size_t i = 0; i < flip.node.size(); ++i) {
      const Item axis = flip.element(i);
      (cfg::as_choice(axis, {"horizontal", "vertical"}) == 0 ? a.flip_horizontal : a.flip_vertical) = true;
    }
  }
  if (Item crop = r["crop"]; crop.present && !crop.node.IsNull()) {
    const char* what = "[height, width] (integers >= 1), the window model.input takes";
    if (!crop.node.IsSequence() || crop.node.size() != 2) crop.expected(what);
    a.crop_height = int(cfg::as_int(crop.element(0), 1, kIntMax));
    a.crop_width = int(cfg::as_int(crop.element(1), 1, kIntMax));
  }
}

void read_data(const MapReader& root, LossType loss, DataConfig& d) {
  Item data_item = root["data"];
  if (!data_item.present) data_item.missing("a map with at least `train: FILE.h5`");
  MapReader r(data_item,
              {"train", "validation", "images", "targets", "scale", "shuffle", "downsample", "augment", "synthesize",
               "fit", "pad_value", "level", "mean", "std", "channels"});
  if (!r.has("train")) r["train"].missing("the path of the training data: an HDF5 file or a CSV manifest");
  d.train = r.get_string("train", "");
  d.images = r.get_string("images", d.images);
  d.targets = r.get_string("targets", d.targets);
  if (Item s = r["scale"]; s.present && s.node.IsScalar() && s.node.Scalar() == "auto")
    d.scale_auto = true;
  else
    d.scale = r.get_positive("scale", d.scale);
  d.fit = r.get_choice("fit", DataFit::Error, {"error", "pad", "crop", "resize"},
                       {DataFit::Error, DataFit::Pad, DataFit::Crop, DataFit::Resize});
  d.pad_value = r.get_finite("pad_value", d.pad_value);
  d.level = int(r.get_int("level", d.level, 0, kIntMax));
  d.channels = int(r.get_int("channels", d.channels, 0, kIntMax));
  for (const char* key : {"mean", "std"}) {
    Item it = r[key];
    if (!it.present || it.node.IsNull()) continue;
    if (!it.node.IsSequence() || it.node.size() == 0) it.expected("a list of one number per channel, such as [0.485, 0.456, 0.406]");
    std::vector<double>& v = std::string(key) == "mean" ? d.mean : d.std;
    for (size_t i = 0; i < it.node.size(); ++i)
      v.push_back(std::string(key) == "mean" ? cfg::as_double_finite(it.element(i)) : cfg::as_double_positive(it.element(i)));
  }
  d.shuffle = r.get_bool("shuffle", d.shuffle);
  d.validation = cfg::as_nullable_string(r["validation"]).value_or("");
  d.downsample = int(r.get_int("downsample", d.downsample, 1, kIntMax));
  read_augment(r["augment"], d.augment);
  Item syn = r["synthesize"];
  if (!syn.present || syn.node.IsNull()) return;
  MapReader s(syn, {"count", "height", "width", "channels", "classes", "masks", "validation_count"}, {}, false);
  SynthesizeConfig c;
  c.count = int(s.get_int("count", c.count, 1, kIntMax));
  c.height = int(s.get_int("height", c.height, 1, kIntMax));
  c.width = int(s.get_int("width", c.width, 1, kIntMax));
  c.channels = int(s.get_int("channels", c.channels, 1, kIntMax));
  c.classes = int(s.get_int("classes", c.classes, 1, kIntMax));
  c.masks = s.get_bool("masks", c.masks);
  c.validation_count = int(s.get_int("validation_count", c.validation_count, 0, kIntMax));
  d.synthesize = c;
}

void read_optimizer(const Item& it, OptimizerConfig& o) {
  if (!it.present || it.node.IsNull()) return;
  if (!it.node.IsMap()) it.expected("a map such as {type: adam, lr: 0.0001}");
  const Item type_item = peek(it, "type");
  if (type_item.present)
    o.type = cfg::as_choice(type_item, {"adam", "sgd"}) == 0 ? OptimizerType::Adam : OptimizerType::SGD;
  const bool adam = o.type == OptimizerType::Adam;
  const std::vector<std::string>& allowed = adam ? kAdamKeys : kSgdKeys;
  const std::vector<std::string>& other = adam ? kSgdKeys : kAdamKeys;
  auto foreign = [&](const std::string& key) -> std::optional<std::string> {
    if (std::find(other.begin(), other.end(), key) == other.end()) return std::nullopt;
    return fmt::format("is not allowed with type {} (it is a setting of {}); allowed keys: {}", to_string(o.type),
                       adam ? "sgd" : "adam", cfg::join(allowed, ", "));
  };
  MapReader r(it, allowed, foreign, false);
  o.lr = r.get_positive("lr", o.lr);
  if (adam) {
    o.beta1 = r.get_unit("beta1", o.beta1);
    o.beta2 = r.get_unit("beta2", o.beta2);
    o.epsilon = r.get_positive("epsilon", o.epsilon);
  } else {
    o.momentum = r.get_unit("momentum", o.momentum);
  }
}

// A monitor's keys in `r` (SPEC section 14): monitor (default val_loss), mode. Which names
// exist is checked once the whole config is read (check_monitors).
Monitor read_monitor(const MapReader& r) {
  Monitor m;
  m.name = r.get_string("monitor", m.name);
  m.mode = r.get_choice("mode", MonitorMode::Auto, {"auto", "min", "max"},
                        {MonitorMode::Auto, MonitorMode::Min, MonitorMode::Max});
  const Item at = r.has("monitor") ? r["monitor"] : r.self();
  m.where = at.where() + ": " + (r.has("monitor") ? at.path : at.path + ".monitor");
  return m;
}

void read_lr_schedule(const Item& it, LrSchedule& s) {
  if (!it.present || it.node.IsNull()) return;
  if (!it.node.IsMap()) it.expected("a map such as {type: cosine, warmup_steps: 100}");
  const Item type_item = peek(it, "type");
  if (!type_item.present) type_item.missing("one of constant | cosine | step | plateau");
  const std::vector<ScheduleType> types = {ScheduleType::Constant, ScheduleType::Cosine, ScheduleType::Step,
                                           ScheduleType::Plateau};
  s.type = types.at(cfg::as_choice(type_item, {"constant", "cosine", "step", "plateau"}));
  const std::map<ScheduleType, std::vector<std::string>> keys = {
      {ScheduleType::Constant, {"type"}},
      {ScheduleType::Cosine, {"type", "warmup_steps", "min_lr"}},
      {ScheduleType::Step, {"type", "every", "factor"}},
      {ScheduleType::Plateau, {"type", "monitor", "mode", "factor", "patience", "min_delta", "min_lr", "cooldown"}}};
  const std::vector<std::string>& allowed = keys.at(s.type);
  auto foreign = [&](const std::string& key) -> std::optional<std::string> {
    for (const auto& [type, ks] : keys)
      if (std::find(ks.begin(), ks.end(), key) != ks.end())
        return fmt::format("is not allowed with type {} (it is a setting of {}); allowed keys: {}",
                           to_string(s.type), to_string(type), cfg::join(allowed, ", "));
    return std::nullopt;
  };
  MapReader r(it, allowed, foreign, false);
  if (s.type == ScheduleType::Cosine) {
    s.warmup_steps = r.get_int("warmup_steps", s.warmup_steps, 0, kI64Max);
    s.min_lr = r.get_nonneg("min_lr", s.min_lr);
  } else if (s.type == ScheduleType::Step) {
    s.every = r.get_int("every", s.every, 1, kI64Max);
    s.factor = r.get_positive("factor", s.factor);
  } else if (s.type == ScheduleType::Plateau) {
    s.monitor = read_monitor(r);
    s.factor = r.get_unit("factor", 0.1);
    if (s.factor == 0) r["factor"].expected("a number in (0, 1): the factor the learning rate is multiplied by");
    s.patience = r.get_int("patience", s.patience, 0, kI64Max);
    s.min_delta = r.get_nonneg("min_delta", s.min_delta);
    s.min_lr = r.get_nonneg("min_lr", s.min_lr);
    s.cooldown = r.get_int("cooldown", s.cooldown, 0, kI64Max);
  }
}

void read_training(const MapReader& root, TrainingConfig& t) {
  MapReader r(root["training"],
              {"batch_size", "steps", "epochs", "optimizer", "init_weights", "init_by_name", "log_every",
               "validate_every", "metrics", "lr_schedule", "weight_decay", "accumulate", "class_weights",
               "pos_weight", "early_stopping", "freeze", "unfreeze_at"});
  t.batch_size = int(r.get_int("batch_size", t.batch_size, 1, kIntMax));
  t.steps = r.get_int("steps", 0, 0, kI64Max);
  t.epochs = r.get_int("epochs", 0, 0, kI64Max);
  if (t.steps == 0 && t.epochs == 0) {
    const Item at = r.has("steps") ? r["steps"] : r.has("epochs") ? r["epochs"] : r.self();
    at.fail(fmt::format("{}: expected steps >= 1 or epochs >= 1 (how long to train), found {}",
                        root["training"].path,
                        r.has("steps") || r.has("epochs") ? "zero" : "neither"));
  }
  if (t.steps > 0) t.epochs = 0;  // steps wins
  read_optimizer(r["optimizer"], t.optimizer);
  t.init_weights = cfg::as_nullable_string(r["init_weights"]).value_or("");
  t.init_by_name = r.get_bool("init_by_name", t.init_by_name);
  t.log_every = int(r.get_int("log_every", t.log_every, 1, kIntMax));
  t.validate_every = r.get_int("validate_every", t.validate_every, 0, kI64Max);
  if (Item m = r["metrics"]; m.present && !m.node.IsNull()) {
    if (!m.node.IsSequence()) m.expected("a list such as [accuracy, auc] (labels) or [dice, iou] (masks)");
    t.metrics.clear();
    const std::vector<Metric> all = {Metric::Accuracy, Metric::AUC, Metric::Dice, Metric::IoU};
    for (size_t i = 0; i < m.node.size(); ++i) {
      const Metric metric = all.at(cfg::as_choice(m.element(i), {"accuracy", "auc", "dice", "iou"}));
      if (std::find(t.metrics.begin(), t.metrics.end(), metric) != t.metrics.end())
        m.element(i).fail(fmt::format("{}: {} is listed twice", m.element(i).path, to_string(metric)));
      t.metrics.push_back(metric);
    }
  }
  read_lr_schedule(r["lr_schedule"], t.lr_schedule);
  t.weight_decay = r.get_nonneg("weight_decay", t.weight_decay);
  t.accumulate = int(r.get_int("accumulate", t.accumulate, 1, kIntMax));
  if (t.batch_size % t.accumulate != 0)
    r["accumulate"].fail(fmt::format("{}: {} micro-batches must divide training.batch_size {}", r["accumulate"].path,
                                     t.accumulate, t.batch_size));
  if (Item w = r["class_weights"]; w.present && !w.node.IsNull()) {
    const char* what = "a list of one weight (a number >= 0) per class, such as [1.0, 20.0]";
    if (!w.node.IsSequence() || w.node.size() < 2) w.expected(what);
    if (w.node.size() > size_t(LossWeights::kMaxClasses))
      w.fail(fmt::format("{}: {} weights; at most {} classes can be weighted", w.path, w.node.size(),
                         LossWeights::kMaxClasses));
    for (size_t i = 0; i < w.node.size(); ++i) t.class_weights.push_back(cfg::as_double_nonneg(w.element(i)));
  }
  if (Item p = r["pos_weight"]; p.present && !p.node.IsNull()) t.pos_weight = cfg::as_double_positive(p);
  if (Item f = r["freeze"]; f.present && !f.node.IsNull()) {
    if (!f.node.IsSequence()) f.expected("a list of layer names or glob patterns, such as [\"stem*\", block1_conv]");
    for (size_t i = 0; i < f.node.size(); ++i) t.freeze.push_back(cfg::as_string(f.element(i)));
  }
  t.unfreeze_at = r.get_int("unfreeze_at", t.unfreeze_at, 0, kI64Max);
  if (t.unfreeze_at > 0 && t.freeze.empty())
    r["unfreeze_at"].fail(fmt::format("{}: releases the layers of training.freeze, and it is empty",
                                      r["unfreeze_at"].path));
  if (Item e = r["early_stopping"]; e.present && !e.node.IsNull()) {
    MapReader es(e, {"monitor", "mode", "patience", "min_delta"}, {}, false);
    EarlyStopping stop;
    stop.monitor = read_monitor(es);
    stop.patience = es.get_int("patience", stop.patience, 0, kI64Max);
    stop.min_delta = es.get_nonneg("min_delta", stop.min_delta);
    t.early_stopping = stop;
  }
}

void read_parallel(const MapReader& root, ParallelConfig& p) {
  MapReader r(root["parallel"],
              {"backend", "grid", "device_memory", "host_memory", "devices_per_node", "activations", "threads",
               "cpu_isa", "fuse"});
  p.backend = r.get_choice("backend", Backend::CPU, {"cpu", "cuda"}, {Backend::CPU, Backend::CUDA});
  if (Item g = r["grid"]; g.present) {
    const char* what = "[rows, cols] (integers >= 1) or auto";
    if (g.node.IsScalar() && g.node.Scalar() == "auto") {
      p.grid_auto = true;
    } else {
      if (!g.node.IsSequence() || g.node.size() != 2) g.expected(what);
      p.grid_rows = int(cfg::as_int(g.element(0), 1, kIntMax));
      p.grid_cols = int(cfg::as_int(g.element(1), 1, kIntMax));
      if (int64_t(p.grid_rows) * p.grid_cols > kIntMax)
        g.fail(fmt::format("{}: {} x {} shards is out of range (at most {} in all)", g.path, p.grid_rows,
                           p.grid_cols, kIntMax));
    }
  }
  const char* size_text = "a size such as 11441MiB, 2GB or a number of bytes (units B, KiB, MiB, GiB, KB, MB, GB)";
  auto read_size = [&](const Item& m, const std::string& text) {
    uint64_t bytes = 0;
    try {
      bytes = parse_size(text);
    } catch (const std::invalid_argument& e) {
      m.fail(fmt::format("{}: expected {}, found {} ({})", m.path, size_text, cfg::describe(m.node), e.what()));
    }
    if (bytes == 0) m.expected("a size > 0");
    return bytes;
  };
  if (Item m = r["device_memory"]; m.present) {
    if (!m.node.IsScalar()) m.expected(size_text);
    p.device_memory = read_size(m, m.node.Scalar());
  }
  if (Item m = r["host_memory"]; m.present) {
    if (!m.node.IsScalar()) m.expected(std::string("auto or ") + size_text);
    p.host_memory = m.node.Scalar() == "auto" ? 0 : read_size(m, m.node.Scalar());
  }
  p.devices_per_node = int(r.get_int("devices_per_node", p.devices_per_node, 1, kIntMax));
  if (Item t = r["threads"]; t.present) {
    const std::string text = t.node.IsScalar() ? t.node.Scalar() : "";
    int threads = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), threads);
    if (text != "auto" && (ec != std::errc() || end != text.data() + text.size() || threads < 1 || threads > 4096))
      t.expected("auto or the CPU threads of each rank, an integer in [1, 4096]");
    p.threads = text == "auto" ? 0 : threads;
  }
  if (Item isa = r["cpu_isa"]; isa.present) {
    p.cpu_isa = isa.node.IsScalar() ? isa.node.Scalar() : "";
    const std::vector<std::string>& names = cpu::dnnl_isa_names();
    if (p.cpu_isa != "auto" && std::find(names.begin(), names.end(), p.cpu_isa) == names.end())
      isa.expected(fmt::format("auto or one of oneDNN's CPU ISAs: {}", fmt::join(names, ", ")));
  }
  p.fuse = r.get_bool("fuse", p.fuse);
  p.activations = r.get_choice(
      "activations", ActivationPolicy::Auto, {"auto", "keep", "offload", "recompute"},
      {ActivationPolicy::Auto, ActivationPolicy::Keep, ActivationPolicy::Offload, ActivationPolicy::Recompute});
}


void read_slurm(const MapReader& root, SlurmConfig& s) {
  MapReader r(root["slurm"], {"partition", "nodes", "time", "account", "signal", "signal_before", "extra"});
  s.partition = r.get_string("partition", s.partition);
  s.nodes = int(r.get_int("nodes", s.nodes, 1, kIntMax));
  std::optional<int64_t> limit = slurm_time_seconds(s.time);
  if (Item t = r["time"]; t.present) {
    if (!t.node.IsScalar() || !(limit = slurm_time_seconds(t.node.Scalar()))) t.expected(kTimeFormats);
    s.time = t.node.Scalar();
  }
  s.account = cfg::as_nullable_string(r["account"]).value_or("");
  if (Item sig = r["signal"]; sig.present) {
    const std::string what = "a signal name (" + cfg::join(kSignals, ", ") + ", with or without SIG)";
    if (!sig.node.IsScalar()) sig.expected(what);
    std::string name = sig.node.Scalar();
    for (char& c : name) c = char(std::toupper(static_cast<unsigned char>(c)));
    if (name.rfind("SIG", 0) == 0) name = name.substr(3);
    if (std::find(kSignals.begin(), kSignals.end(), name) == kSignals.end()) sig.expected(what);
    s.signal = name;
  }
  // Slurm stores the warning time in 16 bits.
  s.signal_before = int(r.get_int("signal_before", s.signal_before, 0, 65535));
  if (*limit > 0 && s.signal_before >= *limit) {
    Item at = r.has("signal_before") ? r["signal_before"] : r["time"];
    at.fail(fmt::format("slurm.signal_before: {} s must be shorter than slurm.time '{}' ({} s), or the job is "
                        "signalled before it starts",
                        s.signal_before, s.time, *limit));
  }
  if (Item extra = r["extra"]; extra.present && !extra.node.IsNull()) {
    if (!extra.node.IsSequence()) extra.expected("a list of strings (extra #SBATCH lines)");
    for (size_t i = 0; i < extra.node.size(); ++i) s.extra.push_back(cfg::as_string(extra.element(i)));
  }
}

// Every monitor names a figure that validation computes: val_loss, or val_ and one of
// training.metrics; and validation runs during training (data.validation, validate_every).
void check_monitors(const Config& c) {
  std::vector<const Monitor*> monitors;
  if (c.checkpoint.best) monitors.push_back(&*c.checkpoint.best);
  if (c.training.early_stopping) monitors.push_back(&c.training.early_stopping->monitor);
  if (c.training.lr_schedule.type == ScheduleType::Plateau) monitors.push_back(&c.training.lr_schedule.monitor);
  std::vector<std::string> names{"val_loss"};
  for (Metric m : c.training.metrics) names.push_back(std::string("val_") + to_string(m));
  for (const Monitor* m : monitors) {
    if (std::find(names.begin(), names.end(), m->name) == names.end())
      throw ConfigError(fmt::format("{}: expected a validation figure: one of {} (training.metrics adds val_ and a "
                                    "metric); found '{}'",
                                    m->where, cfg::join(names, ", "), m->name));
    if (c.data.validation.empty() || c.training.validate_every == 0)
      throw ConfigError(fmt::format("{}: {} is computed by validation during training: set data.validation and "
                                    "training.validate_every (steps, > 0){}",
                                    m->where, m->name,
                                    c.data.validation.empty() ? "" : "; training.validate_every is 0"));
  }
}


Config read_config(const cfg::Source& src, const YAML::Node& root_node) {
  Item root_item{&src, "", root_node, root_node, true};
  MapReader root(root_item, {"name", "run_dir", "seed", "data", "model", "training", "parallel", "checkpoint",
                             "recycle", "slurm"});
  Config c;
  c.name = root.get_string("name", c.name);
  c.run_dir = root.get_string("run_dir", "runs/" + c.name);
  if (Item seed = root["seed"]; seed.present) c.seed = cfg::as_uint64(seed);
  read_model(root, c.model);
  read_data(root, c.model.loss, c.data);
  for (const auto& [key, v] : {std::pair<const char*, const std::vector<double>&>{"mean", c.data.mean}, {"std", c.data.std}})
    if (!v.empty() && int(v.size()) != c.model.channels)
      root["data"].fail(fmt::format("data.{}: {} values; model.input has {} channel{}, one value each", key, v.size(),
                                    c.model.channels, c.model.channels == 1 ? "" : "s"));
  if (c.data.channels > 0 && c.data.channels != c.model.channels)
    root["data"].fail(fmt::format("data.channels: {}, but model.input has {}: the images become the model's "
                                  "channels (adapt a pretrained model with `halotrain import --channels` instead)",
                                  c.data.channels, c.model.channels));
  read_training(root, c.training);
  read_parallel(root, c.parallel);
  const AugmentConfig& a = c.data.augment;
  if (a.crops() && (a.crop_height != c.model.height || a.crop_width != c.model.width))
    root["data"].fail(fmt::format("data.augment.crop: the window [{}, {}] must equal model.input's [{}, {}] (the "
                                  "crop is what the model takes)",
                                  a.crop_height, a.crop_width, c.model.height, c.model.width));

  MapReader ck(root["checkpoint"], {"every_steps", "keep", "resume", "best"});
  c.checkpoint.every_steps = ck.get_int("every_steps", c.checkpoint.every_steps, 0, kI64Max);
  c.checkpoint.keep = int(ck.get_int("keep", c.checkpoint.keep, 1, kIntMax));
  c.checkpoint.resume = ck.get_string("resume", c.checkpoint.resume);
  if (Item b = ck["best"]; b.present && !b.node.IsNull())
    c.checkpoint.best = read_monitor(MapReader(b, {"monitor", "mode"}, {}, false));
  check_monitors(c);

  MapReader rc(root["recycle"], {"every_steps", "mode"});
  c.recycle.every_steps = rc.get_int("every_steps", c.recycle.every_steps, 0, kI64Max);
  c.recycle.mode = rc.get_choice("mode", RecycleMode::InProcess, {"in_process", "restart"},
                                 {RecycleMode::InProcess, RecycleMode::Restart});

  read_slurm(root, c.slurm);
  return c;
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  cfg::Source src{source_name, {}};
  YAML::Node root = cfg::load_yaml(yaml_text, source_name);
  if (!root.IsMap() && !root.IsNull())
    throw ConfigError(fmt::format("{}: expected a map of settings (name, data, model, ...), found {}", source_name,
                                  cfg::describe(root)));
  // An empty file parses to a node-less null; overrides need a real map to write into.
  if (root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
  for (const auto& o : overrides) cfg::apply_override(root, o, src);
  Config c = read_config(src, root);
  c.source_path = source_name;
  if (overrides.empty()) {
    c.text = yaml_text;
  } else {
    YAML::Emitter out;
    out << root;
    c.text = std::string(out.c_str()) + "\n";
  }
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  const std::string problem = input_file_problem(path);
  if (problem == "does not exist") throw ConfigError(fmt::format("{}: config file not found", path));
  if (!problem.empty()) throw ConfigError(fmt::format("{}: {} (the config file)", path, problem));
  return parse_config(read_text_file(path), path, overrides);
}




}  // namespace ht
