"""The toy model of the engine tests: exact checks of batching, chunking, caching and
preemption without weights (imported by conftest.py's ``toy`` fixture and by tests that
use it directly)."""

from __future__ import annotations

import torch

from jacana_engine.worker.attention_metadata import AttentionMetadata


class ToyLM:
    """A weightless ``CausalLM`` whose next token is a function of the whole history *as
    read back from the paged KV cache*: it writes (token, position) as every layer's K/V,
    then rebuilds each sequence's history through its block table. A wrong slot, block
    table, shared prefix block or position changes the output (or raises)."""

    VOCAB = 97
    EOS = 96

    def __init__(self, num_layers: int = 2, max_len: int = 512) -> None:
        from jacana_engine.models.base import ModelConfig

        self.config = ModelConfig(
            architecture="ToyForCausalLM",
            vocab_size=self.VOCAB,
            hidden_size=self.VOCAB,
            intermediate_size=1,
            num_hidden_layers=num_layers,
            num_attention_heads=1,
            num_key_value_heads=1,
            head_dim=2,
            rms_norm_eps=1e-6,
            rope_theta=1e4,
            max_position_embeddings=max_len,
            tie_word_embeddings=False,
            eos_token_ids=(self.EOS,),
        )
        self.tokens_computed = 0

    @classmethod
    def next_token(cls, history: list[int]) -> int:
        return (31 * sum(t * (i + 1) for i, t in enumerate(history)) + 7) % cls.VOCAB

    @classmethod
    def greedy(cls, prompt: list[int], n: int) -> list[int]:
        """The toy model's greedy continuation of ``prompt``: the reference."""
        tokens = list(prompt)
        for _ in range(n):
            tokens.append(cls.next_token(tokens))
        return tokens[len(prompt) :]

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata):
        self.tokens_computed += int(input_ids.shape[0])
        for cache in kv_caches:  # [2, num_blocks, block_size, 1, 2]
            flat = cache.view(2, -1, 2)  # [2, slots, 2]
            flat[0, meta.slot_mapping, 0] = input_ids.to(cache.dtype)
            flat[1, meta.slot_mapping, 0] = positions.to(cache.dtype)
        flat = kv_caches[-1].view(2, -1, 2)
        bs = meta.block_size
        hidden = torch.zeros(input_ids.shape[0], self.VOCAB)  # [T, V]
        for i in range(meta.num_seqs):
            q0, q1 = int(meta.query_start_loc[i]), int(meta.query_start_loc[i + 1])
            pos = torch.arange(int(meta.seq_lens[i]))
            slots = meta.block_tables[i, pos // bs].long() * bs + pos % bs
            tokens = flat[0, slots, 0].long()  # [length]
            if not torch.equal(flat[1, slots, 0].long(), pos):
                raise AssertionError("KV cache holds tokens at the wrong positions")
            nexts = (31 * torch.cumsum(tokens * (pos + 1), 0) + 7) % self.VOCAB  # [length]
            rows = torch.arange(q0, q1)
            hidden[rows, nexts[positions[q0:q1]]] = 1.0
        return hidden

    def compute_logits(self, hidden):
        return self.logits_in_model_dtype(hidden)

    def logits_in_model_dtype(self, hidden):
        return hidden.float() * 4.0  # [N, V]; soft enough that sampling is random


def make_toy_engine(*, model: ToyLM | None = None, unchecked: bool = False, **overrides):
    """An ``LLMEngine`` over a ``ToyLM`` (token ids only); ``overrides`` go to EngineConfig.

    ``unchecked`` builds the config without validation: toy budgets below what the service
    accepts (a step of 5 tokens, a pool of a few hundred bytes) make short prompts chunk."""
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine

    kw = dict(model="toy", load_format="dummy", block_size=4, num_kv_blocks=64)
    kw.update(overrides)
    config = EngineConfig.model_construct(**kw) if unchecked else EngineConfig(**kw)
    return LLMEngine(config, model=model or ToyLM(), tokenizer=None)
