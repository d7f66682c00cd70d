"""The OpenAI sampling surface at the gateway: penalties, logit_bias, min_tokens, n,
best_of, logprobs and echo — validation, translation to the engine request, and the
OpenAI-shaped answers built from scripted engine messages (the recording engine).
"""

from __future__ import annotations

import json

import pytest

from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODEL = "test-model"  # what the conftest's dead-engine ``client`` serves


def chat(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def completion(**fields) -> dict:
    return {"model": "m", "prompt": "Once", **fields}


def top(token_id: int, raw: bytes, logprob: float) -> pb.TopLogprob:
    return pb.TopLogprob(token_id=token_id, token=raw, logprob=logprob)


def entry(token_id: int, raw: bytes, logprob: float | None, *alts) -> pb.TokenLogprob:
    e = pb.TokenLogprob(token_id=token_id, token=raw, top_logprobs=list(alts))
    if logprob is not None:
        e.logprob = logprob
    return e


def message(text="", ids=(), logprobs=(), index=0, reason=None, completion=0, **extra):
    msg = pb.GenerateResponse(
        text=text, token_ids=list(ids), logprobs=list(logprobs), index=index, **extra
    )
    if reason is not None:
        msg.finish_reason = reason
        msg.usage.CopyFrom(pb.Usage(prompt_tokens=5, completion_tokens=completion))
    return msg


def sse_chunks(raw: str) -> list[dict]:
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def post(make_client, make_settings, engine, path, body):
    async with make_client(make_settings({"m": [engine.address]})) as client:
        return await client.post(path, json=body)


# ---- validation (nothing reaches the dead engine) ----------------------------------------

BAD = [
    (CHAT, {"presence_penalty": 2.5}, "presence_penalty"),
    (CHAT, {"frequency_penalty": -2.1}, "frequency_penalty"),
    (CHAT, {"repetition_penalty": 0}, "repetition_penalty"),
    (CHAT, {"repetition_penalty": 10.5}, "repetition_penalty"),
    (CHAT, {"logit_bias": {"abc": 1}}, "logit_bias"),
    (CHAT, {"logit_bias": {"-5": 1}}, "logit_bias"),
    (CHAT, {"logit_bias": {"5": 100.5}}, "logit_bias"),
    (CHAT, {"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
    (CHAT, {"logit_bias": {"5": "high"}}, "logit_bias.5"),
    (CHAT, {"min_tokens": -1}, "min_tokens"),
    (CHAT, {"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
    (CHAT, {"min_tokens": 9, "max_completion_tokens": 8}, "min_tokens"),
    (CHAT, {"n": 129}, "n"),
    (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {"top_logprobs": 2}, "top_logprobs"),
    (CHAT, {"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    (CHAT, {"logprobs": 1}, "logprobs"),
    (COMPLETIONS, {"logprobs": 21}, "logprobs"),
    (COMPLETIONS, {"logprobs": True}, "logprobs"),
    (COMPLETIONS, {"echo": "yes"}, "echo"),
    (COMPLETIONS, {"best_of": 2, "n": 3}, "best_of"),
    (COMPLETIONS, {"best_of": 3, "n": 2, "stream": True}, "best_of"),
    (COMPLETIONS, {"min_tokens": 17}, "min_tokens"),  # above the default max_tokens 16
]


@pytest.mark.parametrize(("path", "fields", "param"), BAD)
async def test_bad_values_are_400_naming_the_field(client, path, fields, param):
    body = {
        "model": MODEL,
        **({"messages": [{"role": "user", "content": "x"}]} if path == CHAT else {"prompt": "x"}),
        **fields,
    }
    resp = await client.post(path, json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param, error
    assert error["code"] != "unsupported_parameter"


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        (CHAT, {"n": 3, "presence_penalty": -2, "frequency_penalty": 2, "logit_bias": {"1": -100}}),
        (CHAT, {"logprobs": True, "top_logprobs": 20, "min_tokens": 4, "repetition_penalty": 1.1}),
        (COMPLETIONS, {"echo": True, "logprobs": 0, "best_of": 4, "n": 2}),
        (COMPLETIONS, {"best_of": 2, "n": 2, "stream": True}),
    ],
)
async def test_supported_values_reach_the_engine(client, path, fields):
    body = {
        "model": MODEL,
        **({"messages": [{"role": "user", "content": "x"}]} if path == CHAT else {"prompt": "x"}),
        **fields,
    }
    resp = await client.post(path, json=body)
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_unavailable"


# ---- translation -------------------------------------------------------------------------


async def test_chat_sampling_fields_are_forwarded(make_client, make_settings, engine, script):
    engine.servicer.script = script([message("x", reason=pb.FINISH_REASON_STOP)])
    body = chat(
        presence_penalty=0.5,
        frequency_penalty=-1.25,
        repetition_penalty=1.3,
        logit_bias={"17": -100, "50256": 2.5},
        min_tokens=3,
        n=1,
        logprobs=True,
        top_logprobs=4,
    )
    assert (await post(make_client, make_settings, engine, CHAT, body)).status_code == 200
    s = engine.servicer.requests[0].sampling
    assert (s.presence_penalty, s.frequency_penalty, s.min_tokens, s.n) == (0.5, -1.25, 3, 1)
    assert s.repetition_penalty == pytest.approx(1.3)
    assert dict(s.logit_bias) == {17: -100.0, 50256: 2.5}
    assert s.HasField("logprobs") and s.logprobs == 4
    assert not s.HasField("prompt_logprobs") and not s.echo


async def test_defaults_ask_for_nothing_extra(make_client, make_settings, engine, script):
    engine.servicer.script = script([message("x", reason=pb.FINISH_REASON_STOP)])
    await post(make_client, make_settings, engine, CHAT, chat(logprobs=False))
    await post(make_client, make_settings, engine, COMPLETIONS, completion())
    for sent in engine.servicer.requests:
        s = sent.sampling
        assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0, 0, 1)
        assert (s.min_tokens, s.n, dict(s.logit_bias), s.echo) == (0, 1, {}, False)
        assert not s.HasField("logprobs") and not s.HasField("prompt_logprobs")


async def test_completion_logprobs_echo_and_best_of_are_forwarded(
    make_client, make_settings, engine, script
):
    engine.servicer.script = script(
        [message("x", logprobs=[entry(1, b"x", -0.125)], index=i, reason=1) for i in range(3)]
    )
    await post(make_client, make_settings, engine, COMPLETIONS, completion(logprobs=2, echo=True))
    await post(make_client, make_settings, engine, COMPLETIONS, completion(best_of=3))
    echo, best = (r.sampling for r in engine.servicer.requests)
    assert (echo.logprobs, echo.prompt_logprobs, echo.echo, echo.n) == (2, 2, True, 1)
    assert best.n == 3 and best.HasField("logprobs") and best.logprobs == 0


# ---- chat answers ------------------------------------------------------------------------

# "é" is two bytes: a token holding only the first one is not a character by itself
HALF = b"\xc3"
SCRIPT_LOGPROBS = [
    message("He", [7], [entry(7, b"He", -0.5, top(7, b"He", -0.5), top(9, b" Hi", -1.5))]),
    message("", [8], [entry(8, HALF, -0.25, top(8, HALF, -0.25), top(3, b"!", -2.0))]),
    message(
        "\u00e9",
        [10],
        [entry(10, b"\xa9", float("-inf"), top(11, b"y", -0.125), top(10, b"\xa9", -3.0))],
        reason=pb.FINISH_REASON_LENGTH,
        completion=3,
    ),
]


def chat_entry(token: str, raw: bytes, logprob: float, alts: list) -> dict:
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(raw),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(b)} for t, b, lp in alts],
    }


async def test_chat_logprobs_shape(make_client, make_settings, engine, script):
    engine.servicer.script = script(SCRIPT_LOGPROBS)
    resp = await post(make_client, make_settings, engine, CHAT, chat(logprobs=True, top_logprobs=1))
    choice = resp.json()["choices"][0]
    assert choice["message"]["content"] == "He\u00e9"
    assert choice["logprobs"]["content"] == [
        chat_entry("He", b"He", -0.5, [("He", b"He", -0.5)]),
        chat_entry("\\xc3", HALF, -0.25, [("\\xc3", HALF, -0.25)]),
        chat_entry("\\xa9", b"\xa9", -9999.0, [("y", b"y", -0.125)]),
    ]


async def test_chat_stream_carries_logprobs_with_their_tokens(
    make_client, make_settings, engine, script
):
    engine.servicer.script = script(SCRIPT_LOGPROBS)
    body = chat(logprobs=True, top_logprobs=2, stream=True)
    resp = await post(make_client, make_settings, engine, CHAT, body)
    chunks = [c["choices"][0] for c in sse_chunks(resp.text)]
    assert chunks[0]["delta"] == {"role": "assistant"} and chunks[0]["logprobs"] is None
    with_tokens = chunks[1:4]
    assert [c["delta"]["content"] for c in with_tokens] == ["He", "", "\u00e9"]
    tokens = [[e["token"] for e in c["logprobs"]["content"]] for c in with_tokens]
    assert tokens == [["He"], ["\\xc3"], ["\\xa9"]]
    assert all(len(c["logprobs"]["content"][0]["top_logprobs"]) == 2 for c in with_tokens)
    assert chunks[-1]["finish_reason"] == "length"


async def test_chat_n_choices_non_streaming(make_client, make_settings, engine, script):
    engine.servicer.script = script(
        [
            message("a", [1], index=1),
            message("x", [2], index=0),
            message("b", [3], index=1, reason=pb.FINISH_REASON_STOP, completion=2),
            message("y", [4], index=0, reason=pb.FINISH_REASON_LENGTH, completion=2),
        ]
    )
    resp = await post(make_client, make_settings, engine, CHAT, chat(n=2))
    body = resp.json()
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "xy", "length"),
        (1, "ab", "stop"),
    ]
    assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 4


async def test_chat_n_choices_streaming(make_client, make_settings, engine, script):
    engine.servicer.script = script(
        [
            message("x", [2], index=0),
            message("a", [1], index=1, reason=pb.FINISH_REASON_STOP, completion=1),
            message("y", [4], index=0, reason=pb.FINISH_REASON_LENGTH, completion=2),
        ]
    )
    body = chat(n=2, stream=True, stream_options={"include_usage": True})
    chunks = sse_chunks((await post(make_client, make_settings, engine, CHAT, body)).text)
    *chunks, final = chunks
    seen = [
        (c["choices"][0]["index"], c["choices"][0]["delta"], c["choices"][0]["finish_reason"])
        for c in chunks
    ]
    assert seen == [
        (0, {"role": "assistant"}, None),
        (1, {"role": "assistant"}, None),
        (0, {"content": "x"}, None),
        (1, {"content": "a"}, None),
        (1, {}, "stop"),
        (0, {"content": "y"}, None),
        (0, {}, "length"),
    ]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 3


async def test_a_choice_that_never_finishes_is_an_error(make_client, make_settings, engine, script):
    engine.servicer.script = script([message("x", [1], index=0, reason=1, completion=1)])
    resp = await post(make_client, make_settings, engine, CHAT, chat(n=2))
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_error"


# ---- completions answers -----------------------------------------------------------------

PROMPT_LOGPROBS = [
    entry(50, b"Once", None),
    entry(51, b" upon", -3.5, top(60, b" more", -0.5), top(51, b" upon", -3.5)),
]


def echo_script(prompt_text: str | None = None) -> list[pb.GenerateResponse]:
    extra = {"prompt_text": prompt_text} if prompt_text is not None else {}
    return [
        message(
            " a",
            [5],
            [entry(5, b" a", -1.0, top(5, b" a", -1.0))],
            prompt_logprobs=PROMPT_LOGPROBS,
            **extra,
        ),
        message(
            " time", [6], [entry(6, b" time", -0.5, top(7, b" day", -0.25))], reason=2, completion=2
        ),
    ]


async def test_completion_echo_with_logprobs(make_client, make_settings, engine, script):
    engine.servicer.script = script(echo_script())
    body = completion(prompt="Once upon", echo=True, logprobs=1)
    choice = (await post(make_client, make_settings, engine, COMPLETIONS, body)).json()["choices"][
        0
    ]
    assert choice["text"] == "Once upon a time"
    assert choice["logprobs"] == {
        "tokens": ["Once", " upon", " a", " time"],
        "token_logprobs": [None, -3.5, -1.0, -0.5],
        "top_logprobs": [
            None,
            {" more": -0.5, " upon": -3.5},
            {" a": -1.0},
            {" day": -0.25, " time": -0.5},
        ],
        "text_offset": [0, 4, 9, 11],
    }


async def test_completion_logprobs_without_echo_start_at_the_completion(
    make_client, make_settings, engine, script
):
    engine.servicer.script = script(echo_script())
    choice = (
        await post(make_client, make_settings, engine, COMPLETIONS, completion(logprobs=0))
    ).json()["choices"][0]
    assert choice["text"] == " a time"
    assert choice["logprobs"]["tokens"] == [" a", " time"]
    assert choice["logprobs"]["text_offset"] == [0, 2]


async def test_echo_of_a_token_id_prompt_uses_the_engine_text(
    make_client, make_settings, engine, script
):
    engine.servicer.script = script(echo_script(prompt_text="Once upon"))
    body = completion(prompt=[50, 51], echo=True)
    choice = (await post(make_client, make_settings, engine, COMPLETIONS, body)).json()["choices"][
        0
    ]
    assert choice["text"] == "Once upon a time" and choice["logprobs"] is None


async def test_completion_stream_echo_then_tokens_with_running_offsets(
    make_client, make_settings, engine, script
):
    engine.servicer.script = script(echo_script())
    body = completion(prompt="Once upon", echo=True, logprobs=1, stream=True)
    chunks = [
        c["choices"][0]
        for c in sse_chunks(
            (await post(make_client, make_settings, engine, COMPLETIONS, body)).text
        )
    ]
    assert [c["text"] for c in chunks] == ["Once upon", " a", " time", ""]
    assert chunks[0]["logprobs"]["token_logprobs"] == [None, -3.5]
    assert [c["logprobs"]["text_offset"] for c in chunks[:3]] == [[0, 4], [9], [11]]
    assert chunks[-1]["finish_reason"] == "length" and chunks[-1]["logprobs"] is None


async def test_best_of_answers_the_highest_mean_logprob(make_client, make_settings, engine, script):
    def candidate(index: int, logprobs: list[float]) -> pb.GenerateResponse:
        entries = [entry(1, b"t", lp) for lp in logprobs]
        return message(
            f"c{index}",
            [1] * len(logprobs),
            entries,
            index=index,
            reason=1,
            completion=len(logprobs),
        )

    engine.servicer.script = script(
        [candidate(0, [-2.0, -2.0]), candidate(1, [-0.5, -1.5, -0.4]), candidate(2, [-0.125, -3.0])]
    )
    resp = await post(make_client, make_settings, engine, COMPLETIONS, completion(best_of=3))
    body = resp.json()
    assert body["choices"] == [
        {"index": 0, "text": "c1", "logprobs": None, "finish_reason": "stop"}
    ]
    assert body["usage"]["completion_tokens"] == 7  # every candidate counts
    engine.servicer.script = script(
        [candidate(0, [-2.0]), candidate(1, [-0.5]), candidate(2, [-0.125])]
    )
    body = (
        await post(
            make_client, make_settings, engine, COMPLETIONS, completion(best_of=3, n=2, logprobs=0)
        )
    ).json()
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "c2"), (1, "c1")]
    assert body["choices"][0]["logprobs"]["token_logprobs"] == [-0.125]
