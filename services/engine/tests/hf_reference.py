"""Checks against Hugging Face transformers shared by the engine's parity tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


def transformers_from_gguf(path: Path):
    """(model, tokenizer) that transformers loads from the GGUF at ``path``: float32, CPU,
    eval mode, offline (skips when transformers is not installed)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model.eval(), tok


def assert_greedy_matches_transformers(model, tok, prompt_ids, ours, new_tokens: int) -> None:
    """Each of ``ours`` (our greedy continuations) equals transformers' ``generate`` of that
    prompt alone (the reference of the parity tests), token for token."""
    for ids, own in zip(prompt_ids, ours, strict=True):
        want = hf_greedy(model, ids, new_tokens, eos_token_id=model.generation_config.eos_token_id)
        assert own == want, (
            f"prompt {tok.decode(ids)!r}:\n{tok.decode(own)!r}\n{tok.decode(want)!r}"
        )


def hf_greedy(hf_model, ids: list[int], new: int, **kwargs) -> list[int]:
    """transformers' greedy continuation of ``ids`` alone (``new`` tokens at most; no EOS
    stop unless ``eos_token_id`` is given; other ``generate`` arguments pass through)."""
    kwargs.setdefault("eos_token_id", None)
    with torch.inference_mode():
        out = hf_model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=new,
            pad_token_id=0,
            **kwargs,
        )
    return out[0, len(ids) :].tolist()
