"""docs/configuration.md is exactly what the settings classes generate."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_config_docs", ROOT / "tools/gen_config_docs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_reference_is_current():
    gen = _load_generator()
    fresh = gen.render()
    assert gen.DOC.exists(), f"{gen.DOC} missing: run {gen.COMMAND}"
    assert gen.DOC.read_text() == fresh, (
        f"docs/configuration.md is stale (a settings field changed): run {gen.COMMAND}"
    )


def test_every_field_has_a_row_with_its_description():
    gen = _load_generator()
    text = gen.DOC.read_text()
    for _title, _prefix, modules, name in gen.SERVICES:
        cls = gen._load(modules, name)
        for field_name, field in cls.model_fields.items():
            assert field.description, f"{name}.{field_name} has no description"
            env = cls.env_names(field_name)[0]
            base = f"<PREFIX>{field_name.upper()}"  # a ServiceSettings field, listed once
            assert env in text or base in text, f"{env} missing from docs/configuration.md"
