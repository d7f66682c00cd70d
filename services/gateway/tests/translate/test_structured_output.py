"""What each structured-output field of a request becomes in the engine's ``Guide``."""

from __future__ import annotations

import json

import pytest

from jacana_gateway.schemas.chat import ChatCompletionRequest
from jacana_gateway.schemas.generation import CompletionRequest
from jacana_gateway.translate.structured_output import guide

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


@pytest.mark.parametrize(
    ("body", "kind", "value", "param"),
    [
        (_chat(response_format={"type": "json_object"}), "json_object", True, "response_format"),
        (
            _chat(
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": SCHEMA},
                }
            ),
            "json_schema",
            SCHEMA,
            "response_format",
        ),
        (  # OpenAI's json_schema without a schema: any object
            _chat(response_format={"type": "json_schema", "json_schema": {"name": "n"}}),
            "json_object",
            True,
            "response_format",
        ),
        (_chat(guided_json=SCHEMA), "json_schema", SCHEMA, "guided_json"),
        (
            CompletionRequest(model="m", prompt="x", guided_regex="a+"),
            "regex",
            "a+",
            "guided_regex",
        ),
        (
            CompletionRequest(model="m", prompt="x", guided_grammar='start: "a"'),
            "lark",
            'start: "a"',
            "guided_grammar",
        ),
        (
            CompletionRequest(model="m", prompt="x", guided_choice=["y", "n"]),
            "choice",
            ["y", "n"],
            "guided_choice",
        ),
    ],
)
def test_each_field_becomes_its_guide(body, kind, value, param):
    got = guide(body)
    assert got.WhichOneof("kind") == kind
    raw = getattr(got, kind)
    assert (json.loads(raw) if kind in ("json_schema", "choice") else raw) == value
    assert got.param == param


@pytest.mark.parametrize(
    "body",
    [_chat(), _chat(response_format={"type": "text"}), CompletionRequest(model="m", prompt="x")],
)
def test_free_text_has_no_guide(body):
    assert guide(body) is None
