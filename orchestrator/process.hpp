// Running a program (sbatch, srun, scontrol) and collecting what it printed. No shell:
// the arguments go to the program as they are.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ht {

struct CommandResult {
  bool started = false;  // false: the program could not be run (see `error`)
  int exit_code = -1;    // the exit status; 128 + n when killed by signal n
  bool timed_out = false;
  std::string out, err;  // its stdout and stderr
  std::string error;     // why it did not start, or how it ended abnormally
};

// Runs argv[0] (looked up on PATH) with the other arguments; kills it after `timeout_s`
// seconds (0: no limit). Thread-safe; uses posix_spawn, so it is fine inside MPI ranks.
CommandResult run_command(const std::vector<std::string>& argv, int timeout_s = 60);

// The full path of `name` on PATH, or nullopt.
std::optional<std::string> find_on_path(const std::string& name);

}  // namespace ht
