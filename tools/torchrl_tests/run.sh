#!/usr/bin/env bash
# Rerun TorchRL's objective tests with TorchRL's own classes (RLLOSS_SWAP=0, the reference)
# and with rlloss's classes patched in (RLLOSS_SWAP=1), then regenerate REPORT.md.
#
#   ./run.sh                    # all six files, both settings
#   ONLY="dqn values" ./run.sh  # a subset of files (others keep their previous raw results)
#   ONLY="bc diffusion_bc act dt rnd" ./run.sh  # the imitation and exploration losses' tests
#   REPORT_ONLY=1 ./run.sh      # just rebuild REPORT.md / results_*.json from raw/
#
# Env: BUDGET (s per file per setting, default 1500), SETTINGS (default "torchrl rlloss"; e.g.
# "rlloss" to rerun only the swapped side after a change to rlloss), WAIT_FILE (wait until it exists before
# starting, checked every 60 s), VENV (a virtualenv to activate; default: the current python),
# TESTS (default ../shared/torchrl-tests beside the repository, the folder holding TorchRL's
# `test/`; see its README.md for the commit). CI's gate is gate.py (README.md).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE"
REPO="$(cd "$HERE/../.." && pwd)"
if [ -n "${VENV:-}" ]; then . "$VENV/bin/activate"; fi
BUDGET="${BUDGET:-1500}"
TESTS="${TESTS:-$REPO/../shared/torchrl-tests}"
ONLY="${ONLY:-ppo dqn ddpg sac iql cql tqc values loss_module dreamer dreamer_v3 controllers}"
mkdir -p raw logs

if [ -n "${WAIT_FILE:-}" ]; then
  while [ ! -f "$WAIT_FILE" ]; do sleep 60; done
fi

# Selection: the test classes/functions that target the 37 swapped classes.
sel() {
  local o=test/objectives
  case "$1" in
    ppo) echo "$o/test_ppo.py::TestPPO $o/test_ppo.py::TestA2C $o/test_ppo.py::TestReinforce $o/test_ppo.py::test_ppo_ess_preserves_feature_shape_for_singleton_batch" ;;
    dqn) echo "$o/test_dqn.py::TestDQN $o/test_dqn.py::TestQMixer" ;;
    ddpg) echo "$o/test_ddpg.py::TestDDPG $o/test_ddpg.py::TestTD3 $o/test_ddpg.py::TestTD3BC" ;;
    sac) echo "$o/test_sac.py::TestSAC $o/test_sac.py::TestDiscreteSAC $o/test_sac.py::TestREDQ $o/test_sac.py::TestCrossQ" ;;
    iql) echo "$o/test_iql.py::TestIQL $o/test_iql.py::TestDiscreteIQL" ;;
    cql) echo "$o/test_cql.py::TestCQL $o/test_cql.py::TestDiscreteCQL" ;;
    tqc) echo "$o/test_tqc.py::TestTQC" ;;
    dreamer) echo "$o/test_dreamer.py::TestDreamer $o/test_dreamer.py::TestWorldModelLoss" ;;
    dreamer_v3) echo "$o/test_dreamer_v3.py::TestDreamerV3" ;;
    controllers) echo "$o/test_controllers.py::TestExponentialQuadraticCost" ;;
    values) echo "$o/test_values.py::TestValues $o/test_values.py::TestAdv" ;;
    bc) echo "$o/test_bc.py::TestBCLoss" ;;
    diffusion_bc) echo "$o/test_diffusion_bc.py::TestDiffusionBCLoss" ;;
    act) echo "$o/test_act.py::TestACTLoss" ;;
    dt) echo "$o/test_dt.py::TestDT $o/test_dt.py::TestOnlineDT $o/test_dt.py::TestGAIL" ;;
    rnd) echo "test/test_rnd.py::TestRNDLoss" ;;
    loss_module) echo "$o/test_loss_module.py::test_updater $o/test_loss_module.py::test_updater_warning $o/test_loss_module.py::test_instantiate_with_different_keys $o/test_loss_module.py::TestMakeValueEstimator $o/test_loss_module.py::TestSchedulableBuffers $o/test_loss_module.py::TestPrepareValueEstimatorKwargs $o/test_loss_module.py::TestDefaultForwardValueEstimatorKeys $o/test_loss_module.py::TestValueEstimatorRegistry" ;;
  esac
}

if [ -z "${REPORT_ONLY:-}" ]; then
  {
    echo "tests: $(cat "$TESTS/SOURCE" 2>/dev/null)"
    python -c "import torch, tensordict, torchrl; print('torch', torch.__version__, '| tensordict', tensordict.__version__, '| torchrl', torchrl.__version__)" 2>/dev/null
    echo "rlloss: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null) $(git -C "$REPO" status --porcelain 2>/dev/null | wc -l) uncommitted changes"
    echo "run: $(date -u +%FT%TZ), BUDGET=${BUDGET}s per file per setting"
  } > raw/meta.txt
  for name in $ONLY; do
    for setting in ${SETTINGS:-torchrl rlloss}; do
      swap=0; [ "$setting" = rlloss ] && swap=1
      rm -f "raw/${setting}_${name}.jsonl"
      sed -i "/^${setting}\t${name}\t/d" raw/runs.tsv 2>/dev/null
      t0=$(date +%s.%N)
      ( cd "$TESTS" && \
        PYTHONPATH="$HERE:$REPO" RLLOSS_SWAP=$swap RLLOSS_RESULTS="$HERE/raw/${setting}_${name}.jsonl" \
        timeout -k 30 "$BUDGET" python -m pytest -p swap_plugin -p no:cacheprovider -q -rA \
          $(sel "$name") ) > "logs/${setting}_${name}.log" 2>&1
      rc=$?
      t1=$(date +%s.%N)
      rl="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)+$(git -C "$REPO" status --porcelain 2>/dev/null | wc -l)dirty"
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$setting" "$name" "$rc" "$(echo "$t1 - $t0" | bc)" "$rl" "$(date -u +%FT%TZ)" >> raw/runs.tsv
      echo "$setting $name rc=$rc $(tail -1 "logs/${setting}_${name}.log")"
    done
  done
fi
python make_report.py
