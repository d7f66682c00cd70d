"""Whether, and how, an engine embeds: the :class:`PoolingSpec` from settings and model files.

``JACANA_ENGINE_POOLING=auto`` (the default) reads what the checkpoint declares:
- a GGUF file: llama.cpp's ``<arch>.pooling_type`` key (1 mean, 2 cls, 3 last; 0/none or
  absent: a generation model, no embeddings);
- a Hugging Face directory in the sentence-transformers layout: ``modules.json`` names a
  Pooling module (its ``config.json`` says ``pooling_mode_lasttoken`` / ``mean_tokens`` /
  ``cls_token``) and, when present, a Normalize module (Qwen3-Embedding ships both:
  last-token pooling, normalized).
A chat checkpoint declares neither, so by default it does not embed.

``last`` / ``mean`` / ``cls`` force a method on any model (normalization from the files
when they say, else on), ``none`` turns embeddings off. Read once at start-up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jacana_engine.pooling.methods import POOLINGS, PoolingSpec

# llama.cpp's enum llama_pooling_type -> our method (rank pooling is a reranker head).
_GGUF_POOLING = {1: "mean", 2: "cls", 3: "last"}
# sentence-transformers Pooling config flag -> our method
_ST_POOLING = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}
_ST_UNSUPPORTED = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)


def resolve_pooling(
    model_path: str, pooling: str = "auto", normalize: bool | None = None
) -> PoolingSpec | None:
    """The engine's pooling, or None when it serves no embeddings.

    Raises ``ValueError`` for a setting or a declared pooling the engine cannot run.
    """
    if pooling == "none":
        return None
    declared = _declared(Path(model_path)) if model_path else None
    if pooling == "auto":
        if declared is None:
            return None
        method, declared_normalize = declared
    elif pooling in POOLINGS:
        method, declared_normalize = pooling, declared[1] if declared else None
    else:
        raise ValueError(f"pooling must be auto, none or one of {', '.join(POOLINGS)}")
    if normalize is None:
        normalize = True if declared_normalize is None else declared_normalize
    return PoolingSpec(method, normalize)


def _declared(path: Path) -> tuple[str, bool | None] | None:
    """(method, normalize or None when unsaid) that the checkpoint declares, if any."""
    if path.is_file() and path.suffix == ".gguf":
        return _from_gguf(path)
    if path.is_dir():
        return _from_sentence_transformers(path)
    return None


def _from_gguf(path: Path) -> tuple[str, bool | None] | None:
    from jacana_engine.loader.gguf_metadata import read_gguf_metadata

    md = read_gguf_metadata(path)
    arch = md.get("general.architecture", "")
    kind = md.get(f"{arch}.pooling_type")
    if kind is None or int(kind) == 0:
        return None
    if int(kind) not in _GGUF_POOLING:
        raise ValueError(f"{path}: GGUF pooling_type {kind} is not supported (1, 2 or 3)")
    return _GGUF_POOLING[int(kind)], None


def _from_sentence_transformers(directory: Path) -> tuple[str, bool | None] | None:
    modules = _read_json(directory / "modules.json")
    if not isinstance(modules, list):
        pooling_dir = directory / "1_Pooling"
        normalize = None
    else:
        types = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules}
        if "Pooling" not in types:
            return None
        pooling_dir = directory / str(types["Pooling"].get("path", "1_Pooling"))
        normalize = "Normalize" in types
    cfg = _read_json(pooling_dir / "config.json")
    if not isinstance(cfg, dict):
        return None
    odd = [k for k in _ST_UNSUPPORTED if cfg.get(k)]
    chosen = [method for key, method in _ST_POOLING.items() if cfg.get(key)]
    if odd or len(chosen) != 1:
        raise ValueError(
            f"{pooling_dir}: pooling {sorted(k for k, v in cfg.items() if v is True)} is not "
            "supported by the engine (one of last-token, mean, cls); set JACANA_ENGINE_POOLING"
        )
    return chosen[0], normalize


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as f:
        return json.load(f)
