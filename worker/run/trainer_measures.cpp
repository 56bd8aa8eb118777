// What a run measures of itself, beside the plan's predictions: halo bytes per step and
// where they went, the collectives' share of the step, each rank's peak memory
// (run_dir/memory.csv). Members of Trainer (worker/run/trainer.hpp); collective where they say.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>

#include "worker/run/trainer.hpp"
#include "worker/runtime/log.hpp"

namespace ht {

void Trainer::log_halo_traffic(int64_t steps) {
  // Which ranks share a host: a 32-bit hash of each rank's host name (exact in a double).
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  std::vector<double> hosts(size_t(device_->world->size()), 0.0);
  hosts[size_t(rank_)] = double(uint32_t(std::hash<std::string>()(host)));
  device_->world->allreduce_sum_host(hosts.data(), hosts.size());
  uint64_t intra = 0, inter = 0;
  for (size_t peer = 0; peer < halo_sent_.size(); ++peer)
    (hosts[peer] == hosts[size_t(rank_)] ? intra : inter) += halo_sent_[peer];
  const HaloTraffic planned = halo_traffic(config_, plan_, rank_, policies_);
  const int node = node_of(config_, rank_);
  log().info("on host {} (the plan's node {}, device {}): halo bytes sent per step {} to ranks on this host, {} to "
             "other hosts; the plan's {} intra-node, {} inter-node",
             host, node, local_device_of(config_, rank_), intra / uint64_t(std::max<int64_t>(steps, 1)),
             inter / uint64_t(std::max<int64_t>(steps, 1)), planned.intra_node, planned.inter_node);
}

void Trainer::bank_collective_seconds() {
  for (const auto& layer : device_->layers)
    collective_seconds_[layer->spec().config.type()] += layer->collective_seconds();
}

void Trainer::log_collectives(int64_t steps, double step_seconds) {
  bank_collective_seconds();
  if (rank_ != 0 || collective_seconds_.empty()) return;
  std::string parts;
  double total = 0;
  for (const auto& [kind, s] : collective_seconds_) {
    if (s <= 0) continue;
    total += s;
    parts += fmt::format("{}{} {:.2f} ms", parts.empty() ? "" : ", ", kind, 1e3 * s / double(steps));
  }
  if (total <= 0) return;
  log().info("collectives inside layers, per step on rank 0 (waiting included): {}; {:.1f}% of the step time",
             parts, 100.0 * total / std::max(step_seconds, 1e-12));
}

std::vector<double> Trainer::peaks_of_ranks(uint64_t local) {
  std::vector<double> peaks(device_->world->size(), 0.0);
  peaks[rank_] = double(local);
  device_->world->allreduce_sum_host(peaks.data(), peaks.size());
  return peaks;
}

uint64_t Trainer::max_peak_over_ranks() {
  const std::vector<double> peaks = peaks_of_ranks(device_->backend->allocator().peak());
  return uint64_t(*std::max_element(peaks.begin(), peaks.end()));
}

void Trainer::write_memory_report() {
  // Collective: every rank gives its peaks; rank 0 writes them beside the predictions.
  const std::vector<double> device = peaks_of_ranks(device_->backend->allocator().peak());
  const std::vector<double> host = peaks_of_ranks(device_->backend->host_pool().peak());
  if (rank_ != 0) return;
  std::ofstream out(config_.run_dir + "/memory.csv", std::ios::trunc);
  out << "rank,peak_device_bytes,predicted_peak_device_bytes,host_pool_peak_bytes,predicted_host_pool_bytes\n";
  double worst = 0;
  for (int r = 0; r < int(device.size()); ++r) {
    const MemoryEstimate& e = job_.ranks.at(r);
    out << fmt::format("{},{},{},{},{}\n", r, uint64_t(device[r]), e.total, uint64_t(host[r]), e.host_offload);
    worst = std::max(worst, std::abs(device[r] - double(e.total)) / std::max(double(e.total), 1.0));
  }
  if (!out) log().warn("{}/memory.csv: could not write the memory report", config_.run_dir);
  log().info("peak device memory per rank within {:.1f}% of the memory model's prediction ({}/memory.csv)",
             100 * worst, config_.run_dir);
}

}  // namespace ht
