"""The split-model locator: parts joined once into the cache, checked, clear errors."""

from __future__ import annotations

import hashlib

import pytest

from jacana_engine.assets.model_packages import AssetError, SplitAsset, cache_dir, locate

PARTS = [b"GGUF" + bytes(range(200)), b"second part " * 50, b"tail"]
SITE = "site"


def _locate(asset: SplitAsset, tmp_path):
    return locate(asset, search_path=[str(tmp_path / SITE)])


def _asset(tmp_path, monkeypatch, *, installed=(1, 2, 3), sha=None) -> SplitAsset:
    """Fake part packages ``fakemodelpart1..3`` in ``SITE`` under tmp_path (passed to
    ``locate`` as its search path); the cache under tmp_path."""
    site = tmp_path / SITE
    for i in installed:
        pkg = site / f"fakemodelpart{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(PARTS[i - 1])
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
    path = _locate(asset, tmp_path)
    assert path == cache_dir() / "Fake-Model.gguf" == tmp_path / "cache" / "Fake-Model.gguf"
    assert path.read_bytes() == b"".join(PARTS)
    stamp = path.stat().st_mtime_ns
    assert _locate(asset, tmp_path) == path and path.stat().st_mtime_ns == stamp  # not joined again
    assert [p.name for p in path.parent.iterdir()] == ["Fake-Model.gguf"]  # no temp files


def test_wrong_checksum_is_a_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    asset = _asset(tmp_path, monkeypatch, sha="0" * 64)
    with pytest.raises(AssetError, match=r"sha256.*expected.*reinstall"):
        _locate(asset, tmp_path)
    assert not any((tmp_path / "cache").iterdir())


def test_missing_parts_are_named(tmp_path, monkeypatch):
    asset = _asset(tmp_path, monkeypatch, installed=(1, 3))
    with pytest.raises(AssetError, match=r"fakemodelpart2 .*pip install fake"):
        _locate(asset, tmp_path)


def test_absent_model_is_none_unless_cached(tmp_path, monkeypatch):
    asset = _asset(tmp_path, monkeypatch, installed=())
    assert _locate(asset, tmp_path) is None
    cached = tmp_path / "cache" / "Fake-Model.gguf"
    cached.parent.mkdir()
    cached.write_bytes(b"".join(PARTS))  # copied in by hand, e.g. onto a GPU machine
    assert _locate(asset, tmp_path) == cached
