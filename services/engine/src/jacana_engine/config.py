"""Engine configuration: one frozen dataclass handed to every engine component.

``EngineConfig`` is what the engine core reads; the service's environment settings
(``settings.py``) are translated into it once at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jacana_engine.spec.config import SpeculativeConfig


@dataclass(frozen=True)
class EngineConfig:
    """How to load and run one model.

    model: a ``.gguf`` file, a Hugging Face directory (config.json + *.safetensors), or for
        ``load_format="dummy"`` a config.json path / HF directory whose shapes are used with
        random weights.
    model_id: the name clients use for this model.
    load_format: "auto" (from the path), "gguf", "safetensors" or "dummy".
    dtype: compute dtype, "float32" | "bfloat16" | "float16".
    device: torch device string, "cpu" or "cuda[:N]".
    block_size: tokens per KV-cache block.
    num_kv_blocks: size of the block pool; None sizes it from memory (below).
    kv_cache_memory_bytes: byte budget for the KV pool when ``num_kv_blocks`` is None.
    kv_cache_fraction: instead of a byte budget, this fraction of the memory free after
        the weights are loaded (CUDA: device memory; CPU: available RAM). With neither
        set: 0.9 of free memory on CUDA, 512 MiB on CPU (see ``kv_cache/sizing.py``).
    enable_prefix_caching: share the KV blocks of identical prompt prefixes between
        requests (content-hashed full blocks, LRU eviction).
    priority_aging_s: seconds of waiting that count as one priority level, so a waiting
        request of any priority is eventually served; 0 makes priorities strict.
    max_model_len: prompt + completion limit; None uses the model's own.
    max_num_seqs: most sequences in one step (running batch size).
    max_num_batched_tokens: token budget of one step (prefill chunks + decodes).
    seed: seed for requests that bring none and for dummy weights.
    attention_backend: a registered attention backend ("torch", "triton") or "auto"
        (triton on CUDA, torch elsewhere); its namesake layer ops come with it.
    linear_backend: GEMMs of the dense layers: "auto" (oneDNN on CPU when this torch build
        runs it correctly, else F.linear), "torch" or "onednn".
    decode_gemm: dense layers of decode-sized steps (<= 16 rows) on CUDA with graphs:
        "auto" (the default) times cuBLAS against the skinny Triton kernel per weight
        shape and row count at start-up and runs the faster (``layers/decode_gemm.py``);
        "torch" always cuBLAS (transformers' own GEMMs, so greedy output follows its
        rounding more often: ``bench/results/gpu_targets.md``).
    tune_in_graph: with ``decode_gemm="auto"`` and a batch-1 decode graph, time each
        weight shape's one-row choices (cuBLAS and the skinny candidates) inside that
        graph, shape after shape (``layers/graph_picks.py``), instead of keeping the picks
        of the tuner's same-shape chains (on an H200 a Qwen3-8B batch-1 graph 3.90 ->
        3.86 ms); ~150 graph captures at a Qwen3-8B's first start (each shape's ~28
        dependent candidates, ~10 of them folded one-row tiles, the lm_head's too), kept
        in ``tuning_cache``.
    pdl: in decode graphs of at most 16 tokens, launch the Triton kernels (norms, RoPE +
        KV store, attention, activation) with programmatic dependent launch
        (``kernels/_pdl.py``; compute capability 9.0 and later, off elsewhere); with
        ``decode_gemm="auto"`` the skinny kernel's candidates are also timed launched so,
        and one is kept where it is at least as fast as cuBLAS, whose launch would break
        the chain (``model_runner.PDL_MAX_TOKENS`` gives the measurements).
    fuse_rope_attention: on the Triton attention backend, fold the q/k norm, RoPE and KV
        store of decode steps into the decode attention launch (``DecodeRotation``: one
        launch fewer per layer, 0.04 ms off a Qwen3-8B batch-1 step on an H200; the same
        tokens as the rope kernel's, which GPU tests check). Never for float16
        activations (``model_runner.rope_folds_into_attention``).
    exact_decode_attention: on the Triton attention backend, where the attention kernels
        follow the numerics of cuDNN's attention, which transformers' SDPA runs on Hopper
        (head_dim <= 64: SmolLM2), decode adds a sequence of up to 256 keys in one pass as
        cuDNN does, whatever the CUDA graphs' split count, so its bits are cuDNN's; off,
        each tile may be its own split, merged after: faster at small batches (SmolLM2's
        shapes at batch 1 on an H200: 0.74 -> 0.54 ms per token), rounding otherwise.
    tuning_cache: a JSON file where the ``decode_gemm="auto"`` choices are kept per GPU,
        software and shape, so a restart skips the timing (``layers/tuning_cache.py``);
        None times at every start.
    enforce_eager: never capture or replay CUDA graphs.
    overlap_decode: while a decode step runs on the device, plan and launch the next one
        (its input tokens are the running step's samples, read on the device) before
        reading the running step's tokens back (``decode_overlap.py``).
    stream_interval: streamed outputs carry at least this many tokens each (the first and
        the last excepted): fewer stream messages per token under load, coarser deltas.
    cuda_graph_max_batch_size: largest decode batch captured in a CUDA graph (capped at
        ``max_num_seqs``); larger decode batches run eagerly.
    prefill_graph_tokens: with CUDA graphs, also capture prefill graphs up to this many
        tokens (capped at ``max_num_batched_tokens`` and ``max_model_len``): a step of
        2 to that many tokens with prompt (or draft) tokens replays one
        (``prefill_graphs.py``) instead of the eager forward's ~10 host calls a layer;
        0: off. On an H200 they took a 1024-token prompt's first token from 10.6 to
        3.6 ms on Qwen3-0.6B and from 23.9 to 21.9 ms on Qwen3-8B.
    prefill_graph_seqs: the most sequences a prefill graph's step holds (its chunks beside
        decode rows: mixed steps replay too); 0: ``max_num_seqs``; 1: one chunk alone.
    eager_row_buckets: where CUDA graphs could run (CUDA, a graph-safe attention
        backend), pad an eager step's token rows (prompts, or prompts beside decodes) to
        one of ~150 counts whose GEMM shapes the warm-up met (``row_buckets.py``): cuBLAS
        chooses a kernel on the host the first time it meets a shape, 130-170 µs a call
        on an H200's host against 20-30 µs after, four shapes a step.
    warm_up: before the engine is ready, serve a few dummy requests through every sampling
        path and prefill grid (``warm_up.py``) so the Triton kernel variants only traffic
        reaches compile at start-up, not in the middle of a served step, then reset the
        engine's bookkeeping; None: on CUDA only (on an H200 the first varied traffic
        otherwise compiled 4 kernels, one step stalling 1.4 s).
    speculative: speculative decoding (proposer, k, transport); off by default.
    pooling: embeddings (the ``Embed`` RPC): "auto" (what the checkpoint declares, see
        ``pooling_config.py``), "none", or a pooling method ("last", "mean", "cls").
    embed_normalize: L2-normalize embeddings; None follows the checkpoint (else True).
    """

    model: str
    model_id: str = "model"
    load_format: str = "auto"
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_fraction: float | None = None
    enable_prefix_caching: bool = True
    priority_aging_s: float = 10.0
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    seed: int = 0
    attention_backend: str = "auto"
    linear_backend: str = "auto"
    decode_gemm: str = "auto"
    tune_in_graph: bool = True
    pdl: bool = True
    fuse_rope_attention: bool = True
    exact_decode_attention: bool = True
    tuning_cache: str | None = None
    enforce_eager: bool = False
    overlap_decode: bool = True
    cuda_graph_max_batch_size: int = 512
    prefill_graph_tokens: int = 2048
    prefill_graph_seqs: int = 0
    eager_row_buckets: bool = True
    warm_up: bool | None = None
    stream_interval: int = 1
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    pooling: str = "auto"
    embed_normalize: bool | None = None
