// Stop requests from outside: Slurm's warning signal before the time limit (slurm.signal,
// USR2 by default; the sbatch script asks for it with --signal=<sig>@<s>, which Slurm sends
// to the srun-launched ranks) asks for checkpoint + requeue; SIGTERM (scancel, time limit,
// preemption) asks for checkpoint + exit. The handlers only set flags; the trainer polls
// pending_stop() at each step boundary and all ranks agree before acting.
//
// Contract with the sbatch script (orchestrator/slurm.cpp): a stop exits with code 3. When
// the job requeued itself, run_dir/.requeued exists (it holds the job id), and the script
// ends quietly instead of relaunching; without it, exit 3 means "relaunch me" under
// recycle.mode restart. The script removes the marker before every launch.
#pragma once

#include <csignal>
#include <string>

namespace ht {

// Ordered by strength: a max-reduce over ranks gives the strongest request.
enum class StopRequest { None = 0, Requeue = 1, Terminate = 2 };

// The signal number of "USR2", "SIGUSR1", "TERM", ... (case-insensitive); -1 if unknown.
int signal_number(const std::string& name);

// Installs handlers for `warning_signal` (-> Requeue), SIGTERM (-> Terminate) and SIGINT
// (the first -> Terminate, a second ends the process at once), each unless it is the
// warning signal. Idempotent. Throws std::invalid_argument for an unknown name.
//
// `grace_seconds` > 0 also starts a watchdog: a stop request still not acted on after
// that long (the process is blocked in a read or in a collective whose peer is gone or
// stopped) ends the process with exit 1 and a message saying so; the checkpoints on
// disk are untouched (a write cut short leaves only its temporary file).
void install_stop_handlers(const std::string& warning_signal, int grace_seconds = 0);

// The trainer acted on the stop request (its checkpoint is being written): the watchdog
// stands down.
void stop_request_taken();

// The run moved on (a layer, a validation round, a checkpoint): the watchdog measures its
// grace from the last call, so only a run that is stuck is ended, not a slow one.
void note_progress();

// SIGTERM, SIGINT and the warning signal (ignored when <= 0): the stop signals a
// supervisor forwards, and blocks in a worker it starts until install_stop_handlers runs.
sigset_t stop_signal_set(int warning_signal);

// What the signals asked for so far; Requeue wins when both arrived (the warning came
// first, and the SIGTERM is then Slurm ending this run of the job).
StopRequest pending_stop();

// Forgets the requests seen so far (tests, or after acting on one).
void clear_stop_requests();

// run_dir/.requeued: present after a successful request_requeue of this run.
std::string requeue_marker_path(const std::string& run_dir);

// For rank 0, after the checkpoint is on disk and every rank knows it: writes the marker,
// then runs `scontrol requeue $SLURM_JOB_ID` (30 s limit). Slurm then ends this run of the
// job (SIGTERM to every process, SIGKILL after KillWait) and queues it again; the ranks
// should simply exit 3. False with the reason (and no marker left) when SLURM_JOB_ID is
// unset or scontrol fails.
bool request_requeue(const std::string& run_dir, std::string* error);

}  // namespace ht
