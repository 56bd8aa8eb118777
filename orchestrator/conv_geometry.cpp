#include "orchestrator/conv_geometry.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/cpu/conv.hpp"
#include "kernels/cpu/dnnl_isa.hpp"
#include "kernels/cpu/threads.hpp"
#include "orchestrator/layer_kind.hpp"

namespace ht {

namespace {

// The window's kernel, strides and this shard's padding (the worker's set_window).
void set_window(ConvGeom& g, const ShardPlan& plan, int layer, int rank) {
  const LayerSpec& s = plan.model.layers[layer];
  const LayerPlan& lp = plan.layers[layer];
  const int iy = plan.grid_row_of(rank), ix = plan.grid_col_of(rank);
  g.kh = s.rows.kernel;
  g.kw = s.cols.kernel;
  g.stride_h = s.rows.stride;
  g.stride_w = s.cols.stride;
  g.pad_top = lp.rows.pad_lo[iy];
  g.pad_bottom = lp.rows.pad_hi[iy];
  g.pad_left = lp.cols.pad_lo[ix];
  g.pad_right = lp.cols.pad_hi[ix];
}

}  // namespace

std::vector<ShardConv> layer_convs(const ShardPlan& plan, int layer, int rank, int batch, ConvUse use) {
  const LayerSpec& s = plan.model.layers[layer];
  const std::string& type = s.config.type();
  const bool depthwise = type == "depthwise_conv2d" || type == "separable_conv2d";
  if (type != "conv2d" && !depthwise && type != "conv2d_transpose") return {};
  const bool training = use == ConvUse::Training, need_dx = training && makes_input_gradient(s);
  const unsigned weights = training ? unsigned(cpu::kConvBackwardWeights) : 0u;
  const Rect out = plan.owned_output(layer, rank);
  ConvGeom g;
  g.n = batch;
  set_window(g, plan, layer, rank);
  if (type == "conv2d_transpose") {  // the conv that maps its output to its input, run backwards
    g.cin = s.out.c;
    g.hin = out.rows.size();
    g.win = out.cols.size();
    g.cout = s.in.c;
    return {{g, cpu::kConvBackwardData | weights | (need_dx ? unsigned(cpu::kConvForward) : 0u)}};
  }
  const Rect need = plan.needed_input(layer, rank);
  g.cin = s.in.c;
  g.hin = need.rows.size();
  g.win = need.cols.size();
  g.cout = depthwise ? s.in.c * int(s.config.integer("depth_multiplier")) : s.out.c;
  g.groups = depthwise ? s.in.c : s.config.integer("groups");
  g.dil_h = s.rows.dilation;
  g.dil_w = s.cols.dilation;
  const ShardConv conv{g, cpu::kConvForward | weights | (need_dx ? unsigned(cpu::kConvBackwardData) : 0u)};
  if (type != "separable_conv2d") return {conv};
  ConvGeom pointwise;  // its data gradient is the depthwise part's output gradient
  pointwise.n = batch;
  pointwise.cin = g.cout;
  pointwise.hin = out.rows.size();
  pointwise.win = out.cols.size();
  pointwise.cout = s.out.c;
  return {conv, {pointwise, training ? cpu::kConvAllPasses : cpu::kConvForward}};
}

std::vector<ShardConv> shard_convs(const ShardPlan& plan, int rank, int batch, ConvUse use) {
  std::vector<ShardConv> all;
  for (int l = 0; l < int(plan.model.layers.size()); ++l)
    for (const ShardConv& c : layer_convs(plan, l, rank, batch, use)) all.push_back(c);
  return all;
}

int local_batch(const Config& config, int groups) {
  groups = std::max(groups, 1);
  return std::max(1, (config.training.batch_size / config.training.accumulate + groups - 1) / groups);
}

int local_batch(const Config& config, const ShardPlan& plan) { return local_batch(config, plan.groups); }

uint64_t conv_scratch_bytes(const Config& config, const ShardPlan& plan, int rank, ConvUse use) {
  if (config.parallel.backend != Backend::CPU) return 0;
  use_cpu_isa(config);
  const int threads = threads_per_rank(config, plan.world());
  cpu::ConvScratch need;
  for (const ShardConv& c : shard_convs(plan, rank, local_batch(config, plan), use))
    need.include(cpu::dnnl_conv_scratch(c.geom, c.passes, threads));
  return need.total();
}

std::string use_cpu_isa(const Config& config) {
  const std::string& asked = config.parallel.cpu_isa;
  std::string reached;
  try {
    reached = cpu::use_dnnl_isa(asked);
  } catch (const std::logic_error& e) {
    throw ConfigError(fmt::format("parallel.cpu_isa {}: {}", asked, e.what()));
  }
  if (asked != "auto" && reached != asked)
    throw ConfigError(fmt::format("parallel.cpu_isa {}: this machine's oneDNN reaches {} (its CPU, or "
                                  "ONEDNN_MAX_CPU_ISA); plan where the ranks run, or set the ISA they share",
                                  asked, reached));
  return reached;
}

int threads_per_rank(const Config& config, int in_process) {
  if (config.parallel.threads > 0) return config.parallel.threads;
  return cpu::worker_threads(cpu::workers_on_node(in_process));
}

}  // namespace ht
