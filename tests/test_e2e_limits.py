"""End to end: an explicit ``max_tokens: null`` is bounded, through the real engine.

A gateway with a small ``JACANA_MAX_NEW_TOKENS`` beside the session's engine; with
``ignore_eos`` the model never stops by itself, so the token counts show the bound.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from stack import MODEL_ID, Service, start_gateway

SERVER_LIMIT = 12


@pytest.fixture(scope="module")
def limited(engine: Service) -> Iterator[str]:
    gateway = start_gateway({MODEL_ID: [engine.address]}, JACANA_MAX_NEW_TOKENS=str(SERVER_LIMIT))
    yield f"http://{gateway.address}/v1"
    gateway.stop()


def _stream_tokens(url: str, body: dict) -> int:
    """The completion tokens of a streamed request, from its usage chunk."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    return json.loads(events[-2])["usage"]["completion_tokens"]


def test_null_max_tokens_is_bounded(limited: str):
    common = {"model": MODEL_ID, "temperature": 0, "ignore_eos": True}
    completion = {**common, "prompt": "Once upon a time", "max_tokens": None}
    # completions: null is the omitted value, OpenAI's 16, lowered to the server's limit
    assert _stream_tokens(f"{limited}/completions", completion) == SERVER_LIMIT
    chat = {**common, "messages": [{"role": "user", "content": "Tell a long story."}]}
    for nulls in ({"max_tokens": None}, {"max_completion_tokens": None}):
        assert _stream_tokens(f"{limited}/chat/completions", {**chat, **nulls}) == SERVER_LIMIT


def test_null_max_tokens_on_completions_is_openais_default(base_url: str):
    body = {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": None}
    body |= {"temperature": 0, "ignore_eos": True}
    assert _stream_tokens(f"{base_url}/completions", body) == 16
