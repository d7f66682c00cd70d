"""Suite-wide test policy: references must be present in CI, GPU tests need a GPU.

Oracle tests compare Jacana with an independent reference (transformers, faster-whisper,
CTranslate2, sentence-transformers, the model packages of requirements/models.txt, the
espeak-ng/sox/ffmpeg binaries). Where a reference is absent such a test skips, so a partial
environment would give a green run that checked nothing. With ``JACANA_REQUIRE_ORACLES=1``
(set by ``.ci/run``) every skip is reported as a failure that names its reason, so the
run fails and says what is missing.

The one exception is hardware CI does not have: a test that needs a CUDA device carries
``@pytest.mark.gpu`` (the default ``-m 'not gpu and not slow'`` deselects it) and skips
where no CUDA device is present; in CI mode such a skip stays a skip.

Under pytest-xdist (``make test`` runs ``-n 2``) each worker gets its share of the cores
for torch's intra-op threads, and so do the processes it starts (OMP_NUM_THREADS): two
workers each spinning two OpenMP threads on two cores run slower than one thread each.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_ORACLES_ENV = "JACANA_REQUIRE_ORACLES"

# Shared fixtures: ``redis_server`` (tests/redis_server.py).
pytest_plugins = ("redis_server",)


def pytest_configure(config: pytest.Config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        threads = str(max(1, (os.cpu_count() or 1) // workers))
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, threads)
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _require_oracles() -> bool:
    return os.environ.get(REQUIRE_ORACLES_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _skip_reason(longrepr) -> str:
    # a skip's longrepr is (path, lineno, "Skipped: <reason>")
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _as_failure(report, where: str) -> None:
    reason = _skip_reason(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (
        f"{where} skipped, and {REQUIRE_ORACLES_ENV}=1 allows no skips outside "
        f"@pytest.mark.gpu tests: {reason}"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and not hasattr(report, "wasxfail")
        and _require_oracles()
        and item.get_closest_marker("gpu") is None
    ):
        _as_failure(report, "test")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _require_oracles():
        # a module-level importorskip: the whole file would vanish from the run
        _as_failure(report, "module")


def pytest_report_header(config: pytest.Config) -> str:
    if _require_oracles():
        return f"{REQUIRE_ORACLES_ENV}=1: a skipped test fails (except @pytest.mark.gpu)"
    return f"{REQUIRE_ORACLES_ENV} unset: tests whose reference is missing skip"
