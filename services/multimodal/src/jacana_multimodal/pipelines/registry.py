"""Which video models a deployment serves, and how each architecture is carded and loaded.

A ``ModelSpec`` (from settings) names a model id, an architecture and, for downloaded
checkpoints, a directory. ``ARCHITECTURES`` maps each architecture name to its card
template, the loader of its weights and, for the embedded tiny models, the builder that
creates the directory when the spec has none. Adding an architecture is one entry there.
``load_model`` hands the loader the worker's ``cuda_compile`` setting.

``card_for`` is pure and imports neither torch nor diffusers: the service, which validates
requests but never renders, stays light. Only ``load_model`` (in a render worker) imports
the pipeline modules.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jacana_multimodal.pipelines import cards
from jacana_multimodal.pipelines.base import ModelCard, VideoModel

if TYPE_CHECKING:
    import torch

DEFAULT_MODEL_ID = "wan-tiny-random"


@dataclass(frozen=True)
class ModelSpec:
    """One served model. ``path`` is the diffusers directory of its weights; None only for
    an embedded architecture, whose weights are built into the worker's cache directory."""

    id: str
    architecture: str
    path: Path | None = None


def _load_wan(
    path: Path,
    card: ModelCard,
    device: torch.device | str,
    dtype: torch.dtype,
    cuda_compile: bool,
):
    # Imported here, not at the top: torch and diffusers take seconds to import and the
    # service process never needs them.
    from jacana_multimodal.pipelines.wan import WanVideoModel

    return WanVideoModel.load(path, card, device=device, dtype=dtype, cuda_compile=cuda_compile)


def _build_tiny(cache_dir: Path, *, image_to_video: bool) -> Path:
    from jacana_multimodal.pipelines.tiny_wan import ensure_tiny_wan

    return ensure_tiny_wan(cache_dir, image_to_video=image_to_video)


@dataclass(frozen=True)
class Architecture:
    """How one architecture is served.

    ``card``: the template (its ``id`` is replaced by the spec's). ``load``: builds the
    ``VideoModel`` from a directory. ``embedded``: for architectures that ship their own
    weights, ``cache_dir -> directory``, used when the spec has no path.
    """

    card: ModelCard
    load: Callable[..., VideoModel]
    embedded: Callable[[Path], Path] | None = None


ARCHITECTURES: dict[str, Architecture] = {
    arch.card.architecture: arch
    for arch in (
        Architecture(cards.WAN21_T2V, _load_wan),
        Architecture(cards.WAN21_I2V, _load_wan),
        Architecture(
            cards.WAN21_T2V_TINY, _load_wan, embedded=partial(_build_tiny, image_to_video=False)
        ),
        Architecture(
            cards.WAN21_I2V_TINY, _load_wan, embedded=partial(_build_tiny, image_to_video=True)
        ),
    )
}


def default_specs() -> tuple[ModelSpec, ...]:
    """The embedded tiny text-to-video model alone: what a fresh install serves."""
    return (ModelSpec(id=DEFAULT_MODEL_ID, architecture=cards.WAN21_T2V_TINY.architecture),)


def _architecture(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ValueError(f"unknown video architecture {name!r} (known: {known})") from None


def card_for(spec: ModelSpec) -> ModelCard:
    """The card of ``spec``: its architecture's template under the spec's id. Loads nothing."""
    return dataclasses.replace(_architecture(spec.architecture).card, id=spec.id)


def model_path(spec: ModelSpec, cache_dir: Path) -> Path:
    """The directory ``spec``'s weights load from, building embedded weights on first use."""
    arch = _architecture(spec.architecture)
    if spec.path is not None:
        path = Path(spec.path)
        if not (path / "model_index.json").is_file():
            raise FileNotFoundError(
                f"model {spec.id!r}: {path} is not a diffusers directory (no model_index.json)"
            )
        return path
    if arch.embedded is None:
        raise ValueError(f"model {spec.id!r}: architecture {spec.architecture!r} needs a path")
    return arch.embedded(cache_dir)


def load_model(
    spec: ModelSpec,
    cache_dir: Path,
    device: torch.device | str,
    dtype: torch.dtype,
    cuda_compile: bool = False,
) -> VideoModel:
    """Load ``spec``'s weights onto ``device`` in ``dtype``; with ``cuda_compile``, a model
    on CUDA compiles its transformer (``MultimodalSettings.cuda_compile``).

    The caller picks them (``wan.default_device_and_dtype()`` gives the usual choice).
    """
    path = model_path(spec, Path(cache_dir))
    arch = _architecture(spec.architecture)
    return arch.load(path, card_for(spec), device, dtype, cuda_compile)


_SPEC_KEYS = {"id", "architecture", "path"}


def _spec_from(entry: Any, index: int) -> ModelSpec:
    if isinstance(entry, ModelSpec):
        entry = dataclasses.asdict(entry)
    where = f"video model #{index}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object with id, architecture and path")
    unknown = set(entry) - _SPEC_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (allowed: {sorted(_SPEC_KEYS)})")
    model_id, name, path = entry.get("id"), entry.get("architecture"), entry.get("path")
    if not isinstance(model_id, str) or not model_id.strip():
        raise ValueError(f"{where}: 'id' must be a non-empty string")
    if not isinstance(name, str):
        raise ValueError(f"{where} ({model_id}): 'architecture' must be a string")
    arch = _architecture(name)
    if path in (None, ""):
        if arch.embedded is None:
            raise ValueError(
                f"{where} ({model_id}): architecture {name!r} needs 'path', the diffusers "
                "directory of its weights"
            )
        return ModelSpec(id=model_id, architecture=name)
    if not isinstance(path, str | Path):
        raise ValueError(f"{where} ({model_id}): 'path' must be a string")
    return ModelSpec(id=model_id, architecture=name, path=Path(path))


def parse_model_specs(value: str | Sequence[Any]) -> tuple[ModelSpec, ...]:
    """Specs from a settings value: JSON text or an already-decoded list of objects
    ``{"id", "architecture", "path"}`` (``path`` optional for embedded architectures).

    Raises ``ValueError`` naming the bad entry: unknown architecture or key, missing path,
    duplicate id, empty list. Whether a path exists is checked when the worker loads it
    (the service process, which only needs cards, may not have the weights mounted).
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"video models: not valid JSON ({exc})") from None
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise ValueError("video models: expected a list of {id, architecture, path} objects")
    specs = tuple(_spec_from(entry, i) for i, entry in enumerate(value))
    if not specs:
        raise ValueError("video models: the list is empty; give at least one model")
    ids = [spec.id for spec in specs]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"video models: duplicate ids {duplicates}")
    return specs
