"""The decode-GEMM tuning cache: what it keeps, what it keys on, and that a broken or
unwritable file costs a start-up its speed, never its correctness."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.kernels.skinny_gemm import SkinnyConfig
from jacana_engine.tuning.cache import TuningCache

CHOICE = {1: SkinnyConfig(1, 8, 1024, False), 4: SkinnyConfig(4, 16, 256, False, pdl=True)}


def test_a_choice_survives_a_new_cache_object(tmp_path):
    w = torch.empty(40, 64)
    key = TuningCache.key("skinny", w, [1, 2, 4], pdl=False)
    TuningCache(tmp_path / "sub" / "t.json").put(key, CHOICE)
    assert TuningCache(tmp_path / "sub" / "t.json").get(key) == CHOICE
    assert TuningCache(tmp_path / "sub" / "t.json").get(key + "x") is None


def test_the_key_changes_with_everything_a_timing_depends_on():
    w = torch.empty(40, 64)
    base = TuningCache.key("skinny", w, [1, 2], pdl=False)
    others = [
        TuningCache.key("norm", w, [1, 2], pdl=False),
        TuningCache.key("skinny", torch.empty(64, 40), [1, 2], pdl=False),
        TuningCache.key("skinny", w.bfloat16(), [1, 2], pdl=False),
        TuningCache.key("skinny", w, [1, 2, 4], pdl=False),
        TuningCache.key("skinny", w, [1, 2], pdl=True),
    ]
    assert len({base, *others}) == 6
    assert TuningCache.key("skinny", w, [2, 1], pdl=False) == base  # row order is not news


def test_the_key_changes_with_the_kernel_or_tuner_source(monkeypatch, tmp_path):
    """An edited kernel (new candidates, other code, in any module of the package) misses
    the choices of the old one."""
    import shutil

    from jacana_engine.kernels import skinny_gemm
    from jacana_engine.tuning import cache as tuning_cache

    w = torch.empty(40, 64)
    before = TuningCache.key("skinny", w, [1], pdl=False)
    package = Path(skinny_gemm.__file__).parent
    copy = tmp_path / "skinny_gemm"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "tile.py").write_text((package / "tile.py").read_text() + "\n# edited\n")
    monkeypatch.setattr(skinny_gemm, "__file__", str(copy / "__init__.py"))
    tuning_cache.code_fingerprint.cache_clear()
    try:
        assert TuningCache.key("skinny", w, [1], pdl=False) != before
    finally:
        monkeypatch.undo()
        tuning_cache.code_fingerprint.cache_clear()
    assert TuningCache.key("skinny", w, [1], pdl=False) == before


def test_a_broken_file_reads_as_empty_and_is_rewritten(tmp_path, caplog):
    path = tmp_path / "t.json"
    path.write_text("{not json")
    cache = TuningCache(path)
    with caplog.at_level(logging.WARNING):
        assert cache.get("k") is None
    assert "unreadable" in caplog.text
    cache.put("k", CHOICE)
    assert TuningCache(path).get("k") == CHOICE


def test_an_unwritable_place_only_warns(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = TuningCache(blocker / "t.json")  # its folder would be a file
    with caplog.at_level(logging.WARNING):
        cache.put("k", CHOICE)
    assert "not written" in caplog.text
    assert cache.get("k") == CHOICE  # this process still remembers it


_WRITER = """
import sys
from jacana_engine.kernels.skinny_gemm import SkinnyConfig
from jacana_engine.tuning.cache import TuningCache
path, name = sys.argv[1], sys.argv[2]
for i in range(25):  # a fresh object each time: every put starts from an old read
    TuningCache(path).put(f"{name}-{i}", {1: SkinnyConfig(1, 8, 1024, False)})
"""


def test_engines_writing_at_once_keep_each_others_entries(tmp_path):
    """Three processes each put 25 keys into one file at the same time: all 75 remain
    (without the lock and merge, each write dropped what the others had added since its
    read)."""
    import subprocess
    import sys

    path = tmp_path / "t.json"
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), f"w{n}"]) for n in range(3)
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0]
    cache = TuningCache(path)
    missing = [f"w{n}-{i}" for n in range(3) for i in range(25) if cache.get(f"w{n}-{i}") is None]
    assert not missing, missing
