"""The gateway's /metrics after real requests through the recording engine (real gRPC):
requests by route, model and status, the generation histograms and token counters, and
an unexpected exception counted as a 500."""

from __future__ import annotations

import grpc
import httpx
from prometheus_client.parser import text_string_to_metric_families

from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_gateway.app import create_app


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    """``(sample name, labels) -> value`` of a /metrics body (parsed as Prometheus does)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _get(samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _messages() -> list[pb.GenerateResponse]:
    usage = pb.Usage(prompt_tokens=7, completion_tokens=3, cached_prompt_tokens=0)
    return [
        pb.GenerateResponse(text="Hel", token_ids=[11]),
        pb.GenerateResponse(text="lo", token_ids=[12]),
        pb.GenerateResponse(
            text="!", token_ids=[13], finish_reason=pb.FINISH_REASON_STOP, usage=usage
        ),
    ]


async def test_requests_latency_and_tokens_are_counted(make_client, make_settings, engine, script):
    engine.servicer.script = script(_messages(), pause_s=0.02)
    async with make_client(make_settings({"m": [engine.address]})) as client:
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
        stream = {"model": "m", "prompt": "hi", "stream": True}
        reply = await client.post("/v1/completions", json=stream)
        assert reply.status_code == 200 and reply.text.endswith("data: [DONE]\n\n")
        unknown = {"model": "nope", "prompt": "hi"}
        assert (await client.post("/v1/completions", json=unknown)).status_code == 404
        assert (await client.get("/no/such/path")).status_code == 404
        scrape = await client.get("/metrics")
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain")
    s = _samples(scrape.text)
    requests = "jacana_gateway_requests_total"
    assert _get(s, requests, route="/v1/chat/completions", model="m", status="200") == 1
    assert _get(s, requests, route="/v1/completions", model="m", status="200") == 1
    # the model is a label only once resolved: an unknown one cannot grow the label set
    assert _get(s, requests, route="/v1/completions", model="", status="404") == 1
    assert _get(s, requests, route="other", model="", status="404") == 1
    duration = "jacana_gateway_request_duration_seconds_count"
    assert _get(s, duration, route="/v1/completions", status="200") == 1
    for name in ("time_to_first_token", "time_per_output_token", "e2e_request_latency"):
        assert _get(s, f"jacana_gateway_{name}_seconds_count", model="m") == 2, name
    # three tokens sent 20 ms apart (received with some jitter): about 20 ms per token
    tpot = _get(s, "jacana_gateway_time_per_output_token_seconds_sum", model="m")
    assert 2 * 0.01 <= tpot < 2 * 1.0
    assert _get(s, "jacana_gateway_prompt_tokens_total", model="m") == 2 * 7
    assert _get(s, "jacana_gateway_generation_tokens_total", model="m") == 2 * 3
    assert _get(s, "jacana_gateway_requests_in_flight") == 1  # the scrape itself


async def test_a_failed_generation_is_counted_but_not_timed(
    make_client, make_settings, engine, script
):
    engine.servicer.script = script(error=(grpc.StatusCode.INVALID_ARGUMENT, "bad", "prompt"))
    async with make_client(make_settings({"m": [engine.address]})) as client:
        body = {"model": "m", "prompt": "hi"}
        assert (await client.post("/v1/completions", json=body)).status_code == 400
        s = _samples((await client.get("/metrics")).text)
    requests = "jacana_gateway_requests_total"
    assert _get(s, requests, route="/v1/completions", model="m", status="400") == 1
    # no latency child for the model at all: nothing was observed
    assert _get(s, "jacana_gateway_e2e_request_latency_seconds_count", model="m") is None


async def test_an_unexpected_exception_is_a_counted_500(make_settings):
    app = create_app(make_settings())

    async def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/v1/broken", broken, methods=["GET"])
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            reply = await client.get("/v1/broken")
            assert reply.status_code == 500
            assert reply.json()["error"]["type"]
            s = _samples((await client.get("/metrics")).text)
    assert _get(s, "jacana_gateway_errors_total", route="/v1/broken") == 1
    assert _get(s, "jacana_gateway_requests_total", route="/v1/broken", model="", status="500") == 1
