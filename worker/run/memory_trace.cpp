#include "worker/run/memory_trace.hpp"

#include <fmt/format.h>

#include <fstream>

#include "orchestrator/config.hpp"

namespace ht {

void MemoryTrace::Recorder::allocation(int64_t bytes) {
  if (trace->events_.empty()) trace->events_.emplace_back();  // before the first operation
  std::string& e = trace->events_.back();
  e += fmt::format("{}[\"{}\", {}]", e.empty() ? "" : ", ", pool, bytes);
}

void MemoryTrace::start(Allocator& device, Allocator& host) {
  device_ = &device;
  host_ = &host;
  held_ = device.in_use();
  host_held_ = host.in_use();
  device_recorder_.trace = host_recorder_.trace = this;
  device_recorder_.pool = "device";
  host_recorder_.pool = "host";
  device.set_observer(&device_recorder_);
  host.set_observer(&host_recorder_);
}

void MemoryTrace::begin(const StepOp& op) {
  ops_.push_back(&op);
  events_.emplace_back();
}

void MemoryTrace::detach() {
  if (device_) device_->set_observer(nullptr);
  if (host_) host_->set_observer(nullptr);
  device_ = host_ = nullptr;
}

void MemoryTrace::finish(const std::string& path, int rank) {
  detach();
  std::ofstream out(path);
  out << fmt::format("{{\"rank\": {}, \"step\": {}, \"held\": {}, \"host_held\": {}, \"ops\": [", rank, step_, held_,
                     host_held_);
  for (size_t i = 0; i < ops_.size(); ++i)
    out << fmt::format("{}\n  {{\"action\": \"{}\", \"index\": {}, \"events\": [{}]}}", i ? "," : "",
                       step_action_name(ops_[i]->action), ops_[i]->index, events_[i]);
  out << "\n]}\n";
  if (!out.flush()) throw ConfigError(fmt::format("--trace-memory: cannot write {}", path));
}

}  // namespace ht
