#!/usr/bin/env bash
# Slurm end to end (ctest label `slurm`): a real single-node Slurm on localhost
# (slurm/local-cluster), `halotrain submit`, and the checkpoints the jobs leave.
#
# usage: e2e.sh HALOTRAIN WORKDIR SCENARIO...
#   bad_input   no sbatch on PATH, malformed slurm.time, too large a grid, batch vs ranks,
#               the script run without sbatch: exit 1 with a message, nothing written
#   completes   2 ranks on 1 node; the job COMPLETES and its last checkpoint equals a local
#               `halotrain train` of the same config, bit for bit
#   restart     recycle.mode restart: the ranks exit 3 every 2 steps and the script launches
#               them again; completes with the weights of a local run
#   requeue     `scancel --signal=USR2` mid-run: checkpoint, `scontrol requeue` (Restarts=1),
#               resume; completes with the weights of an uninterrupted run
#   kill_rank   one rank SIGKILLed: the job fails within 60 s with a message in its log,
#               the last checkpoint is intact, and submitting again resumes from it
#   two_nodes   a 2-node cluster (slurm/local-cluster start --nodes 2: network namespaces),
#               slurm.nodes 2 x 2 ranks: each rank runs on the node and device the plan
#               gives it, its measured halo bytes per step (same host / other hosts) equal
#               the plan's intra- and inter-node figures, and the weights equal a local run
#   node_loss   the same job, node 2 killed mid-run (its slurmd and ranks): the job ends
#               within 60 s, the newest checkpoint is intact, and with the node back the
#               job (requeued by Slurm, or submitted again) ends with an uninterrupted
#               run's weights
#
# Exit 0 passed, 1 failed, 77 skipped (no Slurm packages, or not root).
# Every wait has a deadline; the cluster is stopped on exit, failure included. The cluster
# lives in $HALOTRAIN_SLURM_DIR (default /tmp/halotrain-slurm-test) on its own ports.
set -euo pipefail

(($# >= 3)) || { echo "usage: $0 HALOTRAIN WORKDIR SCENARIO..." >&2; exit 2; }
# No Slurm here (or not root, which slurmd needs): skip, as GPU tests do without a GPU.
for tool in slurmctld slurmd munged sbatch scontrol; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (Debian: slurm-wlm munge)"; exit 77; }
done
[[ $(id -u) == 0 ]] || { echo "SKIP: the local Slurm cluster needs root"; exit 77; }
HALOTRAIN=$(realpath "$1")
WORK=$2
shift 2
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$SRC/slurm/local-cluster
PY=/usr/bin/python3
export HALOTRAIN_SLURM_DIR=${HALOTRAIN_SLURM_DIR:-/tmp/halotrain-slurm-test}
export HALOTRAIN_SLURM_PORT=${HALOTRAIN_SLURM_PORT:-16827}
export HALOTRAIN_SLURM_PARTITION=local
export OMP_NUM_THREADS=1  # the local reference runs as the job's ranks do: 1 thread each
mkdir -p "$WORK"
WORK=$(realpath "$WORK")

failures=0
cluster_up=0
log() { echo "[e2e $(date +%T)] $*"; }
fail() { echo "[e2e] FAIL: $*" >&2; failures=$((failures + 1)); return 1; }

cleanup() {
  if ((cluster_up)); then
    # Cancel what still runs so no rank outlives the cluster, then stop the daemons.
    timeout 10 scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 1 30); do
      [[ -z $(timeout 5 squeue -h -t running,completing 2>/dev/null) ]] && break
      sleep 0.5
    done
    "$CLUSTER" stop >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
trap 'exit 1' TERM INT  # a ctest timeout or ^C still stops the cluster

start_cluster() {  # start_cluster [NODES]
  local env nodes=${1:-1}
  ((cluster_up)) && return 0
  cluster_up=1
  env=$("$CLUSTER" start --nodes "$nodes") || { fail "the local cluster did not start"; return 1; }
  eval "$env"
  log "cluster up: $SLURM_CONF"
}

# The demo model on small synthetic images; $1 = run_dir, $2 = steps, $3 = H, $4 = W.
sets_for() {
  local run_dir=$1 steps=$2 h=$3 w=$4
  SETS=(--set "run_dir=$run_dir" --set "training.steps=$steps" --set "checkpoint.every_steps=$5"
        --set checkpoint.keep=3 --set training.log_every=1
        --set "data.synthesize={count: 8, height: $h, width: $w, channels: 1, classes: 2}"
        --set "model.input=[$h, $w, 1]" --set "data.train=$WORK/data-${h}x$w.h5"
        --set "data.validation=$WORK/val-${h}x$w.h5"
        --set slurm.partition=local --set slurm.time=10 --set slurm.nodes=1
        --set parallel.devices_per_node=2 --set "parallel.grid=[2, 1]")
}
CFG=$SRC/configs/demo.yaml

job_field() {  # job_field ID KEY: the value of KEY= in `scontrol show job`
  timeout 10 scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# Waits until job $1 reaches one of the states in $2 (regex); fails after $3 seconds.
wait_state() {
  local id=$1 want=$2 state="" deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    state=$(job_field "$id" JobState)
    [[ $state =~ ^($want)$ ]] && { echo "$state"; return 0; }
    [[ $state =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)$ ]] && break
    sleep 0.5
  done
  echo "$state"
  return 1
}

show_logs() {  # the job's logs, for a failure message
  local dir=$1
  for f in "$dir"/slurm-*.out "$dir"/slurm-*.err; do
    [[ -e $f ]] && { echo "---- $f"; tail -n 25 "$f"; }
  done >&2
  return 0
}

# ls -v: ckpt-100 after ckpt-20 (the names are ours, no odd characters).
# shellcheck disable=SC2012
newest_ckpt() { ls -1v "$1"/checkpoints/ckpt-*.h5 2>/dev/null | tail -n 1; }

# Both checkpoints verify, and hold the same datasets with the same bytes and the same
# attributes. The config text differs in run_dir, so it and the checksum over it are left out.
same_weights() {
  local f
  for f in "$1" "$2"; do
    timeout 30 "$HALOTRAIN" inspect "$f" | grep -q "checksum: OK" || { echo "$f: checksum does not verify" >&2; return 1; }
  done
  "$PY" - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
def items(f):
    out = {}
    def visit(name, obj):
        for k, v in obj.attrs.items():
            if (name, k) != ("halotrain", "checksum"):
                out["@" + name + "/" + k] = np.asarray(v)
        if isinstance(obj, h5py.Dataset) and name != "halotrain/config_text":
            out[name] = obj[()]
    f.visititems(visit)
    for k, v in f.attrs.items():
        out["@/" + k] = np.asarray(v)
    return out
x, y = items(a), items(b)
bad = sorted(set(x) ^ set(y))
bad += [k for k in sorted(set(x) & set(y))
        if np.asarray(x[k]).dtype != np.asarray(y[k]).dtype or np.asarray(x[k]).tobytes() != np.asarray(y[k]).tobytes()]
if bad:
    print("checkpoints differ in:", ", ".join(bad[:10]), file=sys.stderr)
    sys.exit(1)
print(f"identical: {len(x)} datasets and attributes")
PY
}

submit() {  # submit ARGS... -> prints the job id
  timeout 60 "$HALOTRAIN" submit "$CFG" "$@" 2>>"$WORK/submit.log"
}

# A local (threads) run of the same config, the reference for the job's weights.
reference_run() {  # reference_run RUN_DIR STEPS H W EVERY [--set ...]
  sets_for "$1" "$2" "$3" "$4" "$5"
  rm -rf "$1"
  timeout 300 "$HALOTRAIN" train "$CFG" "${SETS[@]}" "${@:6}" >"$WORK/$(basename "$1").log" 2>&1 ||
    { tail -n 20 "$WORK/$(basename "$1").log" >&2; fail "reference run $1 failed"; }
}

expect_exit1() {  # expect_exit1 WHAT PATTERN COMMAND...: exit 1 and PATTERN in the output
  local what=$1 pattern=$2 out code=0
  shift 2
  out=$("$@" 2>&1) || code=$?
  if [[ $code != 1 ]] || ! grep -qiE "$pattern" <<<"$out"; then
    fail "$what: expected exit 1 and /$pattern/, got exit $code: $out"
    return 1
  fi
  log "ok: $what -> $(grep -iE "$pattern" <<<"$out" | head -n 1)"
}

scenario_bad_input() {
  local run=$WORK/bad/run
  rm -rf "$WORK/bad"
  sets_for "$run" 6 128 96 2
  expect_exit1 "no sbatch on PATH" "sbatch not found" env PATH=/nonexistent "$HALOTRAIN" submit "$CFG" "${SETS[@]}"
  expect_exit1 "malformed slurm.time" "slurm.time" "$HALOTRAIN" submit "$CFG" "${SETS[@]}" --set slurm.time=1:2:3:4
  expect_exit1 "grid larger than the allocation" "needs a multiple of 8 ranks" \
    "$HALOTRAIN" submit "$CFG" "${SETS[@]}" --set "parallel.grid=[4, 2]"
  expect_exit1 "batch not divisible by the sample groups" "batch_size 3 must be divisible" \
    "$HALOTRAIN" submit "$CFG" "${SETS[@]}" --set "parallel.grid=[1, 1]" --set training.batch_size=3
  [[ ! -e $run ]] || fail "a refused submit wrote $run"
  # The script itself refuses to run outside sbatch.
  mkdir -p "$WORK/bad"
  "$HALOTRAIN" submit "$CFG" "${SETS[@]}" --dry-run >"$WORK/bad/job.sbatch"
  expect_exit1 "job.sbatch run without sbatch" "SLURM_JOB_ID is not set" env -u SLURM_JOB_ID bash "$WORK/bad/job.sbatch"
}

scenario_completes() {
  local run=$WORK/completes/run ref=$WORK/completes/ref id state
  rm -rf "$WORK/completes"
  reference_run "$ref" 6 128 96 2 || return 1
  start_cluster || return 1
  sets_for "$run" 6 128 96 2
  id=$(submit "${SETS[@]}") || { fail "halotrain submit failed: $(tail -n 3 "$WORK/submit.log")"; return 1; }
  log "submitted job $id"
  state=$(wait_state "$id" COMPLETED 120) || { show_logs "$run"; fail "job $id ended $state, expected COMPLETED"; return 1; }
  log "job $id $state ($(job_field "$id" NumTasks) tasks)"
  [[ -s $run/job.sbatch ]] || fail "no $run/job.sbatch"
  [[ -e $run/checkpoints/ckpt-6.h5 ]] || { show_logs "$run"; fail "no ckpt-6.h5 in $run"; return 1; }
  same_weights "$run/checkpoints/ckpt-6.h5" "$ref/checkpoints/ckpt-6.h5" || fail "job weights differ from the local run"
}

scenario_restart() {
  local run=$WORK/restart/run ref=$WORK/restart/ref id state launches
  local restart=(--set recycle.mode=restart --set recycle.every_steps=2)
  rm -rf "$WORK/restart"
  reference_run "$ref" 6 128 96 2 "${restart[@]}" || return 1
  start_cluster || return 1
  sets_for "$run" 6 128 96 2
  id=$(submit "${SETS[@]}" "${restart[@]}") || { fail "halotrain submit failed: $(tail -n 3 "$WORK/submit.log")"; return 1; }
  log "submitted job $id"
  state=$(wait_state "$id" COMPLETED 120) || { show_logs "$run"; fail "job $id ended $state, expected COMPLETED"; return 1; }
  launches=$(grep -c "launching them again" "$run/slurm-$id.out" || true)
  log "job $id $state after $launches relaunches"
  [[ $launches == 2 ]] || { show_logs "$run"; fail "job $id: $launches relaunches, expected 2 (after steps 2 and 4)"; }
  same_weights "$run/checkpoints/ckpt-6.h5" "$ref/checkpoints/ckpt-6.h5" || fail "job weights differ from the local run"
}

# The long config of the stop scenarios: long enough to signal or kill mid-run.
LONG=(300 256 192 10)

# Waits until run_dir $1 holds checkpoint step >= $2; fails after $3 seconds.
wait_ckpt() {
  local deadline=$((SECONDS + $3)) f
  while ((SECONDS < deadline)); do
    f=$(newest_ckpt "$1")
    [[ -n $f && $(basename "$f" .h5 | sed 's/ckpt-//') -ge $2 ]] && return 0
    sleep 0.2
  done
  return 1
}

scenario_requeue() {
  local run=$WORK/requeue/run ref=$WORK/requeue/ref id state restarts
  rm -rf "$WORK/requeue"
  reference_run "$ref" "${LONG[@]}" || return 1
  start_cluster || return 1
  sets_for "$run" "${LONG[@]}"
  id=$(submit "${SETS[@]}") || { fail "halotrain submit failed: $(tail -n 3 "$WORK/submit.log")"; return 1; }
  log "submitted job $id"
  wait_ckpt "$run" 20 120 || { show_logs "$run"; fail "job $id wrote no ckpt-20 in 120 s"; return 1; }
  timeout 10 scancel --signal=USR2 "$id"
  log "sent USR2 to job $id after $(basename "$(newest_ckpt "$run")")"
  state=$(wait_state "$id" COMPLETED 180) || { show_logs "$run"; fail "job $id ended $state after USR2"; return 1; }
  restarts=$(job_field "$id" Restarts)
  log "job $id $state, Restarts=$restarts"
  [[ $restarts == 1 ]] || { show_logs "$run"; fail "job $id: Restarts=$restarts, expected 1"; }
  # `scontrol requeue` ends the batch shell too, so the message is Slurm's, not the script's.
  grep -q "CANCELLED AT .* DUE TO JOB REQUEUE" "$run/slurm-$id.err" || fail "no requeue message in slurm-$id.err"
  grep -qi "resuming from" "$run/slurm-$id.err" "$run/slurm-$id.out" || fail "the second run did not resume"
  same_weights "$(newest_ckpt "$run")" "$ref/checkpoints/ckpt-${LONG[0]}.h5" ||
    fail "requeued job's weights differ from an uninterrupted run"
}

scenario_kill_rank() {
  local run=$WORK/kill/run ref=$WORK/kill/ref id id2 state victim t0 last msg
  rm -rf "$WORK/kill"
  reference_run "$ref" "${LONG[@]}" || return 1
  start_cluster || return 1
  sets_for "$run" "${LONG[@]}"
  id=$(submit "${SETS[@]}") || { fail "halotrain submit failed: $(tail -n 3 "$WORK/submit.log")"; return 1; }
  log "submitted job $id"
  wait_ckpt "$run" 20 120 || { show_logs "$run"; fail "job $id wrote no ckpt-20 in 120 s"; return 1; }
  # Rank 1 of step 0: its pid from Slurm's own process tracking.
  victim=$(timeout 10 scontrol listpids "$id" | awk '$3 == "0" && $5 == "1" {print $1; exit}')
  [[ -n $victim ]] || { fail "no pid for rank 1 of job $id"; return 1; }
  kill -9 "$victim"
  t0=$SECONDS
  log "killed rank 1 (pid $victim) of job $id"
  state=$(wait_state "$id" "FAILED|CANCELLED" 60) || { show_logs "$run"; fail "job $id is $state 60 s after the kill"; return 1; }
  log "job $id $state $((SECONDS - t0)) s after the kill, exit $(job_field "$id" ExitCode)"
  msg=$(grep -hiE "killed|error" "$run/slurm-$id.err" "$run/slurm-$id.out" || true)
  [[ -n $msg ]] || fail "no message about the killed rank in job $id's log"
  head -n 3 <<<"$msg" | sed 's/^/    log: /'
  last=$(newest_ckpt "$run")
  timeout 30 "$HALOTRAIN" inspect "$last" | grep -q "checksum: OK" || fail "$last is not intact"
  log "last checkpoint $(basename "$last") intact; submitting again"
  id2=$(submit "${SETS[@]}") || { fail "second submit failed: $(tail -n 3 "$WORK/submit.log")"; return 1; }
  state=$(wait_state "$id2" COMPLETED 180) || { show_logs "$run"; fail "resubmitted job $id2 ended $state"; return 1; }
  grep -qi "resuming from .*/$(basename "$last")" "$run/slurm-$id2.err" "$run/slurm-$id2.out" ||
    fail "job $id2 did not resume from $last"
  log "job $id2 $state, resumed from $(basename "$last")"
  same_weights "$(newest_ckpt "$run")" "$ref/checkpoints/ckpt-${LONG[0]}.h5" ||
    fail "resumed job's weights differ from an uninterrupted run"
}

# 2 nodes x 2 ranks, grid [2, 2]: the rows of the image split across the nodes.
TWO_NODES=(--set slurm.nodes=2 --set parallel.devices_per_node=2 --set "parallel.grid=[2, 2]")

# Each rank's line "on host H (the plan's node N, device D): halo bytes sent per step A to
# ranks on this host, B to other hosts; the plan's A' intra-node, B' inter-node" in $1.
check_placement() {
  local log=$1 r line inter=0
  for r in 0 1 2 3; do
    line=$(grep -h "\[$r/4\] info on host" "$log" | tail -n 1)
    [[ -n $line ]] || { fail "rank $r logged no placement line in $log"; continue; }
    [[ $line == *"on host htnode$((r / 2 + 1)) (the plan's node $((r / 2)), device $((r % 2)))"* ]] ||
      fail "rank $r ran elsewhere than the plan says: $line"
    local got_intra got_inter plan_intra plan_inter
    read -r got_intra got_inter plan_intra plan_inter < <(sed -E \
      's/.*per step ([0-9]+) to ranks on this host, ([0-9]+) to other hosts; the plan.s ([0-9]+) intra-node, ([0-9]+) inter-node.*/\1 \2 \3 \4/' <<<"$line")
    [[ $got_intra == "$plan_intra" && $got_inter == "$plan_inter" ]] ||
      fail "rank $r halo bytes per step measured $got_intra/$got_inter (same host/other hosts), plan $plan_intra/$plan_inter"
    inter=$((inter + got_inter))
    log "rank $r: $(sed -E 's/.*info on host //' <<<"$line")"
  done
  ((inter > 0)) || fail "no halo bytes crossed nodes"
}

scenario_two_nodes() {
  local run=$WORK/two/run ref=$WORK/two/ref id state
  rm -rf "$WORK/two"
  reference_run "$ref" 6 128 96 2 "${TWO_NODES[@]}" || return 1
  start_cluster 2 || return 1
  sets_for "$run" 6 128 96 2
  id=$(submit "${SETS[@]}" "${TWO_NODES[@]}") || { fail "halotrain submit failed: $(tail -n 3 "$WORK/submit.log")"; return 1; }
  log "submitted job $id"
  state=$(wait_state "$id" COMPLETED 120) || { show_logs "$run"; fail "job $id ended $state, expected COMPLETED"; return 1; }
  log "job $id $state on $(job_field "$id" NodeList) ($(job_field "$id" NumTasks) tasks)"
  check_placement "$run/slurm-$id.err"
  same_weights "$run/checkpoints/ckpt-6.h5" "$ref/checkpoints/ckpt-6.h5" || fail "job weights differ from the local run"
}

scenario_node_loss() {
  local run=$WORK/loss/run ref=$WORK/loss/ref id id2 state t0 last took
  rm -rf "$WORK/loss"
  reference_run "$ref" "${LONG[@]}" "${TWO_NODES[@]}" || return 1
  start_cluster 2 || return 1
  sets_for "$run" "${LONG[@]}"
  id=$(submit "${SETS[@]}" "${TWO_NODES[@]}") || { fail "halotrain submit failed: $(tail -n 3 "$WORK/submit.log")"; return 1; }
  log "submitted job $id"
  wait_ckpt "$run" 20 120 || { show_logs "$run"; fail "job $id wrote no ckpt-20 in 120 s"; return 1; }
  "$CLUSTER" kill-node 2
  t0=$SECONDS
  log "killed node htnode2 after $(basename "$(newest_ckpt "$run")")"
  # Ended: failed, or requeued by Slurm (pending again) since the job is requeueable.
  local deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    state=$(job_field "$id" JobState)
    [[ $state != RUNNING && $state != COMPLETING ]] && break
    sleep 0.5
  done
  took=$((SECONDS - t0))
  [[ $state != RUNNING && $state != COMPLETING ]] || { show_logs "$run"; fail "job $id still $state 60 s after the node died"; return 1; }
  log "job $id $state $took s after the node died (reason $(job_field "$id" Reason))"
  # No rank of the job survives on the node that is left.
  sleep 2
  [[ -z $(pgrep -f "halotrain train .*loss" || true) ]] || fail "ranks outlived the job: $(pgrep -af "halotrain train")"
  last=$(newest_ckpt "$run")
  timeout 30 "$HALOTRAIN" inspect "$last" | grep -q "checksum: OK" || fail "$last is not intact"
  log "newest checkpoint $(basename "$last") intact; node htnode2 back"
  "$CLUSTER" start-node 2 >/dev/null 2>&1 || { fail "node 2 did not start again"; return 1; }
  id2=$id
  if [[ $state != PENDING ]]; then
    id2=$(submit "${SETS[@]}" "${TWO_NODES[@]}") || { fail "second submit failed: $(tail -n 3 "$WORK/submit.log")"; return 1; }
    log "submitted again: job $id2"
  else
    log "Slurm requeued job $id; it runs again when the node is back"
  fi
  state=$(wait_state "$id2" COMPLETED 240) || { show_logs "$run"; fail "job $id2 ended $state after the node came back"; return 1; }
  grep -qi "resuming from" "$run"/slurm-"$id2".err "$run"/slurm-"$id2".out || fail "job $id2 did not resume"
  log "job $id2 $state"
  same_weights "$(newest_ckpt "$run")" "$ref/checkpoints/ckpt-${LONG[0]}.h5" ||
    fail "the weights after the node loss differ from an uninterrupted run"
}

for scenario in "$@"; do
  declare -F "scenario_$scenario" >/dev/null || { echo "unknown scenario $scenario" >&2; exit 2; }
  log "== $scenario"
  before=$failures
  "scenario_$scenario" || true
  if ((failures == before)); then log "== $scenario passed"; else log "== $scenario FAILED"; fi
done
((failures == 0)) || { echo "$failures check(s) failed" >&2; exit 1; }
