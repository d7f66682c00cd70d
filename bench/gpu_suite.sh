#!/usr/bin/env bash
# The GPU session in one command: GPU tests, then the offline grid (Jacana vs transformers),
# then the online benchmark through the gateway. Results land in $OUT (default
# bench/results/gpu); the last lines printed are the tables.
#
#   bench/gpu_suite.sh [all|part1|part2]
#
# all    tests (kernels, triton backend, engine parity incl. SmolLM2) + offline + online
# part1  tests without SmolLM2 + offline grid          (first of two calls, see below)
# part2  SmolLM2 parity + offline c64 + online         (second call)
# part3  online, then what was tried for the misses (no graphs; a larger prefill budget)
#
# Wheels the device lacks travel in .whl/ (installed to /tmp/site). The SmolLM2 GGUF is
# larger than one call may carry: put chunks under .gguf_part/ (a.bin, b.bin); each call
# copies what it carries to /tmp/jacana-gguf, which survives between calls while the
# machine stays warm, and the file is assembled and checked once both chunks are there.
set -uo pipefail
cd "$(dirname "$0")/.."
PHASE=${1:-all}
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
T0=$(date +%s)
stamp() { echo "[suite +$(( $(date +%s) - T0 ))s] $*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=services/engine/src:libs/common/src:services/gateway/src:bench:tests${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader

mkdir -p /tmp/jacana-gguf
for f in .gguf_part*/*.bin; do [ -f "$f" ] && cp "$f" /tmp/jacana-gguf/; done
GGUF=/tmp/jacana-gguf/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f /tmp/jacana-gguf/a.bin ] && [ -f /tmp/jacana-gguf/b.bin ]; then
  cat /tmp/jacana-gguf/a.bin /tmp/jacana-gguf/b.bin > "$GGUF"
fi
if [ -f "$GGUF" ] && echo "$GGUF_SHA256  $GGUF" | sha256sum -c --quiet; then
  export JACANA_SMOLLM2_GGUF=$GGUF
  stamp "SmolLM2 GGUF assembled, sha256 ok"
else
  stamp "SmolLM2 GGUF not (yet) complete: its parity test skips"
fi

PYTEST=(python3 -m pytest -p no:cacheprovider -o "addopts=-ra --import-mode=importlib" -q)
export JACANA_GPU_REPORT="$OUT/gpu_parity.json"
case "$PHASE" in
  all)   TESTS=(services/engine/tests/kernels services/engine/tests/test_gpu_engine.py) ;;
  part1) TESTS=(services/engine/tests/kernels/test_triton_backend.py
                "services/engine/tests/test_gpu_engine.py::test_random_qwen3_matches_transformers") ;;
  part2) TESTS=("services/engine/tests/test_gpu_engine.py::test_smollm2_matches_transformers") ;;
  *)     TESTS=() ;;
esac
if [ ${#TESTS[@]} -gt 0 ]; then
  stamp "pytest ${TESTS[*]}"
  timeout 180 "${PYTEST[@]}" -m "not slow" "${TESTS[@]}" 2>&1 | tee "$OUT/pytest_$PHASE.log" | tail -25
fi

if [ "$PHASE" = part3 ]; then
  stamp "online through the gateway"
  timeout 180 python3 bench/online_gpu.py --model qwen3-8b --reps 3 --out "$OUT" 2>&1 \
    | tee "$OUT/online_stdout.log" | tail -12
  stamp "tried: b1 without CUDA graphs"
  timeout 80 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf --eager \
    --workloads b1 --reps 3 --name offline_eager_b1 --out "$OUT" 2>&1 | tail -9
  stamp "done"
  exit 0
fi

if [ "$PHASE" != part2 ]; then
  stamp "offline grid"
  timeout 330 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --reps 3 \
    --profile --out "$OUT" 2>&1 | grep -v "^\[transformers\]" | tail -60
fi
if [ "$PHASE" != part1 ]; then
  stamp "offline c64 (no peer) for the online ratio"
  timeout 120 python3 bench/offline_gpu.py --model qwen3-8b --no-hf --workloads c64 --reps 3 \
    --name offline_c64 --out "$OUT" 2>&1 | tail -8
  stamp "online through the gateway"
  timeout 240 python3 bench/online_gpu.py --model qwen3-8b --reps 3 --out "$OUT" 2>&1 \
    | tee "$OUT/online_stdout.log" | tail -12
fi
stamp "done"
