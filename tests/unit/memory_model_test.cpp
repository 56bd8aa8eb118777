// MemoryModel: the breakdown adds up and matches hand counts, policies and the host pool
// bound the peak, sharding splits activations, halo traffic is split by node placement,
// and the search's lower bound holds (the plan built on it: plan_test.cpp).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <string>

#include "orchestrator/activation_plan.hpp"
#include "orchestrator/config.hpp"
#include "orchestrator/conv_geometry.hpp"
#include "orchestrator/layer_kind.hpp"
#include "orchestrator/memory_model.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/plan.hpp"
#include "orchestrator/shard_plan.hpp"

#include "common/memory_configs.hpp"

namespace ht {
namespace {

using testing::classifier;
using testing::conv;
using testing::dense;
using testing::events_of;
using testing::layer;

uint64_t sum_of(const MemoryEstimate& e) {
  return e.params + e.grads + e.optimizer + e.input + e.activations + e.transient + e.workspace + e.halo;
}

TEST(MemoryModel, BreakdownAddsUpAndCountsTheReplicatedState) {
  Config c = classifier();
  const ModelSpec m = build_model_spec(c);
  const ShardPlan p = make_shard_plan(m, {1, 1});
  const MemoryEstimate e = estimate_memory(c, p, 0);
  EXPECT_EQ(e.total, sum_of(e));
  EXPECT_EQ(e.local_batch, 4);
  EXPECT_EQ(e.params, uint64_t(m.param_count()) * 4);
  EXPECT_EQ(e.grads, uint64_t(m.param_count(true)) * 4);
  EXPECT_LT(e.grads, e.params);  // BN moving statistics are not trainable
  EXPECT_EQ(e.optimizer, 2 * e.grads);
  // Image tiles and one-hot targets, twice on the CPU backend: the next batch is read
  // during this one.
  EXPECT_EQ(e.input, 2 * (4ull * 64 * 48 * 4 + 4ull * 2 * 4));
  // CPU backend: oneDNN's scratch for the shard's convs, as the kernels report it.
  EXPECT_EQ(e.workspace, conv_scratch_bytes(c, p, 0, ConvUse::Training));
  EXPECT_GT(e.workspace, 0u);  // the second conv (8 -> 16 channels) reorders to blocks
  EXPECT_EQ(e.host_offload, 0u);

  c.training.optimizer.type = OptimizerType::SGD;
  EXPECT_EQ(estimate_memory(c, p, 0).optimizer, 0u);
  c.training.optimizer.momentum = 0.9;
  EXPECT_EQ(estimate_memory(c, p, 0).optimizer, e.grads);
  c.parallel.backend = Backend::CUDA;
  EXPECT_EQ(estimate_memory(c, p, 0).workspace, kConvWorkspaceLimit);
}

// cuDNN pads both sides alike: at a shard edge (padding 1 at the image border, 0 towards
// the neighbour) the CUDA conv runs on a zeroed copy one row taller, kept in one scratch
// that grows to the largest such copy (rounded up to 4 KiB below 1 MiB).
TEST(MemoryModel, CudaCountsThePaddedCopyAtAShardEdge) {
  Config c = classifier();
  c.parallel.backend = Backend::CUDA;
  const ModelSpec m = build_model_spec(c);
  const MemoryEstimate e = estimate_memory(c, make_shard_plan(m, {2, 1}), 0);
  // First conv: 4 images x 1 channel x (33 + 1) rows x 48 cols x 4 B = 26112 -> 28672.
  // Second conv (after the 2x2 pool): 4 x 8 x (17 + 1) x 24 x 4 = 55296 -> 57344.
  EXPECT_EQ(e.workspace, kConvWorkspaceLimit + 57344);
}

// One 8 x 8 image, conv(2, 3x3 same) -> relu -> global pool -> dense(2), counted by hand
// in the worker's order. One shard reads exactly what it owns: no extended copies.
TEST(MemoryModel, KeepPeakMatchesAHandCount) {
  Config c = classifier();
  c.model.height = c.model.width = 8;
  LayerConfig k = conv(2);
  LayerConfig d = dense(2);
  c.model.layers = {k, layer("relu"), layer("global_avg_pool"), d};
  c.training.batch_size = 1;
  const ModelSpec m = build_model_spec(c);
  const MemoryEstimate e =
      estimate_memory(c, make_shard_plan(m, {1, 1}), 0, uniform_policies(m, ActivationPolicy::Keep));
  // The conv reads the image: no data gradient, and one channel runs the loop kernels
  // where they are vectorised; whatever oneDNN scratch remains is reserved up front.
  const ShardPlan p = make_shard_plan(m, {1, 1});
  EXPECT_EQ(e.workspace, conv_scratch_bytes(c, p, 0, ConvUse::Training));
  const uint64_t fixed = e.params + e.grads + e.optimizer + e.workspace;
  // Forward: image 256 B + targets 8 B; conv and relu outputs 512 B each, pool and dense
  // outputs 8 B each; loss gradient 8 B. The conv's output goes after the relu's forward:
  // no backward reads it (the conv's reads its input, the relu's its output). Backward: the
  // dense input gradient (8 B) frees the dense output and its gradient; the peak is the
  // pool's backward: relu and pool outputs (520 B), the 8 B gradient flowing in and the
  // 512 B one it makes. The relu's backward then writes its input gradient over that one
  // (LayerTraits::backward_in_place).
  EXPECT_EQ(e.input, 2 * 264u);  // and the next step's, read in the background
  EXPECT_EQ(e.activations, 520u);
  EXPECT_EQ(e.transient, 520u);
  EXPECT_EQ(e.halo, 0u);
  EXPECT_EQ(e.total, fixed + 2 * 264 + 520 + 520);
}

// The same model, per layer (the plan's and the report's per-layer view), counted by hand.
TEST(MemoryModel, PerLayerSizesMatchAHandCount) {
  Config c = classifier();
  c.model.height = c.model.width = 8;
  LayerConfig d = dense(2);
  c.model.layers = {conv(2), layer("relu"), layer("global_avg_pool"), d};
  c.training.batch_size = 1;
  const ModelSpec m = build_model_spec(c);
  const std::vector<LayerMemory> x =
      layer_memory(c, make_shard_plan(m, {1, 1}), 0, uniform_policies(m, ActivationPolicy::Keep));
  ASSERT_EQ(x.size(), 4u);
  EXPECT_EQ(x[0].params, (2u * 9 + 2) * 4);  // 3x3x1x2 kernel and 2 biases
  EXPECT_EQ(x[0].grads, x[0].params);
  EXPECT_EQ(x[0].optimizer, 2 * x[0].params);  // adam
  EXPECT_EQ(x[1].params, 0u);
  EXPECT_EQ(x[3].params, (2u * 2 + 2) * 4);  // dense on the 2 pooled features
  EXPECT_EQ(x[0].activations, 0u);            // no backward reads the conv's output (2 x 8 x 8 floats)
  EXPECT_EQ(x[1].activations, 512u);
  EXPECT_EQ(x[2].activations, 8u);
  EXPECT_EQ(x[0].transient, 512u);  // the first layer makes no input gradient
  // The ReLU runs with the conv as one chain: its output gradient passes down as the
  // conv's. Apart, the ReLU makes its input gradient beside it.
  EXPECT_EQ(x[1].transient, 512u);
  EXPECT_EQ(x[2].transient, 8u + 512u);
  for (const LayerMemory& l : x) EXPECT_EQ(l.halo, 0u);
  Config apart = c;
  apart.parallel.fuse = false;
  const std::vector<LayerMemory> y =
      layer_memory(apart, make_shard_plan(m, {1, 1}), 0, uniform_policies(m, ActivationPolicy::Keep));
  EXPECT_EQ(y[0].activations, 0u);
  EXPECT_EQ(y[1].activations, 512u);
  EXPECT_EQ(y[1].transient, 1024u);
}

// A windowed layer that keeps its halo-extended input reads that in its backward, not its
// input (step_schedule.hpp reads_extended_only): conv -> conv on two shards, the first
// conv's output goes after the second's forward, on both ranks. A 2x2 'same' window reads
// the row below only, so the bottom shard reads its input in place: then the input is
// read on every rank, so that a recompute of it would run on all of them alike. Gathered
// again for the backward (not kept), it is read.
TEST(MemoryModel, AKeptExtendedInputStandsInForItsInput) {
  Config c = classifier();
  c.model.height = c.model.width = 16;
  c.training.batch_size = 1;
  for (const int kernel : {3, 2}) {
    SCOPED_TRACE(kernel);
    c.model.layers = {conv(4), conv(4, kernel), layer("relu"), layer("global_avg_pool"), dense(2)};
    const ModelSpec m = build_model_spec(c);
    const ShardPlan p = make_shard_plan(m, {2, 1});
    LayerPolicies keep = uniform_policies(m, ActivationPolicy::Keep);
    const bool everywhere = kernel == 3;
    for (int rank = 0; rank < 2; ++rank) {
      SCOPED_TRACE(rank);
      const RankSizes z = rank_sizes(c, p, rank);
      EXPECT_EQ(z.layers[1].in_place, kernel == 2 && rank == 1);
      EXPECT_EQ(z.layers[1].extended_everywhere, everywhere);
      const StepSchedule s = training_schedule(c, p, rank, keep);
      EXPECT_EQ(s.read_by_backward[1], everywhere ? 0 : 1);
      const uint64_t x = tile_bytes(p.owned_output(0, rank), 4, 1);
      const std::vector<LayerMemory> per_layer = layer_memory(c, p, rank, keep);
      // (the first conv keeps the image's extended tile besides)
      EXPECT_EQ(per_layer[0].activations - z.layers[0].ext, everywhere ? 0 : x);
      if (everywhere) {
        EXPECT_EQ(events_of(s, StepAction::Stash, 1), std::vector<int64_t>{-int64_t(x)});
        EXPECT_EQ(per_layer[1].activations, z.layers[1].ext);  // the extended input, instead
      } else {
        for (const StepOp& op : s.ops) EXPECT_FALSE(op.action == StepAction::Stash && op.index == 1);
      }
    }
    LayerPolicies regather = keep;
    regather[1] = ActivationPolicy::Offload;
    EXPECT_EQ(training_schedule(c, p, 0, regather).read_by_backward[1], 1);
  }
}

// conv -> conv -> ReLU on two shards, the ReLU under recompute, apart: no backward reads
// the second conv's output (the ReLU's reads its own), but the ReLU's forward runs again
// and reads it, so it waits as the conv's policy (keep) says, and only the ReLU runs again.
// Fused (the second conv and the ReLU one chain), the conv keeps its window: made again,
// the chain would gather it a second time beside the kept one, so the ReLU's output stays
// (step_schedule.hpp kReadAndKept) and nothing runs again. Everything a micro-batch
// allocates it frees.
TEST(MemoryModel, AReaderUnderRecomputeKeepsItsInput) {
  for (const bool fuse : {false, true}) {
    SCOPED_TRACE(fuse);
    Config c = classifier();
    c.model.height = c.model.width = 16;
    c.training.batch_size = 1;
    c.parallel.fuse = fuse;
    c.model.layers = {conv(4), conv(4), layer("relu"), layer("global_avg_pool"), dense(2)};
    const ModelSpec m = build_model_spec(c);
    const ShardPlan p = make_shard_plan(m, {2, 1});
    LayerPolicies policies = uniform_policies(m, ActivationPolicy::Keep);
    EXPECT_EQ(training_schedule(c, p, 0, policies).read_by_backward[2], 0);
    policies[2] = ActivationPolicy::Recompute;
    for (int rank = 0; rank < 2; ++rank) {
      SCOPED_TRACE(rank);
      const StepSchedule s = training_schedule(c, p, rank, policies);
      if (!fuse) EXPECT_EQ(s.read_by_backward[2], 1);  // fused, the conv's output is never made
      EXPECT_EQ(s.read_by_backward[3], fuse ? kReadAndKept : 1);
      int64_t micro_batch = 0;
      std::vector<int> recomputed;
      for (size_t o = s.micro_begin; o < s.micro_end; ++o) {
        for (const MemoryEvent& e : s.ops[o].events) micro_batch += e.bytes;
        if (s.ops[o].action == StepAction::Recompute) recomputed.push_back(s.ops[o].index);
      }
      EXPECT_EQ(recomputed, fuse ? std::vector<int>{} : std::vector<int>{2});
      EXPECT_EQ(micro_batch, 0);
    }
  }
}

// Summed over the layers, the weights are the replicated state of the peak, and what each
// layer offloads is the host pool's peak (every offloaded output waits there at once).
TEST(MemoryModel, PerLayerSizesAddUpToTheEstimate) {
  Config c = classifier();
  const ModelSpec m = build_model_spec(c);
  const ShardPlan p = make_shard_plan(m, {2, 1});
  const LayerPolicies offload = uniform_policies(m, ActivationPolicy::Offload);
  const MemoryEstimate e = estimate_memory(c, p, 1, offload);
  uint64_t params = 0, grads = 0, optimizer = 0, offloaded = 0, halo = 0;
  for (const LayerMemory& l : layer_memory(c, p, 1, offload)) {
    params += l.params;
    grads += l.grads;
    optimizer += l.optimizer;
    offloaded += l.offloaded;
    halo = std::max(halo, l.halo);
  }
  EXPECT_EQ(params, e.params);
  EXPECT_EQ(grads, e.grads);
  EXPECT_EQ(optimizer, e.optimizer);
  EXPECT_GT(offloaded, 0u);
  EXPECT_EQ(offloaded, e.host_offload);
  EXPECT_GT(halo, 0u);  // two shards exchange
}

TEST(MemoryModel, OffloadAndRecomputeLowerThePeakAndAutoFitsATightBudget) {
  Config c = classifier();
  // A deeper model: two full-resolution blocks before the first pool.
  c.model.layers.insert(c.model.layers.begin(),
                        {conv(8), layer("batch_norm"), layer("relu")});
  const ModelSpec m = build_model_spec(c);
  const ShardPlan p = make_shard_plan(m, {2, 1});
  const MemoryEstimate keep = estimate_memory_max(c, p, uniform_policies(m, ActivationPolicy::Keep));
  const MemoryEstimate off = estimate_memory_max(c, p, uniform_policies(m, ActivationPolicy::Offload));
  const MemoryEstimate rec = estimate_memory_max(c, p, uniform_policies(m, ActivationPolicy::Recompute));
  EXPECT_LT(off.total, keep.total);
  EXPECT_GT(off.host_offload, 0u);
  EXPECT_LT(rec.total, keep.total);
  EXPECT_EQ(rec.host_offload, 0u);
  EXPECT_EQ(off.total, sum_of(off));

  // Auto keeps everything when it fits...
  c.parallel.device_memory = keep.total;
  EXPECT_EQ(activation_policies(c, p), uniform_policies(m, ActivationPolicy::Keep));
  // ...and otherwise fits with something cheaper than keep, never slower than needed.
  c.parallel.device_memory = (keep.total + std::min(off.total, rec.total)) / 2;
  const LayerPolicies chosen = activation_policies(c, p);
  EXPECT_NE(chosen, uniform_policies(m, ActivationPolicy::Keep));
  EXPECT_LE(estimate_memory_max(c, p, chosen).total, c.parallel.device_memory);
  EXPECT_TRUE(plan_fits(c, p));
  EXPECT_EQ(chosen.back(), ActivationPolicy::Keep);  // the last layer always keeps
  const DeviceCostModel k80 = k80_die();
  EXPECT_GE(predict_step_time(c, p, chosen, k80).total(),
            predict_step_time(c, p, uniform_policies(m, ActivationPolicy::Keep), k80).total());

  // An explicit policy is applied as asked, fit or not.
  c.parallel.activations = ActivationPolicy::Keep;
  EXPECT_FALSE(plan_fits(c, p));
}

// parallel.host_memory bounds the host pool: auto offloads no more than it holds on any
// rank, and a plan whose pool passes it is refused naming the amount needed.
TEST(MemoryModel, HostMemoryBoundsTheOffloadPool) {
  Config c = classifier();
  c.parallel.backend = Backend::CUDA;  // the K80's overlapped copies: auto likes offload
  // The layers apart: fused, the chains' outputs are too few to matter beside the transients.
  c.parallel.fuse = false;
  c.model.layers.insert(c.model.layers.begin(), {conv(8), layer("batch_norm"), layer("relu")});
  const ModelSpec m = build_model_spec(c);
  const ShardPlan p = make_shard_plan(m, {2, 1});
  const MemoryEstimate keep = estimate_memory_max(c, p, uniform_policies(m, ActivationPolicy::Keep));
  const MemoryEstimate off = estimate_memory_max(c, p, uniform_policies(m, ActivationPolicy::Offload));
  c.parallel.device_memory = (keep.total + off.total) / 2;
  c.parallel.host_memory = 1ull << 40;
  uint64_t host = 0;
  StepMemory(c, p).estimate_max(activation_policies(c, p), &host);
  ASSERT_GT(host, 0u) << "the test wants a plan that offloads when the host holds it";
  c.parallel.host_memory = host - 1;
  const LayerPolicies bounded = activation_policies(c, p);
  uint64_t bounded_host = 0;
  EXPECT_LE(StepMemory(c, p).estimate_max(bounded, &bounded_host).total, c.parallel.device_memory);
  EXPECT_LE(bounded_host, c.parallel.host_memory);
  EXPECT_TRUE(make_plan(c, p).fits());

  c.parallel.activations = ActivationPolicy::Offload;
  c.parallel.device_memory = keep.total;
  c.parallel.host_memory = 1024;
  const Plan refused = make_plan(c, p);
  EXPECT_FALSE(refused.fits());
  EXPECT_NE(refused.verdict.find("parallel.host_memory is 1.00 KiB"), std::string::npos) << refused.verdict;
  uint64_t need = 0;
  StepMemory(c, p).estimate_max(refused.policies, &need);
  EXPECT_NE(refused.verdict.find("need " + format_size(need) + " of host memory"), std::string::npos)
      << refused.verdict;

  // auto: the node's memory shared among its ranks, less an eighth.
  c.parallel.host_memory = 0;
  EXPECT_EQ(host_memory_budget(c, 8, 64ull << 30), 28ull << 30);  // 2 dies a node
  c.parallel.backend = Backend::CPU;
  c.slurm.nodes = 2;
  EXPECT_EQ(host_memory_budget(c, 8, 64ull << 30), 14ull << 30);  // 4 ranks a node
  c.parallel.host_memory = 5;
  EXPECT_EQ(host_memory_budget(c, 8, 64ull << 30), 5u);
}

TEST(MemoryModel, StepTimeAddsTheRecomputedForwardAndTheOffloadTraffic) {
  Config c = classifier();
  c.parallel.backend = Backend::CUDA;
  const ModelSpec m = build_model_spec(c);
  const ShardPlan p = make_shard_plan(m, {2, 1});
  const DeviceCostModel k80 = k80_die();
  const StepTime keep = predict_step_time(c, p, uniform_policies(m, ActivationPolicy::Keep), k80);
  const StepTime rec = predict_step_time(c, p, uniform_policies(m, ActivationPolicy::Recompute), k80);
  const StepTime off = predict_step_time(c, p, uniform_policies(m, ActivationPolicy::Offload), k80);
  EXPECT_GT(keep.compute, 0);
  EXPECT_GT(keep.halo, 0);       // two shards exchange rows
  EXPECT_GT(keep.allreduce, 0);  // and sum their gradients
  EXPECT_EQ(keep.recompute, 0);
  EXPECT_EQ(keep.offload, 0);
  EXPECT_GT(rec.recompute, 0);
  EXPECT_LT(rec.recompute, keep.compute / 3);  // at most one more forward
  EXPECT_GT(rec.halo, keep.halo);              // gathers again for backward
  // Offloading an activation of B bytes moves 2B over a link the card's two dies share.
  const Rect out = p.owned_output(0, 0);
  const double conv1 = double(out.area()) * m.layers[0].out.c * 4 * 4;
  EXPECT_GE(off.offload, 2 * conv1 * 2 / k80.host_link_bw);
  EXPECT_GE(off.total(), keep.total());
  // Exactly what the schedule sends to the host pool (not the outputs no backward reads:
  // those are dropped), on the busier shard.
  double host_seconds = 0;
  for (int rank = 0; rank < 2; ++rank) {
    uint64_t host = 0;
    for (const StepOp& op : training_schedule(c, p, rank, uniform_policies(m, ActivationPolicy::Offload)).ops)
      for (const MemoryEvent& e : op.events)
        if (e.kind == MemoryKind::Host && e.bytes > 0) host += uint64_t(e.bytes);
    host_seconds = std::max(host_seconds, 2.0 * double(host) * k80.devices_per_link / k80.host_link_bw);
  }
  EXPECT_NEAR(off.offload, host_seconds, 1e-9 * host_seconds);
  // A layer under recompute whose output nothing reads again (a conv read only by a ReLU,
  // which reads its own output) is never made again: the schedule has no Recompute for it,
  // and the step time no recompute.
  LayerPolicies conv_only = uniform_policies(m, ActivationPolicy::Keep);
  conv_only[4] = ActivationPolicy::Recompute;  // conv 16, read by a ReLU
  for (const StepOp& op : training_schedule(c, p, 0, conv_only).ops) EXPECT_NE(op.action, StepAction::Recompute);
  EXPECT_EQ(predict_step_time(c, p, conv_only, k80).recompute, 0);
  conv_only[5] = ActivationPolicy::Recompute;  // and the ReLU, whose forward then reads it again
  EXPECT_GT(predict_step_time(c, p, conv_only, k80).recompute, 0);
}

TEST(MemoryModel, TwoShardsRoughlyHalveActivations) {
  const Config c = classifier();
  const ModelSpec m = build_model_spec(c);
  const MemoryEstimate one = estimate_memory_max(c, make_shard_plan(m, {1, 1}));
  const MemoryEstimate two = estimate_memory_max(c, make_shard_plan(m, {2, 1}));
  const double ratio = double(two.activations) / double(one.activations);
  EXPECT_GE(ratio, 0.5);
  // The halo-extended inputs are a larger share where the fused chain makes neither the
  // normalised tensor nor the ReLU's output, and the last conv's output goes unread.
  EXPECT_LE(ratio, 0.62);
  EXPECT_EQ(two.params, one.params);  // replicated
  // Two sample groups halve the local batch instead.
  const MemoryEstimate grouped = estimate_memory_max(c, make_shard_plan(m, {1, 1}, 2));
  EXPECT_EQ(grouped.local_batch, 2);
  EXPECT_EQ(grouped.activations * 2, one.activations);
}

TEST(MemoryModel, PerPixelLossesAddTheMaskTile) {
  Config c = classifier();
  c.model.layers = {conv(4), layer("relu"), conv(1)};
  c.model.loss = LossType::SigmoidBCE;
  const ShardPlan p = make_shard_plan(build_model_spec(c), {2, 2});
  const MemoryEstimate e = estimate_memory(c, p, 3);
  // Image and mask tiles, 4 images; twice on the CPU backend (the next step's too).
  EXPECT_EQ(e.input, 2 * (2ull * 4 * 32 * 24 * 4));
}

TEST(MemoryModel, HaloTrafficSplitsByNode) {
  Config c = classifier();
  const ShardPlan p = make_shard_plan(build_model_spec(c), {4, 1});
  c.parallel.devices_per_node = 2;  // ranks {0,1} on node 0, {2,3} on node 1
  EXPECT_EQ(node_of(c, 3), 1);
  EXPECT_EQ(local_device_of(c, 3), 1);
  const HaloTraffic t0 = halo_traffic(c, p, 0), t1 = halo_traffic(c, p, 1), t3 = halo_traffic(c, p, 3);
  EXPECT_GT(t0.intra_node, 0u);
  EXPECT_EQ(t0.inter_node, 0u);
  EXPECT_GT(t1.inter_node, 0u);
  EXPECT_EQ(t1.intra_node, t1.inter_node);  // even shards: one row each way to each side
  EXPECT_EQ(t3.inter_node, 0u);

  // Forward halos out plus backward gradients of the received halos, per layer; the first
  // layer computes no input gradient, so it sends none back (the worker's measured bytes
  // per step equal this on real runs: tests/slurm/e2e.sh two_nodes).
  uint64_t manual = 0;
  for (int l = 0; l < int(p.layers.size()); ++l)
    for (HaloPhase ph : {HaloPhase::Rows, HaloPhase::Cols}) {
      for (const auto& r : p.sends(l, 1, ph)) manual += uint64_t(r.rect.area()) * p.model.layers[l].in.c * 4 * 4;
      if (l > 0)
        for (const auto& r : p.receives(l, 1, ph)) manual += uint64_t(r.rect.area()) * p.model.layers[l].in.c * 4 * 4;
    }
  EXPECT_EQ(t1.total(), manual);

  const HaloTraffic two = halo_traffic_total(c, p);
  c.parallel.devices_per_node = 4;
  const HaloTraffic four = halo_traffic_total(c, p);
  c.parallel.devices_per_node = 1;
  const HaloTraffic single = halo_traffic_total(c, p);
  EXPECT_EQ(four.inter_node, 0u);
  EXPECT_EQ(single.intra_node, 0u);
  EXPECT_EQ(two.total(), four.total());
  EXPECT_EQ(two.total(), single.total());
  EXPECT_GT(two.inter_node, 0u);
  EXPECT_GT(two.intra_node, 0u);
}

// The search skips what cannot fit by a bound no policy gets under: it must hold for every
// policy, every grid and both backends.
TEST(MemoryModel, LowerBoundHoldsForEveryPolicy) {
  Config c = classifier();
  c.model.layers.insert(c.model.layers.begin(), {conv(8), layer("batch_norm"), layer("relu")});
  const ModelSpec m = build_model_spec(c);
  int checked = 0;
  for (Backend backend : {Backend::CPU, Backend::CUDA}) {
    c.parallel.backend = backend;
    for (GridShape g : {GridShape{1, 1}, GridShape{2, 1}, GridShape{2, 2}, GridShape{4, 1}}) {
      const ShardPlan p = make_shard_plan(m, g);
      const StepMemory memory(c, p);
      for (ActivationPolicy a : {ActivationPolicy::Keep, ActivationPolicy::Offload, ActivationPolicy::Recompute}) {
        EXPECT_LE(memory.lower_bound(), memory.estimate_max(uniform_policies(m, a)).total)
            << to_string(a) << " on " << g.rows << "x" << g.cols;
        EXPECT_EQ(memory.estimate_max(uniform_policies(m, a)).total,
                  estimate_memory_max(c, p, uniform_policies(m, a)).total);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 24);
}

}  // namespace
}  // namespace ht
