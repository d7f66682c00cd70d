"""Shared fixtures of the engine tests."""

from __future__ import annotations

import random

import pytest
import torch

from jacana_engine.attention_metadata import AttentionMetadata

# --- model numerics: a minimal paged-KV driver for CausalLM implementations -------------


class PagedDriver:
    """Runs a ``CausalLM`` step by step over a paged KV cache, as a model runner would.

    Blocks come from a shuffled pool, so a sequence's blocks are scattered and its
    tokens cross block boundaries. Host-only test harness, fp32 by default.
    """

    def __init__(self, model, *, block_size: int = 16, num_blocks: int = 256, seed: int = 0):
        cfg = model.config
        self.model = model
        self.block_size = block_size
        dtype = model.model.embed_tokens.weight.dtype
        shape = (2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def _slot(self, seq: int, pos: int) -> int:
        table = self.tables.setdefault(seq, [])
        while len(table) <= pos // self.block_size:
            table.append(self.free.pop())
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def step(self, chunks: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Feed ``new_tokens`` to each ``(seq_id, new_tokens)``; logits [n_new, vocab] per seq."""
        ids, positions, slots, qlens, slens = [], [], [], [], []
        for seq, tokens in chunks:
            start = self.lens.get(seq, 0)
            for i, tok in enumerate(tokens):
                ids.append(tok)
                positions.append(start + i)
                slots.append(self._slot(seq, start + i))
            self.lens[seq] = start + len(tokens)
            qlens.append(len(tokens))
            slens.append(self.lens[seq])
        width = max(len(self.tables[seq]) for seq, _ in chunks)
        tables = [self.tables[seq] + [0] * (width - len(self.tables[seq])) for seq, _ in chunks]
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            seq_lens=torch.tensor(slens, dtype=torch.int32),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_lens_cpu=qlens,
            seq_lens_cpu=slens,
            block_size=self.block_size,
        )
        with torch.inference_mode():
            hidden = self.model.forward(
                torch.tensor(ids, dtype=torch.int64),
                torch.tensor(positions, dtype=torch.int64),
                self.kv_caches,
                meta,
            )
            logits = self.model.compute_logits(hidden)
        return list(logits.split(qlens))

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy continuation of all prompts, batched: one prefill step, then decode steps."""
        base = len(self.lens)
        seqs = list(range(base, base + len(prompts)))
        logits = self.step(list(zip(seqs, prompts, strict=True)))
        out = [[int(lg[-1].argmax())] for lg in logits]
        for _ in range(max_new_tokens - 1):
            logits = self.step([(s, [o[-1]]) for s, o in zip(seqs, out, strict=True)])
            for o, lg in zip(out, logits, strict=True):
                o.append(int(lg[-1].argmax()))
        return out


@pytest.fixture(scope="session")
def paged_driver():
    """Factory: ``paged_driver(model, block_size=16, ...)`` -> ``PagedDriver``."""
    return PagedDriver


@pytest.fixture(scope="module")
def torch_one_thread():
    """Run a module's torch work on one thread, then restore the previous count.

    Small and decode-sized matmuls gain little from a second thread on a 2-core box, and
    OpenMP spin-waits make them crawl when other processes share the cores.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
