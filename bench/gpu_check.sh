#!/usr/bin/env bash
# Issue 30, item 8 on a CUDA machine, in one run (under 8 minutes on an H100): the CUDA tests, the bf16 bench, and
# what `arceusd peers` / `status` show of a GPU daemon beside a CPU-only one.
#
#   bash bench/gpu_check.sh          # from the repository root (any cwd works: it changes to the root)
#
# The machine has torch (CUDA), transformers, peft, tokenizers, grpcio, msgpack, click, rich, pytest, hypothesis
# and safetensors, and no internet: the daemon's other dependencies come from the wheels in .whl/ (ignored by git,
# carried with the tree), installed into the interpreter's own site-packages: the worker harness of the tests
# starts its processes with a PYTHONPATH of its own, so wheels in a --target folder were not found by them (seen
# on an H200, 2026-11-28). Nothing is installed in editable mode: the repository runs from PYTHONPATH. Everything goes to stdout and, with $OUT set, to $OUT/gpu.txt; the two-daemon
# test's `peers` / `status` / job view land in $OUT/gpu-swarm/.
#
# Steps (each under its own timeout; a failed step is reported and the next one still runs; the exit status is
# that of the first failed step):
#   1. install the wheels; print nvidia-smi -L and the versions;
#   2. python3 -m pytest -q -x -k cuda -p no:cacheprovider        (every CUDA test, the two-daemon one included)
#   3. python3 bench/hf.py --device cuda                            (part 1 on the GPU, part 2: one GPU daemon alone)
#   4. python3 bench/hf.py --device cuda --overhead                 (the engine's fixed cost per step, launch-bound)
set -u
cd "$(dirname "$0")/.."
PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-190}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-240}
OVERHEAD_TIMEOUT=${OVERHEAD_TIMEOUT:-90}
BENCH_ARGS=${BENCH_ARGS:---device cuda}
OUT=${OUT:-}
if [ -n "$OUT" ]; then
    mkdir -p "$OUT"
    exec > >(tee -a "$OUT/gpu.txt") 2>&1
fi
status=0
began=$(date +%s)

step() {  # step NAME SECONDS COMMAND...: run it under a timeout, say how it ended and how long it took
    local name=$1 limit=$2 t0 rc
    shift 2
    echo
    echo "=== $name (at most ${limit} s): $*"
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    echo "=== $name: exit $rc after $(($(date +%s) - t0)) s$([ "$rc" -eq 124 ] && echo ' (timed out)')"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
    return 0
}

echo "=== install the wheels of .whl/ into the interpreter's site-packages"
if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl; then
    echo "=== installing the wheels failed (is .whl/ carried with the tree?)"
    exit 3
fi
export PYTHONPATH=$PWD
export PYTHONUNBUFFERED=1

echo "=== the machine"
nvidia-smi -L || echo "(no nvidia-smi)"
python3 - <<'EOF'
import sys

import torch
import transformers

print(f"python {sys.version.split()[0]}, torch {torch.__version__} (cuda {torch.version.cuda}), "
      f"transformers {transformers.__version__}")
try:
    import peft
    print(f"peft {peft.__version__}")
except ImportError:
    print("peft: not installed")
print(f"cuda available: {torch.cuda.is_available()}"
      + (f", {torch.cuda.device_count()} device(s): {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""))
import trio, zeroconf, cryptography  # noqa: E401  (from the wheels)
print(f"trio {trio.__version__}, zeroconf {zeroconf.__version__}, cryptography {cryptography.__version__}")
EOF

SWARM_OUT=${OUT:+$OUT/gpu-swarm}
export ARCEUS_GPU_OUT=${SWARM_OUT:-/tmp/arceus-gpu-swarm}
step "CUDA tests" "$PYTEST_TIMEOUT" python3 -m pytest -q -x -k cuda -p no:cacheprovider -s
for f in peers status_gpu status_cpu job; do
    if [ -f "$ARCEUS_GPU_OUT/$f.txt" ]; then
        echo "--- $f (the two-daemon CUDA test: a GPU daemon and a CPU-only one)"
        cat "$ARCEUS_GPU_OUT/$f.txt"
    fi
done
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
step "bench/hf.py" "$BENCH_TIMEOUT" python3 bench/hf.py $BENCH_ARGS
step "bench/hf.py --overhead" "$OVERHEAD_TIMEOUT" python3 bench/hf.py --device cuda --overhead

echo
echo "=== gpu_check: exit $status after $(($(date +%s) - began)) s"
exit "$status"
