"""README.md stays true: every service setting is documented, every local link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jacana_asr.settings import AsrSettings
from jacana_embeddings.settings import EmbeddingsSettings
from jacana_engine.entrypoints.settings import EngineSettings
from jacana_gateway.settings import GatewaySettings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize(
    "settings", [EngineSettings, EmbeddingsSettings, GatewaySettings, AsrSettings]
)
def test_every_setting_is_in_the_readme(settings):
    prefix = settings.model_config["env_prefix"]
    missing = [
        f"{prefix}{name.upper()}"
        for name in settings.model_fields
        if f"{prefix}{name.upper()}" not in README
    ]
    assert not missing, f"README.md does not document {missing}"


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_local_links_resolve(doc):
    text = (ROOT / doc).read_text()
    links = [t for t in re.findall(r"\]\(([^)#]+)\)", text) if "://" not in t]
    assert links or doc != "README.md"
    for target in links:
        assert (ROOT / doc).parent.joinpath(target).exists(), f"{doc} links to missing {target}"
