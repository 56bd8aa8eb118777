#include "worker/run/checkpoint_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "orchestrator/files.hpp"
#include "worker/run/checkpoint.hpp"
#include "worker/runtime/log.hpp"

namespace fs = std::filesystem;

namespace ht {

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) != 0 || e.path().extension() != ".h5") continue;
    const std::string digits = name.substr(5, name.size() - 5 - 3);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
      continue;
    try {
      found.emplace_back(std::stoll(digits), e.path().string());
    } catch (const std::exception&) {  // more digits than a step can have: not ours
    }
  }
  std::sort(found.rbegin(), found.rend());
  return found;
}

namespace {

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// A checkpoint's temporary name is "<final>.tmp-<pid>" (h5::temp_path).
constexpr int kLockTries = 50;  // 5 s in steps of 100 ms

bool is_temporary(const std::string& name) {
  return (name.rfind("ckpt-", 0) == 0 || name.rfind("best.h5", 0) == 0) && name.find(".h5.tmp-") != std::string::npos;
}

}  // namespace

CheckpointDir::CheckpointDir(const Config& config)
    : dir_((fs::path(config.run_dir) / "checkpoints").string()),
      run_dir_(config.run_dir),
      keep_(std::max(config.checkpoint.keep, 1)) {
  for (const std::string& d : {run_dir_, dir_})
    if (const std::string problem = writable_directory_problem(d); !problem.empty())
      throw ConfigError(fmt::format("{}: run_dir {}: {} {}; set run_dir to a directory this process can write",
                                    config.source_path, config.run_dir, d, problem));

  // The lock lives as long as this object: flock is released by the kernel when the
  // process dies, however it dies, so a lock file left behind never blocks a later run.
  const std::string lock = (fs::path(dir_) / ".lock").string();
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0)
    throw ConfigError(fmt::format("run_dir {}: cannot open {}: {}", run_dir_, lock, std::strerror(errno)));
  // A requeued job may start while the run it replaces is still on its way out: wait a little.
  int err = 0;
  for (int tries = 0; ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0; ++tries) {
    err = errno;
    if (err != EWOULDBLOCK || tries == kLockTries) break;
    if (tries == 0) log().info("{}: another run holds it; waiting up to {} s", lock, kLockTries / 10);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    err = 0;
  }
  if (err != 0) {
    if (err == EWOULDBLOCK) {
      std::string holder;
      std::getline(std::ifstream(lock), holder);
      ::close(lock_fd_);
      lock_fd_ = -1;
      throw ConfigError(fmt::format(
          "run_dir {} is in use by another training run ({}); wait for it to end, or give this run its own "
          "run_dir",
          run_dir_, holder.empty() ? "holder unknown" : holder));
    }
    // File systems without locks: train on, but leave temporaries alone (one may be live).
    log().warn("{}: cannot lock ({}); stale temporary checkpoint files are not cleaned up", lock,
               std::strerror(err));
    ::close(lock_fd_);
    lock_fd_ = -1;
    return;
  }
  const std::string me = fmt::format("pid {} on {}\n", long(::getpid()), host_name());
  if (::ftruncate(lock_fd_, 0) != 0 || ::write(lock_fd_, me.data(), me.size()) < 0)
    log().warn("{}: cannot record this run in the lock file: {}", lock, std::strerror(errno));

  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_temporary(name)) continue;
    std::error_code rm;
    if (fs::remove(e.path(), rm))
      log().info("removed {}: the temporary file of a checkpoint write that did not finish", e.path().string());
    else if (rm)
      log().warn("cannot remove the stale temporary {}: {}", e.path().string(), rm.message());
  }
}

CheckpointDir::~CheckpointDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

bool CheckpointDir::valid(int64_t step, const std::string& file) {
  if (valid_.count(step)) return true;
  if (invalid_.count(step)) return false;
  const std::string problem = checkpoint_problem(file);
  if (problem.empty()) {
    valid_.insert(step);
    return true;
  }
  invalid_.insert(step);
  log().warn("{}: {}; not counted among the {} checkpoints kept, and left in place", file, problem, keep_);
  return false;
}

void CheckpointDir::check_start(int64_t start_step, const std::string& resumed_from) {
  const auto found = list_checkpoints(dir_);
  std::vector<std::string> names;
  for (const auto& [step, file] : found) names.push_back(fs::path(file).filename().string());
  // A best checkpoint is another run's too: a fresh run would replace it.
  const std::string best = (fs::path(dir_) / "best.h5").string();
  const bool best_valid = fs::exists(best) && checkpoint_problem(best).empty();
  if (best_valid) names.push_back("best.h5");
  if (resumed_from.empty() && start_step == 0 && (!found.empty() || best_valid)) {
    // checkpoint.resume: never, or auto over files none of which verifies.
    bool any_valid = best_valid;
    for (const auto& [step, file] : found) any_valid = any_valid || valid(step, file);
    if (any_valid)
      throw ConfigError(fmt::format(
          "run_dir {}: {} already holds checkpoints of another run ({}) and checkpoint.resume is never: "
          "training would replace them; use a new run_dir, move them away, or set checkpoint.resume: auto "
          "to go on from the newest",
          run_dir_, dir_, fmt::join(names, ", ")));
  }
  std::vector<std::string> newer;
  for (const auto& [step, file] : found)
    if (step > start_step && valid(step, file)) newer.push_back(fs::path(file).filename().string());
  if (!newer.empty())
    throw ConfigError(fmt::format(
        "run_dir {}: {} holds checkpoints newer than step {} that this run resumes from ({}): training on "
        "would replace them; move them away or give this run its own run_dir",
        run_dir_, dir_, start_step, fmt::join(newer, ", ")));
  if (!resumed_from.empty() && fs::path(resumed_from).parent_path() == fs::path(dir_)) valid_.insert(start_step);
}

void CheckpointDir::prune_after(int64_t step) {
  valid_.insert(step);
  invalid_.erase(step);  // the file just written replaced whatever had that name
  int kept = 0;
  for (const auto& [s, file] : list_checkpoints(dir_)) {
    if (s > step) continue;  // not this run's: never touched
    if (kept < keep_) {
      if (valid(s, file)) ++kept;
      continue;
    }
    std::error_code ec;
    fs::remove(file, ec);
    if (ec) log().warn("cannot remove the old checkpoint {}: {}", file, ec.message());
    valid_.erase(s);
  }
}

std::string find_resume_checkpoint(const Config& config, bool verbose) {
  const std::string& mode = config.checkpoint.resume;
  if (mode == "never") return "";
  if (mode != "auto") {
    if (const std::string problem = input_file_problem(mode); !problem.empty())
      throw ConfigError(fmt::format("checkpoint.resume {}: {}", mode, problem));
    const std::string problem = checkpoint_problem(mode);
    if (!problem.empty()) throw ConfigError(fmt::format("checkpoint.resume {}: {}", mode, problem));
    return mode;
  }
  std::vector<std::string> skipped;
  for (const auto& [step, path] : list_checkpoints((fs::path(config.run_dir) / "checkpoints").string())) {
    const std::string problem = checkpoint_problem(path);
    if (problem.empty()) {
      if (verbose && !skipped.empty())
        log().warn("resume: using {} instead of the newer {}", path, fmt::join(skipped, ", "));
      return path;
    }
    if (verbose) log().warn("resume: skipping {}: {}", path, problem);
    skipped.push_back(path);
  }
  if (verbose && !skipped.empty()) log().warn("resume: no valid checkpoint in {}; starting fresh", config.run_dir);
  return "";
}

}  // namespace ht
