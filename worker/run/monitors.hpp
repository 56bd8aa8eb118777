// The callbacks of Keras that watch a validation figure (SPEC section 14): the best
// checkpoint (ModelCheckpoint(save_best_only)), EarlyStopping and ReduceLROnPlateau, with
// Keras's rules. Every rank holds the same state (all see the same validation values); it
// is saved in each checkpoint, so a resumed run decides as an uninterrupted one would.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orchestrator/config.hpp"
#include "worker/run/evaluation.hpp"

namespace ht {

class Monitors {
 public:
  explicit Monitors(const Config& config);

  struct Verdict {
    bool best = false;    // checkpoint.best's figure improved: write best.h5
    bool stop = false;    // early stopping: the run ends here
    bool lowered = false; // the plateau lowered the learning rate
  };
  // After the validation at `steps_done` optimizer steps.
  Verdict observe(const MetricValues& values, int64_t steps_done);

  // The learning rate of a plateau schedule now (`lr` before any lowering).
  double plateau_lr(double lr) const { return lr_ > 0 ? lr_ : lr; }
  // Where early stopping ended the run (0: it has not), and why, for the log and the report.
  int64_t stopped_at() const { return stopped_at_; }
  std::string stop_reason() const;
  int64_t best_step() const { return best_step_; }
  double best_value() const { return best_value_; }

  // The state as JSON (doubles round-trip; "" when no monitor is configured), and back;
  // ConfigError naming `what` for text that is not such state.
  std::string save() const;
  void load(const std::string& json, const std::string& what);

 private:
  const Config& config_;
  // checkpoint.best
  double best_value_;
  int64_t best_step_ = 0;
  // early_stopping
  double stop_best_;
  int64_t stop_wait_ = 0, validations_ = 0, stopped_at_ = 0;
  // plateau
  double plateau_best_;
  int64_t plateau_wait_ = 0, cooldown_left_ = 0;
  double lr_ = 0;  // 0: not lowered yet
};

// For the report: what a run's monitors decided, from the state saved in best.h5 and in its
// newest checkpoint ("" where there is none): the best value and its step, and an early stop.
std::vector<std::string> monitor_notes(const std::string& best_state, const std::string& newest_state);

}  // namespace ht
