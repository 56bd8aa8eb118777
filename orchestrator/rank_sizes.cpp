// What each layer of a rank allocates in a step (step_schedule.hpp LayerSizes), which
// conv + ReLU and batch norm + ReLU (+ max pool) chains fuse, and the other sizes the schedule is made of.
#include <algorithm>
#include <cstdlib>

#include "kernels/device_memory.hpp"
#include "orchestrator/layer_kind.hpp"
#include "orchestrator/step_schedule.hpp"

namespace ht {

namespace {

constexpr uint64_t kFloat = sizeof(float);
const HaloPhase kPhases[2] = {HaloPhase::Rows, HaloPhase::Cols};

}  // namespace

uint64_t tile_bytes(const Rect& rect, int channels, int batch) {
  return uint64_t(rect.area()) * uint64_t(channels) * uint64_t(batch) * kFloat;
}

bool backward_reads_window(const LayerSpec& layer) {
  const WindowUse use = layer.kind().traits.backward_window;
  return layer.windowed() &&
         (use == WindowUse::WeightGradient || (use == WindowUse::InputGradient && makes_input_gradient(layer)));
}

ReplicatedState replicated_state(const Config& config, const ModelSpec& model) {
  const OptimizerConfig& o = config.training.optimizer;
  ReplicatedState s;
  // Optimizer state per trainable weight: adam's two moments, sgd's velocity when it has momentum.
  s.optimizer_slots = o.type == OptimizerType::Adam ? 2 : (o.momentum > 0 ? 1 : 0);
  const uint64_t all = uint64_t(model.param_count(false)), trainable = uint64_t(model.param_count(true));
  s.params = all * kFloat;
  // With micro-batches the trainer keeps their sum beside the gradients of the current one.
  s.grads = trainable * kFloat * (config.training.accumulate > 1 ? 2 : 1);
  s.optimizer = s.optimizer_slots * trainable * kFloat;
  return s;
}

bool backward_in_place(const ShardPlan& plan, int l) {
  const LayerSpec& spec = plan.model.layers[size_t(l)];
  return spec.kind().traits.backward_in_place && spec.inputs.size() == 1 && !plan.layers[size_t(l)].gathers;
}

namespace {

// The max pool of a batch norm + ReLU + max pool chain at `head`, when the model has one
// (the ReLU read only by a max pool whose windows tile its input), else -1.
int pool_in_model(const ModelSpec& m, int head) {
  const int pool = head + 2;
  if (pool >= int(m.layers.size())) return -1;
  const LayerSpec& mp = m.layers[size_t(pool)];
  auto tiles = [](const Window1D& w) {
    return w.kernel == w.stride && w.dilation == 1 && w.pad_lo == 0 && w.pad_hi == 0 && w.ceil_extra == 0;
  };
  if (m.readers[size_t(head) + 2] != std::vector<int>{pool} || mp.config.type() != "max_pool2d" ||
      !tiles(mp.rows) || !tiles(mp.cols) || mp.rows.kernel * mp.cols.kernel >= 255)
    return -1;
  return pool;
}

// Whether every rank's windows of the chain's pool start at the first row and column it
// owns, read nothing of its neighbours' (no halo) and leave fewer than a window's rows
// and columns over (the last shard of an odd size).
bool pools_own_shards(const ShardPlan& plan, int pool) {
  const Window1D &rows = plan.model.layers[size_t(pool)].rows, &cols = plan.model.layers[size_t(pool)].cols;
  auto pools_own = [](const Range& in, const Range& need, const Range& out, int k) {
    return need.lo >= in.lo && need.hi <= in.hi && out.lo * k == in.lo && in.size() / k == out.size();
  };
  for (int r = 0; r < plan.world(); ++r) {
    const Rect in = plan.owned_input(pool, r), need = plan.needed_input(pool, r), out = plan.owned_output(pool, r);
    if (!pools_own(in.rows, need.rows, out.rows, rows.kernel) || !pools_own(in.cols, need.cols, out.cols, cols.kernel))
      return false;
  }
  return true;
}

// Whether no rank reads windowed layer l's input in place (HaloExchange::in_place): every
// (grid row, grid col) pair is a rank, so one does where some row and some col need no halo.
bool extended_everywhere(const ShardPlan& plan, int l) {
  auto some_owned = [](const AxisPlan& a) {
    for (size_t i = 0; i < a.needed_in.size(); ++i)
      if (a.needed_in[i] == a.owned_in[i]) return true;
    return false;
  };
  const LayerPlan& lp = plan.layers[size_t(l)];
  return !(some_owned(lp.rows) && some_owned(lp.cols));
}

}  // namespace

bool conv_heads_chains(const LayerSpec& layer) {
  const std::string& type = layer.config.type();
  return type == "conv2d" || type == "depthwise_conv2d";
}

int chain_in_model(const Config& config, const ModelSpec& m, int head) {
  const int act = head + 1;
  if (!config.parallel.fuse || act >= int(m.layers.size())) return -1;
  const LayerSpec& h = m.layers[size_t(head)];
  // The activations whose gradient their output alone decides (0 < y, 0 < y < 6): the
  // head's output is never made.
  const std::string& type = m.layers[size_t(act)].config.type();
  if ((type != "relu" && type != "relu6") || m.readers[size_t(act)] != std::vector<int>{act}) return -1;
  if (conv_heads_chains(h)) return act;
  if (h.config.type() != "batch_norm" || !h.spatial || h.inputs.size() != 1) return -1;
  // The pooled chain's kernels follow a ReLU (the CPU's and the CUDA backend's).
  const int pool = type == "relu" ? pool_in_model(m, head) : -1;
  return pool >= 0 ? pool : act;
}

int fusable_chain(const Config& config, const ShardPlan& plan, int head) {
  int tail = chain_in_model(config, plan.model, head);
  if (tail < 0) return -1;
  // A pool whose windows cross the shards' borders stays apart: the chain ends at the ReLU.
  if (tail == head + 2 && !pools_own_shards(plan, tail)) tail = head + 1;
  // Sharded like the image (not gathered, not the same on every shard of a group).
  if (plan.replicated[size_t(plan.model.layers[size_t(head)].inputs[0])]) return -1;
  for (int k = head; k <= tail; ++k)
    if (plan.layers[size_t(k)].gathers || !plan.layers[size_t(k)].sharded) return -1;
  return tail;
}

bool backward_reads_inputs(const LayerSpec& layer, const LayerSizes& sizes, ActivationPolicy policy) {
  return (layer.kind().traits.backward_reads_inputs && !reads_extended_only(layer, sizes, policy)) ||
         std::any_of(sizes.gathered.begin(), sizes.gathered.end(), [](uint64_t b) { return b > 0; });
}

bool backward_reads_output(const ModelSpec& m, const RankSizes& sizes, const std::vector<int>& fused, int l) {
  if (fused[size_t(l)] < 0) return m.layers[size_t(l)].kind().traits.backward_reads_output;
  const LayerSizes& head = sizes.layers[size_t(fused[size_t(l)])];
  return !head.chain_pools && head.chain_tail == l;
}

std::vector<char> read_by_backward(const ModelSpec& m, const RankSizes& sizes, const LayerPolicies& policies) {
  const size_t L = m.layers.size();
  const std::vector<int> fused = fused_chains(sizes);
  std::vector<char> read(L + 1, 1);  // the image, and the output (the loss reads it)
  for (size_t t = 1; t < L; ++t) {
    bool reads = backward_reads_output(m, sizes, fused, int(t) - 1);
    // A reader whose output is recomputed runs its forward again, which reads it: it waits
    // as its own policy says rather than being made again too.
    for (int r : m.readers[t])
      reads = reads || policies[size_t(r)] == ActivationPolicy::Recompute ||
              backward_reads_inputs(m.layers[size_t(r)], sizes.layers[size_t(r)], policies[size_t(r)]);
    read[t] = reads;
  }
  // A conv chain's output under recompute whose conv is under keep, and so may keep its
  // window on some rank: made again, the conv would gather a second window beside the kept
  // one. It stays (on every rank alike, halo or none).
  for (size_t h = 0; h < L; ++h) {
    const int tail = sizes.layers[h].chain_tail;
    if (tail < 0 || !conv_heads_chains(m.layers[h]) || !read[size_t(tail) + 1]) continue;
    if (policies[h] == ActivationPolicy::Keep && policies[size_t(tail)] == ActivationPolicy::Recompute)
      read[size_t(tail) + 1] = kReadAndKept;
  }
  return read;
}

std::vector<int> fused_chains(const RankSizes& sizes) {
  std::vector<int> head(sizes.layers.size(), -1);
  for (size_t l = 0; l < sizes.layers.size(); ++l)
    for (int k = int(l); k <= sizes.layers[l].chain_tail; ++k) head[size_t(k)] = int(l);
  return head;
}

bool inside_fused_chain(const RankSizes& sizes, const std::vector<int>& fused, int l) {
  return fused[size_t(l)] >= 0 && sizes.layers[size_t(fused[size_t(l)])].chain_tail != l;
}

namespace {

// LayerSizes::chain_dx_over_input of the chain headed by `head`.
bool chain_dx_over_input(const ModelSpec& m, const RankSizes& sizes, const std::vector<int>& fused, int head) {
  if (!sizes.layers[size_t(head)].chain_pools) return false;
  const int t = m.layers[size_t(head)].inputs[0];
  return t > 0 && m.readers[size_t(t)] == std::vector<int>{head} && !backward_reads_output(m, sizes, fused, t - 1);
}

}  // namespace

RankSizes rank_sizes(const Config& config, const ShardPlan& plan, int rank, ConvUse use) {
  const ModelSpec& m = plan.model;
  const int b = local_batch(config, plan), L = int(m.layers.size());
  RankSizes r;
  r.input = tile_bytes(plan.owned_image(rank), m.input.c, b);
  r.conv_scratch = conv_scratch_bytes(config, plan, rank, use);
  r.targets = m.spatial_output() ? tile_bytes(plan.owned_output(L - 1, rank), 1, b)
                                    : uint64_t(b) * m.output().c * kFloat;
  r.staged = config.parallel.backend == Backend::CPU;
  const int iy = plan.grid_row_of(rank), ix = plan.grid_col_of(rank);
  for (int l = 0; l < L; ++l) {
    const LayerSpec& spec = m.layers[l];
    LayerSizes z;
    z.out = tile_bytes(plan.owned_output(l, rank), spec.out.c, b);
    const Rect owned = plan.owned_input(l, rank);
    z.owned_in = tile_bytes(owned, spec.in.c, b);
    if (spec.inner_channels > 0) z.inner = tile_bytes(plan.owned_output(l, rank), spec.inner_channels, b);
    z.dx_over_dy = backward_in_place(plan, l);
    for (size_t k = 0; k < spec.ins.size(); ++k) {
      const int t = spec.inputs[k];
      z.owned_ins.push_back(tile_bytes(plan.owned_tensor(t, rank), spec.ins[k].c, b));
      const Rect whole{{0, spec.ins[k].h}, {0, spec.ins[k].w}};
      z.gathered.push_back(plan.layers[l].gathers && !plan.replicated[t] ? tile_bytes(whole, spec.ins[k].c, b) : 0);
    }
    if (spec.windowed()) {
      const Rect need = plan.needed_input(l, rank);
      z.ext = tile_bytes(need, spec.in.c, b);
      z.in_place = need == owned;
      z.extended_everywhere = extended_everywhere(plan, l);
      for (HaloPhase ph : kPhases) {
        for (const HaloRegion& h : plan.sends(l, rank, ph)) z.sends[int(ph)] += tile_bytes(h.rect, spec.in.c, b);
        for (const HaloRegion& h : plan.receives(l, rank, ph)) z.receives[int(ph)] += tile_bytes(h.rect, spec.in.c, b);
      }
      const LayerPlan& lp = plan.layers[l];
      const int extra_h = std::abs(lp.rows.pad_lo[iy] - lp.rows.pad_hi[iy]);
      const int extra_w = std::abs(lp.cols.pad_lo[ix] - lp.cols.pad_hi[ix]);
      if (spec.kind().traits.conv_workspace && (extra_h || extra_w))
        z.padded = round_device_scratch(uint64_t(b) * spec.in.c * uint64_t(need.rows.size() + extra_h) *
                                             uint64_t(need.cols.size() + extra_w) * kFloat);
    }
    if (use == ConvUse::Training) z.chain_tail = fusable_chain(config, plan, l);
    z.chain_pools = z.chain_tail == l + 2;
    if (z.chain_pools) {
      const Rect pooled = plan.owned_output(z.chain_tail, rank);
      z.argmax = (uint64_t(pooled.area()) * uint64_t(spec.out.c) * uint64_t(b) + kFloat - 1) / kFloat * kFloat;
    }
    r.layers.push_back(z);
  }
  const std::vector<int> fused = fused_chains(r);
  for (int l = 0; l < L; ++l)
    r.layers[size_t(l)].chain_dx_over_input = fused[size_t(l)] == l && chain_dx_over_input(m, r, fused, l);
  return r;
}

uint64_t cudnn_workspace_bytes(const Config& config, const ModelSpec& model) {
  const bool conv = std::any_of(model.layers.begin(), model.layers.end(),
                                [](const LayerSpec& l) { return l.kind().traits.conv_workspace; });
  return config.parallel.backend == Backend::CUDA && conv ? kConvWorkspaceLimit : 0;
}

int prediction_band_rows(int channels, int cols) {
  const uint64_t row = uint64_t(std::max(channels, 1)) * uint64_t(std::max(cols, 1)) * kFloat;
  return int(std::max<uint64_t>(1, kPredictionBandBytes / row));
}

bool keeps_extended_input(const LayerSpec& layer, const LayerSizes& sizes, ActivationPolicy policy) {
  return layer.windowed() && !sizes.in_place && policy == ActivationPolicy::Keep &&
         layer.kind().traits.backward_window != WindowUse::None;
}

bool reads_extended_only(const LayerSpec& layer, const LayerSizes& sizes, ActivationPolicy policy) {
  return sizes.extended_everywhere && keeps_extended_input(layer, sizes, policy);
}

}  // namespace ht
