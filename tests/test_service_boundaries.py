"""Services never import each other: each service's code imports only the shared libraries
(``jacana_common``, ``jacana_jobs``) and its own package. The one stated exception
(docs/architecture.md, "Drafter"): the drafter runs the engine's proposers, so it may
import ``jacana_engine.spec``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = sorted(p.parent for p in ROOT.glob("services/*/src/jacana_*/__init__.py"))
SHARED_LIBRARIES = ("jacana_common", "jacana_jobs")
ALLOWED_FOREIGN = {"jacana_drafter": ("jacana_engine.spec",)}


def imported_modules(path: Path) -> set[str]:
    """Absolute module names ``path`` imports (relative imports stay inside a package)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_every_service_is_found():
    assert {p.name for p in SERVICES} >= {
        "jacana_engine",
        "jacana_gateway",
        "jacana_drafter",
        "jacana_embeddings",
        "jacana_asr",
    }


@pytest.mark.parametrize("package", SERVICES, ids=lambda p: p.name)
def test_a_service_imports_only_shared_libraries_and_itself(package: Path):
    own = package.name
    allowed = (*SHARED_LIBRARIES, own, *ALLOWED_FOREIGN.get(own, ()))
    offending = sorted(
        f"{path.relative_to(ROOT)}: {module}"
        for path in package.rglob("*.py")
        if "/pb/" not in path.as_posix()
        for module in imported_modules(path)
        if module.startswith("jacana_")
        and not any(module == a or module.startswith(a + ".") for a in allowed)
    )
    assert not offending, "imports across services:\n" + "\n".join(offending)
