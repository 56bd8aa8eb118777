// The step schedule's fused chains (step_schedule.hpp fused_chains): what a batch norm +
// ReLU (+ max pool) chain allocates and frees, operation by operation, against the layers
// run apart.
#include <gtest/gtest.h>

#include <algorithm>

#include <vector>

#include "orchestrator/activation_plan.hpp"
#include "orchestrator/memory_model.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/plan.hpp"
#include "orchestrator/shard_plan.hpp"
#include "orchestrator/step_schedule.hpp"

#include "common/memory_configs.hpp"

namespace ht {
namespace {

using testing::classifier;
using testing::conv;
using testing::dense;
using testing::events_of;
using testing::layer;

// conv -> batch norm -> ReLU -> 2x2 max pool on CPU: the batch norm's Forward makes the
// pool's output and one argmax byte per window, the ReLU's and the pool's nothing; the
// backward passes the pool's output gradient down to the batch norm, which makes the conv
// output's gradient. Where a backward reads the pool's output and it was dropped, the
// chain runs again whole, at the batch norm.
TEST(MemoryModel, FusedChainMakesOnlyThePoolsOutputAndItsArgmax) {
  Config c = classifier();
  c.model.layers[5] = layer("sigmoid");  // the next conv apart (a ReLU would make it a chain)
  const ModelSpec m = build_model_spec(c);
  const ShardPlan p = make_shard_plan(m, {2, 1});
  const int rank = 1, b = 4;
  const uint64_t x = tile_bytes(p.owned_output(0, rank), 8, b), pooled = tile_bytes(p.owned_output(3, rank), 8, b);
  const uint64_t argmax = (pooled / 4 + 3) / 4 * 4;  // a byte per window, in whole floats
  const StepSchedule s = training_schedule(c, p, rank, uniform_policies(m, ActivationPolicy::Keep));
  EXPECT_EQ(s.fused, (std::vector<int>{-1, 1, 1, 1, -1, -1, -1, -1}));
  auto events = [&](StepAction a, int l) { return events_of(s, a, l); };
  using V = std::vector<int64_t>;
  EXPECT_EQ(events(StepAction::Forward, 1), (V{int64_t(pooled), int64_t(argmax)}));
  EXPECT_EQ(events(StepAction::Forward, 2), V{});
  EXPECT_EQ(events(StepAction::Forward, 3), V{});
  // The next conv keeps its extended input on both ranks, which holds the pool's output
  // whole: that goes after the conv's forward (step_schedule.hpp reads_extended_only).
  EXPECT_EQ(events(StepAction::Stash, 4), V{-int64_t(pooled)});
  EXPECT_EQ(events(StepAction::Backward, 3), V{});
  const LayerPolicies keep = uniform_policies(m, ActivationPolicy::Keep);
  EXPECT_EQ(layer_memory(c, p, rank, keep)[3].activations, 0u);  // the per-layer view agrees
  EXPECT_EQ(events(StepAction::Backward, 2), V{});
  // The conv's output, read by the chain alone, becomes its own gradient (LayerSizes::chain_dx_over_input):
  // counted as a gradient from here, nothing allocated; the conv's backward frees nothing of it.
  EXPECT_TRUE(s.dx_over_input[1]);
  EXPECT_EQ(events(StepAction::Backward, 1), (V{-int64_t(x), int64_t(x), -int64_t(pooled), -int64_t(argmax)}));
  const V conv_back = events(StepAction::Backward, 0);
  EXPECT_EQ(std::count(conv_back.begin(), conv_back.end(), -int64_t(x)), 1) << "only its output gradient goes";

  // The pool's output dropped: the next conv, keeping its extended input on both ranks,
  // reads only that (step_schedule.hpp reads_extended_only), so nothing makes the chain
  // again. Where that conv gathers its input again for its backward (not kept), the chain
  // runs again whole, at the batch norm.
  auto chain_recomputes = [&](const LayerPolicies& policies) {
    const StepSchedule rec = training_schedule(c, p, rank, policies);
    EXPECT_EQ(rec.fused, s.fused);
    int recomputes = 0;
    for (const StepOp& op : rec.ops) {
      if (op.action != StepAction::Recompute || op.index < 1 || op.index > 3) continue;
      EXPECT_EQ(op.index, 1);
      EXPECT_EQ(op.events.size(), 1u);
      if (!op.events.empty()) {
        EXPECT_EQ(op.events[0].bytes, int64_t(pooled));  // the argmax bytes stay
      }
      ++recomputes;
    }
    return recomputes;
  };
  LayerPolicies drop_pool = uniform_policies(m, ActivationPolicy::Keep);
  drop_pool[3] = ActivationPolicy::Recompute;
  EXPECT_EQ(chain_recomputes(drop_pool), 0);
  drop_pool[4] = ActivationPolicy::Offload;
  EXPECT_EQ(chain_recomputes(drop_pool), 1);
  EXPECT_EQ(events_of(training_schedule(c, p, rank, drop_pool), StepAction::Backward, 3), V{-int64_t(pooled)});
  LayerPolicies offload = keep;
  offload[3] = offload[4] = ActivationPolicy::Offload;
  EXPECT_EQ(layer_memory(c, p, rank, offload)[3].offloaded, pooled);
  offload[4] = ActivationPolicy::Keep;  // the conv keeps its extended input: nothing to offload
  EXPECT_EQ(layer_memory(c, p, rank, offload)[3].offloaded, 0u);
  // The ReLU's output fewer than unfused, less the argmax (unfused, the normalised tensor
  // goes after the ReLU's forward: no backward reads it).
  const uint64_t fused = estimate_memory(c, p, rank).activations;
  Config apart = c;
  apart.parallel.fuse = false;
  EXPECT_EQ(training_schedule(apart, p, rank, uniform_policies(m, ActivationPolicy::Keep)).fused,
            std::vector<int>(8, -1));
  EXPECT_EQ(fused + x - argmax, estimate_memory(apart, p, rank).activations);
  // The CUDA backend fuses the same chain, pool included (kernels/cuda/norm_relu_pool.cu).
  Config cuda = c;
  cuda.parallel.backend = Backend::CUDA;
  EXPECT_EQ(training_schedule(cuda, p, rank, uniform_policies(m, ActivationPolicy::Keep)).fused, s.fused);
}

// conv -> batch norm -> ReLU (or ReLU6) -> conv: the batch norm's Forward makes the
// activation's output only. The ReLU's Backward passes the output gradient down and leaves its output
// for the batch norm's, which reads it and frees it, its input gradient written over the
// output gradient.
TEST(MemoryModel, FusedChainWithoutPoolMakesOnlyTheReLUsOutput) {
  for (const char* act : {"relu", "relu6"}) {
    SCOPED_TRACE(act);
    Config c = classifier();
    c.model.layers = {conv(8), layer("batch_norm"), layer(act), conv(16), layer("sigmoid"),
                      layer("global_avg_pool"), dense(2)};
    const ModelSpec m = build_model_spec(c);
    const ShardPlan p = make_shard_plan(m, {2, 1});
    const int rank = 1;
    const uint64_t x = tile_bytes(p.owned_output(0, rank), 8, 4);
    const LayerPolicies keep = uniform_policies(m, ActivationPolicy::Keep);
    const StepSchedule s = training_schedule(c, p, rank, keep);
    EXPECT_EQ(s.fused, (std::vector<int>{-1, 1, 1, -1, -1, -1, -1}));
    auto events = [&](StepAction a, int l) { return events_of(s, a, l); };
    using V = std::vector<int64_t>;
    EXPECT_EQ(events(StepAction::Forward, 1), V{int64_t(x)});
    EXPECT_EQ(events(StepAction::Forward, 2), V{});
    EXPECT_EQ(events(StepAction::Backward, 2), V{});
    EXPECT_EQ(events(StepAction::Backward, 1), V{-int64_t(x)});  // the ReLU's output
    // The batch norm's backward reads the chain's output, though the ReLU6 kind's does not
    // and the next conv reads its extended copy instead: kept, never made again.
    EXPECT_EQ(s.read_by_backward[3], 1);
    for (const StepOp& op : s.ops) EXPECT_NE(op.action, StepAction::Recompute);
    Config apart = c;
    apart.parallel.fuse = false;
    EXPECT_EQ(training_schedule(apart, p, rank, keep).fused, std::vector<int>(7, -1));
    // Apart, the ReLU's backward reads its output, the ReLU6's its input (the normalised
    // tensor); the other one goes after the activation's forward (the next conv reads its
    // extended copy): one tensor of the chain's size kept either way, as fused.
    EXPECT_EQ(estimate_memory(c, p, rank).activations, estimate_memory(apart, p, rank).activations);
  }
}

// conv -> ReLU (or ReLU6) -> conv -> ReLU on two shards: each conv's Forward makes its
// activation's output, never its own; the activation's Backward passes the output gradient
// down, and the conv's frees the activation's output (read by its mask) before it makes
// its input gradient. Never more memory than apart, where the conv's output is made
// beside the activation's.
TEST(MemoryModel, ConvChainMakesOnlyTheActivationsOutput) {
  for (const char* act : {"relu", "relu6"}) {
    SCOPED_TRACE(act);
    Config c = classifier();
    c.model.layers = {conv(8), layer(act), conv(16), layer("relu"), layer("global_avg_pool"), dense(2)};
    const ModelSpec m = build_model_spec(c);
    const ShardPlan p = make_shard_plan(m, {2, 1});
    const int rank = 1;
    const uint64_t y = tile_bytes(p.owned_output(2, rank), 16, 4);
    const LayerPolicies keep = uniform_policies(m, ActivationPolicy::Keep);
    const StepSchedule s = training_schedule(c, p, rank, keep);
    EXPECT_EQ(s.fused, (std::vector<int>{0, 0, 2, 2, -1, -1}));
    using V = std::vector<int64_t>;
    const V forward = events_of(s, StepAction::Forward, 2);
    EXPECT_EQ(std::count(forward.begin(), forward.end(), int64_t(y)), 1) << "the ReLU's output, once";
    EXPECT_EQ(events_of(s, StepAction::Forward, 3), V{});
    EXPECT_EQ(events_of(s, StepAction::Backward, 3), V{});
    const V backward = events_of(s, StepAction::Backward, 2);
    ASSERT_FALSE(backward.empty());
    EXPECT_EQ(backward.front(), -int64_t(y));  // the activation's output goes first
    Config apart = c;
    apart.parallel.fuse = false;
    EXPECT_EQ(training_schedule(apart, p, rank, keep).fused, std::vector<int>(6, -1));
    EXPECT_LE(estimate_memory(c, p, rank).total, estimate_memory(apart, p, rank).total);
  }
}

// Mixed policies on the same chain (conv2d_2 + its ReLU, on two shards): the ReLU's output
// under recompute is made again by the whole chain, gathering the conv's window anew,
// when the conv is under offload; under keep the conv keeps its window and the output
// stays instead. No gradient reaching the first chain, its kept window goes with it. Every
// micro-batch frees what it allocates; the step time and the halo traffic charge the
// conv's forward and exchange where the chain runs again.
TEST(MemoryModel, ConvChainUnderMixedPolicies) {
  Config c = classifier();
  c.model.layers = {conv(8), layer("relu"), conv(16), layer("relu"), layer("global_avg_pool"), dense(2)};
  const ModelSpec m = build_model_spec(c);
  const ShardPlan p = make_shard_plan(m, {2, 1});
  auto balanced = [](const StepSchedule& s) {
    int64_t sum = 0;
    for (size_t o = s.micro_begin; o < s.micro_end; ++o)
      for (const MemoryEvent& e : s.ops[o].events) sum += e.bytes;
    return sum == 0;
  };
  auto recomputes = [](const StepSchedule& s) {
    std::vector<int> at;
    for (const StepOp& op : s.ops)
      if (op.action == StepAction::Recompute) at.push_back(op.index);
    return at;
  };
  uint64_t sends = 0;  // conv2d_2's halo, once, over both ranks
  for (int rank = 0; rank < 2; ++rank)
    for (HaloPhase ph : {HaloPhase::Rows, HaloPhase::Cols})
      for (const HaloRegion& r : p.sends(2, rank, ph)) sends += tile_bytes(r.rect, 8, 4);
  ASSERT_GT(sends, 0u);
  const DeviceCostModel k80 = k80_die();
  LayerPolicies again = uniform_policies(m, ActivationPolicy::Keep), stays = again;
  again[2] = ActivationPolicy::Offload;
  again[3] = stays[3] = ActivationPolicy::Recompute;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    const StepSchedule a = training_schedule(c, p, rank, again), k = training_schedule(c, p, rank, stays);
    EXPECT_EQ(recomputes(a), std::vector<int>{2});
    EXPECT_EQ(recomputes(k), std::vector<int>{});
    EXPECT_EQ(k.read_by_backward[4], kReadAndKept);
    EXPECT_TRUE(balanced(a));
    EXPECT_TRUE(balanced(k));
    std::vector<char> gradient(m.layers.size() + 1, 1);
    gradient[0] = gradient[1] = gradient[2] = 0;  // none reaches conv2d_1 + its ReLU
    const StepSchedule frozen = training_schedule(c, p, rank, uniform_policies(m, ActivationPolicy::Keep), gradient);
    EXPECT_TRUE(balanced(frozen));
  }
  EXPECT_GT(predict_step_time(c, p, again, k80).recompute, 0);
  EXPECT_EQ(predict_step_time(c, p, stays, k80).recompute, 0);
  // conv2d_2's exchange: the forward, the chain made again, and the window gathered again
  // for the backward (offload keeps none) against the forward alone. The gradients' way
  // back is the same in both.
  EXPECT_EQ(halo_traffic_total(c, p, again).total() - halo_traffic_total(c, p, stays).total(), 2 * sends);
}

}  // namespace
}  // namespace ht
