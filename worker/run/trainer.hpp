// The training loop of one worker (one shard of one sample group), and `halotrain train`,
// which starts one per shard through the launcher: threads of this process (the embedded
// default) or one MPI rank each.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "orchestrator/plan.hpp"
#include "orchestrator/shard_plan.hpp"
#include "worker/comm/comm.hpp"
#include "worker/comm/counting_comm.hpp"
#include "worker/layers/layers.hpp"
#include "worker/run/batch.hpp"
#include "worker/run/checkpoint.hpp"
#include "worker/run/checkpoint_dir.hpp"
#include "worker/run/device_state.hpp"
#include "worker/run/evaluation.hpp"
#include "worker/run/launcher.hpp"
#include "worker/run/memory_trace.hpp"
#include "worker/run/monitors.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {

// The run stopped at a step boundary with a checkpoint written: for requeue after Slurm's
// warning signal, on SIGTERM, or for `recycle.mode: restart`. Exit code 3.
class StopRequested : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;
  std::string checkpoint;  // the last one written
  uint64_t peak_device_bytes = 0;
  MetricValues validation;  // the last validation's loss and metrics; empty without one
  std::string stopped_early;  // why training.early_stopping ended the run; "" when it did not
};

// What `halotrain train` takes beside the config.
struct TrainOptions {
  // Records every allocation and free of the run's second step, under the step schedule's
  // operation that made it, in run_dir/memory-trace-RANK.json (`plan --schedule --json`
  // gives what the plan expects, in the same terms).
  bool trace_memory = false;
};

class Trainer {
 public:
  // `plan` outlives the trainer.
  Trainer(const Config& config, const Plan& plan, int rank, Comm& world,
          const BackendOptions& backend_options, DeviceWorldFactory device_world = {},
          const TrainOptions& options = {});
  ~Trainer();

  TrainSummary run();

 private:
  // Device state: backend, parameters, optimizer state, layers. Recycling tears all of it
  // down and builds it again from a host snapshot.
  struct HostSnapshot;
  void build_device_state(const HostSnapshot* restore);
  HostSnapshot take_snapshot();
  void recycle_in_process();
  std::string checkpoint(int64_t steps_done);
  TrainingProgress progress(int64_t steps_done) const;
  // After a validation: the monitors decide; best.h5 is written here. True: stop now.
  bool after_validation(const MetricValues& val, int64_t steps_done);
  void stop_if_requested(int64_t steps_done, bool checkpoint_written, TrainSummary& summary);
  // One step: the operations of schedule_ (worker/run/train_step.cpp).
  double train_step(int64_t step);
  struct MicroBatch;
  void run_op(const StepOp& op, MicroBatch* batch, int64_t step, int micro);
  void finish_offload(MicroBatch& a, int index);  // the copy to the host is done: free its source
  void stash(MicroBatch& a, int index);           // after the last forward read of acts[index]
  void prefetch(MicroBatch& a, int index);        // starts bringing acts[index] back
  void restore(MicroBatch& a, int index);         // acts[index], fetched back, ready for compute
  void backward(MicroBatch& a, int layer);
  // A fused chain (step_schedule.hpp fused_chains): its forward and backward run at its
  // head; its other layers pass on.
  int chain_tail(int head) const;
  void forward_chain(MicroBatch& a, int layer, ForwardMode mode);
  void backward_chain(MicroBatch& a, int layer);
  void add_gradient(MicroBatch& a, int tensor, Tensor dx);  // summed into grads[tensor]
  void loss_gradient(MicroBatch& a, int64_t step);
  void sum_gradients(int micro);
  MetricValues validate();  // collective: loss and metrics over data.validation, inference mode
  double learning_rate(int64_t step) const;
  double loss_and_grad(const Tensor& y, const Batch& batch, Tensor& dy);
  std::vector<double> peaks_of_ranks(uint64_t local);  // collective: one value per rank
  uint64_t max_peak_over_ranks();
  void write_memory_report();  // run_dir/memory.csv: measured vs predicted peaks per rank
  void log_halo_traffic(int64_t steps);  // collective: measured halo bytes per step vs the plan's
  void bank_collective_seconds();        // the layers' collective times, before they go
  void log_collectives(int64_t steps, double step_seconds);  // rank 0: their share of the steps
  std::string refresh_report();  // rank 0: run_dir/report.html from the run's files so far; "" if not
  void report(int64_t step, double loss, double seconds, uint64_t peak, bool logged, const MetricValues& val);

  const Config& config_;
  const Plan& job_;
  const ShardPlan& plan_;  // job_.shards
  int rank_;
  Comm& host_world_;  // from the launcher
  BackendOptions backend_options_;
  DeviceWorldFactory make_device_world_;
  const LayerPolicies& policies_;  // job_.policies: the activation policy of each layer
  StepPosition position_;          // of the micro-batch in flight, for the layers
  // Declared after the backend, so destroyed before it: device comms stage in its memory.
  std::vector<uint64_t> halo_sent_;  // bytes sent to each rank, training steps only
  // Declared before everything that holds device memory beside it, so destroyed after.
  std::unique_ptr<DeviceState> device_;
  OptimizerState optimizer_;
  LossWeights loss_weights_;  // training.class_weights and pos_weight
  Monitors monitors_;         // checkpoint.best, training.early_stopping, the plateau schedule
  std::vector<char> frozen_;  // per layer, this step (SPEC section 14); the layers read it
  std::vector<char> gradient_;  // per tensor, this step: whether the backward makes its gradient
  bool released_ = false;       // training.unfreeze_at has passed
  StepSchedule schedule_;       // this rank's step, for frozen_ and gradient_
  StepSchedule validation_schedule_;  // a batch of data.validation
  std::unique_ptr<MemoryTrace> trace_;  // --trace-memory
  std::unique_ptr<BatchSource> data_;
  std::unique_ptr<BatchSource> validation_;  // data.validation, when set
  Tensor grad_sum_;  // training.accumulate > 1: the gradients of the micro-batches so far
  std::map<std::string, double> collective_seconds_;  // per layer kind, of the layers recycled so far
  std::unique_ptr<CheckpointDir> checkpoints_;  // rank 0's claim on run_dir/checkpoints
  int64_t start_step_ = 0;
  std::string resumed_data_, data_identity_;  // data.train's identity: the checkpoint's, and now
  struct Reporter;
  std::unique_ptr<Reporter> reporter_;
};

// Runs `halotrain train`: under MPI one rank per shard, otherwise every shard as a thread of
// this process. Returns the summary of rank 0.
TrainSummary run_training(const Config& config, const TrainOptions& options = {});

}  // namespace ht
