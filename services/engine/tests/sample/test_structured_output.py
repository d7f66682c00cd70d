"""Structured output (``structured_output.py``): a guided request's tokens are the ones the
same grammar allows on transformers' side, its output obeys the guide by checks that do
not use the grammar library, and nothing else in the batch changes.

The reference: transformers' greedy ``generate`` on the same GGUF with a logits
processor that builds its own llguidance matcher from transformers' tokenizer (not from
ours) and masks the logits the same way.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from hf_reference import hf_greedy
from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.sample.params import SamplingParams
from jacana_engine.sample.structured_output import Guide

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
PROMPT = "Describe Alice, who is 30 and speaks French, as a JSON object."
CHOICES = ["positive", "negative", "neutral (unsure)"]
REGEX = r"(Mon|Tue|Wed)day, [0-9]{2}:[0-9]{2}"
NEW_TOKENS = 48


def _obeys_person(value) -> bool:
    """PERSON's constraints, checked by hand (no schema library, no grammar)."""
    return (
        isinstance(value, dict)
        and set(value) == {"name", "age", "languages"}
        and isinstance(value["name"], str)
        and type(value["age"]) is int
        and isinstance(value["languages"], list)
        and len(value["languages"]) <= 3
        and all(isinstance(x, str) for x in value["languages"])
    )


# guide -> the independent check of a finished output's text
GUIDES = {
    "json_schema": (
        Guide("json_schema", json.dumps(PERSON)),
        lambda t: _obeys_person(json.loads(t)),
    ),
    "json_object": (Guide("json_object"), lambda t: isinstance(json.loads(t), dict)),
    "regex": (Guide("regex", REGEX), lambda t: re.fullmatch(REGEX, t) is not None),
    "choice": (Guide("choice", json.dumps(CHOICES)), lambda t: t in CHOICES),
}


# (left free, the model writes an object of a dozen keys to PROMPT, past NEW_TOKENS; to
# this one it writes the same JSON free as guided)
PROMPTS = {"json_object": "What is the capital of France? Answer in JSON."}


def _chat(tokenizer, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def chat_ids(smollm2_tokenizer):
    return _chat(smollm2_tokenizer, PROMPT)


class _Reference:
    """transformers' side: a logits processor holding its own llguidance matcher, built
    on transformers' tokenizer, that sets every token it rejects to -inf."""

    def __init__(self, hf_tokenizer, vocab_size: int, eos: list[int], guide: Guide) -> None:
        import llguidance
        import llguidance.hf

        vocabulary = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=eos)
        self.matcher = llguidance.LLMatcher(vocabulary, guide.grammar(), log_level=0)
        self.prompt_length: int | None = None
        self.vocab_size = vocab_size

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import llguidance.torch

        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        else:
            assert self.matcher.consume_token(int(input_ids[0, -1]))
        bitmask = llguidance.torch.allocate_token_bitmask(1, self.vocab_size)
        llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask)
        bits = (bitmask[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1  # [W, 32]
        allowed = bits.flatten()[: scores.shape[1]].bool()
        return scores.masked_fill(~allowed, float("-inf"))


def _reference_greedy(hf_smollm2, engine, ids: list[int], guide: Guide) -> list[int]:
    model, hf_tokenizer = hf_smollm2
    eos = sorted(engine.eos_token_ids)
    processor = _Reference(hf_tokenizer, engine.vocab_size, eos, guide)
    return hf_greedy(model, ids, NEW_TOKENS, logits_processor=[processor], eos_token_id=eos)


def _text(engine, out: list[int], max_tokens: int) -> str:
    """The text of an output that ended before ``max_tokens`` (on an end-of-sequence id,
    which the engine leaves out: the grammar's end)."""
    assert len(out) < max_tokens, "the output did not end where the grammar did"
    return engine.tokenizer.decode(out)


@pytest.mark.parametrize("kind", sorted(GUIDES))
def test_guided_greedy_is_token_exact_with_transformers_under_the_same_grammar(
    smollm2_engine, hf_smollm2, smollm2_tokenizer, kind
):
    guide, obeys = GUIDES[kind]
    chat_ids = _chat(smollm2_tokenizer, PROMPTS.get(kind, PROMPT))
    overlapped = smollm2_engine.overlapped_steps_total
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, guide=guide)
    ours = smollm2_engine.generate([chat_ids], params)[0]
    reference = _reference_greedy(hf_smollm2, smollm2_engine, chat_ids, guide)
    assert reference[-1] in smollm2_engine.eos_token_ids  # it ended where the grammar did
    assert ours == reference[:-1]  # (the engine's output leaves the end-of-sequence id out)
    assert obeys(_text(smollm2_engine, ours, NEW_TOKENS)), smollm2_engine.tokenizer.decode(ours)
    # a guided row's grammar reads each token on the host: its steps never overlap
    assert smollm2_engine.overlapped_steps_total == overlapped
    free = smollm2_engine.generate([chat_ids], dataclasses.replace(params, guide=None))[0]
    assert free != ours or kind in PROMPTS, "the guide changed nothing"
    assert smollm2_engine.overlapped_steps_total > overlapped  # (which free rows do)


def test_guided_and_free_rows_in_one_batch_give_their_solo_outputs(smollm2_engine, chat_ids):
    plain = SamplingParams(temperature=0.0, max_tokens=24)
    params = [
        dataclasses.replace(plain, guide=GUIDES["json_schema"][0]),
        plain,
        dataclasses.replace(plain, guide=GUIDES["choice"][0]),
        dataclasses.replace(plain, temperature=0.8, seed=3, guide=GUIDES["regex"][0]),
    ]
    prompts = [chat_ids, chat_ids[:-3], chat_ids, chat_ids]
    batched = smollm2_engine.generate(prompts, params)
    solo = [smollm2_engine.generate([p], sp)[0] for p, sp in zip(prompts, params, strict=True)]
    assert batched == solo


@pytest.mark.parametrize("seed", range(4))
def test_sampled_guided_outputs_obey_the_schema(smollm2_engine, chat_ids, seed):
    guide = Guide(
        "json_schema",
        json.dumps(
            {
                "type": "object",
                "properties": {"mood": {"enum": ["happy", "sad"]}, "sure": {"type": "boolean"}},
                "required": ["mood", "sure"],
                "additionalProperties": False,
            }
        ),
    )
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=64, guide=guide)
    out = smollm2_engine.generate([chat_ids], params)[0]
    value = json.loads(_text(smollm2_engine, out, 64))
    assert set(value) == {"mood", "sure"}
    assert value["mood"] in ("happy", "sad") and isinstance(value["sure"], bool)


def test_a_grammar_state_replays_an_output_that_shrank(smollm2_engine, chat_ids):
    guide = GUIDES["json_schema"][0]
    state = smollm2_engine.guides.state(guide)
    out = smollm2_engine.generate(
        [chat_ids], SamplingParams(temperature=0.0, max_tokens=12, guide=guide)
    )[0]
    fresh = smollm2_engine.guides.state(guide)
    assert (state.mask(out[:8]) == fresh.mask(out[:8])).all()
    assert (state.mask(out[:3]) == smollm2_engine.guides.state(guide).mask(out[:3])).all()
    assert state.consumed == 3
    assert not (state.mask(out[:3]) == fresh.mask(out[:8])).all()  # the masks do differ


@pytest.mark.parametrize(
    ("guide", "message"),
    [
        (Guide("json_schema", '{"type": "strin"}', "response_format"), "strin"),
        (Guide("json_schema", "{not json", "response_format"), "not JSON"),
        (Guide("json_schema", "[1]", "guided_json"), "must be an object"),
        (Guide("regex", "(unclosed", "guided_regex"), "regex"),
        (Guide("regex", r"x[^\s\S]", "guided_regex"), "can match no output"),
        (Guide("lark", "start: a\na: a", "guided_grammar"), "can match no output"),
        (Guide("choice", "[]", "guided_choice"), "one or more"),
        (Guide("choice", '["a", 3]', "guided_choice"), "strings"),
        (Guide("yaml", "", "guided_yaml"), "unknown guide kind"),
    ],
)
def test_a_guide_that_does_not_compile_is_refused_naming_its_field(smollm2_engine, guide, message):
    with pytest.raises(InvalidRequestError) as raised:
        smollm2_engine.add_request("bad", [1, 2, 3], SamplingParams(guide=guide))
    assert raised.value.param == guide.param
    assert message in raised.value.message
    assert not smollm2_engine.has_unfinished_requests()


@pytest.mark.parametrize("field", [{"min_tokens": 2}, {"ignore_eos": True}])
def test_fields_that_hold_the_output_past_the_grammar_are_refused(field):
    params = SamplingParams(guide=Guide("json_object", param="response_format"), **field)
    with pytest.raises(InvalidRequestError) as raised:
        params.validate(vocab_size=100)
    assert raised.value.param == next(iter(field))


def test_a_model_without_a_tokenizer_refuses_a_guide(toy):
    engine = toy.engine()
    with pytest.raises(InvalidRequestError, match="tokenizer") as raised:
        engine.add_request("g", [1, 2], SamplingParams(guide=Guide("regex", "a", "guided_regex")))
    assert raised.value.param == "guided_regex"
