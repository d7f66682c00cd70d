"""The docs stay true: every environment variable README.md names exists, every local link
resolves, and the README stays a front door (the full settings reference is generated into
docs/configuration.md from the settings classes)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
ENV_VAR = re.compile(r"\bJACANA_[A-Z0-9_]*[A-Z0-9]\b")
# Files that read variables of their own, outside any settings class (make up, bootstrap,
# compose): a variable README names that no settings class declares must be read there.
LAUNCHERS = ["Makefile", "docker-compose.yml", "Dockerfile", "scripts/*", "infra/**/*"]


def _settings_classes() -> list[type[BaseSettings]]:
    """Every settings class of the services and libraries, found through their settings
    modules (``src/jacana_*/**/settings.py``), abstract bases left out."""
    for path in sorted(ROOT.glob("*/*/src/jacana_*/**/settings.py")):
        src = next(p for p in path.parents if p.name == "src")
        importlib.import_module(".".join(path.relative_to(src).with_suffix("").parts))
    found, todo = [], list(BaseSettings.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("jacana_") and cls not in found:
            found.append(cls)
    return [c for c in found if not any(o is not c and issubclass(o, c) for o in found)]


def _field_env_names(prefix: str, model: type[BaseModel], delimiter: str | None) -> set[str]:
    names = set()
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        choices = getattr(alias, "choices", [alias] if isinstance(alias, str) else [])
        names.update(str(c).upper() for c in choices)
        if not choices:
            names.add(f"{prefix}{name}".upper())
        nested = field.annotation
        if delimiter and isinstance(nested, type) and issubclass(nested, BaseModel):
            names |= _field_env_names(f"{prefix}{name}{delimiter}", nested, delimiter)
    return names


CLASSES = _settings_classes()
DECLARED = {
    name
    for cls in CLASSES
    for name in _field_env_names(
        cls.model_config.get("env_prefix", ""), cls, cls.model_config.get("env_nested_delimiter")
    )
}
PREFIXES = {cls.model_config.get("env_prefix", "") for cls in CLASSES}


def test_settings_classes_are_found():
    prefixes = {p.rstrip("_").removeprefix("JACANA_").lower() for p in PREFIXES}
    services = {p.name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").exists()}
    assert services <= prefixes, f"no settings class found for {services - prefixes}"
    assert "JACANA_ENGINE_MODEL" in DECLARED


def _undeclared(text: str) -> list[str]:
    """The variables ``text`` names that no settings class declares and no launcher reads
    (a variable under a service's prefix must be that service's setting)."""
    launchers = "".join(
        p.read_text(errors="ignore")
        for pattern in LAUNCHERS
        for p in ROOT.glob(pattern)
        if p.is_file()
    )
    unknown = []
    for name in sorted(set(ENV_VAR.findall(text))):
        if name in DECLARED:
            continue
        owned = any(name.startswith(prefix) for prefix in PREFIXES)
        if owned or not re.search(rf"\b{name}\b", launchers):
            unknown.append(name)
    return unknown


def test_every_variable_the_readme_names_exists():
    unknown = _undeclared(README)
    assert not unknown, f"README.md names variables that nothing declares: {unknown}"


def test_the_check_catches_undeclared_variables():
    text = "`JACANA_ENGINE_MODEL`, `JACANA_STACK_ASR`, `JACANA_ENGINE_NO_SUCH` and `JACANA_NOPE`"
    assert _undeclared(text) == ["JACANA_ENGINE_NO_SUCH", "JACANA_NOPE"]


def test_readme_is_a_front_door():
    assert len(README.splitlines()) <= 250
    assert not re.findall(r"\]\(bench/results/", README), "result tables: docs/performance.md"
    history = r"\b(?:\d+(?:st|nd|rd|th)|[a-z]+-[a-z]+(?:st|nd|rd|th)|[a-z]+teenth) run\b|_v\d+\b"
    assert not re.search(history, README), "run history belongs in git, not the README"


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md", "docs/performance.md"])
def test_local_links_resolve(doc):
    text = (ROOT / doc).read_text()
    links = [t for t in re.findall(r"\]\(([^)#]+)\)", text) if "://" not in t]
    assert links or doc != "README.md"
    for target in links:
        assert (ROOT / doc).parent.joinpath(target).exists(), f"{doc} links to missing {target}"
