"""End to end: structured output (``response_format``, ``guided_*``) through the gateway and
the real engine, driven with the official openai SDK, its pydantic ``parse`` helper
included. The outputs are checked without the grammar library (json, pydantic, re)."""

from __future__ import annotations

import json
import re

import openai
import pydantic
import pytest

from stack import MODEL_ID


class City(pydantic.BaseModel):
    name: str
    country: str
    population_millions: float


QUESTION = [{"role": "user", "content": "Tell me about Paris as JSON."}]


def test_parse_with_a_pydantic_model_returns_an_instance(client):
    resp = client.chat.completions.parse(
        model=MODEL_ID, messages=QUESTION, response_format=City, temperature=0, max_tokens=80
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, City)
    assert City.model_validate_json(choice.message.content) == choice.message.parsed


def _strict(schema: dict) -> dict:
    """``schema`` with no properties beyond its own (what OpenAI's strict mode requires)."""
    return {**schema, "additionalProperties": False}


def test_streamed_json_schema_output_is_the_non_streamed_one(client):
    schema = _strict(City.model_json_schema())
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}
    kw = dict(model=MODEL_ID, messages=QUESTION, response_format=fmt, temperature=0, max_tokens=80)
    whole = client.chat.completions.create(**kw).choices[0]
    parts = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(**kw, stream=True)
        if c.choices
    ]
    assert "".join(parts) == whole.message.content
    assert whole.finish_reason == "stop"
    City.model_validate_json(whole.message.content)


def test_sampled_choices_each_obey_the_schema(client):
    mood = {
        "type": "object",
        "properties": {"mood": {"enum": ["happy", "sad"]}, "sure": {"type": "boolean"}},
        "required": ["mood", "sure"],
    }
    resp = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "How do you feel today? Answer in JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "m", "schema": _strict(mood)},
        },
        temperature=1.0,
        seed=11,
        n=3,
        max_tokens=64,
    )
    for choice in resp.choices:
        assert choice.finish_reason == "stop", choice.message.content
        value = json.loads(choice.message.content)
        assert set(value) == {"mood", "sure"} and value["mood"] in ("happy", "sad")
        assert isinstance(value["sure"], bool)


CITIES = ["Paris", "Lyon", "Marseille"]
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
DISTANCE = 'start: answer " " unit\nanswer: /[0-9]+/\nunit: "km" | "miles"'
# (prompt, max_tokens, guide field, the finished text's check, whether it must end on "stop")
COMPLETION_GUIDES = {
    "choice": (
        "The capital of France is",
        8,
        {"guided_choice": CITIES},
        lambda text: text in CITIES,
        True,
    ),
    "regex": (
        "The date of the moon landing was",
        16,
        {"guided_regex": DATE},
        lambda text: re.fullmatch(DATE, text),
        False,
    ),
    "grammar": (
        "The distance from Paris to Lyon is",
        12,
        {"guided_grammar": DISTANCE},
        lambda text: re.fullmatch(r"[0-9]+ (km|miles)", text),
        False,
    ),
}


@pytest.mark.parametrize("kind", sorted(COMPLETION_GUIDES))
def test_guided_completions(client, kind):
    prompt, max_tokens, field, obeys, stops = COMPLETION_GUIDES[kind]
    resp = client.completions.create(
        model=MODEL_ID, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body=field
    )
    assert obeys(resp.choices[0].text), resp.choices[0].text
    if stops:
        assert resp.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "strin"}},
                }
            },
            "response_format",
        ),
        ({"extra_body": {"guided_regex": "(unclosed"}}, "guided_regex"),
        (
            {"response_format": {"type": "json_object"}, "extra_body": {"min_tokens": 3}},
            "min_tokens",
        ),
    ],
)
def test_a_guide_the_engine_cannot_compile_is_a_400_naming_its_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=4, **kwargs)
    assert raised.value.status_code == 400
    assert raised.value.body["param"] == param
    # and the engine still serves
    resp = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=2)
    assert resp.choices[0].finish_reason == "length"
