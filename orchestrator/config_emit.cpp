// The resolved config as YAML.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cmath>
#include <stdexcept>

#include "orchestrator/config_io.hpp"
#include "orchestrator/layer_kind.hpp"

namespace ht {

namespace {

// Shortest text that reads back as the same double, always with a '.' or exponent.
std::string num(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// Strings are always quoted so a name like "null" or "123" stays a string.
struct Q {
  const std::string& s;
};
YAML::Emitter& operator<<(YAML::Emitter& out, const Q& q) { return out << YAML::DoubleQuoted << q.s; }

void key_nullable(YAML::Emitter& out, const char* key, const std::string& v) {
  out << YAML::Key << key << YAML::Value;
  if (v.empty()) out << YAML::Null;
  else out << Q{v};
}

// The shortest form that reads back the same: 1, [1, 2] or [[1, 0], [2, 2]].
void emit_padding(YAML::Emitter& out, const std::string& key, const Padding& p) {
  out << YAML::Key << key << YAML::Value;
  if (p.mode != PaddingMode::Explicit) out << to_string(p.mode);
  else if (p.is_uniform()) out << p.top;
  else if (p.top == p.bottom && p.left == p.right) out << YAML::Flow << YAML::BeginSeq << p.top << p.left << YAML::EndSeq;
  else
    out << YAML::Flow << YAML::BeginSeq << YAML::Flow << YAML::BeginSeq << p.top << p.bottom << YAML::EndSeq
        << YAML::Flow << YAML::BeginSeq << p.left << p.right << YAML::EndSeq << YAML::EndSeq;
}

// A size as [rows, cols] (one integer when they are equal); margins as [[top, bottom],
// [left, right]].
void emit_ints(YAML::Emitter& out, const std::vector<int64_t>& v) {
  if (v.size() == 2 && v[0] == v[1]) {
    out << v[0];
    return;
  }
  out << YAML::Flow << YAML::BeginSeq;
  if (v.size() == 4) {
    out << YAML::Flow << YAML::BeginSeq << v[0] << v[1] << YAML::EndSeq;
    out << YAML::Flow << YAML::BeginSeq << v[2] << v[3] << YAML::EndSeq;
  } else {
    for (int64_t x : v) out << x;
  }
  out << YAML::EndSeq;
}

void emit_layer(YAML::Emitter& out, const LayerConfig& l) {
  out << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "type" << YAML::Value << l.type();
  if (!l.name.empty()) out << YAML::Key << "name" << YAML::Value << Q{l.name};
  if (!l.inputs.empty()) {
    out << YAML::Key << "inputs" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const std::string& name : l.inputs) out << Q{name};
    out << YAML::EndSeq;
  }
  if (!l.trainable) out << YAML::Key << "trainable" << YAML::Value << false;
  for (const auto& [key, value] : l.values) {
    if (const Padding* p = std::get_if<Padding>(&value)) {
      emit_padding(out, key, *p);
      continue;
    }
    out << YAML::Key << key << YAML::Value;
    if (const int64_t* i = std::get_if<int64_t>(&value)) out << *i;
    else if (const double* d = std::get_if<double>(&value)) out << num(*d);
    else if (const std::string* s = std::get_if<std::string>(&value)) out << *s;
    else if (const auto* v = std::get_if<std::vector<int64_t>>(&value)) emit_ints(out, *v);
    else out << std::get<bool>(value);
  }
  out << YAML::EndMap;
}

void emit_monitor(YAML::Emitter& out, const Monitor& m) {
  out << YAML::Key << "monitor" << YAML::Value << Q{m.name};
  out << YAML::Key << "mode" << YAML::Value
      << (m.mode == MonitorMode::Auto ? "auto" : m.mode == MonitorMode::Min ? "min" : "max");
}

// key: [x, y, ...] of numbers, in flow style.
void emit_numbers(YAML::Emitter& out, const char* key, const std::vector<double>& v) {
  out << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (double x : v) out << num(x);
  out << YAML::EndSeq;
}

void emit_data(YAML::Emitter& out, const DataConfig& d) {
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "train" << YAML::Value << Q{d.train};
  key_nullable(out, "validation", d.validation);
  out << YAML::Key << "images" << YAML::Value << Q{d.images};
  out << YAML::Key << "targets" << YAML::Value << Q{d.targets};
  if (d.scale_auto) out << YAML::Key << "scale" << YAML::Value << "auto";
  else out << YAML::Key << "scale" << YAML::Value << num(d.scale);
  if (d.fit != DataFit::Error)
    out << YAML::Key << "fit" << YAML::Value
        << (d.fit == DataFit::Pad ? "pad" : d.fit == DataFit::Crop ? "crop" : "resize") << YAML::Key << "pad_value"
        << YAML::Value << num(d.pad_value);
  if (d.level) out << YAML::Key << "level" << YAML::Value << d.level;
  if (d.channels) out << YAML::Key << "channels" << YAML::Value << d.channels;
  if (!d.mean.empty()) emit_numbers(out, "mean", d.mean);
  if (!d.std.empty()) emit_numbers(out, "std", d.std);
  out << YAML::Key << "shuffle" << YAML::Value << d.shuffle;
  out << YAML::Key << "downsample" << YAML::Value << d.downsample;
  out << YAML::Key << "augment" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "flip" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  if (d.augment.flip_horizontal) out << "horizontal";
  if (d.augment.flip_vertical) out << "vertical";
  out << YAML::EndSeq;
  out << YAML::Key << "crop" << YAML::Value;
  if (d.augment.crops())
    out << YAML::Flow << YAML::BeginSeq << d.augment.crop_height << d.augment.crop_width << YAML::EndSeq;
  else
    out << YAML::Null;
  out << YAML::EndMap;
  out << YAML::Key << "synthesize" << YAML::Value;
  if (!d.synthesize) {
    out << YAML::Null;
  } else {
    const SynthesizeConfig& s = *d.synthesize;
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "count" << YAML::Value << s.count << YAML::Key << "height"
        << YAML::Value << s.height << YAML::Key << "width" << YAML::Value << s.width << YAML::Key << "channels"
        << YAML::Value << s.channels << YAML::Key << "classes" << YAML::Value << s.classes << YAML::Key << "masks"
        << YAML::Value << s.masks << YAML::Key << "validation_count" << YAML::Value << s.validation_count
        << YAML::EndMap;
  }
  out << YAML::EndMap;
}

void emit_training(YAML::Emitter& out, const TrainingConfig& t) {
  out << YAML::Key << "training" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "batch_size" << YAML::Value << t.batch_size;
  out << YAML::Key << "steps" << YAML::Value << t.steps;
  out << YAML::Key << "epochs" << YAML::Value << t.epochs;
  const OptimizerConfig& o = t.optimizer;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "type" << YAML::Value << to_string(o.type) << YAML::Key << "lr" << YAML::Value << num(o.lr);
  if (o.type == OptimizerType::Adam)
    out << YAML::Key << "beta1" << YAML::Value << num(o.beta1) << YAML::Key << "beta2" << YAML::Value
        << num(o.beta2) << YAML::Key << "epsilon" << YAML::Value << num(o.epsilon);
  else
    out << YAML::Key << "momentum" << YAML::Value << num(o.momentum);
  out << YAML::EndMap;
  key_nullable(out, "init_weights", t.init_weights);
  out << YAML::Key << "init_by_name" << YAML::Value << t.init_by_name;
  out << YAML::Key << "log_every" << YAML::Value << t.log_every;
  out << YAML::Key << "validate_every" << YAML::Value << t.validate_every;
  out << YAML::Key << "metrics" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (Metric m : t.metrics) out << to_string(m);
  out << YAML::EndSeq;
  const LrSchedule& ls = t.lr_schedule;
  out << YAML::Key << "lr_schedule" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "type" << YAML::Value << to_string(ls.type);
  if (ls.type == ScheduleType::Cosine)
    out << YAML::Key << "warmup_steps" << YAML::Value << ls.warmup_steps << YAML::Key << "min_lr" << YAML::Value
        << num(ls.min_lr);
  if (ls.type == ScheduleType::Step)
    out << YAML::Key << "every" << YAML::Value << ls.every << YAML::Key << "factor" << YAML::Value << num(ls.factor);
  if (ls.type == ScheduleType::Plateau) {
    emit_monitor(out, ls.monitor);
    out << YAML::Key << "factor" << YAML::Value << num(ls.factor) << YAML::Key << "patience" << YAML::Value
        << ls.patience << YAML::Key << "min_delta" << YAML::Value << num(ls.min_delta) << YAML::Key << "min_lr"
        << YAML::Value << num(ls.min_lr) << YAML::Key << "cooldown" << YAML::Value << ls.cooldown;
  }
  out << YAML::EndMap;
  out << YAML::Key << "weight_decay" << YAML::Value << num(t.weight_decay);
  out << YAML::Key << "accumulate" << YAML::Value << t.accumulate;
  if (!t.class_weights.empty()) emit_numbers(out, "class_weights", t.class_weights);
  if (t.pos_weight != 1) out << YAML::Key << "pos_weight" << YAML::Value << num(t.pos_weight);
  if (!t.freeze.empty()) {
    out << YAML::Key << "freeze" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const std::string& p : t.freeze) out << Q{p};
    out << YAML::EndSeq << YAML::Key << "unfreeze_at" << YAML::Value << t.unfreeze_at;
  }
  if (const auto& es = t.early_stopping) {
    out << YAML::Key << "early_stopping" << YAML::Value << YAML::Flow << YAML::BeginMap;
    emit_monitor(out, es->monitor);
    out << YAML::Key << "patience" << YAML::Value << es->patience << YAML::Key << "min_delta" << YAML::Value
        << num(es->min_delta) << YAML::EndMap;
  }
  out << YAML::EndMap;
}

}  // namespace

std::string to_yaml(const Config& c) {
  YAML::Emitter out;
  out.SetBoolFormat(YAML::TrueFalseBool);
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << Q{c.name};
  out << YAML::Key << "run_dir" << YAML::Value << Q{c.run_dir};
  out << YAML::Key << "seed" << YAML::Value << c.seed;

  emit_data(out, c.data);

  const ModelConfig& m = c.model;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "input" << YAML::Value << YAML::Flow << YAML::BeginSeq << m.height << m.width << m.channels
      << YAML::EndSeq;
  out << YAML::Key << "layers" << YAML::Value << YAML::BeginSeq;
  for (const auto& l : m.layers) emit_layer(out, l);
  out << YAML::EndSeq;
  out << YAML::Key << "loss" << YAML::Value << to_string(m.loss);
  out << YAML::EndMap;

  emit_training(out, c.training);

  const ParallelConfig& p = c.parallel;
  out << YAML::Key << "parallel" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "backend" << YAML::Value << to_string(p.backend);
  out << YAML::Key << "grid" << YAML::Value;
  if (p.grid_auto) out << "auto";
  else out << YAML::Flow << YAML::BeginSeq << p.grid_rows << p.grid_cols << YAML::EndSeq;
  out << YAML::Key << "device_memory" << YAML::Value << exact_size(p.device_memory);
  out << YAML::Key << "host_memory" << YAML::Value;
  if (p.host_memory == 0) out << "auto";
  else out << exact_size(p.host_memory);
  out << YAML::Key << "devices_per_node" << YAML::Value << p.devices_per_node;
  out << YAML::Key << "activations" << YAML::Value << to_string(p.activations);
  out << YAML::Key << "threads" << YAML::Value;
  if (p.threads == 0) out << "auto";
  else out << p.threads;
  out << YAML::Key << "cpu_isa" << YAML::Value << p.cpu_isa;
  out << YAML::Key << "fuse" << YAML::Value << p.fuse;
  out << YAML::EndMap;

  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "every_steps" << YAML::Value << c.checkpoint.every_steps;
  out << YAML::Key << "keep" << YAML::Value << c.checkpoint.keep;
  out << YAML::Key << "resume" << YAML::Value << Q{c.checkpoint.resume};
  if (c.checkpoint.best) {
    out << YAML::Key << "best" << YAML::Value << YAML::Flow << YAML::BeginMap;
    emit_monitor(out, *c.checkpoint.best);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  out << YAML::Key << "recycle" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "every_steps" << YAML::Value << c.recycle.every_steps;
  out << YAML::Key << "mode" << YAML::Value << to_string(c.recycle.mode);
  out << YAML::EndMap;

  const SlurmConfig& s = c.slurm;
  out << YAML::Key << "slurm" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "partition" << YAML::Value << Q{s.partition};
  out << YAML::Key << "nodes" << YAML::Value << s.nodes;
  out << YAML::Key << "time" << YAML::Value << Q{s.time};
  key_nullable(out, "account", s.account);
  out << YAML::Key << "signal" << YAML::Value << s.signal;
  out << YAML::Key << "signal_before" << YAML::Value << s.signal_before;
  out << YAML::Key << "extra" << YAML::Value << YAML::BeginSeq;
  for (const auto& line : s.extra) out << Q{line};
  out << YAML::EndSeq;
  out << YAML::EndMap;

  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace ht
