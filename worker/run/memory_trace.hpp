// `halotrain train --trace-memory`: every allocation and free of a rank's device allocator
// and host pool during one training step, under the step schedule's operation that made
// it, written as JSON beside what `plan --schedule --json` predicts for that rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orchestrator/step_schedule.hpp"
#include "worker/runtime/tensor.hpp"

namespace ht {

class MemoryTrace {
 public:
  explicit MemoryTrace(int64_t step) : step_(step) {}
  ~MemoryTrace() { detach(); }
  MemoryTrace(const MemoryTrace&) = delete;
  MemoryTrace& operator=(const MemoryTrace&) = delete;

  int64_t step() const { return step_; }  // the step traced
  // Records from now on what the two allocators do; what they hold now is the step's start.
  void start(Allocator& device, Allocator& host);
  // Later events belong to `op` (every operation run: a micro-batch's once per micro-batch).
  void begin(const StepOp& op);
  // Stops recording and writes {"rank", "step", "held", "host_held", "ops": [{"action",
  // "index", "events": [["device" | "host", bytes], ...]}]} to `path`.
  void finish(const std::string& path, int rank);

 private:
  struct Recorder : AllocationObserver {
    MemoryTrace* trace = nullptr;
    const char* pool = "";
    void allocation(int64_t bytes) override;
  };
  void detach();

  int64_t step_;
  Allocator* device_ = nullptr;
  Allocator* host_ = nullptr;
  Recorder device_recorder_, host_recorder_;
  uint64_t held_ = 0, host_held_ = 0;
  std::vector<const StepOp*> ops_;
  std::vector<std::string> events_;  // per operation run, JSON
};

}  // namespace ht
