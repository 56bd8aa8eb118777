// The memory model of inference (evaluate, predict, validation during training): the
// worker's forward_inference order replayed against the per-rank sizes of the training
// model (rank_sizes).
#include <algorithm>

#include "orchestrator/conv_geometry.hpp"
#include "orchestrator/memory_model.hpp"

namespace ht {

namespace {
constexpr uint64_t kFloat = sizeof(float);
}  // namespace

int prediction_band_rows(int channels, int cols) {
  const uint64_t row = uint64_t(std::max(channels, 1)) * uint64_t(std::max(cols, 1)) * kFloat;
  return int(std::max<uint64_t>(1, kPredictionBandBytes / row));
}

MemoryEstimate estimate_inference_memory(const Config& config, const ShardPlan& plan, int rank, Inference kind) {
  // The worker's order (worker/layers/layers.cpp forward_inference, worker/run/inference.cpp): the
  // weights, the input tile, then per layer its gathered input and halo staging, its
  // output, and the inputs it read last freed; predict then moves the output to rank 0 in
  // bands.
  const ModelSpec& m = plan.model;
  const RankSizes z = rank_sizes(config, plan, rank);
  MemoryEstimate e;
  e.rank = rank;
  e.local_batch = local_batch(config, plan);
  e.params = uint64_t(m.param_count(false)) * kFloat;
  uint64_t live = z.input, peak = z.input, peak_transient = 0, peak_halo = 0;
  const auto at_peak = [&](uint64_t total, uint64_t transient, uint64_t halo) {
    if (total <= peak) return;
    peak = total;
    peak_transient = transient;
    peak_halo = halo;
  };
  for (int l = 0; l < int(m.layers.size()); ++l) {
    const LayerSizes& s = z.layers[l];
    // The extended copy of a windowed layer, or the inputs a layer gathers whole.
    uint64_t ext = m.layers[l].windowed() && !s.in_place ? s.ext : 0;
    for (uint64_t whole : s.gathered) ext += whole;
    if (m.layers[l].windowed())
      for (int ph : {0, 1}) at_peak(live + ext + s.stage(ph), ext, s.stage(ph));
    at_peak(live + ext + s.inner + s.out, ext + s.inner, 0);  // a separable conv's inner tensor beside it
    live += s.out;  // the extended copy goes, and each tensor it read for the last time
    const std::vector<int>& in = m.layers[l].inputs;
    for (size_t k = 0; k < in.size(); ++k)
      if (m.last_reader(in[k]) == l && std::find(in.begin(), in.begin() + k, in[k]) == in.begin() + k)
        live -= in[k] == 0 ? z.input : z.layers[in[k] - 1].out;
  }
  if (kind == Inference::Predict) {
    // The band this rank packs or (rank 0) receives beside its output.
    const int L = int(m.layers.size());
    const bool spatial = m.spatial_output();
    const int C = m.output().c;
    uint64_t band = 0;
    for (int r = 0; r < plan.world(); ++r) {
      if (r != rank && rank != 0) continue;
      if (!spatial && plan.shard_of(r) != 0) continue;
      if (!spatial) {
        band = std::max(band, uint64_t(e.local_batch) * C * kFloat);
        continue;
      }
      const Rect t = plan.owned_output(L - 1, r);
      const int rows = std::min(t.rows.size(), prediction_band_rows(C, t.cols.size()));
      band = std::max(band, uint64_t(rows) * t.cols.size() * C * kFloat);
    }
    at_peak(live + band, band, 0);
  }
  // The CUDA backend's conv scratch, as in training: the cuDNN workspace at its limit and
  // the largest padded copy, held from the first conv on.
  if (config.parallel.backend == Backend::CUDA) {
    e.workspace = cudnn_workspace_bytes(config, m);
    uint64_t padded = 0;
    for (const LayerSizes& s : z.layers) padded = std::max(padded, s.padded);
    e.workspace += padded;
  }
  e.workspace += conv_scratch_bytes(config, plan, rank, ConvUse::Inference);  // CPU: oneDNN's, reserved with the layers
  e.input = 0;
  e.activations = peak - peak_transient - peak_halo;
  e.transient = peak_transient;
  e.halo = peak_halo;
  e.total = e.params + e.workspace + peak;
  return e;
}

MemoryEstimate estimate_inference_memory_max(const Config& config, const ShardPlan& plan, Inference kind) {
  MemoryEstimate best = estimate_inference_memory(config, plan, 0, kind);
  for (int r = 1; r < plan.world(); ++r) {
    MemoryEstimate e = estimate_inference_memory(config, plan, r, kind);
    if (e.total > best.total) best = e;
  }
  return best;
}

}  // namespace ht
