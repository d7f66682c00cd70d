"""The split-model locator: parts joined once into the cache, checked, clear errors."""

from __future__ import annotations

import hashlib
import importlib
import sys

import pytest

from jacana_engine.assets.model_packages import AssetError, SplitAsset, cache_dir, locate

PARTS = [b"GGUF" + bytes(range(200)), b"second part " * 50, b"tail"]


def _asset(tmp_path, monkeypatch, *, installed=(1, 2, 3), sha=None) -> SplitAsset:
    """Fake part packages ``fakemodelpart1..3`` on sys.path; the cache under tmp_path."""
    site = tmp_path / "site"
    for i in installed:
        pkg = site / f"fakemodelpart{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(PARTS[i - 1])
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    for i in (1, 2, 3):
        sys.modules.pop(f"fakemodelpart{i}", None)
    monkeypatch.setenv("JACANA_MODEL_CACHE", str(tmp_path / "cache"))
    whole = b"".join(PARTS)
    return SplitAsset(
        name="Fake-Model",
        package_prefix="fakemodelpart",
        num_parts=3,
        size=len(whole),
        sha256=sha or hashlib.sha256(whole).hexdigest(),
        requirement="pip install fake",
    )


def test_parts_join_once_into_the_cache(tmp_path, monkeypatch):
    asset = _asset(tmp_path, monkeypatch)
    path = locate(asset)
    assert path == cache_dir() / "Fake-Model.gguf" == tmp_path / "cache" / "Fake-Model.gguf"
    assert path.read_bytes() == b"".join(PARTS)
    stamp = path.stat().st_mtime_ns
    assert locate(asset) == path and path.stat().st_mtime_ns == stamp  # not joined again
    assert [p.name for p in path.parent.iterdir()] == ["Fake-Model.gguf"]  # no temp files


def test_wrong_checksum_is_a_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    asset = _asset(tmp_path, monkeypatch, sha="0" * 64)
    with pytest.raises(AssetError, match=r"sha256.*expected.*reinstall"):
        locate(asset)
    assert not any((tmp_path / "cache").iterdir())


def test_missing_parts_are_named(tmp_path, monkeypatch):
    asset = _asset(tmp_path, monkeypatch, installed=(1, 3))
    with pytest.raises(AssetError, match=r"fakemodelpart2 .*pip install fake"):
        locate(asset)


def test_absent_model_is_none_unless_cached(tmp_path, monkeypatch):
    asset = _asset(tmp_path, monkeypatch, installed=())
    assert locate(asset) is None
    cached = tmp_path / "cache" / "Fake-Model.gguf"
    cached.parent.mkdir()
    cached.write_bytes(b"".join(PARTS))  # copied in by hand, e.g. onto a GPU machine
    assert locate(asset) == cached
