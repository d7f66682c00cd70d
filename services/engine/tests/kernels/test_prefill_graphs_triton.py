"""A prefill graph's staged step (``prefill_graphs.py``) through the Triton path, on the CPU
under the interpreter: the forward a graph captures, run on the staged buffers of a mixed
step (prompt chunks beside decode rows, a chunk after a cached prefix, empty sequence
slots, padding rows, a padded tile table), gives the eager step's hidden states and
writes the KV cache only at the step's own slots. On a GPU, test_prefill_graphs.py
replays the graphs themselves."""

from __future__ import annotations

import pytest
import torch
from tiny_decoder import random_triton_qwen3, zero_kv_caches

from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.core.sequence import Sequence
from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.sample.params import SamplingParams
from jacana_engine.worker.batch import build_batch
from jacana_engine.worker.prefill_graphs import PrefillGraphs

BLOCK = 4
NUM_BLOCKS = 16


def test_a_staged_mixed_step_computes_the_eager_steps_rows_and_kv(device, seed):
    if device.type == "cuda":
        pytest.skip("on a GPU: test_prefill_graphs.py replays the captured graphs")
    model = random_triton_qwen3(seed, device)
    cfg = model.config
    bm = BlockManager(NUM_BLOCKS, BLOCK)

    def sequence(name: str, length: int) -> Sequence:
        seq = Sequence(
            name, [(5 * i + 3 * len(name)) % 64 for i in range(length)], SamplingParams(), 64
        )
        bm.allocate(seq, length + 1)
        return seq

    forward = lambda ids, pos, meta, caches: model.forward(ids, pos, caches, meta)  # noqa: E731
    eager = zero_kv_caches(model, NUM_BLOCKS, BLOCK, device)
    staged = zero_kv_caches(model, NUM_BLOCKS, BLOCK, device)
    graphs = PrefillGraphs(
        lambda ids, pos, meta: forward(ids, pos, meta, staged),
        buckets=[8, 32],
        max_seqs=4,  # one slot stays empty below
        block_size=BLOCK,
        max_blocks=NUM_BLOCKS,
        max_model_len=NUM_BLOCKS * BLOCK,
        block_m=lambda tokens: 4,  # two queries a tile at this model's group of 2
        group=cfg.num_attention_heads // cfg.num_key_value_heads,
        device=device,
    )
    a, b, c = sequence("a", 5), sequence("bb", 9), sequence("ccc", 7)
    with torch.inference_mode():
        # step 1: a and b prefill whole (14 tokens in the 32 bucket), c's first 4 tokens
        first = [
            ScheduledSequence(a, 0, 5, True),
            ScheduledSequence(b, 0, 9, True),
            ScheduledSequence(c, 0, 4, False),
        ]
        # step 2: decodes of a and b beside c's last 3 prompt tokens after its prefix
        a.output_token_ids.append(11)
        b.output_token_ids.append(12)
        second = [
            ScheduledSequence(a, 5, 1, True),
            ScheduledSequence(c, 4, 3, True),
            ScheduledSequence(b, 9, 1, True),
        ]
        for step, bucket in ((first, 32), (second, 8)):
            assert graphs.staging.fits(step)
            tokens, query_start = graphs.stage(step)
            assert tokens == bucket
            batch = build_batch(step, BLOCK)
            assert query_start == batch.meta.query_start_loc.tolist()
            want = model.forward(batch.input_ids, batch.positions, eager, batch.meta)
            got = forward(*graphs.inputs(tokens), staged)  # [bucket, hidden]
            n = query_start[-1]
            torch.testing.assert_close(got[:n], want, rtol=1e-5, atol=1e-5)
            for mine, theirs in zip(staged, eager, strict=True):
                torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
