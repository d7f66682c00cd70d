"""Request validation and output shaping of the service core (no transport)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jacana_embeddings.errors import InvalidRequestError, ModelNotFoundError
from jacana_embeddings.service import resolve_dimensions, shorten


async def test_texts_and_their_token_ids_give_the_same_vectors(embedder, make_service):
    service = make_service()
    texts = ["The quick brown fox.", "東京 🙂"]
    by_text = await service.embed(texts=texts)
    ids = [ids for ids, _ in embedder.tokenize(texts, truncate=False)]
    by_ids = await service.embed(token_ids=ids)
    np.testing.assert_allclose(by_text.vectors, by_ids.vectors, atol=1e-6)
    assert by_text.num_tokens == by_ids.num_tokens == [len(i) for i in ids]
    assert by_text.prompt_tokens == sum(len(i) for i in ids)


async def test_truncation_only_on_request(make_service):
    service = make_service()
    long_text = "lorem ipsum dolor " * 200
    with pytest.raises(InvalidRequestError, match=r"input\[1\] has \d+ tokens") as exc:
        await service.embed(texts=["short", long_text])
    assert exc.value.param == "input"
    result = await service.embed(texts=["short", long_text], truncate=True)
    assert result.num_tokens[1] == 256 and result.truncated == [False, True]
    with pytest.raises(InvalidRequestError, match="257 tokens"):
        await service.embed(token_ids=[[101] * 257])
    cut = await service.embed(token_ids=[[101] * 257], truncate=True)
    assert cut.num_tokens == [256] and cut.truncated == [True]


@pytest.mark.parametrize(
    "kwargs, param, message",
    [
        ({"texts": []}, "input", "must not be empty"),
        ({"texts": ["ok", ""]}, "input", r"input\[1\] is an empty string"),
        ({"token_ids": [[101, 102], []]}, "input", r"input\[1\] is an empty token list"),
        ({"token_ids": [[101, 30522]]}, "input", "vocabulary"),
        ({"token_ids": [[-1]]}, "input", "vocabulary"),
        ({"texts": ["a"] * 5}, "input", "at most 4 inputs"),
        ({}, "input", "either texts or token ids"),
        ({"texts": ["a"], "token_ids": [[1]]}, "input", "either texts or token ids"),
        ({"texts": ["a"], "dimensions": 128}, "dimensions", "does not support 'dimensions'"),
        ({"texts": ["a"], "dimensions": 0}, "dimensions", "between 1 and 384"),
        ({"texts": ["a"], "dimensions": 385}, "dimensions", "between 1 and 384"),
    ],
)
async def test_bad_requests(make_service, kwargs, param, message):
    service = make_service(max_inputs=4)
    with pytest.raises(InvalidRequestError, match=message) as exc:
        await service.embed(**kwargs)
    assert exc.value.param == param
    assert service.batcher.stats().batches_total == 0  # refused before any forward pass


async def test_unknown_model(make_service):
    service = make_service()
    with pytest.raises(ModelNotFoundError) as exc:
        await service.embed(texts=["a"], model="text-embedding-3-small")
    assert exc.value.param == "model"
    assert (await service.embed(texts=["a"], model="all-minilm-l6-v2")).dimension == 384


async def test_native_dimensions_is_accepted_without_matryoshka(make_service):
    service = make_service()
    plain = await service.embed(texts=["a b c"])
    same = await service.embed(texts=["a b c"], dimensions=384)
    np.testing.assert_array_equal(plain.vectors, same.vectors)


async def test_matryoshka_truncates_and_renormalizes(embedder, make_service):
    info = dataclasses.replace(embedder.info, matryoshka_dims=(384, 128, 64))
    service = make_service()
    service.info = info
    full = await service.embed(texts=["Matryoshka dolls nest inside each other."])
    short = await service.embed(texts=["Matryoshka dolls nest inside each other."], dimensions=64)
    assert short.dimension == 64
    expected = full.vectors[:, :64] / np.linalg.norm(full.vectors[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(short.vectors, expected, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(short.vectors, axis=1), 1.0, atol=1e-6)


def test_resolve_dimensions(embedder):
    info = embedder.info
    assert resolve_dimensions(info, None) is None
    assert resolve_dimensions(info, 384) is None
    mrl = dataclasses.replace(info, matryoshka_dims=(384, 256))
    assert resolve_dimensions(mrl, 100) == 100  # any size up to the model's, as OpenAI allows


def test_shorten_without_renormalization():
    v = np.array([[3.0, 4.0, 12.0]], dtype=np.float32)
    np.testing.assert_array_equal(shorten(v, 2, renormalize=False), [[3.0, 4.0]])
    np.testing.assert_allclose(shorten(v, 2, renormalize=True), [[0.6, 0.8]])


async def test_large_requests_tokenize_off_the_loop_with_the_same_result(make_service):
    service = make_service()
    texts = ["alpha beta gamma " * 300, "delta epsilon " * 300]  # > 4096 characters together
    together = await service.embed(texts=texts, truncate=True)
    apart = [await service.embed(texts=[t], truncate=True) for t in texts]
    np.testing.assert_allclose(
        together.vectors, np.concatenate([a.vectors for a in apart]), atol=1e-5
    )
    assert together.truncated == [True, True]
