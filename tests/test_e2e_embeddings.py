"""End to end: the real embeddings service and gateway processes, driven with the official
openai SDK (which asks for base64 by default and decodes little-endian float32)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from stack import Service
from stack_embeddings import EMBEDDINGS_MODEL_ID, start_embeddings, start_embeddings_gateway

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "Ünïcödé 東京 🙂",
]


@pytest.fixture(scope="module")
def embeddings_service() -> Iterator[Service]:
    service = start_embeddings()
    yield service
    service.stop()


@pytest.fixture(scope="module")
def embeddings_gateway(embeddings_service: Service) -> Iterator[Service]:
    service = start_embeddings_gateway({EMBEDDINGS_MODEL_ID: [embeddings_service.address]})
    yield service
    service.stop()


@pytest.fixture
def sdk(embeddings_gateway: Service) -> Iterator[openai.OpenAI]:
    base_url = f"http://{embeddings_gateway.address}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    from jacana_embeddings.settings import default_model_path

    model = SentenceTransformer(default_model_path(), device="cpu")
    return model.encode(TEXTS, convert_to_numpy=True)


def test_sdk_default_base64_and_float_agree_with_sentence_transformers(sdk, reference):
    by_default = sdk.embeddings.create(model=EMBEDDINGS_MODEL_ID, input=TEXTS)
    as_float = sdk.embeddings.create(
        model=EMBEDDINGS_MODEL_ID, input=TEXTS, encoding_format="float"
    )
    a = np.array([d.embedding for d in by_default.data])
    b = np.array([d.embedding for d in as_float.data])
    np.testing.assert_array_equal(a, b)
    assert a.shape == (len(TEXTS), 384)
    cosine = (a * reference).sum(1) / (
        np.linalg.norm(a, axis=1) * np.linalg.norm(reference, axis=1)
    )
    assert cosine.min() >= 0.99999
    assert [d.index for d in by_default.data] == list(range(len(TEXTS)))
    assert by_default.model == EMBEDDINGS_MODEL_ID
    assert by_default.usage.prompt_tokens == by_default.usage.total_tokens > len(TEXTS) * 2


def test_single_string_and_token_ids(sdk):
    one = sdk.embeddings.create(model=EMBEDDINGS_MODEL_ID, input="A man is eating food.")
    ids = [101, 1037, 2158, 2003, 5983, 2833, 1012, 102]  # the same sentence, BERT ids
    by_ids = sdk.embeddings.create(model=EMBEDDINGS_MODEL_ID, input=ids)
    np.testing.assert_allclose(one.data[0].embedding, by_ids.data[0].embedding, atol=1e-6)
    assert one.usage.prompt_tokens == by_ids.usage.prompt_tokens == len(ids)


async def test_concurrent_clients_get_their_own_vectors(embeddings_gateway):
    base_url = f"http://{embeddings_gateway.address}/v1"
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    texts = [f"request {i}: " + "some words " * (i % 5) for i in range(24)]
    solo = await client.embeddings.create(model=EMBEDDINGS_MODEL_ID, input=texts)
    replies = await asyncio.gather(
        *(client.embeddings.create(model=EMBEDDINGS_MODEL_ID, input=t) for t in texts)
    )
    got = np.array([r.data[0].embedding for r in replies])
    np.testing.assert_allclose(got, np.array([d.embedding for d in solo.data]), atol=1e-5)
    await client.close()


@pytest.mark.parametrize(
    "kwargs, status, param",
    [
        ({"input": ""}, 400, "input"),
        ({"input": ["ok", ""]}, 400, "input"),
        ({"input": "lorem ipsum " * 300}, 400, "input"),  # longer than 256 tokens
        ({"input": [[101, 999999]]}, 400, "input"),  # outside the vocabulary
        ({"input": "x", "dimensions": 64}, 400, "dimensions"),  # not a Matryoshka model
        ({"input": ["x"] * 2049}, 400, "input"),
        ({"input": "x", "model": "text-embedding-3-small"}, 404, "model"),
    ],
)
def test_bad_requests(sdk, kwargs, status, param):
    kwargs = {"model": EMBEDDINGS_MODEL_ID, **kwargs}
    with pytest.raises(openai.APIStatusError) as exc:
        sdk.embeddings.create(**kwargs)
    assert exc.value.status_code == status
    assert exc.value.body["param"] == param


def test_truncate_extension(sdk):
    long_text = "lorem ipsum " * 300
    reply = sdk.embeddings.create(
        model=EMBEDDINGS_MODEL_ID, input=long_text, extra_body={"truncate": True}
    )
    assert reply.usage.prompt_tokens == 256
    assert len(reply.data[0].embedding) == 384


def test_sigterm_exits_cleanly():
    """A second, private instance: SIGTERM stops it gracefully with exit status 0."""
    service = start_embeddings()
    try:
        service.process.send_signal(signal.SIGTERM)
        assert service.process.wait(30) == 0, service.log_tail()
    finally:
        service.stop()


def test_gateway_reaches_the_service_over_http(embeddings_gateway):
    resp = httpx.post(
        f"http://{embeddings_gateway.address}/v1/embeddings",
        json={"model": EMBEDDINGS_MODEL_ID, "input": "plain http", "encoding_format": "float"},
        timeout=60,
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "list" and len(body["data"][0]["embedding"]) == 384


def test_an_embeddings_only_gateway_lists_and_checks_the_model(sdk, embeddings_gateway):
    assert [m.id for m in sdk.models.list().data] == [EMBEDDINGS_MODEL_ID]
    assert sdk.models.retrieve(EMBEDDINGS_MODEL_ID).owned_by == "jacana"
    health = httpx.get(f"http://{embeddings_gateway.address}/health", timeout=10)
    assert health.status_code == 200
    model = health.json()["models"][EMBEDDINGS_MODEL_ID]
    assert model["kind"] == "embeddings" and model["healthy_replicas"] == 1
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.chat.completions.create(
            model=EMBEDDINGS_MODEL_ID, messages=[{"role": "user", "content": "hi"}]
        )
    assert exc.value.body["code"] == "model_not_supported"
