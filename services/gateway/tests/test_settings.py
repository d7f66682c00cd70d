"""GatewaySettings: environment parsing, the suite-wide aliases, bounds, start-up errors."""

from __future__ import annotations

import pytest

from jacana_common.settings import SettingsError
from jacana_gateway.settings import GatewaySettings

ENGINES = '{"smollm2-135m-instruct": ["127.0.0.1:50051", "10.0.0.2:50051"]}'


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("JACANA_"):
            monkeypatch.delenv(name)


def test_defaults_and_engines_from_json(monkeypatch):
    monkeypatch.setenv("JACANA_GATEWAY_ENGINES", ENGINES)
    s = GatewaySettings.load()
    assert s.engines == {"smollm2-135m-instruct": ["127.0.0.1:50051", "10.0.0.2:50051"]}
    assert (s.host, s.port) == ("127.0.0.1", 8000)
    assert (s.max_prompt_chars, s.max_new_tokens) == (200_000, 4096)
    assert s.api_keys is None
    assert s.request_timeout_s > 0 and s.shutdown_grace_s > 0


def test_suite_wide_limit_names_are_honoured(monkeypatch):
    monkeypatch.setenv("JACANA_GATEWAY_ENGINES", ENGINES)
    monkeypatch.setenv("JACANA_MAX_PROMPT_CHARS", "1234")
    monkeypatch.setenv("JACANA_MAX_NEW_TOKENS", "99")
    s = GatewaySettings.load()
    assert (s.max_prompt_chars, s.max_new_tokens) == (1234, 99)
    # The gateway-specific spelling wins over the suite-wide one.
    monkeypatch.setenv("JACANA_GATEWAY_MAX_PROMPT_CHARS", "777")
    monkeypatch.setenv("JACANA_GATEWAY_MAX_NEW_TOKENS", "55")
    s = GatewaySettings.load()
    assert (s.max_prompt_chars, s.max_new_tokens) == (777, 55)
    # Keyword arguments use the field names.
    assert GatewaySettings.load(max_prompt_chars=5).max_prompt_chars == 5


def test_api_keys_from_json(monkeypatch):
    monkeypatch.setenv("JACANA_GATEWAY_ENGINES", ENGINES)
    monkeypatch.setenv("JACANA_GATEWAY_API_KEYS", '["sk-a", "sk-b"]')
    assert GatewaySettings.load().api_keys == ["sk-a", "sk-b"]


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("JACANA_GATEWAY_ENGINES", "{}", "ENGINES"),
        ("JACANA_GATEWAY_ENGINES", '{"m": []}', "ENGINES"),
        ("JACANA_GATEWAY_ENGINES", '{"m": ["no-port"]}', "no-port"),
        ("JACANA_GATEWAY_ENGINES", '{"bad id": ["h:1"]}', "bad id"),
        ("JACANA_GATEWAY_ENGINES", '{"m": ["h:1", "h:1"]}', "duplicate"),
        ("JACANA_GATEWAY_PORT", "70000", "PORT"),
        ("JACANA_MAX_PROMPT_CHARS", "0", "MAX_PROMPT_CHARS"),
        ("JACANA_GATEWAY_MAX_NEW_TOKENS", "-1", "MAX_NEW_TOKENS"),
        ("JACANA_GATEWAY_REQUEST_TIMEOUT_S", "0", "REQUEST_TIMEOUT_S"),
        ("JACANA_GATEWAY_API_KEYS", "[]", "API_KEYS"),
        ("JACANA_GATEWAY_API_KEYS", '[""]', "API_KEYS"),
        ("JACANA_GATEWAY_MAX_IN_FLIGHT", "0", "MAX_IN_FLIGHT"),
        ("JACANA_GATEWAY_MAX_BODY_BYTES", "10", "MAX_BODY_BYTES"),
    ],
)
def test_invalid_values_fail_at_start_up_naming_the_variable(monkeypatch, name, value, needle):
    monkeypatch.setenv("JACANA_GATEWAY_ENGINES", '{"m": ["127.0.0.1:50051"]}')
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        GatewaySettings.load()
    assert needle in str(info.value)


def test_engines_that_are_not_json_fail_at_start_up(monkeypatch):
    from jacana_gateway.settings import GatewaySettings

    monkeypatch.setenv("JACANA_GATEWAY_ENGINES", "smollm2=127.0.0.1:50051")
    with pytest.raises(SettingsError) as info:
        GatewaySettings.load()
    assert "engines" in str(info.value) and "JSON" in str(info.value)


def test_something_to_serve_is_required():
    with pytest.raises(SettingsError) as info:
        GatewaySettings.load()
    message = str(info.value)
    assert "no model to serve" in message
    assert "JACANA_GATEWAY_ENGINES" in message and "JACANA_GATEWAY_EMBEDDINGS" in message


def test_embeddings_alone_are_enough(monkeypatch):
    monkeypatch.setenv("JACANA_GATEWAY_EMBEDDINGS", '{"all-minilm-l6-v2": ["127.0.0.1:50061"]}')
    s = GatewaySettings.load()
    assert s.engines == {}
    assert s.embeddings == {"all-minilm-l6-v2": ["127.0.0.1:50061"]}


def test_a_model_id_names_one_kind_of_model(monkeypatch):
    monkeypatch.setenv("JACANA_GATEWAY_ENGINES", '{"m": ["127.0.0.1:50051"]}')
    monkeypatch.setenv("JACANA_GATEWAY_EMBEDDINGS", '{"m": ["127.0.0.1:50061"]}')
    with pytest.raises(SettingsError, match="appear in both"):
        GatewaySettings.load()


def test_every_field_is_documented():
    for name, field in GatewaySettings.model_fields.items():
        assert field.description, name
