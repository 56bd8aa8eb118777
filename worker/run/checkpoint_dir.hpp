// run_dir/checkpoints as one run owns it: only the run that holds its lock writes there,
// and a run never deletes or replaces a checkpoint it did not write, nor the newest valid
// one. Rank 0 holds the CheckpointDir for the whole run (recycles included).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "orchestrator/config.hpp"

namespace ht {

// The ckpt-<step>.h5 files of `dir`, newest first; nothing when `dir` does not exist.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

// The checkpoint `checkpoint.resume` asks for: the newest one in run_dir/checkpoints whose
// checksum verifies (`auto`; torn or corrupt newer files are skipped with a warning naming
// them), none (`never`), or the given path. Empty: start fresh. Throws ConfigError for a
// named file that is missing or corrupt.
std::string find_resume_checkpoint(const Config& config, bool verbose);

class CheckpointDir {
 public:
  // Claims config.run_dir/checkpoints: creates it, checks that it can be written (ConfigError
  // naming `run_dir` otherwise), takes its writer lock (ConfigError naming the pid and host
  // of a live run that holds it) and removes the temporary files of earlier writers that
  // died mid-write: only the lock holder writes there, so every one left is stale.
  explicit CheckpointDir(const Config& config);
  ~CheckpointDir();
  CheckpointDir(const CheckpointDir&) = delete;
  CheckpointDir& operator=(const CheckpointDir&) = delete;

  const std::string& path() const { return dir_; }

  // Before the first step of a run that starts after `start_step` steps (0: fresh), from
  // `resumed_from` ("" for none): ConfigError when going on would replace checkpoints of
  // another run: `checkpoint.resume: never` over a directory that holds some, or valid
  // files newer than `start_step` (a resume from an older path). Newer files that do not
  // verify are left alone and never counted.
  void check_start(int64_t start_step, const std::string& resumed_from);

  // After the checkpoint of `step` is on disk: keeps the newest `checkpoint.keep` valid
  // checkpoints up to `step` and deletes the older ones. Files that do not verify are not
  // counted; files newer than `step` are never touched.
  void prune_after(int64_t step);

 private:
  bool valid(int64_t step, const std::string& file);  // verified once, then remembered

  std::string dir_;
  std::string run_dir_;
  int keep_ = 1;
  int lock_fd_ = -1;
  std::set<int64_t> valid_;    // steps known to verify (written or checked by this run)
  std::set<int64_t> invalid_;  // steps seen not to verify (warned once)
};

}  // namespace ht
