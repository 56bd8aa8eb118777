#include "orchestrator/slurm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <sstream>

namespace ht {

namespace {

// Characters bash takes literally in a word (no globbing, expansion or splitting).
bool plain_word(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("_./:=@%+,-").find(c) != std::string_view::npos;
  });
}

// A value on an #SBATCH line: sbatch splits those lines at blanks and honours double quotes.
std::string sbatch_value(const std::string& key, const std::string& value, const Config& config) {
  if (value.find_first_of("\n\r\"") != std::string::npos)
    throw ConfigError(fmt::format("{}: {} '{}' cannot go on an #SBATCH line (line break or double quote)",
                                  config.source_path, key, value));
  if (value.find_first_of(" \t") != std::string::npos) return "\"" + value + "\"";
  return value;
}

void require_no_newline(const std::string& what, const std::string& value, const Config& config) {
  if (value.find_first_of("\n\r") != std::string::npos)
    throw ConfigError(fmt::format("{}: {} must be one line, found '{}'", config.source_path, what, value));
}

}  // namespace

std::string shell_quote(const std::string& text) {
  if (plain_word(text)) return text;
  std::string out = "'";
  for (char c : text) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

void check_allocation(const Config& config, GridShape grid) {
  const SlurmConfig& s = config.slurm;
  const int per_node = config.parallel.devices_per_node;
  const int64_t ranks = int64_t(s.nodes) * per_node;
  const int shards = grid.rows * grid.cols;
  if (ranks < shards || ranks % shards != 0) {
    const int nodes_needed = shards / std::gcd(shards, per_node);  // the fewest nodes that fit the grid
    throw ConfigError(fmt::format(
        "{}: parallel.grid [{}, {}] needs a multiple of {} ranks, but the job gets slurm.nodes {} x "
        "parallel.devices_per_node {} = {}; use slurm.nodes {} or a grid whose rows x cols divides {}",
        config.source_path, grid.rows, grid.cols, shards, s.nodes, per_node, ranks, nodes_needed, ranks));
  }
  const int64_t groups = ranks / shards;
  const int accumulate = config.training.accumulate;
  if (config.training.batch_size % (groups * accumulate) != 0)
    throw ConfigError(fmt::format(
        "{}: training.batch_size {} must be divisible by the {} sample groups of this job ({} ranks = slurm.nodes "
        "{} x parallel.devices_per_node {}, grid {}x{}){}",
        config.source_path, config.training.batch_size, groups, ranks, s.nodes, per_node, grid.rows, grid.cols,
        accumulate > 1 ? fmt::format(" times training.accumulate {}", accumulate) : ""));
  if (!slurm_time_seconds(s.time))
    throw ConfigError(fmt::format(
        "{}: slurm.time: expected a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS), found '{}'",
        config.source_path, s.time));
}

std::string choose_launcher(const std::string& srun_mpi_list) {
  if (srun_mpi_list.empty() || srun_mpi_list.find("pmix") != std::string::npos) return "srun --mpi=pmix";
  return "mpirun";
}

std::string absolute_run_dir(const Config& config, const std::string& workdir) {
  namespace fs = std::filesystem;
  fs::path dir(config.run_dir);
  if (dir.is_relative()) dir = fs::path(workdir) / dir;
  std::string out = dir.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

std::string sbatch_path(const Config& config, const std::string& workdir) {
  return absolute_run_dir(config, workdir) + "/job.sbatch";
}

namespace {

// What the script is built from, checked: the plan fills the allocation, paths are
// absolute, nothing holds a newline that would end an #SBATCH line or a command.
void check_submission(const Config& config, const ShardPlan& plan, const std::string& config_path_abs,
                      const SubmitOptions& options) {
  const SlurmConfig& s = config.slurm;
  const ParallelConfig& p = config.parallel;
  check_allocation(config, GridShape{plan.grid_rows, plan.grid_cols});
  const int ranks = s.nodes * p.devices_per_node;
  if (plan.world() != ranks)
    throw ConfigError(fmt::format("{}: the shard plan has {} ranks, the job {} (slurm.nodes {} x "
                                  "parallel.devices_per_node {})",
                                  config.source_path, plan.world(), ranks, s.nodes, p.devices_per_node));
  for (const auto& [what, path] : {std::pair<const char*, const std::string&>{"the halotrain path", options.halotrain},
                                   {"the working directory", options.workdir},
                                   {"the config path", config_path_abs}}) {
    if (path.empty() || path.front() != '/')
      throw ConfigError(fmt::format("{}: {} must be absolute, found '{}'", config.source_path, what, path));
    require_no_newline(what, path, config);
  }
  if (options.launcher.empty()) throw ConfigError("halotrain submit: the launcher is empty");
  require_no_newline("the launcher", options.launcher, config);
  for (const std::string& set : options.sets) require_no_newline("--set", set, config);
  if (options.cpus_per_task < 0)
    throw ConfigError(fmt::format("halotrain submit: --cpus-per-task must be >= 0, found {}", options.cpus_per_task));
}

// The #SBATCH lines: the job's name, logs, resources, time, signal and requeue.
void write_sbatch_options(std::ostringstream& o, const Config& config, const SubmitOptions& options,
                          const std::string& run_dir) {
  const SlurmConfig& s = config.slurm;
  const ParallelConfig& p = config.parallel;
  auto sb = [&](const std::string& option) { o << "#SBATCH " << option << "\n"; };
  sb("--job-name=" + sbatch_value("name", config.name, config));
  sb("--chdir=" + sbatch_value("the working directory", options.workdir, config));
  sb("--output=" + sbatch_value("run_dir", run_dir + "/slurm-%j.out", config));
  sb("--error=" + sbatch_value("run_dir", run_dir + "/slurm-%j.err", config));
  sb("--open-mode=append");  // a requeued job appends its next run to the same logs
  sb(fmt::format("--nodes={}", s.nodes));
  sb(fmt::format("--ntasks-per-node={}", p.devices_per_node));
  if (options.cpus_per_task > 0)
    sb(fmt::format("--cpus-per-task={}", options.cpus_per_task));
  else if (p.backend == Backend::CUDA)
    sb("--cpus-per-task=1");
  else
    sb("--exclusive");
  // --gres works with select/cons_res and cons_tres alike (older K80 clusters run cons_res).
  if (p.backend == Backend::CUDA) sb(fmt::format("--gres=gpu:{}", p.devices_per_node));
  sb("--time=" + sbatch_value("slurm.time", s.time, config));
  if (!s.partition.empty()) sb("--partition=" + sbatch_value("slurm.partition", s.partition, config));
  if (!s.account.empty()) sb("--account=" + sbatch_value("slurm.account", s.account, config));
  if (s.signal_before > 0) sb(fmt::format("--signal={}@{}", s.signal, s.signal_before));
  sb("--requeue");
  for (const std::string& line : s.extra) {
    require_no_newline("slurm.extra", line, config);
    if (line.rfind("#SBATCH", 0) == 0)
      o << line << "\n";
    else
      sb(line);
  }
}

// The job's body: the variables the ranks read, then the launch, again after a restart
// exit (recycle.mode restart) and not after a requeue.
void write_launch(std::ostringstream& o, const Config& config, const std::string& config_path_abs,
                  const SubmitOptions& options, const std::string& run_dir) {
  const bool restart = config.recycle.mode == RecycleMode::Restart && config.recycle.every_steps > 0;
  const int64_t max_launches =
      restart && config.training.steps > 0 ? config.training.steps / config.recycle.every_steps + 2 : 1000;
  std::string launch = options.launcher;
  // srun in Slurm 22.05+ does not take --cpus-per-task from the batch environment. Block
  // distribution puts rank r on node r / devices_per_node with local id r % devices_per_node,
  // as the plan assumes (node_of, local_device_of); every task sees all its node's GPUs.
  if (launch.rfind("srun", 0) == 0) launch += " --distribution=block --cpus-per-task=\"$cpus\"";
  launch += " \"$halotrain\" train \"$config\"";
  for (const std::string& set : options.sets) launch += " --set " + shell_quote(set);

  o << "\nset -euo pipefail\n\n";
  o << "# For sbatch only: the #SBATCH lines above are this job's resources.\n";
  o << "if [[ -z ${SLURM_JOB_ID:-} ]]; then\n";
  o << "  echo \"$0: SLURM_JOB_ID is not set: submit this script with sbatch (or halotrain submit), do not run "
       "it directly\" >&2\n";
  o << "  exit 1\n";
  o << "fi\n\n";
  o << "halotrain=" << shell_quote(options.halotrain) << "\n";
  o << "config=" << shell_quote(config_path_abs) << "\n";
  o << "run_dir=" << shell_quote(run_dir) << "\n";
  o << "relaunch_on_exit3=" << (restart ? 1 : 0) << "  # recycle.mode restart: ranks exit 3 to be launched again\n";
  o << "max_launches=" << max_launches << "\n\n";
  o << "# CPU threads per rank: what Slurm gave each task, else the node split among its ranks.\n";
  o << "cpus=${SLURM_CPUS_PER_TASK:-$(( ${SLURM_CPUS_ON_NODE:-1} / ${SLURM_NTASKS_PER_NODE:-1} ))}\n";
  o << "(( cpus >= 1 )) || cpus=1\n";
  o << "export OMP_NUM_THREADS=$cpus\n\n";
  o << "echo \"halotrain: job $SLURM_JOB_ID run ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST:-?}: "
       "${SLURM_NTASKS:-?} ranks, $cpus CPUs each\"\n";
  o << "for ((launch = 1; ; launch++)); do\n";
  o << "  rm -f \"$run_dir/.requeued\"\n";
  o << "  rc=0\n";
  o << "  # Each rank reads its rank, local rank and node from SLURM_PROCID/LOCALID/NODEID.\n";
  o << "  " << launch << " || rc=$?\n";
  o << "  if [[ -e $run_dir/.requeued ]]; then\n";
  o << "    echo \"halotrain: checkpointed and requeued job $SLURM_JOB_ID; it resumes when it runs again\"\n";
  o << "    exit 0\n";
  o << "  fi\n";
  o << "  if (( rc == 3 && relaunch_on_exit3 && launch < max_launches )); then\n";
  o << "    echo \"halotrain: ranks stopped for a restart (recycle.mode restart); launching them again\"\n";
  o << "    continue\n";
  o << "  fi\n";
  o << "  if (( rc == 3 )); then\n";
  o << "    echo \"halotrain: ranks stopped with a checkpoint (exit 3) and the job was not requeued; submit "
       "again to resume\" >&2\n";
  o << "  fi\n";
  o << "  exit \"$rc\"\n";
  o << "done\n";
}

}  // namespace

std::string render_sbatch(const Config& config, const ShardPlan& plan, const std::string& config_path_abs,
                          const SubmitOptions& options) {
  check_submission(config, plan, config_path_abs, options);
  const std::string run_dir = absolute_run_dir(config, options.workdir);
  std::ostringstream o;
  o << "#!/bin/bash\n";
  o << "# halotrain job '" << config.name << "', written by `halotrain submit`. Submit it again with\n";
  o << "#   sbatch " << run_dir << "/job.sbatch\n";
  write_sbatch_options(o, config, options, run_dir);
  write_launch(o, config, config_path_abs, options, run_dir);
  return o.str();
}

std::optional<uint64_t> smallest_node_memory(const std::string& sinfo_out) {
  std::optional<uint64_t> least;
  std::istringstream lines(sinfo_out);
  for (std::string line; std::getline(lines, line);) {
    size_t i = 0;
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    uint64_t mb = 0;
    size_t digits = 0;
    for (; i < line.size() && std::isdigit(static_cast<unsigned char>(line[i])) && digits < 12; ++i, ++digits)
      mb = mb * 10 + uint64_t(line[i] - '0');
    if (digits == 0 || mb == 0) continue;  // a header, or a node whose memory Slurm does not know
    const uint64_t bytes = mb << 20;
    if (!least || bytes < *least) least = bytes;
  }
  return least;
}

}  // namespace ht
