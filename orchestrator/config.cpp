// The config's own vocabulary: spellings, sizes, Slurm time limits, monitors, learning
// rates. Reading and writing YAML is config_io.hpp's.
#include "orchestrator/config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace ht {

const char* to_string(PaddingMode m) {
  switch (m) {
    case PaddingMode::Explicit: return "explicit";
    case PaddingMode::Same: return "same";
    case PaddingMode::Valid: return "valid";
  }
  return "?";
}

const char* to_string(LossType t) {
  switch (t) {
    case LossType::SoftmaxCrossEntropy: return "softmax_cross_entropy";
    case LossType::SigmoidBCE: return "sigmoid_bce";
    case LossType::MSE: return "mse";
  }
  return "?";
}

const char* to_string(OptimizerType t) { return t == OptimizerType::Adam ? "adam" : "sgd"; }
const char* to_string(Backend b) { return b == Backend::CPU ? "cpu" : "cuda"; }

const char* to_string(ActivationPolicy p) {
  switch (p) {
    case ActivationPolicy::Auto: return "auto";
    case ActivationPolicy::Keep: return "keep";
    case ActivationPolicy::Offload: return "offload";
    case ActivationPolicy::Recompute: return "recompute";
  }
  return "?";
}

const char* to_string(RecycleMode m) { return m == RecycleMode::InProcess ? "in_process" : "restart"; }

const char* to_string(Metric m) {
  switch (m) {
    case Metric::Accuracy: return "accuracy";
    case Metric::AUC: return "auc";
    case Metric::Dice: return "dice";
    case Metric::IoU: return "iou";
  }
  return "?";
}

const char* to_string(ScheduleType t) {
  switch (t) {
    case ScheduleType::Constant: return "constant";
    case ScheduleType::Cosine: return "cosine";
    case ScheduleType::Step: return "step";
    case ScheduleType::Plateau: return "plateau";
  }
  return "?";
}

namespace {

struct Unit {
  const char* name;
  uint64_t bytes;
};
// Largest first, so to_yaml picks the largest unit that divides exactly.
const Unit kUnits[] = {{"TiB", 1ull << 40}, {"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10},
                       {"TB", 1000000000000ull}, {"GB", 1000000000ull}, {"MB", 1000000ull}, {"KB", 1000ull},
                       {"B", 1ull}};

}  // namespace

uint64_t parse_size(const std::string& text) {
  size_t b = text.find_first_not_of(" \t"), e = text.find_last_not_of(" \t");
  const std::string s = b == std::string::npos ? "" : text.substr(b, e - b + 1);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  const std::string number = s.substr(0, i);
  size_t j = i;
  while (j < s.size() && s[j] == ' ') ++j;
  const std::string unit = s.substr(j);
  if (number.empty() || number.front() == '.' || number.back() == '.' ||
      number.find('.') != number.rfind('.'))
    throw std::invalid_argument(fmt::format("'{}' does not start with a number", text));
  uint64_t scale = 0;
  if (unit.empty()) scale = 1;
  for (const Unit& u : kUnits)
    if (unit == u.name) scale = u.bytes;
  if (scale == 0)
    throw std::invalid_argument(
        fmt::format("unknown unit '{}'; expected B, KiB, MiB, GiB, TiB, KB, MB, GB or TB", unit));
  if (number.find('.') == std::string::npos) {
    if (number.size() > 20) throw std::invalid_argument(fmt::format("'{}' is too large", text));
    const unsigned long long n = std::stoull(number);
    if (n > UINT64_MAX / scale) throw std::invalid_argument(fmt::format("'{}' is too large", text));
    return n * scale;
  }
  if (scale == 1) throw std::invalid_argument(fmt::format("'{}' is a fraction of a byte", text));
  const long double v = std::stold(number) * scale;
  if (v >= 18446744073709551615.0L) throw std::invalid_argument(fmt::format("'{}' is too large", text));
  return uint64_t(std::llround(static_cast<double>(v)));
}

std::string format_size(uint64_t bytes) {
  static const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  return fmt::format("{:.2f} {}", v, names[u]);
}

// Exact, so that parsing it gives the same number of bytes back.
std::string exact_size(uint64_t bytes) {
  if (bytes == 0) return "0";
  for (const Unit& u : kUnits)
    if (u.bytes > 1 && bytes % u.bytes == 0) return fmt::format("{}{}", bytes / u.bytes, u.name);
  return fmt::format("{}", bytes);
}

namespace {

bool is_max_figure(const std::string& name) {
  for (const char* m : {"accuracy", "auc", "dice", "iou"})
    if (name == std::string("val_") + m || name == m) return true;
  return false;
}

}  // namespace

std::optional<int64_t> slurm_time_seconds(const std::string& text) {
  std::string s = text;
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (s == "unlimited" || s == "infinite") return -1;
  auto field = [](const std::string& f) -> std::optional<int64_t> {
    if (f.empty() || f.size() > 9 || !std::all_of(f.begin(), f.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      return std::nullopt;
    return std::stoll(f);
  };
  std::vector<std::optional<int64_t>> parts;
  std::optional<int64_t> days;
  std::string rest = s;
  if (const size_t dash = s.find('-'); dash != std::string::npos) {
    days = field(s.substr(0, dash));
    if (!days) return std::nullopt;
    rest = s.substr(dash + 1);
  }
  std::stringstream ss(rest);
  for (std::string f; std::getline(ss, f, ':');) parts.push_back(field(f));
  if (!rest.empty() && rest.back() == ':') return std::nullopt;
  if (parts.empty() || parts.size() > 3) return std::nullopt;
  for (const auto& p : parts)
    if (!p) return std::nullopt;
  int64_t h = 0, m = 0, sec = 0;
  if (days) {  // D-HH, D-HH:MM, D-HH:MM:SS
    h = *parts[0];
    if (parts.size() > 1) m = *parts[1];
    if (parts.size() > 2) sec = *parts[2];
    if (h >= 24 || m >= 60) return std::nullopt;
  } else if (parts.size() == 1) {  // MM, any number of minutes
    m = *parts[0];
  } else if (parts.size() == 2) {  // MM:SS
    m = *parts[0], sec = *parts[1];
  } else {  // HH:MM:SS
    h = *parts[0], m = *parts[1], sec = *parts[2];
    if (m >= 60) return std::nullopt;
  }
  if (sec >= 60) return std::nullopt;
  return ((days.value_or(0) * 24 + h) * 60 + m) * 60 + sec;
}

bool Monitor::maximizes() const {
  return mode == MonitorMode::Max || (mode == MonitorMode::Auto && is_max_figure(name));
}

double scheduled_lr(const LrSchedule& s, double lr, int64_t step, int64_t total_steps) {
  switch (s.type) {
    case ScheduleType::Constant:
    case ScheduleType::Plateau: return lr;  // the plateau's lowering is the trainer's (worker/run/monitors.hpp)
    case ScheduleType::Cosine: {
      if (step < s.warmup_steps) return lr * double(step + 1) / double(s.warmup_steps);
      const double span = double(std::max<int64_t>(total_steps - s.warmup_steps, 1));
      const double t = std::min(double(step - s.warmup_steps) / span, 1.0);
      return s.min_lr + (lr - s.min_lr) * 0.5 * (1 + std::cos(M_PI * t));
    }
    case ScheduleType::Step: return lr * std::pow(s.factor, double(step / s.every));
  }
  return lr;
}

}  // namespace ht
