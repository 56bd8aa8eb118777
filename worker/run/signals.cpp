#include "worker/run/signals.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <csignal>
#include <pthread.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "orchestrator/process.hpp"

namespace ht {

namespace {

// Written only by the handlers, read by pending_stop: sig_atomic_t is all a handler may touch.
volatile std::sig_atomic_t g_requeue = 0;
volatile std::sig_atomic_t g_terminate = 0;

volatile std::sig_atomic_t g_interrupts = 0;

extern "C" void on_warning(int) { g_requeue = 1; }
extern "C" void on_terminate(int) { g_terminate = 1; }
// Ctrl-C: the first asks for a clean stop as SIGTERM does; a second ends the process at
// once, as a user pressing it again expects (signal() and raise() are async-signal-safe).
extern "C" void on_interrupt(int sig) {
  if (g_interrupts) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_interrupts = 1;
  g_terminate = 1;
}

void install(int sig, void (*handler)(int)) {
  struct sigaction sa {};
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = handler;
  // Restart interrupted reads/writes: a signal must not turn into an I/O error mid-step.
  sa.sa_flags = SA_RESTART;
  if (sigaction(sig, &sa, nullptr) != 0) throw std::runtime_error(fmt::format("sigaction({}) failed", sig));
}

}  // namespace

int signal_number(const std::string& text) {
  std::string name = text;
  for (char& c : name) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  if (name == "USR1") return SIGUSR1;
  if (name == "USR2") return SIGUSR2;
  if (name == "TERM") return SIGTERM;
  if (name == "INT") return SIGINT;
  if (name == "HUP") return SIGHUP;
  if (name == "ALRM") return SIGALRM;
  return -1;
}

namespace {

std::atomic<bool> g_taken{false};
std::atomic<uint64_t> g_progress{0};

// Polls the flags the handlers set; ends the process when a request goes unanswered.
void watch(int grace_seconds) {
  using clock = std::chrono::steady_clock;
  std::optional<clock::time_point> since;
  uint64_t seen = g_progress;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const uint64_t progress = g_progress;
    if (pending_stop() == StopRequest::None || g_taken || progress != seen) {
      seen = progress;
      since.reset();
      continue;
    }
    if (!since) since = clock::now();
    if (clock::now() - *since < std::chrono::seconds(grace_seconds)) continue;
    // Only async-signal-safe-ish calls from here: the other threads may hold any lock.
    const std::string msg = fmt::format(
        "a stop was requested and the run has made no progress for {} s (slurm.signal_before): it is blocked "
        "reading data or waiting for another rank; exiting without a new checkpoint (the ones in "
        "run_dir/checkpoints are intact)\n",
        grace_seconds);
    const ssize_t ignored = ::write(2, msg.data(), msg.size());
    (void)ignored;
    std::_Exit(1);
  }
}

}  // namespace

void stop_request_taken() { g_taken = true; }
void note_progress() { ++g_progress; }

void install_stop_handlers(const std::string& warning_signal, int grace_seconds) {
  static std::once_flag watchdog;
  if (grace_seconds > 0)
    std::call_once(watchdog, [grace_seconds] { std::thread(watch, grace_seconds).detach(); });
  const int warning = signal_number(warning_signal);
  if (warning < 0) throw std::invalid_argument(fmt::format("slurm.signal: unknown signal '{}'", warning_signal));
  install(warning, on_warning);
  if (warning != SIGTERM) install(SIGTERM, on_terminate);
  if (warning != SIGINT) install(SIGINT, on_interrupt);
  // A supervisor starts its worker with these blocked (block_stop_signals), so that one
  // sent before the handlers exist waits instead of killing the process: now it may come.
  sigset_t set = stop_signal_set(warning);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

sigset_t stop_signal_set(int warning_signal) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  if (warning_signal > 0) sigaddset(&set, warning_signal);
  return set;
}

StopRequest pending_stop() {
  if (g_requeue) return StopRequest::Requeue;
  if (g_terminate) return StopRequest::Terminate;
  return StopRequest::None;
}

void clear_stop_requests() {
  g_taken = false;
  g_requeue = 0;
  g_terminate = 0;
  g_interrupts = 0;
}

std::string requeue_marker_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / ".requeued").string();
}

bool request_requeue(const std::string& run_dir, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) *error = why;
    return false;
  };
  const char* job = std::getenv("SLURM_JOB_ID");
  if (!job || !*job) return fail("SLURM_JOB_ID is not set (not running under Slurm)");
  const std::string id = job;
  if (!std::all_of(id.begin(), id.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return fail(fmt::format("SLURM_JOB_ID '{}' is not a job id", id));
  // The marker first: `scontrol requeue` ends this run at once, and a batch script that
  // outlives the SIGTERM must already see it.
  const std::string marker = requeue_marker_path(run_dir);
  {
    std::ofstream out(marker, std::ios::trunc);
    out << id << "\n";
    if (!out.flush()) return fail(fmt::format("cannot write {}", marker));
  }
  const CommandResult r = run_command({"scontrol", "requeue", id}, 30);
  if (r.started && r.exit_code == 0) return true;
  std::error_code ignored;
  std::filesystem::remove(marker, ignored);
  std::string why = r.err.empty() ? r.error : r.err;
  while (!why.empty() && std::isspace(static_cast<unsigned char>(why.back()))) why.pop_back();
  if (!r.started) return fail(fmt::format("cannot run scontrol: {}", why));
  return fail(fmt::format("'scontrol requeue {}' failed (exit {}): {}", id, r.exit_code, why));
}

}  // namespace ht
