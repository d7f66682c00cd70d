from __future__ import annotations

import grpc
import pytest
from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from jacana_common.errors import ApiError, api_error_from_grpc, grpc_details
from jacana_common.settings import ServiceSettings, SettingsError


class _DemoSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="JACANA_DEMO_", frozen=True)
    workers: int = Field(2, ge=1, le=8, description="Worker count.")


def test_settings_read_prefixed_env(monkeypatch):
    monkeypatch.setenv("JACANA_DEMO_WORKERS", "4")
    monkeypatch.setenv("JACANA_DEMO_PORT", "1234")
    s = _DemoSettings.load()
    assert (s.workers, s.port) == (4, 1234)


def test_invalid_settings_exit_with_every_offending_variable(monkeypatch):
    monkeypatch.setenv("JACANA_DEMO_WORKERS", "99")
    monkeypatch.setenv("JACANA_DEMO_PORT", "70000")
    with pytest.raises(SettingsError) as info:
        _DemoSettings.load()
    text = str(info.value)
    assert "JACANA_DEMO_WORKERS" in text and "JACANA_DEMO_PORT" in text


def test_api_error_has_openai_shape():
    err = ApiError(400, "temperature must be >= 0", param="temperature")
    assert err.to_dict() == {
        "error": {
            "message": "temperature must be >= 0",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": None,
        }
    }


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400),
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.INTERNAL, 503),  # never a 500 to the client
        (grpc.StatusCode.UNKNOWN, 503),
    ],
)
def test_grpc_status_maps_to_http(code, status):
    assert api_error_from_grpc(code, "boom").status == status


def test_grpc_details_carry_param_and_code():
    err = api_error_from_grpc(grpc.StatusCode.INVALID_ARGUMENT, grpc_details("too long", "prompt"))
    assert (err.status, err.message, err.param, err.code) == (
        400,
        "too long",
        "prompt",
        "invalid_value",
    )
    details = grpc_details("a\nb", "prompt", "context_length_exceeded")
    err = api_error_from_grpc(grpc.StatusCode.INVALID_ARGUMENT, details)
    assert (err.message, err.param, err.code) == ("a\nb", "prompt", "context_length_exceeded")
    err = api_error_from_grpc(grpc.StatusCode.INVALID_ARGUMENT, grpc_details("plain"))
    assert (err.message, err.param, err.code) == ("plain", None, None)


class _AliasedSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="JACANA_DEMO_", frozen=True)
    limit: int = Field(
        10,
        ge=1,
        le=100,
        validation_alias=AliasChoices("JACANA_DEMO_LIMIT", "JACANA_LIMIT"),
        description="A limit also read from a suite-wide variable.",
    )
    targets: dict[str, list[str]] = Field(default_factory=dict, description="JSON mapping.")


def test_aliased_field_errors_name_the_real_variables(monkeypatch):
    monkeypatch.setenv("JACANA_LIMIT", "1000")
    with pytest.raises(SettingsError) as info:
        _AliasedSettings.load()
    assert "JACANA_DEMO_LIMIT or JACANA_LIMIT" in str(info.value)


def test_non_json_structured_variable_is_a_settings_error(monkeypatch):
    monkeypatch.setenv("JACANA_DEMO_TARGETS", "{not json")
    with pytest.raises(SettingsError) as info:
        _AliasedSettings.load()
    assert "JSON" in str(info.value)


def test_gil_switch_interval_is_set_from_microseconds_and_zero_keeps_the_default():
    import sys

    from jacana_common.interpreter import set_gil_switch_interval

    before = sys.getswitchinterval()
    try:
        set_gil_switch_interval(250)
        assert sys.getswitchinterval() == pytest.approx(250e-6)
        set_gil_switch_interval(0)
        assert sys.getswitchinterval() == pytest.approx(250e-6)
        with pytest.raises(ValueError, match="switch interval"):
            set_gil_switch_interval(-1)
    finally:
        sys.setswitchinterval(before)
