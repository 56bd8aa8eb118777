#include "worker/run/monitors.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace ht {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The start of a figure's best: nothing is better than it yet.
double worst_of(const Monitor& m) { return m.maximizes() ? -kInf : kInf; }

double value_of(const MetricValues& values, const Monitor& m) {
  for (const auto& [name, v] : values)
    if ("val_" + name == m.name) return v;
  throw std::logic_error("validation did not compute " + m.name);  // check_monitors rules it out
}

// Keras's test of an improvement by more than the absolute min_delta.
bool improves(const Monitor& m, double current, double best, double min_delta) {
  return m.maximizes() ? current - min_delta > best : current + min_delta < best;
}

// JSON has no infinity: a best that is still the start is written as null.
nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }
double read_best(const nlohmann::json& j, const Monitor& m) { return j.is_null() ? worst_of(m) : j.get<double>(); }

}  // namespace

Monitors::Monitors(const Config& config) : config_(config) {
  best_value_ = config.checkpoint.best ? worst_of(*config.checkpoint.best) : 0;
  stop_best_ = config.training.early_stopping ? worst_of(config.training.early_stopping->monitor) : 0;
  plateau_best_ = worst_of(config.training.lr_schedule.monitor);
}

Monitors::Verdict Monitors::observe(const MetricValues& values, int64_t steps_done) {
  Verdict verdict;
  ++validations_;
  if (const auto& best = config_.checkpoint.best) {
    const double v = value_of(values, *best);
    if (improves(*best, v, best_value_, 0)) {
      best_value_ = v;
      best_step_ = steps_done;
      verdict.best = true;
    }
  }
  if (const auto& es = config_.training.early_stopping) {
    // tf.keras EarlyStopping.on_epoch_end: the wait grows, an improvement resets it, and the
    // run stops when it reaches patience (never at the first validation).
    const double v = value_of(values, es->monitor);
    ++stop_wait_;
    if (improves(es->monitor, v, stop_best_, es->min_delta)) {
      stop_best_ = v;
      stop_wait_ = 0;
    }
    if (stop_wait_ >= es->patience && validations_ > 1) {
      stopped_at_ = steps_done;
      verdict.stop = true;
    }
  }
  const LrSchedule& s = config_.training.lr_schedule;
  if (s.type == ScheduleType::Plateau) {
    // tf.keras ReduceLROnPlateau.on_epoch_end.
    const double v = value_of(values, s.monitor);
    const double lr = plateau_lr(config_.training.optimizer.lr);
    if (cooldown_left_ > 0) {
      --cooldown_left_;
      plateau_wait_ = 0;
    }
    if (improves(s.monitor, v, plateau_best_, s.min_delta)) {
      plateau_best_ = v;
      plateau_wait_ = 0;
    } else if (cooldown_left_ == 0) {
      ++plateau_wait_;
      if (plateau_wait_ >= s.patience && lr > s.min_lr) {
        lr_ = std::max(lr * s.factor, s.min_lr);
        cooldown_left_ = s.cooldown;
        plateau_wait_ = 0;
        verdict.lowered = true;
      }
    }
  }
  return verdict;
}

std::string Monitors::stop_reason() const {
  const EarlyStopping& es = *config_.training.early_stopping;
  return fmt::format("early stopping: {} has not improved by more than {} for {} validation{} (best {:.6g})",
                     es.monitor.name, es.min_delta, es.patience, es.patience == 1 ? "" : "s", stop_best_);
}

std::string Monitors::save() const {
  const bool any = config_.checkpoint.best || config_.training.early_stopping ||
                   config_.training.lr_schedule.type == ScheduleType::Plateau;
  if (!any) return "";
  nlohmann::json j;
  j["validations"] = validations_;
  const auto& best = config_.checkpoint.best;
  const auto& es = config_.training.early_stopping;
  const LrSchedule& s = config_.training.lr_schedule;
  if (best) j["best"] = {{"monitor", best->name}, {"value", finite_or_null(best_value_)}, {"step", best_step_}};
  if (es)
    j["early_stopping"] = {{"monitor", es->monitor.name}, {"patience", es->patience}, {"min_delta", es->min_delta},
                           {"best", finite_or_null(stop_best_)}, {"wait", stop_wait_}, {"stopped_at", stopped_at_}};
  if (s.type == ScheduleType::Plateau)
    j["plateau"] = {{"monitor", s.monitor.name},
                  {"best", finite_or_null(plateau_best_)},
                  {"wait", plateau_wait_},
                  {"cooldown_left", cooldown_left_},
                  {"lr", lr_}};
  return j.dump();
}

void Monitors::load(const std::string& text, const std::string& what) {
  if (text.empty()) return;  // a checkpoint of a run without monitors: they start now
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    validations_ = j.at("validations").get<int64_t>();
    // A monitor of the same figure continues; one added or changed on resume starts afresh,
    // and a stop is kept only while the rule that made it is unchanged (a raised patience
    // trains on).
    auto same = [&](const char* key, const Monitor& m) {
      return j.contains(key) && j.at(key).at("monitor").get<std::string>() == m.name;
    };
    if (const auto& best = config_.checkpoint.best; best && same("best", *best)) {
      best_value_ = read_best(j.at("best").at("value"), *best);
      best_step_ = j.at("best").at("step").get<int64_t>();
    }
    if (const auto& es = config_.training.early_stopping; es && same("early_stopping", es->monitor)) {
      const nlohmann::json& e = j.at("early_stopping");
      stop_best_ = read_best(e.at("best"), es->monitor);
      stop_wait_ = e.at("wait").get<int64_t>();
      if (e.at("patience").get<int64_t>() == es->patience && e.at("min_delta").get<double>() == es->min_delta)
        stopped_at_ = e.at("stopped_at").get<int64_t>();
    }
    if (const LrSchedule& s = config_.training.lr_schedule;
        s.type == ScheduleType::Plateau && same("plateau", s.monitor)) {
      const nlohmann::json& p = j.at("plateau");
      plateau_best_ = read_best(p.at("best"), config_.training.lr_schedule.monitor);
      plateau_wait_ = p.at("wait").get<int64_t>();
      cooldown_left_ = p.at("cooldown_left").get<int64_t>();
      lr_ = p.at("lr").get<double>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("{}: /halotrain/monitors is not the state of the validation monitors: {}", what,
                                  e.what()));
  }
}

std::vector<std::string> monitor_notes(const std::string& best_state, const std::string& newest_state) {
  std::vector<std::string> notes;
  auto parsed = [](const std::string& text) {
    return text.empty() ? nlohmann::json() : nlohmann::json::parse(text, nullptr, false);
  };
  const nlohmann::json best = parsed(best_state), newest = parsed(newest_state);
  if (best.is_object() && best.contains("best") && best["best"]["value"].is_number())
    notes.push_back(fmt::format("best.h5: {} {:.6g} at step {}", best["best"].value("monitor", "?"),
                                best["best"]["value"].get<double>(), best["best"].value("step", int64_t(0))));
  if (newest.is_object() && newest.contains("early_stopping") && newest["early_stopping"].value("stopped_at", 0) > 0) {
    const nlohmann::json& e = newest["early_stopping"];
    notes.push_back(fmt::format("stopped early at step {}: {} did not improve by more than {} for {} validations",
                                e.value("stopped_at", int64_t(0)), e.value("monitor", "?"), e.value("min_delta", 0.0),
                                e.value("patience", int64_t(0))));
  }
  return notes;
}

}  // namespace ht
