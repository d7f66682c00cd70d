#!/usr/bin/env bash
# GPU work in few device calls: the GPU tests and the benchmark grids. Results land in $OUT
# (default bench/results/gpu); the last lines printed are the tables.
#
#   bench/gpu_suite.sh PHASE [PHASE ...]
#
# tests       kernel tests (not those marked slow: the opt-in folds' size tests, which the
#             skinny phase runs), Triton backend, engine vs transformers (random Qwen3,
#             SmolLM2), the embeddings service's GPU tests: the KV-sizing tests alone, then
#             each parity test in its own process beside all the others (SmolLM2's, ~230 s,
#             sets the time; one after another over 380 s);
#             whatever a test run leaves running is ended and named, with the load average
#             (in the first parallel run the grid after it ran slower on the host: 8B and
#             0.6B TTFT 1024 at 33 and 32 ms against 27 and 13 ms after serial tests)
# check       tests (at most 330 s), then the offline grid in what is left of 590 s: the
#             GPU checks and the grid with the peer in one device call
# embeddings  embeddings_gpu.py: all-MiniLM-L6-v2, 128-token inputs, vs its transformers peer;
#             ($EMBED_REPS reps, default 5: this host varies run to run), then without the
#             peer, once per ';'-separated variant in $EMBED_VARIANTS
#             (extra arguments; default "--no-cuda-graphs;--tokenizer-processes 4")
# offline     offline_gpu.py grid: Qwen3-8B and Qwen3-0.6B (b1, ttft1024, c64) vs transformers,
#             with kernel tables and each model's b1 step timeline (GPU busy/idle a step)
# parity      the two engine-vs-transformers parity tests alone, side by side (~4 min;
#             $PARITY_TESTS: the ones to run, default "qwen3 smollm2"; JACANA_PARITY_FOLDED=1
#             adds the opt-in fold_norm_weights mode, ~40 s more)
# trace       hf_trace_parity_gpu.py on all 8 SmolLM2 prompts (eager: each layer's tensors vs
#             transformers', the origins' inputs saved), the saved attention origins replayed
#             against cuDNN (flash_numerics_probe_gpu.py --sites --reference cudnn), the tile
#             variants vs cuDNN on random inputs, and torch's mean order read off
#             (reduction_order_probe_gpu.py --reveal: 576 values a row as SmolLM2's norms,
#             64 as a head_dim-64 q/k norm's heads) (~4 min; SmolLM2's GGUF carried first)
# l2          Qwen3-8B b1 with 0, 4, 8, 16 and 32 MiB of each one-row PDL GEMV's weight
#             prefetched to L2 before its wait (l2_prefetch_bytes), every run on the same
#             decode GEMM picks (one tuning cache) (~3 min)
# picks       graph_picks_gpu.py: every one-row candidate config of each Qwen3-8B weight
#             shape (and the lm_head) timed inside the batch-1 decode graph (coordinate
#             descent), beside the start-up's screened search: what each took and picked
#             (~3 min; $FOLDED_PEELS="1 2" adds folded candidates with two tiles before
#             the wait)
# ablation    graph_ablation_gpu.py: the 8B's batch-1 decode graph captured without its norms,
#             its attention, each weight shape's GEMVs, or all but the GEMVs: what each kind
#             of launch costs in the chain; then with one launch setting changed at a time
#             (decode attention's splits, tiles, warps; one shape's L2 prefetch); then the
#             whole graph and the graph without attention at 1 to 2048 context tokens (~2 min)
# attnchain   attention_chain_gpu.py: the 8B's batch-1 decode graph with and without its
#             attention at 1 to 2048 context tokens, the attention as the engine launches
#             it, in one split (no merge) at 2-4 pipeline stages, and in 4 splits (~3 min)
# attention   the decode attention's GPU tests (with the dependent-launch and overlap ones)
#             beside the random-Qwen3 parity test, then b1 of both models (~3 min)
# head        the decode graphs' head (lm_head and greedy argmax captured in them): its GPU
#             tests with the argmax kernel's, the skinny GEMM's (lookahead configs), the
#             dependent-launch and overlap ones, beside the random-Qwen3 parity test; then
#             the #4 targets without the peer (8B and 0.6B: b1, ttft1024, c64) (~9 min)
# split       the split-norm GPU tests (skinny_gemm, ~1.5-2 min), then Qwen3-8B and 0.6B
#             b1 without and with split_norm on one tuning cache (~3 min warm; a cold
#             machine's first 8B start alone took 126 s in the twenty-fourth run)
# fold        the same for fold_norm_weights (the norm's weight in QKV's and gate/up's, the
#             norm run inside the one-row GEMVs): its kernel GPU tests, then $FOLD_ROUNDS
#             (default 2) rounds of b1 without and with it (~5 min cold)
# prefill     the prefill attention's GPU tests and its launch settings at 8B head shapes
#             (prefill_attention_gpu.py); then prefill_host_gpu.py: one 1024-token prompt's
#             TTFT on Qwen3-0.6B and 8B (cuBLAS decode GEMMs, no tuning), its profiled GPU
#             timeline (busy, idle, host-late gaps) and the host functions that took the
#             most time under cProfile (~2 min)
# prefillgraphs  the one-sequence prefill graphs' GPU tests, then b1 and ttft1024 of both
#             models (5 reps) without and with prefill_graph_tokens=2048, on one tuning
#             cache (~3 min)
# band        Qwen3-8B b1 (5 reps) with nvidia-smi sampled every 50 ms (clocks, power,
#             temperatures, clock event reasons), then b1_band.py: the steps' pace beside
#             what the card reported, in 0.1 s windows (~2 min)
# power       power_probe_gpu.py: the 8B layer chain's GEMVs (skinny picks, other tiles,
#             cuBLAS, the tensor-core gemv_mma probe after its sweep) each replayed for 3 s
#             from an idle card: cold and hot pace, watts, joules a replay, SM clock, power-cap
#             share from NVML (~3 min); $POWER_ONLY picks variants, e.g. "picks;folded
#             picks;folded narrow;folded 8x1024;folded 16x1024;folded 8x2048;copy" (~1.5 min)
# timeline    Qwen3-8B b1 with a profiled run's per-step GPU busy/idle time, its largest
#             idle gaps and what runs outside the graphs (step_timeline.py; ~1.5 min)
# programs    program_timeline_gpu.py: the 8B batch-1 decode graph with per-program
#             timestamps (start, wait passed, work done, end; kernels/_trace.py): each
#             launch's release after the one before, ramp, tail and share of the chain,
#             beside the tracer's GPU test ($PROGRAMS_CONTEXTS, default "320 2048") (~3 min)
# targets     offline_gpu.py without the peer: the #4 targets (b1, ttft1024, c64), b1 again
#             with fuse_norm_gemm, b1 and c64 with fuse_rope_attention off (the L2 prefetch
#             has its own phase, l2); b1 and c64 with
#             pdl off; b1 with cuBLAS only and pdl off; then b1 with decode steps one at a
#             time (overlap_decode off) for comparison (TARGETS_SERIAL=0 skips that)
# online      offline c64 without the peer, then online_gpu.py through the gateway (stream
#             intervals $ONLINE_INTERVALS, default "1 8" tokens per message)
# final       the #4 figures alone: targets' first run (b1, ttft1024, c64 of both models),
#             then online_gpu.py with one stream interval ($ONLINE_INTERVALS, default 1),
#             its ratio against that run's 8B c64 (~4 min)
# compiles    compile_stability_gpu.py: Qwen3-0.6B, then the 8B, each on an empty Triton cache,
#             serving varied traffic (prompt lengths, prefixes, sampling, concurrency) in
#             passes after start-up: the kernels each pass compiled, its longest step
#             (~4 min; $COMPILES_MODELS, default "qwen3-0.6b qwen3-8b"; $COMPILES_ARGS are
#             added, e.g. "--speculative draft_model --draft-model qwen3-0.6b", and
#             $COMPILES_TAG to the result's name; $COMPILES_TIMEOUT: seconds a model, default 280)
# rows        eager row buckets on and off, on one tuning cache: c64 of both models (what
#             padding costs where steps are compute-bound), then the 0.6B serving new varied
#             traffic every pass (new row counts throughout: what the buckets save) (~8 min;
#             $ROWS_C64, $ROWS_ORDER, $ROWS_PASSES: see the phase)
# mixed       prefill graphs holding mixed steps: their GPU tests (with spec and parity), the
#             0.6B's varied traffic with mixed steps replayed and eager ($MIXED_ORDER), the
#             ttft1024 and c64 targets (~7 min)
# sampling    requests that set more sampling fields ($SAMPLING, offline_gpu.py --sampling
#             pairs; default "logprobs=5", e.g. "presence_penalty=0.5 frequency_penalty=0.5"):
#             the overlap GPU tests (SAMPLING_TESTS=0: none), then $SAMPLING_WORKLOADS
#             (default "b1 c64") of $SAMPLING_MODEL (default qwen3-0.6b) with decode steps
#             serial and overlapped, on one tuning cache (~3 min); SAMPLING_PROFILE=1 adds a
#             b1 request under cProfile and b1's step timeline to each side
# firstuse    first_use_gpu.py: host µs of Qwen3-8B's layer GEMMs at new row counts (cuBLAS
#             and cuBLASLt), after a sweep of row buckets, at buckets; torch's sampler
#             operators at new batch sizes (~15 s)
# spec        spec_bench.py --grid gpu (speculative decoding, spec off vs on; $SPEC_ARGS are
#             added, e.g. "--concurrency 32")
# overhead    spec_overhead.py --device cuda (drafter transport cost per step)
# skinny      skinny GEMM kernel: GPU tests at Qwen3 sizes, then skinny_gemm_gpu.py vs cuBLAS
# pdl         pdl_probe_gpu.py: what programmatic dependent launch saves per norm -> GEMV
#             pair at the 8B o_proj and down_proj shapes, with the GEMV prefetching its first
#             tile, and its rows' next 2 KB to L2, before its wait; and a GEMV chain whose
#             GEMVs wait on their predecessor's arrival counter instead of its grid's
#             completion (~1 min)
# dependent   programmatic dependent launch (pdl): its GPU tests with the skinny kernel's and
#             the folded rotation's, the random-Qwen3 parity test, and a profile of the 8B
#             at b1 (~2.5 min)
# stream      layer_stream_probe_gpu.py: one persistent launch per 8B decode layer (o_proj to
#             the next qkv, grid barriers between the GEMVs: software-pipelined Triton, and
#             Gluon with a TMA producer warp) against the separate kernels, with the barriers'
#             and the arithmetic's cost each left out; then the stream kernel's GPU test
#             (~1 min; the Gluon kernels need the GPU machine's Triton 3.6)
# ab          the working tree's engine against other revisions' (.xfer/ab_engine*, written
#             by bench/ab_engine.sh REV [SIDE]; carry .xfer): $AB_MODEL (default qwen3-8b)
#             $AB_WORKLOADS (default b1; e.g. "b1 ttft1024") at $AB_REPS reps (default 3),
#             engine processes taking turns (tree, then each side), $AB_ROUNDS rounds (default 3) on
#             one tuning cache, or with AB_TUNING=own one cache a side (for a change to the
#             candidate configs or the cache's format), each side on a Triton compile
#             cache of its own (first starts comparable); a side's first process tunes
#             (~2 min), the others take ~20 s each; each prints its TPOT, its decode
#             graph's GPU time and its one-row decode GEMM picks; $AB_ARGS: more
#             offline_gpu.py arguments for every side (e.g. "--sampling logprobs=5")
# sweep       skinny_gemm_gpu.py --sweep: ~60 one-row launch configurations per Qwen3 shape
#             vs cuBLAS, the 3 fastest again with evict_first weights and with PDL (~1.5 min)
#
# Durations seen on an H200 (plan device time with them): tests ~4 min, embeddings ~1 min
# plus ~40 s per variant, targets ~4 min, dependent ~2.5 min, sweep ~1.5 min, pdl ~20 s, online ~1 min per stream interval plus ~40 s
# for its offline run, spec ~5.5 min (the grid alone ~5 min; one concurrency of it still takes over 2.5 min:
# the models load and warm up once per group), overlap ~2 min, skinny ~3 min, check
# ~8 min, prefillgraphs ~3 min, picks ~1.5 min, timeline ~2 min, fold ~5 min. Model files
# in parts (bench/gpu_assets.sh; ~5 s of device time a call): the tree (~11 MiB) and .whl/
# (~10 MiB) leave a call room for one part of 32 MiB (JACANA_XFER_CHUNK_MIB=32), so
# SmolLM2's GGUF (94 MiB) takes three calls that follow each other within the machine's
# 30 s idle release, each running a phase of its own (the last the one that needs it).
# A cold online phase ~4 min (tuning ~2 min a start).
#
# Wheels the device lacks travel in .whl/ (installed to /tmp/site), written here by
# bench/gpu_wheels.sh: online needs them (fastapi, a grpcio as new as the stubs), and so
# do SmolLM2's parity and trace (transformers reads the GGUF with gguf). Model files larger
# than one call may carry come over in parts first (bench/gpu_assets.sh): each call copies
# the parts it carries to /tmp, and assets whose parts are complete are assembled there.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
stamp() { echo "[suite +$(($(date +%s) - T0))s] $*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=services/engine/src:services/embeddings/src:services/drafter/src:libs/common/src:services/gateway/src:bench:tests${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.used,memory.total,power.limit,clocks.max.sm,clocks.sm,clocks.mem --format=csv,noheader
eval "$(bash bench/gpu_assets.sh receive)"
export JACANA_MODEL_CACHE=/tmp/jacana-assets
smollm2=${JACANA_ASSET_SMOLLM2_135M_INSTRUCT_Q4_1_GGUF:-}
[ -n "$smollm2" ] && export JACANA_SMOLLM2_GGUF=$smollm2

PYTEST=(python3 -m pytest -p no:cacheprovider -o "addopts=-ra --import-mode=importlib" -q)

in_own_group() {  # run "$@" as the leader of a new process group; prints nothing
  setsid "$@" &
  echo $! >>"$OUT/.groups"
  wait $!
}

end_leftovers() {  # kill what the groups started by in_own_group left running, and say so
  local group left
  for group in $(cat "$OUT/.groups" 2>/dev/null); do
    left=$(pgrep -g "$group" -a 2>/dev/null) || continue
    echo "[suite] left running by process group $group, ended:"
    echo "$left" | head -5
    kill -TERM -- "-$group" 2>/dev/null
  done
  rm -f "$OUT/.groups"
  sleep 2
  echo "[suite] load average $(cut -d' ' -f1-3 /proc/loadavg); GPU processes:" \
    "$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
}

norm_ab() {  # $1: an offline_gpu.py flag (its --no- twin the other side); $2: the skinny
  # kernel's GPU tests to run first (-k); $3: rounds of b1 without then with the flag, both
  # models, on one tuning cache (the first start tunes, ~2 min cold; the rest ~20 s each)
  local flag=$1 tests=$2 rounds=$3 round side
  stamp "GPU tests: -k \"$tests\""
  timeout 180 "${PYTEST[@]}" services/engine/tests/kernels/test_skinny_gemm.py -k "$tests" 2>&1 \
    | tail -4  # on the GPU, the device tests run at their sizes there
  rm -f "/tmp/jacana-$flag-tuning.json"
  for round in $(seq "$rounds"); do
    for side in "no-$flag" "$flag"; do
      stamp "b1 with --$side (round $round)"
      timeout 200 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
        --workloads b1 "--$side" --reps 3 --tuning-cache "/tmp/jacana-$flag-tuning.json" \
        --name "offline_b1_${side}_$round" --out "$OUT" 2>&1 \
        | grep -E "^\| qwen3-[0-9.]+b \| b1 \| (tpot|itl)|split over|graph GPU|^\| qwen3-[0-9.]+b \| [0-9]" \
        | tail -8
    done
  done
}

PARITY=services/engine/tests/test_gpu_engine.py

parity_tests() {  # $1: seconds at most; then the parity tests to run (-k words), each in
  # a process of its own with a report file of its own (a test rewrites its file whole),
  # merged into $OUT/gpu_parity.json once all are done
  local seconds=$1 model
  shift
  for model in "$@"; do
    JACANA_GPU_REPORT="$OUT/gpu_parity_$model.json" in_own_group timeout -s INT "$seconds" \
      "${PYTEST[@]}" -m "gpu and not slow" --durations=5 -k "$model" "$PARITY" \
      >"$OUT/pytest_gpu_parity_$model.log" 2>&1 &
  done
  wait
  python3 - "$OUT/gpu_parity.json" "${@/#/$OUT/gpu_parity_}" <<'MERGE'
import json, os, sys  # one report of the parity tests that wrote theirs
reports = [json.load(open(f + ".json")) for f in sys.argv[2:] if os.path.exists(f + ".json")]
json.dump({k: v for report in reports for k, v in report.items()}, open(sys.argv[1], "w"), indent=2)
MERGE
  for model in "$@"; do
    tail -8 "$OUT/pytest_gpu_parity_$model.log"
  done
}

tests_beside_qwen3_parity() {  # $1: seconds at most; then the GPU test files to run, in one
  # pytest beside the random Qwen3's parity test (its own process)
  local seconds=$1
  shift
  parity_tests "$seconds" qwen3 >"$OUT/parity_tails.log" &
  timeout "$seconds" "${PYTEST[@]}" -m "gpu and not slow" "$@" 2>&1 | tail -6
  wait
  cat "$OUT/parity_tails.log"
  end_leftovers
}

gpu_tests() {  # $1: seconds at most (SIGINT, so pytest still reports its durations)
  stamp "GPU tests"
  local end=$(($(date +%s) + $1)) left
  local memory=services/engine/tests/test_kv_sizing.py
  # The KV-sizing tests read the device's free memory, so they run alone first. Then the
  # two parity tests (mostly transformers' generate, bound by the host's Python; random
  # Qwen3 ~70 s, SmolLM2 ~230 s) each run in a process of their own beside the rest, whose
  # engines have fixed KV pools: the slowest of the three sets the time, not their sum.
  # Each pytest leads its own process group, so that whatever it leaves running is
  # ended (and named) before the benchmarks that follow.
  in_own_group timeout -s INT "$1" "${PYTEST[@]}" -m "gpu and not slow" "$memory" \
    >"$OUT/pytest_gpu_memory.log" 2>&1
  left=$((end - $(date +%s)))
  parity_tests "$left" qwen3 smollm2 >"$OUT/parity_tails.log" &
  in_own_group timeout -s INT "$left" "${PYTEST[@]}" -m "gpu and not slow" --durations=15 \
    --ignore="$PARITY" --ignore="$memory" services/engine/tests services/embeddings/tests \
    >"$OUT/pytest_gpu.log" 2>&1
  wait
  tail -3 "$OUT/pytest_gpu_memory.log"
  cat "$OUT/parity_tails.log"
  tail -30 "$OUT/pytest_gpu.log"
  end_leftovers
  stamp "GPU tests done"
}

graph_tool() {  # $1: a one-row graph tool of bench/ run on the 8B; $2: seconds at most;
  # $3: lines of its output to show
  timeout "$2" python3 "bench/$1" --model qwen3-8b --out "$OUT" 2>&1 \
    | grep -v "^\[transformers\]" | tail -"$3"
}

offline_grid() {  # $1: seconds at most
  stamp "offline grid"
  timeout "$1" python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --reps 3 \
    --profile --timeline --out "$OUT" 2>&1 | grep -v "^\[transformers\]" | tail -40
}

offline_targets() {  # the #4 targets without the peer: b1, ttft1024, c64 of both models
  stamp "offline targets (no peer)"
  timeout 240 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
    --workloads b1 ttft1024 c64 --reps 3 --name offline_targets --out "$OUT" 2>&1 | tail -14
}

online_streams() {  # the c64 load through the gateway, per stream interval (the online
  # ratio's other half is an offline c64 in the same call)
  local interval name
  for interval in ${ONLINE_INTERVALS:-1 8}; do
    stamp "online through the gateway, $interval token(s) per stream message"
    name=online_gpu; [ "$interval" = 1 ] || name=online_gpu_interval$interval
    JACANA_ENGINE_STREAM_INTERVAL=$interval timeout 240 python3 bench/online_gpu.py \
      --model qwen3-8b --reps 3 --name "$name" --out "$OUT" 2>&1 | tail -12
  done
}

online_ratio() {  # offline c64, then the same load through the gateway
  stamp "offline c64 (no peer) for the online ratio"
  timeout 240 python3 bench/offline_gpu.py --model qwen3-8b --no-hf --workloads c64 \
    --reps 3 --name offline_c64 --out "$OUT" 2>&1 | tail -8
  online_streams
}

for phase in "$@"; do
  case "$phase" in
    tests)
      gpu_tests 570
      ;;
    check)
      # the GPU checks and the grid with the peer in one 10-minute device call: the grid
      # gets what the tests leave of 590 s (its JSON is written model by model)
      gpu_tests 330
      offline_grid $((T0 + 590 - $(date +%s)))
      ;;
    embeddings)
      stamp "embeddings"
      model=()
      [ -n "${JACANA_ASSET_MINILM:-}" ] && model=(--model-dir "$JACANA_ASSET_MINILM")
      # The service's tokenizer spreads each batch over every core; the suite's global
      # TOKENIZERS_PARALLELISM=false (quiet forks elsewhere) would hold it to one.
      TOKENIZERS_PARALLELISM=true timeout 300 python3 bench/embeddings_gpu.py --out-dir "$OUT" --reps "${EMBED_REPS:-5}" \
        --sentences 12000 "${model[@]}" 2>&1 \
        | grep -v "Loading weights" | tail -30
      # the same without the peer, once per variant
      IFS=';' read -ra variants <<<"${EMBED_VARIANTS-"--no-cuda-graphs;--tokenizer-processes 4"}"
      for i in "${!variants[@]}"; do
        stamp "embeddings, variant $i: ${variants[$i]}"
        # shellcheck disable=SC2086  # a variant is several arguments
        TOKENIZERS_PARALLELISM=true timeout 150 python3 bench/embeddings_gpu.py --no-peer \
          --out-dir "$OUT/variant$i" --reps 3 --sentences 12000 "${model[@]}" ${variants[$i]} \
          2>&1 | grep -E "^\| [0-9]+x[0-9]+ \||alone|Target|padded shapes"
      done
      ;;
    offline)
      offline_grid 330
      ;;
    parity)
      stamp "engine vs transformers parity tests alone"
      # shellcheck disable=SC2086  # the list is several words
      parity_tests 400 ${PARITY_TESTS:-qwen3 smollm2}
      end_leftovers
      ;;
    trace)
      stamp "SmolLM2 traced layer by layer against transformers; origins replayed vs cuDNN"
      timeout 200 python3 bench/hf_trace_parity_gpu.py --prompts 0,1,2,3,4,5,6,7 --modes eager \
        --out "$OUT" 2>&1 | grep -E "parts at|origins"
      timeout 90 python3 bench/flash_numerics_probe_gpu.py --reference cudnn --variants engine \
        --sites "$OUT/hf_trace_sites_smollm2.pt" --out "$OUT/sites" 2>&1 | grep -E "^(engine|variant)"
      variants="engine,warps4/ncudnn/exp[012]/sum[03]/dot0/div0/fwd,warps4/n64/exp0/sum3/dot0/div0/fwd"
      timeout 200 python3 bench/flash_numerics_probe_gpu.py --reference cudnn \
        --variants "$variants" --out "$OUT" 2>&1 | grep -E "^(engine|variant|warps)"
      timeout 60 python3 bench/reduction_order_probe_gpu.py \
        --reveal 576x1,576x8,576x16,64x2,64x8,64x64 --out "$OUT"
      ;;
    l2)
      # one tuning cache for every run, so all run the same picks and only the prefetch
      # differs (the first run times and fills it)
      stamp "8B b1 with each one-row PDL GEMV prefetching 0, 4, 8, 16, 32 MiB of its weight to L2"
      rm -f /tmp/jacana-l2-tuning.json
      for l2 in 0 4194304 8388608 16777216 33554432; do
        timeout 120 python3 bench/offline_gpu.py --model qwen3-8b --no-hf --workloads b1 \
          --l2-prefetch-bytes $l2 --reps 3 --tuning-cache /tmp/jacana-l2-tuning.json \
          --name offline_b1_l2_budget_$l2 --out "$OUT" 2>&1 \
          | grep -E "^\| qwen3-8b \| b1 \| tpot|L2 prefetch|graph GPU|^\| qwen3-8b \| [0-9]" | tail -4
      done
      ;;
    picks)
      stamp "in-graph search of the 8B's one-row decode GEMM picks (graph_picks_gpu.py)"
      graph_tool graph_picks_gpu.py 300 0
      sed -n 1,20p "$OUT/graph_picks_gpu.md"
      ;;
    attnchain)
      stamp "8B batch-1 decode attention in the chain by context and launch (attention_chain_gpu.py)"
      graph_tool attention_chain_gpu.py 300 20
      ;;
    ablation)
      stamp "what each kind of launch costs in the 8B's batch-1 decode graph (graph_ablation_gpu.py)"
      graph_tool graph_ablation_gpu.py 300 40
      ;;
    attention)
      stamp "decode attention: its GPU tests and the random Qwen3's parity, side by side"
      tests_beside_qwen3_parity 200 services/engine/tests/kernels/test_decode_attention_merge.py \
        services/engine/tests/kernels/test_decode_rotation.py \
        services/engine/tests/kernels/test_attention.py \
        services/engine/tests/test_dependent_launch.py \
        services/engine/tests/test_decode_overlap.py
      stamp "b1 of both models"
      timeout 200 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
        --workloads b1 --reps 3 --name offline_b1 --out "$OUT" 2>&1 \
        | grep -E "^\| qwen3-[0-9.]+b \| (b1|[0-9])" | tail -8
      ;;
    head)
      stamp "the decode graphs' head: its GPU tests and the random Qwen3's parity, side by side"
      tests_beside_qwen3_parity 200 services/engine/tests/kernels/test_argmax.py \
        services/engine/tests/kernels/test_skinny_gemm.py \
        services/engine/tests/test_graph_head.py \
        services/engine/tests/test_dependent_launch.py \
        services/engine/tests/test_decode_overlap.py
      stamp "the #4 targets without the peer"
      timeout 320 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
        --workloads b1 ttft1024 c64 --reps 3 --name offline_targets --out "$OUT" 2>&1 \
        | grep -E "^\| qwen3-[0-9.]+b \| |decode GEMM" | tail -24
      ;;
    split)
      norm_ab split-norm split 1
      ;;
    fold)
      norm_ab fold-norm-weights "in_the_gemms or then_residual or consumers_weight" "${FOLD_ROUNDS:-2}"
      ;;
    prefill)
      stamp "prefill attention: its GPU tests, then its launch settings (prefill_attention_gpu.py)"
      timeout 120 "${PYTEST[@]}" -m gpu services/engine/tests/kernels/test_attention.py \
        -k prefill 2>&1 | tail -3
      timeout 120 python3 bench/prefill_attention_gpu.py --out "$OUT" 2>&1 | tail -20
      stamp "one 1024-token prompt: TTFT, its GPU timeline and host profile (prefill_host_gpu.py)"
      timeout 300 python3 bench/prefill_host_gpu.py --model qwen3-0.6b --model qwen3-8b \
        --no-hf --decode-gemm torch --reps 5 --out "$OUT" 2>&1 | grep -v "^\[transformers\]" \
        | grep -v " INFO " | tail -150
      ;;
    prefillgraphs)
      stamp "one-sequence prefill graphs: their GPU tests"
      timeout 150 "${PYTEST[@]}" -m gpu services/engine/tests/test_prefill_graphs.py \
        >"$OUT/pytest_prefill_graphs.log" 2>&1
      tail -4 "$OUT/pytest_prefill_graphs.log"
      # one tuning cache: both runs decode on the same picks, only the prefill differs
      rm -f /tmp/jacana-prefill-tuning.json
      for tokens in 0 2048; do
        stamp "b1 and ttft1024 with prefill_graph_tokens=$tokens"
        timeout 200 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
          --workloads b1 ttft1024 --prefill-graph-tokens $tokens --reps 5 \
          --tuning-cache /tmp/jacana-prefill-tuning.json --name "offline_prefill_graphs_$tokens" \
          --out "$OUT" 2>&1 | grep -E "^\| qwen3-[0-9.]+b \| (b1|ttft1024) \|" | tail -24
      done
      ;;
    sampling)
      if [ "${SAMPLING_TESTS:-1}" = 1 ]; then
        stamp "overlapped decoding with sampling fields: its GPU tests"
        timeout 150 "${PYTEST[@]}" -m gpu services/engine/tests/test_decode_overlap.py \
          services/engine/tests/test_graph_head.py 2>&1 | tail -3
      fi
      rm -f /tmp/jacana-sampling-tuning.json
      fields=()
      for pair in ${SAMPLING:-logprobs=5}; do fields+=(--sampling "$pair"); done
      profile=()
      [ "${SAMPLING_PROFILE:-0}" = 1 ] && profile=(--host-profile --timeline)
      for side in --serial ""; do
        stamp "${SAMPLING_WORKLOADS:-b1 c64} with ${SAMPLING:-logprobs=5} ${side:-(overlapped)}"
        # shellcheck disable=SC2086  # $side: no word or one; the workloads: several
        timeout 200 python3 bench/offline_gpu.py --model "${SAMPLING_MODEL:-qwen3-0.6b}" --no-hf \
          --workloads ${SAMPLING_WORKLOADS:-b1 c64} "${fields[@]}" $side --reps 3 \
          --tuning-cache /tmp/jacana-sampling-tuning.json "${profile[@]}" \
          --name "offline_sampling${side:+_serial}" --out "$OUT" 2>&1 \
          | grep -E "^\| qwen3-[0-9.]+b \| (b1|c64) \| (tpot|output_tok)|^\| qwen3-[0-9.]+b \| (b1|c64) \| [0-9]|^ +[0-9]+ +[0-9.]+ +[0-9.]+|busy|under cProfile" \
          | head -${SAMPLING_LINES:-40}
      done
      ;;
    rows)
      # one tuning cache: both sides decode on the same picks, only the eager steps differ.
      # $ROWS_C64=0 skips the c64 A/B; $ROWS_ORDER: the varied-traffic processes in order
      # (on/off; default "on off"; "on off off on" weighs the host's drift process to
      # process); $ROWS_PASSES: passes of each (default 5)
      rm -f /tmp/jacana-rows-tuning.json
      if [ "${ROWS_C64:-1}" = 1 ]; then
        for flag in eager-row-buckets no-eager-row-buckets; do
          stamp "c64 of both models, --$flag"
          timeout 240 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
            --workloads c64 --reps 3 --$flag --tuning-cache /tmp/jacana-rows-tuning.json \
            --name "offline_rows_$flag" --out "$OUT" 2>&1 | grep -E "^\| qwen3-[0-9.]+b \| c64 \|"
        done
      fi
      n=0
      for side in ${ROWS_ORDER:-on off}; do
        n=$((n + 1))
        flag=eager-row-buckets; [ "$side" = on ] || flag=no-eager-row-buckets
        stamp "0.6B varied traffic, new every pass (new row counts throughout), --$flag"
        timeout 150 python3 bench/compile_stability_gpu.py --model qwen3-0.6b \
          --passes "${ROWS_PASSES:-5}" --$flag --tuning-cache /tmp/jacana-rows-tuning.json \
          --name "compile_stability_rows_${n}_$flag" --out "$OUT" 2>&1 | grep -E "^\| [0-9]+ \|"
      done
      ;;
    mixed)
      # prefill graphs holding mixed steps (several sequences): their GPU tests beside the
      # spec and parity tests, then the 0.6B's varied traffic with mixed steps replayed
      # and eager ($MIXED_ORDER, default "0 1": prefill_graph_seqs of each process), then
      # the targets' ttft1024 and c64 of both models with the default
      stamp "prefill graph GPU tests, beside the spec and random-Qwen3 parity tests"
      in_own_group timeout -s INT 200 "${PYTEST[@]}" -m gpu services/engine/tests/test_prefill_graphs.py \
        services/engine/tests/test_row_buckets.py services/engine/tests/kernels/test_attention.py \
        >"$OUT/pytest_mixed.log" 2>&1 &
      in_own_group timeout -s INT 200 "${PYTEST[@]}" -m gpu services/engine/tests/test_spec_gpu.py \
        "services/engine/tests/test_gpu_engine.py::test_random_qwen3_matches_transformers" \
        >"$OUT/pytest_spec_parity.log" 2>&1 &
      wait
      tail -4 "$OUT/pytest_mixed.log" "$OUT/pytest_spec_parity.log"
      end_leftovers
      rm -f /tmp/jacana-mixed-tuning.json
      for seqs in ${MIXED_ORDER:-0 1}; do
        stamp "0.6B varied traffic, prefill_graph_seqs $seqs"
        timeout 120 python3 bench/compile_stability_gpu.py --model qwen3-0.6b --passes 3 \
          --prefill-graph-seqs "$seqs" --tuning-cache /tmp/jacana-mixed-tuning.json \
          --name "compile_stability_mixed_seqs$seqs" --out "$OUT" 2>&1 | grep -E "^\| [0-9]+ \|"
      done
      stamp "ttft1024 and c64 of both models, mixed steps replayed"
      timeout 200 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
        --workloads ttft1024 c64 --reps 3 --name offline_mixed --out "$OUT" 2>&1 \
        | grep -E "^\| qwen3-[0-9.]+b \| (c64|ttft1024) \| (ttft_ms|tpot_ms|output_tok_s)"
      ;;
    band)
      stamp "8B b1 beside nvidia-smi's samples"
      nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory,clocks_event_reasons.active \
        --format=csv,noheader -lms 50 >"$OUT/b1_band_smi.csv" 2>&1 &
      smi=$!
      timeout 200 python3 bench/offline_gpu.py --model qwen3-8b --no-hf --workloads b1 \
        --reps 5 --name offline_b1_band --out "$OUT" 2>&1 | grep -E "tpot_ms" | tail -2
      kill "$smi" 2>/dev/null
      python3 bench/b1_band.py "$OUT/offline_b1_band.json" "$OUT/b1_band_smi.csv" | tail -60
      ;;
    power)
      stamp "the 8B layer chain's energy and sustained pace by GEMV launch"
      only=()  # $POWER_ONLY: the variants to run (';'-separated); gemv_mma's sweep only for "mma"
      if [ -n "${POWER_ONLY:-}" ]; then
        only=(--only "$POWER_ONLY")
        case ";$POWER_ONLY;" in *";mma;"*) ;; *) only+=(--no-mma) ;; esac
      fi
      timeout 400 python3 bench/power_probe_gpu.py --out "$OUT" "${only[@]}" 2>&1 \
        | grep -v "^{" | tail -24
      ;;
    programs)
      timeout 120 "${PYTEST[@]}" -m gpu services/engine/tests/kernels/test_trace.py 2>&1 | tail -3
      stamp "8B b1 decode graph, per-program stamps"
      # shellcheck disable=SC2086  # the contexts are words
      timeout 300 python3 bench/program_timeline_gpu.py --contexts ${PROGRAMS_CONTEXTS:-320 2048} \
        --out "$OUT" 2>&1 | tail -40
      ;;
    timeline)
      stamp "8B b1 with its profiled step timeline"
      timeout 150 python3 bench/offline_gpu.py --model qwen3-8b --no-hf --workloads b1 \
        --reps 3 --timeline --name offline_b1_timeline --out "$OUT" 2>&1 \
        | grep -v "^\[transformers\]" | tail -40
      ;;
    firstuse)
      stamp "host cost of a first use: cuBLAS at new row counts, the sampler at new batch sizes"
      timeout 200 python3 bench/first_use_gpu.py --out "$OUT" 2>&1 | grep -v Warning | tail -30
      ;;
    online) online_ratio ;;
    final)  # offline_targets' 8B c64 is the online ratio's offline half
      offline_targets
      ONLINE_INTERVALS=${ONLINE_INTERVALS:-1} online_streams
      ;;
    compiles)
      for model in ${COMPILES_MODELS:-qwen3-0.6b qwen3-8b}; do
        stamp "kernels compiled while serving varied traffic: $model"
        # shellcheck disable=SC2086  # $COMPILES_ARGS: several arguments
        timeout "${COMPILES_TIMEOUT:-280}" python3 bench/compile_stability_gpu.py --model "$model" ${COMPILES_ARGS:-} \
          --name "compile_stability_${model//[.-]/_}${COMPILES_TAG:-}" --out "$OUT" 2>&1 \
          | tail -25
      done
      ;;
    targets)
      offline_targets
      stamp "b1 with each RMSNorm folded into the GEMM after it where faster (fuse_norm_gemm)"
      timeout 150 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
        --workloads b1 --fuse-norm-gemm --reps 3 --name offline_b1_fuse_norm --out "$OUT" \
        2>&1 | grep -E "^\| qwen|RMSNorm \+ decode GEMM" | tail -30
      stamp "b1 and c64 with RoPE + KV store in their own kernel (fuse_rope_attention off)"
      timeout 150 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
        --workloads b1 c64 --no-fuse-rope-attention --reps 3 --name offline_rope_kernel \
        --out "$OUT" 2>&1 | grep -E "^\| qwen" | tail -18
      stamp "b1 and c64 with plain launches (pdl off)"
      timeout 200 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
        --workloads b1 c64 --no-pdl --reps 3 --name offline_no_pdl --out "$OUT" 2>&1 \
        | grep -E "^\| qwen|decode GEMM" | tail -30
      stamp "b1 with cuBLAS for every decode GEMM and plain launches (decode_gemm torch, pdl off)"
      timeout 150 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
        --workloads b1 --decode-gemm torch --no-pdl --reps 3 --name offline_b1_cublas \
        --out "$OUT" 2>&1 | grep -E "^\| qwen|decode GEMM" | tail -30
      [ "${TARGETS_SERIAL:-1}" = 1 ] || continue
      stamp "b1 with decode steps one at a time"
      timeout 150 python3 bench/offline_gpu.py --model qwen3-8b --model qwen3-0.6b --no-hf \
        --workloads b1 --serial --reps 3 --name offline_b1_serial --out "$OUT" 2>&1 | tail -8
      ;;
    dependent)
      stamp "programmatic dependent launch: GPU tests"
      timeout 240 "${PYTEST[@]}" -m gpu services/engine/tests/test_dependent_launch.py \
        services/engine/tests/kernels/test_skinny_gemm.py \
        services/engine/tests/kernels/test_decode_rotation.py \
        "services/engine/tests/test_gpu_engine.py::test_random_qwen3_matches_transformers" \
        2>&1 | tail -6
      stamp "8B b1, profiled"
      timeout 150 python3 bench/offline_gpu.py --model qwen3-8b --no-hf --workloads b1 \
        --reps 1 --profile --name offline_b1_pdl_profile --out "$OUT" 2>&1 | tail -40
      ;;
    spec)
      stamp "speculative decoding GPU test (graph-replayed verification)"
      JACANA_GPU_REPORT="$OUT/gpu_parity.json" timeout 70 "${PYTEST[@]}" -m gpu \
        services/engine/tests/test_spec_gpu.py 2>&1 | tail -6
      stamp "speculative decoding grid"
      # 512 new tokens: a run at concurrency 32 lasts ~1 s, long enough that the gate's
      # periodic measurements weigh in it as in a running server, and timing noise less.
      timeout "${SPEC_TIMEOUT:-480}" python3 bench/spec_bench.py --grid gpu --device cuda --reps 3 \
        --max-tokens 512 --out "$OUT" ${SPEC_ARGS:-} 2>&1 \
        | tee "$OUT/spec_stdout.log" | tail -60
      ;;
    overhead)
      stamp "drafter transport overhead"
      timeout 150 python3 bench/spec_overhead.py --device cuda --out "$OUT" 2>&1 | tail -20
      ;;
    skinny)
      stamp "skinny GEMM tests and microbenchmark"
      timeout 120 "${PYTEST[@]}" -m gpu services/engine/tests/kernels/test_skinny_gemm.py 2>&1 \
        | tail -6
      timeout 180 python3 bench/skinny_gemm_gpu.py --out "$OUT" 2>&1 | tail -50
      ;;
    pdl)
      stamp "programmatic dependent launch probe (norm -> one-row GEMV pairs)"
      timeout 90 python3 bench/pdl_probe_gpu.py --out "$OUT" 2>&1 | tail -10
      timeout 90 python3 bench/pdl_probe_gpu.py --k 12288 --n 4096 --name pdl_probe_gpu_down \
        --out "$OUT" 2>&1 | tail -8
      ;;
    stream)
      stamp "one persistent launch per decode layer against the separate kernels"
      timeout 240 python3 bench/layer_stream_probe_gpu.py --reps 5 --out "$OUT" 2>&1 | tail -22
      timeout 120 "${PYTEST[@]}" -m gpu services/engine/tests/kernels/test_layer_stream_probe.py 2>&1 | tail -4
      ;;
    ab)
      sides=(tree)
      for dir in .xfer/ab_engine .xfer/ab_engine_*; do
        [ -d "$dir" ] || continue
        side=${dir#.xfer/ab_engine}
        side=${side#_}
        side=${side:-base}
        rm -rf "/tmp/jacana-ab-$side" && mkdir -p "/tmp/jacana-ab-$side"
        cp -r "$dir" "/tmp/jacana-ab-$side/jacana_engine"
        sides+=("$side")
      done
      if [ ${#sides[@]} = 1 ]; then
        echo "ab: no .xfer/ab_engine* (bench/ab_engine.sh REV [SIDE] writes it; carry .xfer)" >&2
        continue
      fi
      rm -rf /tmp/jacana-ab-tuning*.json /tmp/jacana-ab-triton-*
      model=${AB_MODEL:-qwen3-8b}
      for round in $(seq "${AB_ROUNDS:-3}"); do
        for side in "${sides[@]}"; do
          src=services/engine/src
          [ "$side" = tree ] || src=/tmp/jacana-ab-$side
          cache=/tmp/jacana-ab-tuning.json
          [ "${AB_TUNING:-shared}" = own ] && cache=/tmp/jacana-ab-tuning-$side.json
          stamp "$model ${AB_WORKLOADS:-b1} on the $side's engine (round $round)"
          # a Triton compile cache a side: each side's first start compiles all it runs
          TRITON_CACHE_DIR=/tmp/jacana-ab-triton-$side \
            PYTHONPATH=$src:${PYTHONPATH#services/engine/src:} timeout 240 python3 bench/offline_gpu.py \
            --model "$model" --no-hf --workloads ${AB_WORKLOADS:-b1} --reps "${AB_REPS:-3}" \
            --tuning-cache "$cache" --name "ab_${side}_$round" --out "$OUT" ${AB_ARGS:-} 2>&1 \
            | grep -E "^\| $model \| [a-z0-9]+ \| (tpot_ms|itl_drift_ms|ttft_ms|output_tok)|^\| $model \| [0-9]" \
            | tail -7
          # the one-row decode GEMM picks of that start (the in-graph search's or the cache's)
          python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("picks:", {s: c.get("skinny", {}).get("1", "cuBLAS") for m in d["models"].values()
                 for s, c in m["info"].get("decode_gemm_picks", {}).items()})' \
            "$OUT/ab_${side}_$round.json" 2>/dev/null
        done
      done
      ;;
    sweep)
      stamp "skinny GEMM launch sweep at one row"
      timeout 300 python3 bench/skinny_gemm_gpu.py --sweep --out "$OUT" 2>&1 | tail -16
      ;;
    *) echo "unknown phase $phase" >&2 ;;
  esac
done
stamp "done"
