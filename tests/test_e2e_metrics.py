"""End to end: the engine's metrics port and the gateway's /metrics, with the real
engine process (default SmolLM2, CPU) behind a real gateway."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stack import MODEL_ID, Service, free_port, start_engine, start_gateway

NEW_TOKENS = 40


@dataclass
class Stack:
    engine: Service
    gateway: Service
    metrics_url: str


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    port = free_port()
    engine = start_engine(JACANA_ENGINE_METRICS_PORT=str(port))
    try:
        gateway = start_gateway({MODEL_ID: [engine.address]})
        try:
            yield Stack(engine, gateway, f"http://127.0.0.1:{port}/metrics")
        finally:
            gateway.stop()
    finally:
        engine.stop()


def scrape(url: str) -> dict[str, float]:
    """``name{sorted labels} -> value`` of every sample at ``url``."""
    text = httpx.get(url, timeout=10).raise_for_status().text
    return {
        s.name + json.dumps(dict(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def key(name: str, **labels: str) -> str:
    return name + json.dumps(dict(sorted(labels.items())))


def test_engine_metrics_follow_a_request(stack: Stack):
    m = {"model": MODEL_ID}
    before = scrape(stack.metrics_url)
    assert before[key("jacana_engine_num_requests_running", **m)] == 0
    total = before[key("jacana_engine_kv_blocks_total", **m)]
    assert before[key("jacana_engine_kv_blocks_free", **m)] == total > 0
    body = {
        "model": MODEL_ID,
        "prompt": "Once upon a time",
        "max_tokens": NEW_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    url = f"http://{stack.gateway.address}/v1/completions"
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        during = scrape(stack.metrics_url)  # the request is still generating
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert during[key("jacana_engine_num_requests_running", **m)] == 1
    assert during[key("jacana_engine_num_requests_waiting", **m)] == 0
    used = during[key("jacana_engine_kv_blocks_used", **m)]
    assert used > 0 and used + during[key("jacana_engine_kv_blocks_free", **m)] == total

    after = scrape(stack.metrics_url)

    def grew(name: str) -> float:
        return after[key(name, **m)] - before[key(name, **m)]

    assert grew("jacana_engine_generation_tokens_total") == NEW_TOKENS
    assert grew("jacana_engine_prompt_tokens_total") > 0
    assert grew("jacana_engine_requests_finished_total") == 1
    assert after[key("jacana_engine_num_requests_running", **m)] == 0
    assert after[key("jacana_engine_kv_blocks_used", **m)] == 0
    assert 0 <= after[key("jacana_engine_prefix_cache_hit_rate", **m)] <= 1
    for name in ("time_to_first_token", "time_per_output_token", "e2e_request_latency"):
        assert after[key(f"jacana_engine_{name}_seconds_count", **m)] >= 1, name

    gateway = scrape(f"http://{stack.gateway.address}/metrics")
    labels = {"model": MODEL_ID, "route": "/v1/completions", "status": "200"}
    assert gateway[key("jacana_gateway_requests_total", **labels)] >= 1
    assert gateway[key("jacana_gateway_generation_tokens_total", **m)] >= NEW_TOKENS
