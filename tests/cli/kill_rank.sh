#!/usr/bin/env bash
# One MPI rank killed mid-run: the other ranks must exit non-zero within 60 s, no hang.
# usage: kill_rank.sh HALOTRAIN MPIRUN WORKDIR
set -uo pipefail
bin=$1 mpirun=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
"$bin" make-data "$work/data.h5" --count 4 --height 256 --width 192 --classes 2 >/dev/null || exit 1
cat > "$work/cfg.yaml" <<YAML
name: kill
run_dir: $work/run
data: {train: $work/data.h5}
model:
  input: [256, 192, 1]
  layers:
    - {type: conv2d, filters: 8, kernel: 3, padding: same}
    - {type: relu}
    - {type: global_avg_pool}
    - {type: dense, units: 2}
training: {batch_size: 2, steps: 100000, optimizer: {type: sgd, lr: 0.01}}
parallel: {grid: [2, 1]}
checkpoint: {every_steps: 0}
YAML
"$mpirun" --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" train "$work/cfg.yaml" \
  >"$work/log" 2>&1 &
launcher=$!
# Wait until both ranks train, then kill the newest rank process.
for _ in $(seq 1 60); do
  grep -q "step 1/" "$work/log" && break
  sleep 1
done
victim=$(pgrep -n -f "$bin train $work/cfg.yaml")
[[ -n $victim ]] || { echo "no rank process found"; cat "$work/log"; kill $launcher; exit 1; }
kill -9 "$victim"
start=$(date +%s)
for _ in $(seq 1 60); do
  kill -0 $launcher 2>/dev/null || break
  sleep 1
done
if kill -0 $launcher 2>/dev/null; then
  echo "the job still runs 60 s after rank $victim was killed"
  pkill -9 -f "$bin train $work/cfg.yaml"
  echo "0 passed, 1 failed"
  exit 1
fi
wait $launcher
code=$?
echo "mpirun exited with $code $(( $(date +%s) - start )) s after the kill"
if [[ $code -eq 0 ]]; then echo "0 passed, 1 failed"; exit 1; fi
echo "1 passed, 0 failed"
