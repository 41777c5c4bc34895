#!/usr/bin/env bash
# Run TorchRL's example scripts (sota-implementations/) with TorchRL's losses (reference) and with
# the imports changed to rlloss, on a small frame budget. TorchRL's scripts are not copied into
# this repository: extract them from a fetched pytorch/rl (see README.md) and point SOTA at them.
#
#   SOTA=/path/to/sota-implementations ./run.sh            # all five, both settings
#   ONLY="dqn ppo" SETTINGS=rlloss ./run.sh                  # a subset
# Writes logs/<setting>_<name>.log and appends a row per run to results.tsv.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
SOTA="${SOTA:?set SOTA to an extracted sota-implementations folder}"
ONLY="${ONLY:-ppo sac td3 dqn ddpg}"
SETTINGS="${SETTINGS:-torchrl rlloss}"
BUDGET="${BUDGET:-900}"
mkdir -p "$HERE/logs"
OFF="logger.backend= logger.video=False"
script() {
  case "$1" in
    ppo) echo "ppo ppo_mujoco.py env.env_name=HalfCheetah-v5 collector.frames_per_batch=256 collector.total_frames=1024 loss.mini_batch_size=64 loss.ppo_epochs=2 logger.test_interval=1000000 $OFF" ;;
    sac) echo "sac sac.py env.name=HalfCheetah-v5 collector.total_frames=2000 collector.init_random_frames=500 collector.frames_per_batch=250 collector.env_per_collector=1 optim.batch_size=64 logger.eval_iter=1000000 $OFF" ;;
    td3) echo "td3 td3.py env.name=HalfCheetah-v5 collector.total_frames=2000 collector.init_random_frames=500 collector.frames_per_batch=250 collector.env_per_collector=1 optim.batch_size=64 logger.eval_iter=1000000 $OFF" ;;
    dqn) echo "dqn dqn_cartpole.py collector.total_frames=3000 collector.frames_per_batch=500 collector.init_random_frames=1000 collector.annealing_frames=2000 loss.num_updates=10 logger.test_interval=1000000 $OFF" ;;
    ddpg) echo "ddpg ddpg.py env.name=HalfCheetah-v5 collector.total_frames=2000 collector.init_random_frames=500 collector.frames_per_batch=250 optim.batch_size=64 logger.eval_iter=1000000 $OFF" ;;
  esac
}
for name in $ONLY; do
  set -- $(script "$name"); folder=$1; file=$2; shift 2
  for setting in $SETTINGS; do
    work="$(mktemp -d)"; cp -r "$SOTA/$folder/." "$work/"
    if [ "$setting" = rlloss ]; then python "$HERE/rewrite.py" "$work"/*.py > "$HERE/logs/${setting}_${name}.imports"; fi
    t0=$(date +%s)
    ( cd "$work" && timeout -k 30 "$BUDGET" python "$file" "$@" hydra.run.dir="$work/out" ) > "$HERE/logs/${setting}_${name}.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%ss\t%s\n' "$name" "$setting" "$rc" "$(( $(date +%s) - t0 ))" "$(date -u +%FT%TZ)" | tee -a "$HERE/results.tsv"
    rm -rf "$work"
  done
done
