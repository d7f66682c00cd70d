"""The suite's CI mode (root conftest.py): with JACANA_REQUIRE_ORACLES=1 a test whose
reference is missing fails and names it; without, it skips. Runs pytest in a subprocess on
synthetic test files beside a copy of the root conftest.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MISSING = "jacana_no_such_reference_module"

TESTS = {
    "test_module_level.py": f"""
import pytest

pytest.importorskip("{MISSING}")


def test_never_collected():
    pass
""",
    "test_in_test.py": f"""
import pytest


def test_needs_a_reference():
    pytest.importorskip("{MISSING}")


@pytest.mark.skipif(True, reason="{MISSING} is not installed")
def test_marked():
    pass


def test_runs():
    assert 1 + 1 == 2
""",
    "test_gpu_only.py": """
import pytest


@pytest.mark.gpu
def test_needs_cuda():
    pytest.skip("needs a CUDA device")
""",
}


def run_pytest(tmp_path: Path, require: str | None, *files: str) -> subprocess.CompletedProcess:
    """pytest in a subprocess on the synthetic files, beside a copy of the root conftest.py
    (the mechanism under test) and an ini file that declares the gpu marker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("JACANA_REQUIRE_ORACLES", None)
    # the plugins the root conftest loads (its shared fixtures) live in tests/
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests"), env.get("PYTHONPATH")]))
    if require is not None:
        env["JACANA_REQUIRE_ORACLES"] = require
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs"]
    return subprocess.run(
        [*command, *files],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers\nmarkers =\n    gpu: needs a CUDA device\n"
        "asyncio_default_fixture_loop_scope = function\n"
    )
    for name, text in TESTS.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_ci_mode_turns_a_missing_reference_into_a_failure_but_lets_gpu_tests_skip(synthetic):
    result = run_pytest(synthetic, "1", "test_in_test.py", "test_gpu_only.py")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    # the skipif mark acts at setup (an error), importorskip in the test's body (a failure)
    assert "1 failed, 1 passed, 1 skipped, 1 error" in out, out
    assert f"could not import '{MISSING}'" in out, out
    assert f"{MISSING} is not installed" in out, out
    assert "JACANA_REQUIRE_ORACLES=1 allows no skips" in out, out
    assert "SKIPPED [1]" in out and "needs a CUDA device" in out, out


def test_ci_mode_fails_a_module_level_importorskip(synthetic):
    result = run_pytest(synthetic, "1", "test_module_level.py")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "1 error" in out and f"could not import '{MISSING}'" in out, out


def test_without_ci_mode_a_missing_reference_skips(synthetic):
    for require in (None, "0"):
        result = run_pytest(synthetic, require, "test_module_level.py", "test_in_test.py")
        out = result.stdout + result.stderr
        assert result.returncode == 0, out
        assert "1 passed, 3 skipped" in out, out
        assert f"could not import '{MISSING}'" in out, out
