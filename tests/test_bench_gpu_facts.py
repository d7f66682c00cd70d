"""``bench/common.gpu_facts``: what nvidia-smi says sets a GPU's speed, recorded beside
each GPU benchmark's environment. Here an ``nvidia-smi`` on PATH that answers as the real
one does (the CPU machines have none), one that fails, and none at all."""

from __future__ import annotations

from pathlib import Path

import common

ANSWER = "580.95.05, 700.00 W, 1980 MHz, 1980 MHz, 3201 MHz"


def _nvidia_smi(folder: Path, body: str) -> None:
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)


def test_facts_are_read_for_the_asked_gpu(tmp_path, monkeypatch):
    # answers only the query for GPU 1 in CSV without a header, as the benchmarks ask
    fields = ",".join(common.GPU_FACTS)
    _nvidia_smi(
        tmp_path,
        f'[ "$1" = "--query-gpu={fields}" ] && [ "$2" = "--format=csv,noheader" ] '
        f'&& [ "$3 $4" = "-i 1" ] && echo "{ANSWER}" && exit 0\nexit 2\n',
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    assert common.gpu_facts("1") == {
        "nvidia-smi driver_version": "580.95.05",
        "nvidia-smi power.limit": "700.00 W",
        "nvidia-smi clocks.max.sm": "1980 MHz",
        "nvidia-smi clocks.sm": "1980 MHz",
        "nvidia-smi clocks.mem": "3201 MHz",
    }
    assert common.gpu_facts("0") == {}  # the stand-in knows GPU 1 only: a failed query


def test_no_facts_without_a_working_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert common.gpu_facts() == {}  # none on PATH
    _nvidia_smi(tmp_path, 'echo "1, 2"\n')  # a reply of other fields
    assert common.gpu_facts() == {}
