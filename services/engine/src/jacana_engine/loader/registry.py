"""Weight formats keyed by name, and "auto" detection from the path."""

from __future__ import annotations

from pathlib import Path

from jacana_engine.loader.base import WeightFormat
from jacana_engine.loader.dummy_format import DummyFormat
from jacana_engine.loader.gguf_format import GGUFFormat
from jacana_engine.loader.safetensors_format import SafetensorsFormat

# Order matters only for "auto": the first format that claims a path wins.
WEIGHT_FORMATS: dict[str, type[WeightFormat]] = {
    "gguf": GGUFFormat,
    "safetensors": SafetensorsFormat,
    "dummy": DummyFormat,
}


def get_format(name: str) -> WeightFormat:
    """The format registered as ``name``; ``ValueError`` lists the choices."""
    cls = WEIGHT_FORMATS.get(name)
    if cls is None:
        raise ValueError(f"unknown load_format {name!r}; choose from {['auto', *WEIGHT_FORMATS]}")
    return cls()


def detect_format(path: Path) -> WeightFormat:
    """The first format that claims ``path`` (a real checkpoint before dummy weights)."""
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    for cls in WEIGHT_FORMATS.values():
        fmt = cls()
        if fmt.claims(path):
            return fmt
    raise ValueError(
        f"cannot tell the format of {path}: expected a .gguf file, an HF directory with "
        "config.json and *.safetensors, or a config.json for dummy weights"
    )


def resolve_format(path: str | Path, load_format: str = "auto") -> WeightFormat:
    """``load_format`` by name, or detected from ``path`` when it is "auto"."""
    p = Path(path)
    if load_format == "auto":
        return detect_format(p)
    if not p.exists():
        raise FileNotFoundError(f"model path {p} does not exist")
    return get_format(load_format)
