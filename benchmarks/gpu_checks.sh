#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one run, most important first, each bounded in time so
# that a slow step cannot starve the ones after it. From the repository root:
#
#     bash benchmarks/gpu_checks.sh OUTDIR
#
# 1. the CUDA-only tests (the loss contract and the estimators without a host sync, the CUDA
#    graph updates, the samplers on a CUDA storage);
# 2. benchmarks/compiled_update.py --device cuda for SAC and TD3 (rlloss and TorchRL, eager / compiled / + graph);
# 3. the same for DQN+PER with the compiled prioritized sampler;
# 4. tutorials/compile_and_cudagraphs.py on the GPU.
# OUTDIR receives all.log and the benchmarks' JSON files (at most 3 files).
set -u
out=${1:?usage: bash benchmarks/gpu_checks.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/rlloss-inductor}
log="$out/all.log"
step() {  # step SECONDS NAME COMMAND...: run with a time limit, log, report the exit status
    local limit=$1 name=$2
    shift 2
    local start=$SECONDS
    echo "=== $name" | tee -a "$log"
    timeout "$limit" "$@" >>"$log" 2>&1
    echo "=== $name: exit $? in $((SECONDS - start)) s" | tee -a "$log"
}
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
    python3 -c "import torch, tensordict, torchrl, rlloss; print('torch', torch.__version__, \
'tensordict', tensordict.__version__, 'torchrl', torchrl.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee -a "$log"
step 120 tests python3 -m pytest -q -p no:cacheprovider -rfE tests/test_cuda.py \
    tests/test_update.py tests/test_random_sampler.py tests/test_prioritized_sampler.py \
    -k "cuda or recorded_update_samples or trees_follow"
tail -3 "$log" | head -2
step 230 "gpu_update SAC TD3" python3 benchmarks/compiled_update.py --device cuda --cases SAC TD3 \
    --inner 100 --methods eager compiled compiled+graph "compiled+graph, sample()" --profile \
    --out "$out/gpu_update.json"
step 90 "gpu_update DQN+PER compiled sampler" python3 benchmarks/compiled_update.py \
    --device cuda --cases DQN+PER --methods compiled+graph "compiled+graph, sample()" \
    --compile-sampler --inner 100 --out "$out/gpu_update-compiled-sampler.json"
step 90 tutorial python3 tutorials/compile_and_cudagraphs.py --device cuda --updates 2000 \
    --out /tmp/rlloss-tutorial
grep -A40 "^updates/s" "$log" | grep -v "^===" | head -60
tail -15 "$log"
