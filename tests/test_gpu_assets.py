"""bench/gpu_assets.sh: model files split into parts here, carried a few per device call,
and joined (sha256-checked) there, whatever order and grouping the parts arrive in."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_assets.sh"
CHUNK = 28 * 1024 * 1024


def _checkout(root: Path) -> Path:
    """A stand-in checkout holding the script (it works relative to its own folder)."""
    (root / "bench").mkdir(parents=True)
    (root / ".git" / "info").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "bench" / "gpu_assets.sh")
    return root


def _run(checkout: Path, tmp: Path, *args: str) -> str:
    env = {
        **os.environ,
        "JACANA_XFER_STORE": str(tmp / "store"),
        "JACANA_ASSETS_DIR": str(tmp / "assets"),
    }
    out = subprocess.run(
        ["bash", str(checkout / "bench" / "gpu_assets.sh"), *args],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout


def _carry(here: Path, there: Path, *parts: str) -> None:
    """One device call: the named files travel, in a fresh copy of the tree."""
    shutil.rmtree(there / ".xfer", ignore_errors=True)
    for part in parts:
        (there / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(here / part, there / part)


def test_a_file_and_a_folder_arrive_in_parts_and_are_checked(tmp_path):
    here = _checkout(tmp_path / "here")
    there = _checkout(tmp_path / "there")
    big = tmp_path / "model.gguf"
    big.write_bytes(os.urandom(CHUNK + 12345))  # two parts
    folder = tmp_path / "minilm"
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "config.json").write_text('{"hidden_size": 384}')
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')

    _run(here, tmp_path, "pack", "model.gguf", str(big))
    _run(here, tmp_path, "pack", "minilm", str(folder))
    assert sorted(p.name for p in (here / ".xfer" / "model.gguf").iterdir()) == [
        "meta",
        "part-00",
        "part-01",
    ]
    assert "/.xfer/" in (here / ".git" / "info" / "exclude").read_text()

    # call 1: the second part of the file only; call 2: the folder and the first part
    _carry(here, there, ".xfer/model.gguf/part-01", ".xfer/model.gguf/meta")
    first = _run(there, tmp_path, "receive")
    assert "1 of 2 parts here" in first and "JACANA_ASSET_MODEL_GGUF" not in first
    _carry(here, there, ".xfer/model.gguf/part-00", ".xfer/minilm/part-00", ".xfer/minilm/meta")
    second = _run(there, tmp_path, "receive")

    assets = tmp_path / "assets"
    assert f"export JACANA_ASSET_MODEL_GGUF={assets / 'model.gguf'}" in second
    assert f"export JACANA_ASSET_MINILM={assets / 'minilm'}" in second
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    assert hashlib.sha256((assets / "model.gguf").read_bytes()).hexdigest() == digest
    assert (assets / "minilm" / "1_Pooling" / "config.json").read_text() == (
        '{"pooling_mode_mean_tokens": true}'
    )


def test_a_damaged_part_is_refused(tmp_path):
    here = _checkout(tmp_path / "here")
    there = _checkout(tmp_path / "there")
    small = tmp_path / "w.bin"
    small.write_bytes(b"weights" * 1000)
    _run(here, tmp_path, "pack", "w.bin", str(small))
    part = here / ".xfer" / "w.bin" / "part-00"
    part.write_bytes(part.read_bytes()[:-1] + b"?")
    _carry(here, there, ".xfer/w.bin/part-00", ".xfer/w.bin/meta")
    out = _run(there, tmp_path, "receive")
    assert "sha256 mismatch" in out and "export" not in out
    assert not (tmp_path / "assets" / "w.bin").exists()
