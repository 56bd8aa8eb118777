// `halotrain submit CONFIG [--dry-run] [--set ...]`: validates the config against the
// allocation, renders run_dir/job.sbatch (orchestrator/slurm.hpp) and runs
// `sbatch --parsable` on it; `--dry-run` prints the script and submits nothing.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ht {

struct SubmitCommand {
  std::string config_path;
  std::vector<std::string> sets;
  bool dry_run = false;
  std::string launcher;   // "": `srun --mpi=pmix` if `srun --mpi=list` has PMIx, else `mpirun`
  int cpus_per_task = 0;  // 0: see SubmitOptions::cpus_per_task
};

// Returns the exit code: 0 submitted (job id on `out`) or printed; 1 a user error (bad
// config, grid vs allocation, no sbatch, sbatch refused: one message on `err`).
// Throws ConfigError for config errors, like the other commands.
int run_submit(const SubmitCommand& command, std::ostream& out, std::ostream& err);

}  // namespace ht
