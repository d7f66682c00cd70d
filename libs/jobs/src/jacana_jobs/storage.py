"""Artifact storage: one small interface, a registry of backends, and the local directory.

A backend owns the bytes stored under its keys; the job store only records the keys. Keys are
relative, ``/``-separated names whose segments are letters, digits, ``.``, ``_`` and ``-``
and never start with ``.`` (so no ``..``, no absolute paths, no hidden names). Invariant:
a key is either absent or holds a complete artifact. ``writer`` writes to a temporary name
and moves it into place only when the ``with`` block ends without an exception, so a crash
or an error leaves nothing under the final key. Backends without a file system (object
storage, later) return ``None`` from ``path_for``.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

_SEGMENT = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}$")
_MAX_KEY = 1024


class InvalidKey(ValueError):
    """A storage key that could escape the store or name a temporary file."""


def validate_key(key: str) -> str:
    """``key`` unchanged when it is a safe relative key, else ``InvalidKey``."""
    if not isinstance(key, str) or not key or len(key) > _MAX_KEY:
        raise InvalidKey(f"storage key must be a non-empty string of <= {_MAX_KEY} chars")
    if not all(_SEGMENT.match(seg) for seg in key.split("/")):
        raise InvalidKey(
            f"invalid storage key {key!r}: relative '/'-separated segments of letters, "
            "digits, '.', '_', '-', none starting with '.'"
        )
    return key


class ArtifactStorage(ABC):
    """Where job artifacts live. Implementations validate every key with ``validate_key``."""

    @abstractmethod
    def writer(self, key: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """A binary file to write the artifact into; it appears under ``key`` (replacing
        any previous artifact) only if the ``with`` block exits normally."""

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """The artifact for reading; ``FileNotFoundError`` when absent."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """True when a complete artifact is stored under ``key``."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Remove the artifact; True if it existed. Idempotent."""

    def path_for(self, key: str) -> Path | None:
        """A local file path for ``key`` (e.g. to stream it), or None when the backend
        has no file system."""
        validate_key(key)
        return None


_BACKENDS: dict[str, Callable[..., ArtifactStorage]] = {}


def register_storage(
    name: str,
) -> Callable[[Callable[..., ArtifactStorage]], Callable[..., ArtifactStorage]]:
    """Class decorator adding a backend to the registry under ``name``."""

    def add(factory: Callable[..., ArtifactStorage]) -> Callable[..., ArtifactStorage]:
        if name in _BACKENDS:
            raise ValueError(f"storage backend {name!r} is already registered")
        _BACKENDS[name] = factory
        return factory

    return add


def make_storage(name: str, **options: object) -> ArtifactStorage:
    """The backend registered as ``name``, built with ``options`` (``local``: ``root``)."""
    try:
        factory = _BACKENDS[name]
    except KeyError:
        known = ", ".join(sorted(_BACKENDS))
        raise ValueError(f"unknown storage backend {name!r} (known: {known})") from None
    return factory(**options)


@register_storage("local")
class LocalStorage(ArtifactStorage):
    """Artifacts as files under ``root``. Temporary files are ``.<name>.<hex>.tmp`` beside
    their target (same file system, so the final ``os.replace`` is atomic); keys can never
    name them because no key segment starts with ``.``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*validate_key(key).split("/"))

    @contextlib.contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        final = self._path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a power loss
        finally:
            os.close(dir_fd)

    def open(self, key: str) -> BinaryIO:
        return open(self._path(key), "rb")  # the caller closes it

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> bool:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return False
        return True

    def path_for(self, key: str) -> Path | None:
        return self._path(key)
