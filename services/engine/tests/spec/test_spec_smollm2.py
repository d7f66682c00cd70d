"""Speculative decoding on the real SmolLM2-135M GGUF (fp32, CPU): greedy output with each
proposer is token-identical to decoding without speculation, stop strings included."""

from __future__ import annotations

import time

import pytest

from jacana_engine.config import EngineConfig
from jacana_engine.core.engine import LLMEngine
from jacana_engine.core.outputs import FinishReason
from jacana_engine.sample.params import SamplingParams
from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.spec.registry import PROPOSERS

pytestmark = pytest.mark.usefixtures("torch_one_thread")

TEXTS = [
    "def fibonacci(n):\n    ",
    "The days of the week are Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and "
    "Sunday. Repeat the list: Monday, Tuesday,",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
]
MAX_TOKENS = 40


def _engine(base: LLMEngine, proposer: str) -> LLMEngine:
    config = EngineConfig(
        model=base.config.model,
        model_id="smollm2",
        num_kv_blocks=128,
        max_model_len=1024,
        speculative=SpeculativeConfig(
            proposer=proposer,
            num_speculative_tokens=4,
            draft_model=base.config.model,  # self-drafting: the target is its own draft model
        ),
    )
    return LLMEngine(config, model=base.model, tokenizer=base.tokenizer)


@pytest.fixture(scope="module")
def prompts(smollm2_engine):
    return [smollm2_engine.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]


@pytest.fixture(scope="module")
def reference(smollm2_engine, prompts):
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return _engine(smollm2_engine, "none").generate(prompts, sp)


@pytest.mark.parametrize("proposer", sorted(PROPOSERS))
def test_greedy_speculation_is_token_identical(smollm2_engine, prompts, reference, proposer):
    engine = _engine(smollm2_engine, proposer)
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    start = time.perf_counter()
    out = engine.generate(prompts, sp)
    elapsed = time.perf_counter() - start
    assert out == reference
    stats = engine.stats()
    s = stats.speculative[proposer]
    print(  # measured acceptance, shown with -s
        f"\n{proposer}: {stats.steps_total} steps, {s.proposals} proposals, "
        f"acceptance {s.acceptance_rate:.2f}, mean accepted length "
        f"{s.mean_accepted_length:.2f}, {elapsed:.1f}s"
    )
    assert s.proposals > 0 and s.accepted_tokens > 0
    # fewer steps than tokens: speculation actually skipped forward passes
    assert stats.steps_total < 1 + sum(len(o) for o in out)


def test_stop_string_inside_an_accepted_draft(smollm2_engine, prompts, reference):
    tok = smollm2_engine.tokenizer
    full = tok.decode(reference[1])
    stop = "Thursday"
    assert stop in full
    expected = full[: full.index(stop)]
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop=(stop,))
    for proposer in ("none", "ngram"):
        engine = _engine(smollm2_engine, proposer)
        engine.add_request("r", prompts[1], sp)
        text, last = "", None
        while engine.has_unfinished_requests():
            for o in engine.step():
                text += o.new_text
                last = o
        assert text == expected, proposer
        assert last.finish_reason is FinishReason.STOP and last.matched_stop == stop
        if proposer != "none":  # the stop string was reached inside verified drafts
            s = engine.stats().speculative[proposer]
            assert s.proposals > 0 and s.accepted_tokens > 0, s
