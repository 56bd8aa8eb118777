#include "orchestrator/submit.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "orchestrator/config_io.hpp"
#include "orchestrator/plan_report.hpp"
#include "orchestrator/process.hpp"
#include "orchestrator/slurm.hpp"

namespace ht {

namespace {

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t start = 0;
  while (start < s.size() && std::isspace(static_cast<unsigned char>(s[start]))) ++start;
  return s.substr(start);
}

// What this Slurm offers: `srun --mpi=list` on the submit host (the same Slurm as the nodes).
std::string probe_launcher() {
  if (!find_on_path("srun")) return choose_launcher("");
  const CommandResult r = run_command({"srun", "--mpi=list"}, 20);
  const std::string listed = r.started && r.exit_code == 0 ? r.out + r.err : "";
  return choose_launcher(listed);
}

}  // namespace

int run_submit(const SubmitCommand& command, std::ostream& out, std::ostream& err) {
  namespace fs = std::filesystem;
  // The ranks' threads are a plan input (oneDNN's scratch grows with them). What each task
  // gets and parallel.threads must agree: a set value asks Slurm for that many CPUs per
  // task, and auto resolves here to --cpus-per-task (1 on CUDA without it), which the ranks
  // are told. Only a CPU job on whole nodes without either keeps auto: its ranks split the
  // node they land on, which the login node cannot know, so its plan is an estimate.
  std::vector<std::string> sets = command.sets;
  SubmitCommand resolved = command;
  const Config given = load_config(command.config_path, command.sets);
  const int threads = given.parallel.threads;
  if (threads > 0 && command.cpus_per_task > 0 && threads != command.cpus_per_task) {
    err << fmt::format("halotrain submit: parallel.threads {} and --cpus-per-task {} disagree: each rank runs "
                       "parallel.threads CPU threads; give one of them, or the same number\n",
                       threads, command.cpus_per_task);
    return 1;
  }
  if (threads > 0) resolved.cpus_per_task = threads;
  const bool cpu_whole_nodes = given.parallel.backend == Backend::CPU && resolved.cpus_per_task == 0;
  if (threads == 0 && !cpu_whole_nodes)
    sets.push_back(fmt::format("parallel.threads={}", std::max(resolved.cpus_per_task, 1)));
  // parallel.host_memory bounds the offload pool, so it is a plan input too: auto resolves
  // here from the partition's smallest node and the ranks are told. Without sinfo's answer
  // each node resolves it for itself (the same on identical nodes).
  const int ranks = given.slurm.nodes * given.parallel.devices_per_node;
  if (given.parallel.host_memory == 0 && find_on_path("sinfo")) {
    const CommandResult r = run_command({"sinfo", "-h", "-N", "-p", given.slurm.partition, "-o", "%m"}, 20);
    if (const auto node = r.started && r.exit_code == 0 ? smallest_node_memory(r.out) : std::nullopt)
      sets.push_back(fmt::format("parallel.host_memory={}", host_memory_budget(given, ranks, *node)));
  }
  const Config config = load_config(command.config_path, sets);
  const ModelSpec model = build_model_spec(config);
  const GridShape grid = plan_grid(config, model);
  check_allocation(config, grid);
  const Plan job = make_plan(config, make_shard_plan(model, grid, ranks));
  const ShardPlan& plan = job.shards;
  // Queue time is too dear to spend on a job that cannot fit its devices.
  if (!job.fits()) {
    err << "halotrain submit: " << job.verdict << "\n";
    return 1;
  }
  if (!command.dry_run && !find_on_path("sbatch")) {
    err << "halotrain submit: sbatch not found on PATH; run this on a Slurm login node (or use --dry-run to see "
           "the script)\n";
    return 1;
  }

  SubmitOptions options;
  options.halotrain = fs::canonical("/proc/self/exe").string();
  options.workdir = fs::current_path().string();
  options.sets = sets;
  options.launcher = command.launcher.empty() ? probe_launcher() : command.launcher;
  options.cpus_per_task = resolved.cpus_per_task;
  const std::string config_abs = fs::absolute(command.config_path).lexically_normal().string();
  const std::string script = render_sbatch(config, plan, config_abs, options);
  if (command.dry_run) {
    out << script;
    return 0;
  }

  const std::string run_dir = absolute_run_dir(config, options.workdir);
  const std::string path = sbatch_path(config, options.workdir);
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) {
    err << fmt::format("halotrain submit: run_dir {}: cannot create it: {}\n", run_dir, ec.message());
    return 1;
  }
  {
    std::ofstream file(path, std::ios::trunc);
    file << script;
    if (!file.flush()) {
      err << fmt::format("halotrain submit: cannot write {}\n", path);
      return 1;
    }
  }
  fs::permissions(path, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add, ec);

  const CommandResult r = run_command({"sbatch", "--parsable", path}, 120);
  if (!r.started || r.exit_code != 0) {
    const std::string why = trimmed(r.err.empty() ? (r.error.empty() ? r.out : r.error) : r.err);
    err << fmt::format("halotrain submit: sbatch {} failed (exit {}): {}\n", path, r.exit_code, why);
    return 1;
  }
  // --parsable prints "<id>" or "<id>;<cluster>".
  std::string id = trimmed(r.out);
  if (const size_t semi = id.find(';'); semi != std::string::npos) id = id.substr(0, semi);
  if (const size_t nl = id.rfind('\n'); nl != std::string::npos) id = id.substr(nl + 1);
  err << fmt::format("halotrain submit: job {} queued: {}; logs {}/slurm-{}.out\n", id, path, run_dir, id);
  out << id << "\n";
  return 0;
}

}  // namespace ht
