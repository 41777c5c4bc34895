#!/bin/bash
# Several run.py experiments at once, one process (one thread) each, on a machine with a core
# per run (the runs in README.md's "second task" section ran on a 16-core device machine).
#   bash tools/benchmarl/parallel_runs.sh OUT FRAMES LIMIT_S TASK:ALGO:LIB ...
# Each run is killed after LIMIT_S seconds; run.py writes its record after every iteration,
# so a run cut short keeps the iterations it finished (outcome "running").
set -u
out=$1 frames=$2 limit=$3
shift 3
mkdir -p "$out"
for spec in "$@"; do
  IFS=: read -r task algo lib <<<"$spec"
  OMP_NUM_THREADS=1 timeout "$limit" "${PYTHON:-python3}" tools/benchmarl/run.py \
    --lib "$lib" --algo "$algo" --task "$task" --seed 0 --frames "$frames" \
    --frames-per-batch 6000 --n-envs 60 --optimizer-steps 200 --lr 3e-4 --out "$out" \
    >"$out/${algo}_${task}_${lib}.log" 2>&1 &
done
wait
