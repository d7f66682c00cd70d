#!/usr/bin/env bash
# The GPU work in few device calls: the GPU tests and the benchmarks a user reruns.
#
#   bench/gpu_suite.sh PHASE [PHASE ...]
#
# tests       every GPU test (-m "gpu and not slow"): the KV-sizing tests alone first (they
#             read the free memory), then the two engine-vs-transformers parity tests each
#             in a process of its own beside all the others (~9 min on an H200)
# parity      the two parity tests alone, side by side (~4 min; SmolLM2's needs its GGUF)
# offline     offline_gpu.py: Qwen3-8B and Qwen3-0.6B, b1 / ttft1024 / c64, beside
#             transformers in the same process (~5 min)
# online      online_gpu.py: the 8B's c64 load streamed through the gateway, set against
#             the offline c64 of the same call (~1.5 min after offline; needs .whl)
# targets     offline, online, then the GPU targets against what is asked, with the peer
#             beside them: $OUT/gpu_targets/<hardware>.md (~7 min on an H200)
# embeddings  embeddings_gpu.py: all-MiniLM-L6-v2, 128-token inputs, vs sentence-transformers
# spec        the speculative GPU test, then spec_bench.py --grid gpu (~6 min)
# video       the multimodal GPU tests, then video_gpu.py: Wan 2.1 T2V 1.3B (random weights),
#             832x480, 81 frames, 10 steps, Jacana vs diffusers and each acceleration
#             alone (~8 min; needs .whl)
#
# Results go to $OUT/<benchmark>/<hardware>.{json,md} ($OUT: the device call's folder, else
# bench/results), the parity tests' report to $OUT/gpu_parity/<hardware>.json, pytest's
# logs to $LOGS (default a temporary folder). The last lines printed are the tables.
# $MODELS: the offline models (default "qwen3-8b qwen3-0.6b"); $OFFLINE_ARGS: more
# offline_gpu.py arguments (e.g. "--no-hf --reps 5"); $ONLINE_MODEL (default qwen3-8b) and
# $ONLINE_ARGS the same for online_gpu.py.
#
# Wheels the machine lacks travel in .whl/ (bench/gpu_wheels.sh writes them; carry .whl):
# online needs them (fastapi, a grpcio as new as the stubs), and so does SmolLM2's parity
# (transformers reads its GGUF with gguf). Model files larger than one call may carry come
# over in parts first (bench/gpu_assets.sh); SmolLM2's GGUF is JACANA_SMOLLM2_GGUF here.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
LOGS=${LOGS:-$(mktemp -d /tmp/jacana-suite.XXXXXX)}
mkdir -p "$OUT" "$LOGS"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
stamp() { echo "[suite +$(($(date +%s) - T0))s] $*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
SRC=services/engine/src:services/embeddings/src:services/drafter/src:services/gateway/src
SRC=$SRC:services/multimodal/src
export PYTHONPATH=$SRC:libs/common/src:bench:tests${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.used,memory.total,power.limit,clocks.max.sm --format=csv,noheader
eval "$(bash bench/gpu_assets.sh receive)"
export JACANA_MODEL_CACHE=/tmp/jacana-assets
smollm2=${JACANA_ASSET_SMOLLM2_135M_INSTRUCT_Q4_1_GGUF:-}
[ -n "$smollm2" ] && export JACANA_SMOLLM2_GGUF=$smollm2

HW=$(python3 -c 'from common import hardware; print(hardware())')
PYTEST=(python3 -m pytest -p no:cacheprovider -o "addopts=-ra --import-mode=importlib" -q)
PARITY=$(find services/engine/tests -name test_gpu_engine.py)
TUNING=/tmp/jacana-suite-tuning.json  # offline and online run the same decode GEMM picks

in_own_group() {  # "$@" as the leader of a new process group, so end_leftovers finds it
  setsid "$@" &
  echo $! >>"$LOGS/.groups"
  wait $!
}

end_leftovers() {  # end (and name) what those groups left running
  local group left
  for group in $(cat "$LOGS/.groups" 2>/dev/null); do
    left=$(pgrep -g "$group" -a 2>/dev/null) || continue
    echo "[suite] left running by process group $group, ended:"
    echo "$left" | head -5
    kill -TERM -- "-$group" 2>/dev/null
  done
  rm -f "$LOGS/.groups"
}

parity_tests() {  # $1: seconds at most; then the parity tests (-k words), a process each,
  # their reports merged into $OUT/gpu_parity/$HW.json
  local seconds=$1 name
  shift
  for name in "$@"; do
    JACANA_GPU_REPORT="$LOGS/parity_$name.json" in_own_group timeout -s INT "$seconds" \
      "${PYTEST[@]}" -m "gpu and not slow" -k "$name" "$PARITY" \
      >"$LOGS/pytest_parity_$name.log" 2>&1 &
  done
  wait
  mkdir -p "$OUT/gpu_parity"
  python3 - "$OUT/gpu_parity/$HW.json" "$LOGS"/parity_*.json <<'MERGE'
import json, os, sys
merged = {k: v for f in sys.argv[2:] if os.path.exists(f) for k, v in json.load(open(f)).items()}
json.dump(merged, open(sys.argv[1], "w"), indent=2)
MERGE
  for name in "$@"; do tail -8 "$LOGS/pytest_parity_$name.log"; done
}

gpu_tests() {  # $1: seconds at most (SIGINT, so pytest still reports)
  local end=$(($(date +%s) + $1)) memory
  memory=$(find services/engine/tests -name test_kv_sizing.py)
  stamp "GPU tests: KV sizing alone"
  in_own_group timeout -s INT "$1" "${PYTEST[@]}" -m "gpu and not slow" "$memory" \
    >"$LOGS/pytest_memory.log" 2>&1
  tail -3 "$LOGS/pytest_memory.log"
  stamp "GPU tests: the parity tests beside the rest"
  parity_tests $((end - $(date +%s))) qwen3 smollm2 >"$LOGS/parity_tails.log" &
  in_own_group timeout -s INT $((end - $(date +%s))) "${PYTEST[@]}" -m "gpu and not slow" \
    --durations=15 --ignore="$PARITY" --ignore="$memory" services/engine/tests \
    services/embeddings/tests >"$LOGS/pytest_gpu.log" 2>&1
  wait
  cat "$LOGS/parity_tails.log"
  tail -30 "$LOGS/pytest_gpu.log"
  end_leftovers
}

offline() {
  stamp "offline: ${MODELS:-qwen3-8b qwen3-0.6b} beside transformers"
  local models=()
  for model in ${MODELS:-qwen3-8b qwen3-0.6b}; do models+=(--model "$model"); done
  # shellcheck disable=SC2086  # $OFFLINE_ARGS: several arguments
  timeout 420 python3 bench/offline_gpu.py "${models[@]}" --reps 3 --tuning-cache "$TUNING" \
    --out "$OUT" ${OFFLINE_ARGS:-} 2>&1 | grep -v "^\[transformers\]" | tail -40
}

online() {
  stamp "online: ${ONLINE_MODEL:-qwen3-8b} c64 through the gateway"
  # shellcheck disable=SC2086  # $ONLINE_ARGS: several arguments
  timeout 240 python3 bench/online_gpu.py --model "${ONLINE_MODEL:-qwen3-8b}" --reps 3 \
    --tuning-cache "$TUNING" --logs "$LOGS" --out "$OUT" ${ONLINE_ARGS:-} 2>&1 | tail -20
}

targets_table() {  # the GPU targets from this call's offline and online results
  mkdir -p "$OUT/gpu_targets"
  python3 - "$OUT/offline_gpu/$HW.json" "$OUT/online_gpu/$HW.json" \
    >"$OUT/gpu_targets/$HW.md" <<'TARGETS'
import json, sys
offline, online = (json.load(open(f)) for f in sys.argv[1:])
def cell(peer, model, workload, metric, digits):
    results = offline["models"].get(model, {}).get("results", {})
    s = results.get(workload, {}).get(peer, {}).get(metric)
    return f"{s['median']:,.{digits}f} ({s['min']:,.{digits}f}–{s['max']:,.{digits}f})" if s else "-"
share = f"{online['online_share']:.0%}" if "online_share" in online else "-"
rows = [
    ("Qwen3-8B b1 TPOT ms", "≤ 4.0", ("qwen3-8b", "b1", "tpot_ms", 2)),
    ("Qwen3-0.6B b1 TPOT ms", "≤ 1.2", ("qwen3-0.6b", "b1", "tpot_ms", 2)),
    ("Qwen3-8B c64 output tok/s", "≥ 3,200", ("qwen3-8b", "c64", "output_tok_s", 0)),
    ("Qwen3-8B TTFT 1024 ms", "≤ 30", ("qwen3-8b", "ttft1024", "ttft_ms", 2)),
]
env = offline["environment"]
print(f"# GPU targets on {env.get('gpu')}: measured vs asked\n")
print("Random bf16 weights with the real shapes, greedy, EOS ignored; median (min–max) of "
      f"{offline['reps']} reps; transformers in the same process (`offline_gpu`); the online "
      "share against the same call's offline c64 (`online_gpu`). "
      f"Power limit {env.get('nvidia-smi power.limit', '?')}.\n")
print("| target | asked | Jacana | transformers |\n|---|---|---|---|")
for name, asked, key in rows:
    print(f"| {name} | {asked} | {cell('jacana', *key)} | {cell('transformers', *key)} |")
print(f"| online / offline at 64 streams | ≥ 90% | {share} | - |")
TARGETS
  cat "$OUT/gpu_targets/$HW.md"
}

for phase in "$@"; do
  case "$phase" in
    tests) gpu_tests 570 ;;
    parity)
      stamp "parity tests alone"
      parity_tests 400 qwen3 smollm2
      end_leftovers
      ;;
    offline) offline ;;
    online) online ;;
    targets) offline; online; targets_table ;;
    embeddings)
      stamp "embeddings"
      model=()
      [ -n "${JACANA_ASSET_MINILM:-}" ] && model=(--model-dir "$JACANA_ASSET_MINILM")
      # the service's tokenizer spreads a batch over every core (the suite's default: one)
      TOKENIZERS_PARALLELISM=true timeout 300 python3 bench/embeddings_gpu.py --out "$OUT" \
        --reps 5 --sentences 12000 "${model[@]}" 2>&1 | grep -v "Loading weights" | tail -30
      ;;
    spec)
      stamp "speculative decoding: its GPU test, then the grid"
      timeout 120 "${PYTEST[@]}" -m gpu "$(find services/engine/tests -name test_spec_gpu.py)" \
        2>&1 | tail -4
      # 512 new tokens: a run at concurrency 32 lasts ~1 s, long enough that the gate's
      # periodic measurements weigh in it as in a running server
      timeout 480 python3 bench/spec_bench.py --grid gpu --device cuda --reps 3 \
        --max-tokens 512 --out "$OUT" 2>&1 | tail -60
      ;;
    video)
      stamp "video: the multimodal GPU tests, then Wan 2.1 1.3B beside diffusers"
      timeout 150 "${PYTEST[@]}" -m gpu -s services/multimodal/tests 2>&1 | tail -8
      timeout 420 python3 bench/video_gpu.py --out "$OUT" 2>&1 | tail -60
      ;;
    *) echo "unknown phase $phase" >&2 ;;
  esac
done
stamp "done"
