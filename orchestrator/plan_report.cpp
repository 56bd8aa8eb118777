#include "orchestrator/plan_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "orchestrator/step_schedule.hpp"

namespace ht {

namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (ch < 0x20)
          out += fmt::format("\\u{:04x}", int(ch));
        else
          out += char(ch);
    }
  }
  return out + "\"";
}

std::string window_text(const LayerSpec& l) {
  if (!l.windowed()) return "-";
  switch (l.rows.kind) {
    case WindowKind::Slide: break;
    case WindowKind::Transpose: return fmt::format("{}x{} up{}", l.rows.kernel, l.cols.kernel, l.rows.stride);
    case WindowKind::Nearest:
    case WindowKind::Bilinear: {
      const char* how = l.rows.kind == WindowKind::Nearest ? "near" : "bilin";
      if (l.rows.out == l.rows.in * l.rows.stride && l.cols.out == l.cols.in * l.cols.stride)
        return fmt::format("up{}x{} {}", l.rows.stride, l.cols.stride, how);
      return fmt::format("to {}x{} {}", l.rows.out, l.cols.out, how);
    }
    case WindowKind::Shift: return "shift";
  }
  auto pair = [](int a, int b) { return a == b ? std::to_string(a) : fmt::format("{}x{}", a, b); };
  return fmt::format("{}x{} s{} d{}", l.rows.kernel, l.cols.kernel, pair(l.rows.stride, l.cols.stride),
                     pair(l.rows.dilation, l.cols.dilation));
}

int nodes_used(const Config& config, const ShardPlan& plan) { return node_of(config, plan.world() - 1) + 1; }

// "conv2d_1, batch_normalization_1" for the layers with policy p, or "none".
std::string layers_with(const ModelSpec& m, const LayerPolicies& policies, ActivationPolicy p) {
  std::string out;
  for (size_t l = 0; l < policies.size(); ++l)
    if (policies[l] == p) out += (out.empty() ? "" : ", ") + m.layers[l].config.name;
  return out.empty() ? "none" : out;
}

// The fused chains (step_schedule.hpp fused_chains, the same on every rank), as
// "bn + relu + pool, ...", or empty.
std::string fused_chains_text(const Config& config, const ShardPlan& plan) {
  const std::vector<int> fused = fused_chains(rank_sizes(config, plan, 0));
  std::vector<std::string> chains;
  for (int l = 0; l < int(fused.size()); ++l) {
    if (fused[size_t(l)] != l) continue;
    std::string chain = plan.model.layers[size_t(l)].config.name;
    for (int k = l + 1; k < int(fused.size()) && fused[size_t(k)] == l; ++k)
      chain += " + " + plan.model.layers[size_t(k)].config.name;
    chains.push_back(chain);
  }
  return fmt::format("{}", fmt::join(chains, ", "));
}

std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.2f} s", s);
  if (s >= 1e-3) return fmt::format("{:.1f} ms", s * 1e3);
  return fmt::format("{:.0f} us", s * 1e6);
}

}  // namespace

HaloWidths halo_widths(const ShardPlan& plan, int layer) {
  HaloWidths h;
  const LayerPlan& l = plan.layers.at(layer);
  if (!l.sharded || !l.input_sharded) return h;
  auto widths = [](const AxisPlan& a, int* lo, int* hi) {
    const int n = int(a.owned_in.size());
    for (int i = 0; i < n; ++i) {
      if (i > 0) *lo = std::max(*lo, a.owned_in[i].lo - a.needed_in[i].lo);
      if (i + 1 < n) *hi = std::max(*hi, a.needed_in[i].hi - a.owned_in[i].hi);
    }
  };
  widths(l.rows, &h.rows_above, &h.rows_below);
  widths(l.cols, &h.cols_left, &h.cols_right);
  return h;
}

std::string predict_fit_verdict(const Config& config, const ShardPlan& plan) {
  const MemoryEstimate e = estimate_inference_memory_max(config, plan, Inference::Predict);
  if (e.total <= config.parallel.device_memory) return "";
  return fmt::format("{}: parallel.grid [{}, {}] does not fit for prediction: rank {} needs {} per device (params {}, "
                     "activations {}, transient {}, halo {}, conv workspace {}) but parallel.device_memory is {}",
                     config.source_path.empty() ? "config" : config.source_path, plan.grid_rows, plan.grid_cols,
                     e.rank, format_size(e.total), format_size(e.params), format_size(e.activations),
                     format_size(e.transient), format_size(e.halo), format_size(e.workspace),
                     format_size(config.parallel.device_memory));
}

std::string render_predict_plan(const Config& config, const ShardPlan& plan, bool json) {
  const ModelSpec& m = plan.model;
  const uint64_t budget = config.parallel.device_memory;
  std::vector<MemoryEstimate> est;
  for (int r = 0; r < plan.world(); ++r) est.push_back(estimate_inference_memory(config, plan, r, Inference::Predict));
  std::string s;
  if (json) {
    s += fmt::format("{{\n  \"mode\": \"predict\",\n  \"name\": {},\n  \"grid\": [{}, {}],\n  \"local_batch\": {},\n",
                     json_string(config.name), plan.grid_rows, plan.grid_cols, local_batch(config, plan));
    s += fmt::format("  \"device_memory\": {},\n  \"ranks\": [\n", budget);
    for (size_t r = 0; r < est.size(); ++r) {
      const MemoryEstimate& e = est[r];
      s += fmt::format("    {{\"rank\": {}, \"peak_device_bytes\": {}, \"params\": {}, \"activations\": {}, "
                       "\"transient\": {}, \"halo\": {}, \"workspace\": {}}}{}\n",
                       r, e.total, e.params, e.activations, e.transient, e.halo, e.workspace,
                       r + 1 < est.size() ? "," : "");
    }
    const bool fits = predict_fit_verdict(config, plan).empty();
    s += fmt::format("  ],\n  \"fits\": {}\n}}\n", fits ? "true" : "false");
    return s;
  }
  s += fmt::format("prediction plan for '{}'{}\n", config.name,
                   config.source_path.empty() ? "" : fmt::format(" ({})", config.source_path));
  s += fmt::format("grid [{}, {}], {} rank{}, image {} x {} x {}, {} image{} per group at a time, backend {}\n",
                   plan.grid_rows, plan.grid_cols, plan.world(), plan.world() == 1 ? "" : "s", m.input.h, m.input.w,
                   m.input.c, local_batch(config, plan), local_batch(config, plan) == 1 ? "" : "s",
                   to_string(config.parallel.backend));
  s += "inference keeps nothing for a backward: each activation is freed once the next layer has read it\n\n";
  s += fmt::format("peak memory per device (budget {}):\n", format_size(budget));
  s += fmt::format("  {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}  {}\n", "rank", "params", "activations",
                   "transient", "halo", "workspace", "total", "fits");
  for (size_t r = 0; r < est.size(); ++r) {
    const MemoryEstimate& e = est[r];
    s += fmt::format("  {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}  {}\n", r, format_size(e.params),
                     format_size(e.activations), format_size(e.transient), format_size(e.halo),
                     format_size(e.workspace), format_size(e.total), e.total <= budget ? "yes" : "NO");
  }
  return s;
}

namespace {

// Whether a rank's peak fits parallel.device_memory and its host pool parallel.host_memory.
bool rank_fits(const Config& config, const Plan& job, const MemoryEstimate& e) {
  return e.total <= config.parallel.device_memory && e.host_offload <= job.host_memory;
}

}  // namespace

// The plan's per-rank memory table, and what its data files hold in host memory.
std::string memory_table_text(const Config& config, const Plan& job) {
  const uint64_t budget = config.parallel.device_memory;
  std::string s;
  auto line = [&s](const std::string& t) { s += t + "\n"; };
  line(fmt::format("peak memory per device, by what it holds at that moment (budget "
                   "parallel.device_memory = {}; the host pool's, parallel.host_memory = {}{}):",
                   format_size(budget), format_size(job.host_memory),
                   config.parallel.host_memory ? "" : " (auto)"));
  line(fmt::format("  {:>5} {:>4} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}  {:<12} {}",
                   "rank", "dev", "params", "grads", "optimizer", "input", "activations", "transient", "halo",
                   "workspace", "PEAK", "verdict", "host pool"));
  for (const MemoryEstimate& e : job.ranks)
    line(fmt::format("  {:>5} {:>4} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}  {:<12} {}",
                     e.rank, local_device_of(config, e.rank), format_size(e.params), format_size(e.grads),
                     format_size(e.optimizer), format_size(e.input), format_size(e.activations),
                     format_size(e.transient), format_size(e.halo), format_size(e.workspace),
                     format_size(e.total),
                     rank_fits(config, job, e) ? "FITS" : "DOES NOT FIT",
                     format_size(e.host_offload)));
  if (const WholeDecodes& d = job.decodes; d.rows > 0) {
    if (d.images == 0)
      line(fmt::format("  data: {} image files, every one streamed: a rank decodes only the tiles or rows under "
                       "its shard",
                       d.rows));
    else
      line(fmt::format("  data: {} of {} image files cannot be streamed (interlaced PNG, progressive JPEG, a "
                       "compressed DICOM frame) and are decoded whole, once per image: up to {} of host memory per rank beside the "
                       "above (the largest: {})",
                       d.images, d.rows, format_size(d.per_rank), d.largest));
  }
  line("");

  return s;
}

std::string render_plan_text(const Config& config, const Plan& job) {
  const ShardPlan& plan = job.shards;
  const ModelSpec& m = plan.model;
  const uint64_t budget = config.parallel.device_memory;
  const LayerPolicies& policies = job.policies;
  std::string s;
  auto line = [&s](const std::string& t) { s += t + "\n"; };

  line(fmt::format("plan for '{}'{}", config.name,
                   config.source_path.empty() ? "" : fmt::format(" ({})", config.source_path)));
  line(fmt::format("grid [{}, {}] (rows x cols), {} sample group{}, world {} rank{} on {} node{} "
                   "({} devices per node)",
                   plan.grid_rows, plan.grid_cols, plan.groups, plan.groups == 1 ? "" : "s", plan.world(),
                   plan.world() == 1 ? "" : "s", nodes_used(config, plan),
                   nodes_used(config, plan) == 1 ? "" : "s", config.parallel.devices_per_node));
  line(fmt::format("image {} x {} x {} (H x W x C), batch {} ({} per group), backend {}", m.input.h,
                   m.input.w, m.input.c, config.training.batch_size, job.local_batch,
                   to_string(config.parallel.backend)));
  line("");

  line("shards (pixel rectangles of the image):");
  line(fmt::format("  {:>5} {:>5} {:>4} {:>6} {:>8}  {:<16} {:<16} {}", "rank", "node", "dev", "group",
                   "shard", "rows", "cols", "tile (H x W)"));
  for (int r = 0; r < plan.world(); ++r) {
    const Rect t = plan.owned_image(r);
    line(fmt::format("  {:>5} {:>5} {:>4} {:>6} {:>8}  {:<16} {:<16} {} x {}", r, node_of(config, r),
                     local_device_of(config, r), plan.group_of(r),
                     fmt::format("({},{})", plan.grid_row_of(r), plan.grid_col_of(r)),
                     fmt::format("[{}, {})", t.rows.lo, t.rows.hi), fmt::format("[{}, {})", t.cols.lo, t.cols.hi),
                     t.rows.size(), t.cols.size()));
  }
  line("");

  line("halo widths per windowed layer (input rows/cols a shard reads from its neighbours):");
  line(fmt::format("  {:<28} {:<12} {:<18} {:>18} {:>16}", "layer", "window", "input (HxWxC)",
                   "rows above/below", "cols left/right"));
  bool any_windowed = false;
  for (int l = 0; l < int(m.layers.size()); ++l) {
    const LayerSpec& L = m.layers[l];
    if (!L.windowed()) continue;
    any_windowed = true;
    const HaloWidths h = halo_widths(plan, l);
    line(fmt::format("  {:<28} {:<12} {:<18} {:>18} {:>16}",
                     fmt::format("{} ({})", L.config.name, L.config.type()), window_text(L),
                     fmt::format("{}x{}x{}", L.in.h, L.in.w, L.in.c),
                     fmt::format("{}/{}", h.rows_above, h.rows_below),
                     fmt::format("{}/{}", h.cols_left, h.cols_right)));
  }
  if (!any_windowed) line("  (no windowed layers: nothing is exchanged)");
  if (plan.tail >= 0) {
    const LayerSpec& first = m.layers[plan.tail - 1];
    line(fmt::format("  the tail: from {} ({}x{}, fewer rows or cols than the grid, or after such a map) every "
                     "shard gathers the maps whole; its {} layers run replicated, their weight gradients counted "
                     "once per sample group",
                     first.config.name, first.out.h, first.out.w, int(m.layers.size()) - (plan.tail - 1)));
  }
  line("");

  line(fmt::format("activations kept for backward (parallel.activations: {}):",
                   to_string(config.parallel.activations)));
  const auto kept = std::count(policies.begin(), policies.end(), ActivationPolicy::Keep);
  line(fmt::format("  {:<10} {}", "keep", kept == int(policies.size()) ? fmt::format("all {} layers", kept)
                                                                        : fmt::format("the other {} layers", kept)));
  for (ActivationPolicy p : {ActivationPolicy::Offload, ActivationPolicy::Recompute})
    line(fmt::format("  {:<10} {}", to_string(p), layers_with(m, policies, p)));
  if (const std::string chains = fused_chains_text(config, plan); !chains.empty())
    line(fmt::format("  {:<10} {} (the head's output, and before a pool the ReLU's, are never made; "
                     "parallel.fuse)",
                     "fused", chains));
  line("");

  s += memory_table_text(config, job);
  const DeviceCostModel device = cost_model_for(config);
  const StepTime& st = job.step_time;
  line(fmt::format("predicted step time on one {} per rank: {}", device.name, seconds_text(st.total())));
  line(fmt::format("  compute {}, recompute {}, halo {}, all-reduce {}, offload traffic {}{} (at the peak rates: "
                   "{:.2f} TFLOP/s, {:.0f} GB/s memory, {:.0f} GB/s host link shared by {})",
                   seconds_text(st.compute), seconds_text(st.recompute), seconds_text(st.halo),
                   seconds_text(st.allreduce), seconds_text(st.offload),
                   st.overlapped ? " beside compute" : "", device.flops / 1e12,
                   device.memory_bw / 1e9, device.host_link_bw / 1e9, device.devices_per_link));
  line("");

  const HaloTraffic t = halo_traffic_total(config, plan, policies);
  line(fmt::format("halo bytes per step (forward + backward, all ranks): intra-node {}, inter-node {}",
                   format_size(t.intra_node), format_size(t.inter_node)));
  if (job.busiest.validation)
    line("the peak is validation's (its forward beside what the step holds), not a training step's");
  if (job.fits())
    line(fmt::format("FITS: peak {} of {} per device (rank {})", format_size(job.busiest.total),
                     format_size(budget), job.busiest.rank));
  else
    line("DOES NOT FIT: " + job.verdict);
  return s;
}

std::string render_plan_json(const Config& config, const Plan& job) {
  const ShardPlan& plan = job.shards;
  const ModelSpec& m = plan.model;
  const uint64_t budget = config.parallel.device_memory;
  const LayerPolicies& policies = job.policies;
  const std::vector<MemoryEstimate>& est = job.ranks;
  const std::string& verdict = job.verdict;
  const DeviceCostModel device = cost_model_for(config);
  const StepTime& st = job.step_time;
  std::string s = "{\n";
  s += fmt::format("  \"name\": {},\n  \"config\": {},\n", json_string(config.name),
                   json_string(config.source_path));
  s += fmt::format("  \"grid\": [{}, {}],\n  \"groups\": {},\n  \"world\": {},\n", plan.grid_rows,
                   plan.grid_cols, plan.groups, plan.world());
  s += fmt::format("  \"devices_per_node\": {},\n  \"nodes\": {},\n", config.parallel.devices_per_node,
                   nodes_used(config, plan));
  s += fmt::format("  \"image\": {{\"height\": {}, \"width\": {}, \"channels\": {}}},\n", m.input.h, m.input.w,
                   m.input.c);
  s += fmt::format("  \"batch_size\": {},\n  \"local_batch\": {},\n  \"backend\": {},\n",
                   config.training.batch_size, job.local_batch,
                   json_string(to_string(config.parallel.backend)));
  s += fmt::format("  \"device_memory\": {},\n  \"host_memory\": {},\n", budget, job.host_memory);

  if (job.decodes.rows > 0)
    s += fmt::format("  \"data_files\": {{\"images\": {}, \"decoded_whole\": {}, \"whole_decode_bytes_per_rank\": {}}},\n",
                     job.decodes.rows, job.decodes.images, job.decodes.per_rank);
  s += "  \"ranks\": [\n";
  for (size_t i = 0; i < est.size(); ++i) {
    const MemoryEstimate& e = est[i];
    const int r = e.rank;
    const Rect t = plan.owned_image(r);
    const HaloTraffic h = halo_traffic(config, plan, r, policies);
    s += fmt::format(
        "    {{\"rank\": {}, \"node\": {}, \"device\": {}, \"group\": {}, \"grid_row\": {}, \"grid_col\": {}, "
        "\"rows\": [{}, {}], \"cols\": [{}, {}], "
        "\"memory\": {{\"params\": {}, \"grads\": {}, \"optimizer\": {}, \"input\": {}, \"activations\": {}, "
        "\"transient\": {}, \"halo\": {}, \"workspace\": {}, \"total\": {}}}, "
        "\"peak_device_bytes\": {}, \"peak_in_validation\": {}, \"host_pool_bytes\": {}, \"fits\": {}, "
        "\"halo_bytes_per_step\": {{\"intra_node\": {}, \"inter_node\": {}}}}}{}\n",
        r, node_of(config, r), local_device_of(config, r), plan.group_of(r), plan.grid_row_of(r),
        plan.grid_col_of(r), t.rows.lo, t.rows.hi, t.cols.lo, t.cols.hi, e.params, e.grads, e.optimizer,
        e.input, e.activations, e.transient, e.halo, e.workspace, e.total, e.total,
        e.validation ? "true" : "false", e.host_offload,
        rank_fits(config, job, e) ? "true" : "false", h.intra_node, h.inter_node, i + 1 < est.size() ? "," : "");
  }
  s += "  ],\n";

  s += "  \"layers\": [\n";
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerSpec& L = m.layers[l];
    const HaloWidths h = halo_widths(plan, int(l));
    s += fmt::format(
        "    {{\"index\": {}, \"name\": {}, \"type\": {}, \"windowed\": {}, \"spatial\": {}, "
        "\"sharded\": {}, \"gathers\": {}, "
        "\"input\": [{}, {}, {}], \"output\": [{}, {}, {}], \"activations\": {}, "
        "\"halo\": {{\"rows_above\": {}, \"rows_below\": {}, \"cols_left\": {}, \"cols_right\": {}}}}}{}\n",
        l, json_string(L.config.name), json_string(L.config.type()), L.windowed() ? "true" : "false",
        L.spatial ? "true" : "false", plan.layers[l].sharded ? "true" : "false",
        plan.layers[l].gathers ? "true" : "false", L.in.h, L.in.w, L.in.c, L.out.h, L.out.w, L.out.c,
        json_string(to_string(policies[l])), h.rows_above,
        h.rows_below, h.cols_left, h.cols_right, l + 1 < m.layers.size() ? "," : "");
  }
  s += "  ],\n";

  const HaloTraffic t = halo_traffic_total(config, plan, policies);
  uint64_t peak = 0;
  for (const MemoryEstimate& e : est) peak = std::max(peak, e.total);
  s += fmt::format("  \"halo_bytes_per_step\": {{\"intra_node\": {}, \"inter_node\": {}}},\n", t.intra_node,
                   t.inter_node);
  s += fmt::format("  \"max_peak_device_bytes\": {},\n", peak);
  s += fmt::format("  \"activations\": {},\n", json_string(to_string(config.parallel.activations)));
  s += fmt::format(
      "  \"step_time\": {{\"device\": {}, \"seconds\": {:.6g}, \"compute\": {:.6g}, \"recompute\": {:.6g}, "
      "\"halo\": {:.6g}, \"allreduce\": {:.6g}, \"offload\": {:.6g}}},\n",
      json_string(device.name), st.total(), st.compute, st.recompute, st.halo, st.allreduce, st.offload);
  s += fmt::format("  \"fits\": {},\n  \"verdict\": {}\n", verdict.empty() ? "true" : "false",
                   json_string(verdict));
  s += "}\n";
  return s;
}

namespace {

// The layer or tensor an operation names.
std::string op_subject(const StepOp& op, const ModelSpec& m) {
  if (op.index < 0) return "";
  switch (op.action) {
    case StepAction::Forward:
    case StepAction::Recompute:
    case StepAction::Backward:
    case StepAction::SkipBackward: return m.layers[op.index].config.name;
    default: return op.index == 0 ? "image" : m.layers[op.index - 1].config.name;
  }
}

}  // namespace

std::string render_schedule_text(const StepSchedule& s, const ModelSpec& m) {
  // Per operation the device bytes live at its highest and after it; the step's peak.
  std::vector<int64_t> high(s.ops.size()), after(s.ops.size());
  int64_t now = 0, peak = 0;
  size_t at_peak = 0;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    high[i] = now;
    for (const MemoryEvent& e : s.ops[i].events) {
      if (e.kind == MemoryKind::Host) continue;
      now += e.bytes;
      high[i] = std::max(high[i], now);
    }
    after[i] = now;
    if (high[i] > peak) peak = high[i], at_peak = i;
  }
  std::string out = fmt::format("schedule of rank {}: {} operations{}\n", s.rank, s.ops.size(),
                                s.micro_batches > 1
                                    ? fmt::format(" (ops {} to {} run {} times, once per micro-batch)", s.micro_begin,
                                                  s.micro_end - 1, s.micro_batches)
                                    : "");
  out += fmt::format("{:>4}  {:<15} {:<26} {:>11} {:>11}  {}\n", "op", "action", "layer / tensor", "highest",
                     "after", "allocated + / freed - (device memory; host: the offload pool)");
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const StepOp& op = s.ops[i];
    std::string events;
    for (const MemoryEvent& e : op.events)
      events += fmt::format("{}{}{} {}", events.empty() ? "" : ", ", e.bytes > 0 ? "+" : "-",
                            format_size(uint64_t(std::abs(e.bytes))), memory_kind_name(e.kind));
    out += fmt::format("{:>4}  {:<15} {:<26} {:>11} {:>11}  {}{}\n", i, step_action_name(op.action),
                       op_subject(op, m), format_size(uint64_t(high[i])), format_size(uint64_t(after[i])), events,
                       i == at_peak ? "   <- peak" : "");
  }
  out += fmt::format("peak {} during op {} ({} {})\n", format_size(uint64_t(peak)), at_peak,
                     step_action_name(s.ops[at_peak].action), op_subject(s.ops[at_peak], m));
  return out;
}

std::string render_schedule_json(const StepSchedule& s, const ModelSpec& m) {
  std::string out = fmt::format("{{\"rank\": {}, \"micro_batches\": {}, \"micro_batch\": [{}, {}], \"ops\": [", s.rank,
                                s.micro_batches, s.micro_begin, s.micro_end);
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const StepOp& op = s.ops[i];
    out += fmt::format("{}\n  {{\"action\": \"{}\", \"index\": {}, \"name\": {}, \"events\": [", i ? "," : "",
                       step_action_name(op.action), op.index, json_string(op_subject(op, m)));
    for (size_t j = 0; j < op.events.size(); ++j)
      out += fmt::format("{}[\"{}\", {}]", j ? ", " : "", memory_kind_name(op.events[j].kind), op.events[j].bytes);
    out += "]}";
  }
  return out + "\n]}";
}

}  // namespace ht
