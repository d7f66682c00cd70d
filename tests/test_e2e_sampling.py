"""End to end: the OpenAI sampling surface (logprobs, echo, n, best_of, penalties,
logit_bias, min_tokens, seeds) through the real gateway and engine, with the openai SDK.

Model numerics are checked against transformers in the engine's own tests; here the
checks are about the whole path: shapes the SDK parses, choices that line up with their
seeds, and parameters that change what the model does.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import openai
import pytest

from stack import MODEL_ID

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
COUNTING = "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,"


def chat(client, **kw):
    kw.setdefault("messages", QUESTION)
    return client.chat.completions.create(model=MODEL_ID, **kw)


def complete(client, prompt: str = "The capital of France is", **kw):
    return client.completions.create(model=MODEL_ID, prompt=prompt, **kw)


def test_chat_logprobs_shape_and_greedy_consistency(client):
    resp = chat(client, temperature=0, max_tokens=10, logprobs=True, top_logprobs=3)
    choice = resp.choices[0]
    content = choice.logprobs.content
    assert len(content) == resp.usage.completion_tokens > 0
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].token == item.token  # greedy picks the most likely
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob)
        values = [t.logprob for t in item.top_logprobs]
        assert values == sorted(values, reverse=True)
    text = bytes(b for item in content for b in item.bytes).decode()
    assert text == choice.message.content


def test_chat_stream_logprobs_equal_the_non_stream_ones(client):
    kw = dict(temperature=0, max_tokens=8, logprobs=True, top_logprobs=2)
    whole = chat(client, **kw).choices[0].logprobs.content
    streamed = []
    for chunk in chat(client, stream=True, **kw):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed.extend(chunk.choices[0].logprobs.content)
    assert [(t.token, t.bytes) for t in streamed] == [(t.token, t.bytes) for t in whole]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in whole], abs=1e-6)


def test_completion_echo_with_logprobs_covers_prompt_and_output(client):
    prompt = "The capital of France is"
    resp = complete(client, prompt, temperature=0, max_tokens=4, echo=True, logprobs=2)
    choice = resp.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(prompt)
    assert len(lp.tokens) == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens) == choice.text
    offsets = [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert lp.text_offset == offsets
    rest = zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True)
    for token, value, alts in rest:
        assert alts[token] == pytest.approx(value) and 2 <= len(alts) <= 3


def test_completion_echo_without_logprobs(client):
    resp = complete(client, "Water boils at", temperature=0, max_tokens=3, echo=True)
    plain = complete(client, "Water boils at", temperature=0, max_tokens=3)
    assert resp.choices[0].text == "Water boils at" + plain.choices[0].text
    assert resp.choices[0].logprobs is None


def test_n_choices_use_seed_plus_index(client):
    kw = dict(temperature=1.0, max_tokens=12, seed=4242)
    many = chat(client, n=3, **kw)
    assert [c.index for c in many.choices] == [0, 1, 2]
    texts = [c.message.content for c in many.choices]
    assert len(set(texts)) > 1
    for i in range(3):
        one = chat(client, **{**kw, "seed": 4242 + i})
        assert one.choices[0].message.content == texts[i]
    assert many.usage.completion_tokens == sum(
        chat(client, **{**kw, "seed": 4242 + i}).usage.completion_tokens for i in range(3)
    )


def test_n_choices_stream_like_they_answer(client):
    kw = dict(temperature=0.8, max_tokens=10, seed=7, n=2)
    whole = [c.text for c in complete(client, COUNTING, **kw).choices]
    parts = {0: [], 1: []}
    for chunk in complete(client, COUNTING, stream=True, **kw):
        for c in chunk.choices:
            parts[c.index].append(c.text)
    assert ["".join(parts[0]), "".join(parts[1])] == whole


def test_best_of_answers_the_candidate_with_the_best_mean_logprob(client):
    kw = dict(temperature=1.0, max_tokens=8, seed=99)
    candidates = complete(client, COUNTING, n=3, logprobs=0, **kw).choices

    def mean(c):
        return sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs)

    best = max(candidates, key=mean)
    resp = complete(client, COUNTING, best_of=3, **kw)
    assert [c.text for c in resp.choices] == [best.text]
    assert resp.choices[0].logprobs is None


def test_frequency_penalty_breaks_repetition(client):
    plain = complete(client, COUNTING, temperature=0, max_tokens=24, logprobs=0)
    penalized = complete(
        client, COUNTING, temperature=0, max_tokens=24, logprobs=0, frequency_penalty=2.0
    )

    def most_common(choice) -> int:
        return Counter(choice.logprobs.tokens).most_common(1)[0][1]

    assert most_common(penalized.choices[0]) < most_common(plain.choices[0])


def test_repetition_and_presence_penalties_change_the_output(client):
    story = "Once upon a time"
    plain = complete(client, story, temperature=0, max_tokens=24).choices[0].text
    for extra in ({"presence_penalty": 2.0}, {"extra_body": {"repetition_penalty": 1.5}}):
        changed = complete(client, story, temperature=0, max_tokens=24, **extra).choices[0].text
        assert changed != plain, extra


def paris_token_id() -> int:
    """The id of " Paris" in the served model's vocabulary (the OpenAI shapes carry none)."""

    from jacana_engine.assets.default_model import default_model_path
    from jacana_engine.text.tokenizer import Tokenizer

    [token_id] = Tokenizer.from_path(default_model_path()).encode(
        " Paris", add_special_tokens=False
    )
    return token_id


def test_logit_bias_forces_and_forbids_a_token(client):
    paris = str(paris_token_id())
    forced = complete(client, "Hello", temperature=0, max_tokens=5, logit_bias={paris: 100})
    assert forced.choices[0].text == " Paris" * 5
    plain = complete(client, temperature=0, max_tokens=3).choices[0].text
    assert plain.startswith(" Paris")
    banned = complete(client, temperature=0, max_tokens=3, logit_bias={paris: -100})
    assert not banned.choices[0].text.startswith(" Paris")


def test_logit_bias_outside_the_vocabulary_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, max_tokens=2, logit_bias={"999999": 5})
    assert info.value.body["param"] == "logit_bias"


def test_min_tokens_holds_off_the_end(client):
    ask = [{"role": "user", "content": "Say hi."}]
    short = chat(client, messages=ask, temperature=0, max_tokens=64)
    assert short.choices[0].finish_reason == "stop"
    floor = short.usage.completion_tokens + 6
    held = chat(
        client, messages=ask, temperature=0, max_tokens=64, extra_body={"min_tokens": floor}
    )
    assert held.usage.completion_tokens >= floor


async def test_same_seed_same_output_whatever_runs_beside_it(client, async_client):
    kw = dict(
        temperature=1.0,
        max_tokens=16,
        seed=31337,
        frequency_penalty=0.7,
        logit_bias={"28": 3},
        extra_body={"repetition_penalty": 1.1},
    )
    solo = chat(client, **kw).choices[0].message.content

    async def one(**extra):
        resp = await async_client.chat.completions.create(
            model=MODEL_ID, messages=QUESTION, **{**kw, **extra}
        )
        return resp.choices[0].message.content

    together = await asyncio.gather(
        one(),
        one(seed=1, presence_penalty=1.0),
        one(seed=2, n=2),
        one(temperature=0.3, seed=3),
    )
    assert together[0] == solo
