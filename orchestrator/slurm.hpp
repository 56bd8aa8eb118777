// The sbatch script of `halotrain submit` (SPEC section 2 and 3 `slurm:`). Pure: renders
// text from the config and the plan; running sbatch is orchestrator/submit.cpp.
//
// What the script does, and why:
// - one Slurm task per rank: --nodes = slurm.nodes, --ntasks-per-node =
//   parallel.devices_per_node; each rank finds its rank, local rank and node in
//   SLURM_PROCID / SLURM_LOCALID / SLURM_NODEID (srun sets them; MPI agrees).
// - the warning signal is `--signal=<sig>@<s>` WITHOUT `B:`: Slurm then sends it to the
//   srun-launched halotrain ranks (every job step), which checkpoint and requeue. With
//   `B:` only the batch shell would get it, and it would have to forward it.
// - the ranks exit 3 when they stopped with a checkpoint written. If the job requeued
//   itself they left run_dir/.requeued (worker/run/signals.hpp), and the script ends; else,
//   under recycle.mode restart, it launches them again (they resume), otherwise it exits 3.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "orchestrator/config.hpp"
#include "orchestrator/shard_plan.hpp"

namespace ht {

// How the job is launched; everything the config does not say.
struct SubmitOptions {
  std::string halotrain;          // absolute path of the halotrain binary the job runs
  std::string workdir;            // absolute; the job's --chdir, where relative config paths resolve
  std::vector<std::string> sets;  // --set overrides, passed on to `halotrain train`
  // Starts one rank per Slurm task. `srun --mpi=pmix` where Slurm has PMIx (OpenMPI 4 as
  // Debian builds it has no PMI-2 client); `mpirun` inside the allocation otherwise.
  std::string launcher = "srun --mpi=pmix";
  // CPUs per rank. 0: 1 for cuda (a rank mostly feeds its GPU); for cpu whole nodes
  // (--exclusive), split evenly among the node's ranks at run time.
  int cpus_per_task = 0;
};

// Checks that the allocation can run this grid and batch, before a plan is made:
// nodes * devices_per_node ranks must be a multiple of the grid's shards, and the batch
// divisible by the sample groups. Throws ConfigError naming the keys and the numbers.
void check_allocation(const Config& config, GridShape grid);

// The text of run_dir/job.sbatch. Validates first (check_allocation, slurm.time, the plan
// matches the allocation, no line breaks in values) and throws ConfigError.
std::string render_sbatch(const Config& config, const ShardPlan& plan, const std::string& config_path_abs,
                          const SubmitOptions& options);

// The launcher to use given what `srun --mpi=list` printed ("" when srun is missing or
// failed): `srun --mpi=pmix` when PMIx is listed or nothing is known, else `mpirun`.
std::string choose_launcher(const std::string& srun_mpi_list);

// The memory of the partition's smallest node, in bytes, from `sinfo -h -N -o %m` (one
// line of megabytes per node, "+" after a lower bound); nullopt when it names none.
std::optional<uint64_t> smallest_node_memory(const std::string& sinfo_out);

// Absolute run_dir (relative ones resolve against `workdir`), and the script's path in it.
std::string absolute_run_dir(const Config& config, const std::string& workdir);
std::string sbatch_path(const Config& config, const std::string& workdir);

// `text` as one bash word: unchanged when it is plainly safe, else single-quoted.
std::string shell_quote(const std::string& text);

}  // namespace ht
