// One training step: the trainer runs its rank's step schedule (orchestrator/step_schedule.hpp)
// operation by operation. Which tensor is stashed, fetched back or recomputed, and when, is
// the schedule's; this file says what each operation does.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "worker/run/memory_trace.hpp"
#include "worker/run/optimizer.hpp"
#include "worker/run/signals.hpp"
#include "worker/run/trainer.hpp"
#include "worker/runtime/log.hpp"

namespace ht {

// The tensors of one micro-batch: acts[t] is tensor t of the model (acts[0] the image tile,
// acts[l + 1] layer l's output), on the device or in the backend's host pool; grads[t] the
// gradient of tensor t, summed over its readers as their backwards run.
struct Trainer::MicroBatch {
  Batch batch;
  std::vector<Tensor> device, host, grads;
  double loss = 0;
  explicit MicroBatch(int layers) : device(layers + 1), host(layers + 1), grads(layers + 1) {}
};

void Trainer::finish_offload(MicroBatch& a, int i) {
  device_->backend->wait_transfers();
  a.device[i].release();
}

void Trainer::stash(MicroBatch& a, int i) {
  Tensor& t = a.device[i];
  if (stored_as(schedule_.read_by_backward, policies_, i) == ActivationPolicy::Recompute) {  // dropped
    t.release();
    return;
  }
  a.host[i] = Tensor(device_->backend->host_pool(), t.n(), t.c(), t.h(), t.w(), "offloaded activation");
  device_->backend->to_host_async(a.host[i].data(), t.data(), t.bytes());
}

void Trainer::prefetch(MicroBatch& a, int i) {
  const Tensor& h = a.host[i];
  a.device[i] = Tensor(device_->backend->allocator(), h.n(), h.c(), h.h(), h.w(),
                       "activation fetched back for layer " + plan_.model.layers[i - 1].config.name);
  device_->backend->to_device_async(a.device[i].data(), h.data(), h.bytes());
}

void Trainer::restore(MicroBatch& a, int i) {
  device_->backend->transfers_done_for_compute();
  a.host[i].release();  // later copies into this block queue behind this one
}

int Trainer::chain_tail(int head) const {
  int tail = head;
  while (size_t(tail) + 1 < schedule_.fused.size() && schedule_.fused[size_t(tail) + 1] == head) ++tail;
  return tail;
}

void Trainer::forward_chain(MicroBatch& a, int l, ForwardMode mode) {
  if (schedule_.fused[size_t(l)] != l) return;  // the chain ran at its head
  const int tail = chain_tail(l);
  a.device[size_t(tail) + 1] =
      device_->layers[l]->forward_chain(a.device[size_t(plan_.model.layers[l].inputs[0])], tail, mode);
}

void Trainer::backward_chain(MicroBatch& a, int l) {
  const int t = plan_.model.layers[l].inputs[0];
  const int head = schedule_.fused[size_t(l)];
  const int tail = chain_tail(head);
  if (head != l) {  // pass the output gradient down; a ReLU's output waits for the head
    if (tail == head + 2) a.device[l + 1].release();
    a.grads[t] = std::move(a.grads[l + 1]);
    return;
  }
  const bool need_dx = gradient_[size_t(t)];
  Tensor dx = device_->layers[l]->backward_chain(a.device[t], a.device[size_t(tail) + 1], std::move(a.grads[l + 1]),
                                                 tail, need_dx, schedule_.dx_over_input[size_t(l)]);
  device_->layers[l]->release_saved();
  a.device[size_t(tail) + 1].release();  // a pooled chain's went at the pool
  if (need_dx) add_gradient(a, t, std::move(dx));
}

void Trainer::add_gradient(MicroBatch& a, int t, Tensor dx) {
  Tensor& sum = a.grads[t];
  if (sum.empty()) {
    sum = std::move(dx);
  } else {
    device_->backend->add(sum.data(), dx.data(), sum.size());
    dx.release();
  }
}

void Trainer::backward(MicroBatch& a, int l) {
  if (schedule_.fused[size_t(l)] >= 0) return backward_chain(a, l);
  const ModelSpec& m = plan_.model;
  const std::vector<int>& inputs = m.layers[l].inputs;
  std::vector<bool> need_dx;
  for (int t : inputs) need_dx.push_back(gradient_[size_t(t)]);
  std::vector<Tensor> dx;
  if (backward_in_place(plan_, l) && need_dx[0])  // the input gradient in the output gradient's memory
    dx.push_back(device_->layers[l]->backward_in_place(a.device[size_t(inputs[0])], a.device[l + 1],
                                                        std::move(a.grads[l + 1])));
  else
    dx = device_->layers[l]->backward(inputs_of(m, l, a.device), a.device[l + 1], a.grads[l + 1], need_dx);
  device_->layers[l]->release_saved();
  a.device[l + 1].release();
  a.grads[l + 1].release();
  for (size_t k = 0; k < inputs.size(); ++k)
    if (need_dx[k]) add_gradient(a, inputs[k], std::move(dx[k]));
}

void Trainer::loss_gradient(MicroBatch& a, int64_t step) {
  const int L = int(device_->layers.size());
  const Tensor& y = a.device[L];
  a.grads[L] = Tensor(device_->backend->allocator(), y.n(), y.c(), y.h(), y.w(), "loss gradient");
  a.loss = loss_and_grad(y, a.batch, a.grads[L]);
  if (std::isfinite(a.loss)) return;
  for (auto& layer : device_->layers) layer->release_saved();
  throw TrainingDiverged(fmt::format(
      "step {}: the loss is {}; stopping without writing a checkpoint (samples {}; lower "
      "training.optimizer.lr or check data.scale)",
      step + 1, std::isnan(a.loss) ? "NaN" : (a.loss > 0 ? "+inf" : "-inf"), fmt::join(a.batch.samples, ", ")));
}

// Each backward writes the gradients of its micro-batch; their sum waits in grad_sum_, and
// the last adds it in, in micro-batch order.
void Trainer::sum_gradients(int micro) {
  const int k = config_.training.accumulate;
  const size_t n = device_->params->trainable_count();
  float* grads = device_->params->grads().data();
  if (micro == 0) device_->backend->copy(grad_sum_.data(), grads, n);
  else if (micro + 1 < k) device_->backend->add(grad_sum_.data(), grads, n);
  else device_->backend->add(grads, grad_sum_.data(), n);
}

void Trainer::run_op(const StepOp& op, MicroBatch* a, int64_t step, int micro) {
  if (trace_ && trace_->step() == step) trace_->begin(op);
  const ModelSpec& m = plan_.model;
  const int i = op.index;
  switch (op.action) {
    case StepAction::Hold: break;
    case StepAction::LoadBatch: {
      // The next micro-batch is read while this one computes (even after the last step: the
      // memory model counts its tensors on every step).
      const bool last_micro = micro + 1 == config_.training.accumulate;
      a->batch = data_->load(step, micro, last_micro ? step + 1 : step, last_micro ? 0 : micro + 1);
      position_ = {config_.seed, step, a->batch.batch_position};
      a->device[0] = std::move(a->batch.images);
      break;
    }
    case StepAction::Forward:
    case StepAction::Recompute: {
      const ForwardMode mode = op.action == StepAction::Forward ? ForwardMode::Train : ForwardMode::Recompute;
      if (schedule_.fused[size_t(i)] >= 0)
        forward_chain(*a, i, mode);
      else
        a->device[i + 1] = device_->layers[i]->forward(inputs_of(m, i, a->device), mode);
      note_progress();
      break;
    }
    case StepAction::Stash: stash(*a, i); break;
    case StepAction::FinishOffload: finish_offload(*a, i); break;
    case StepAction::LossGradient: loss_gradient(*a, step); break;
    case StepAction::Prefetch: prefetch(*a, i); break;
    case StepAction::Restore: restore(*a, i); break;
    case StepAction::Backward:
      backward(*a, i);
      note_progress();
      break;
    case StepAction::SkipBackward:
      device_->layers[i]->release_saved();
      a->device[i + 1].release();
      break;
    case StepAction::EndMicroBatch:
      for (Tensor& t : a->host) t.release();
      a->device[0].release();
      a->batch.targets.release();
      break;
    case StepAction::SumGradients: sum_gradients(micro); break;
    case StepAction::AllReduce:  // one all-reduce of every weight gradient, summed in rank order
      device_->world->allreduce_sum(device_->params->grads().data(), device_->params->trainable_count());
      break;
    case StepAction::Update:
      optimizer_step(config_, plan_.model, frozen_, learning_rate(step), step, *device_->params, optimizer_,
                     *device_->backend);
      break;
    case StepAction::Free:
    case StepAction::SendOutput:
      throw std::logic_error(std::string("an inference operation in a training schedule: ") +
                             step_action_name(op.action));
  }
}

double Trainer::train_step(int64_t step) {
  // The layers frozen this step (SPEC section 14) change only where a freeze is released;
  // the backward goes as far as a weight that trains (the plan's schedule assumes every
  // freeze released: LayerSpec::output_gradient).
  const bool released = config_.training.unfreeze_at > 0 && step >= config_.training.unfreeze_at;
  if (schedule_.ops.empty() || released != released_) {
    released_ = released;
    frozen_ = frozen_layers(config_, plan_.model, step);
    gradient_ = gradient_flow(plan_.model, frozen_);
    schedule_ = training_schedule(config_, plan_, rank_, policies_, gradient_);
  }
  const bool traced = trace_ && trace_->step() == step;
  if (traced) trace_->start(device_->backend->allocator(), device_->backend->host_pool());
  double loss = 0;
  for (int micro = 0; micro < schedule_.micro_batches; ++micro) {
    MicroBatch a(int(device_->layers.size()));
    for (size_t o = schedule_.micro_begin; o < schedule_.micro_end; ++o) run_op(schedule_.ops[o], &a, step, micro);
    loss += a.loss;
  }
  for (size_t o = schedule_.micro_end; o < schedule_.ops.size(); ++o) run_op(schedule_.ops[o], nullptr, step, 0);
  if (traced) {
    trace_->finish(fmt::format("{}/memory-trace-{}.json", config_.run_dir, rank_), rank_);
    if (rank_ == 0)
      log().info("wrote the allocations of step {} to {}/memory-trace-RANK.json", step + 1, config_.run_dir);
  }
  return loss;
}

}  // namespace ht
