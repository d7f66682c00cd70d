"""Row buckets of eager steps (``row_buckets.py``): the buckets, the padding rows (on the
CPU), and on a GPU an engine padding its eager steps against the same engine without."""

from __future__ import annotations

import pytest
import torch

from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.core.sequence import Sequence
from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.sample.params import SamplingParams
from jacana_engine.worker.batch import build_batch
from jacana_engine.worker.row_buckets import pad_rows, padded_rows, row_buckets

BLOCK = 4


def test_buckets_step_by_16_to_512_then_by_64_past_the_most():
    buckets = row_buckets(8192)
    assert buckets[:3] == [16, 32, 48] and buckets[31:34] == [512, 576, 640]
    assert buckets[-1] == 8192 and len(buckets) == 32 + 120
    assert row_buckets(600) == [*range(16, 513, 16), 576, 640]  # 600 rounded up to 640
    assert row_buckets(40) == [16, 32, 48]
    with pytest.raises(ValueError, match="max_tokens"):
        row_buckets(0)


@pytest.mark.parametrize(
    ("tokens", "rows"), [(1, 16), (16, 16), (17, 32), (513, 576), (9000, 9000)]
)
def test_a_step_pads_to_the_smallest_bucket_that_holds_it(tokens, rows):
    assert padded_rows(tokens, row_buckets(8192)) == rows


def _chunk(prompt_len: int, start: int, n: int, bm: BlockManager, name: str) -> ScheduledSequence:
    seq = Sequence(name, [100 + i for i in range(prompt_len)], SamplingParams(), 64)
    bm.allocate(seq, start + n)
    seq.num_computed_tokens = start
    return ScheduledSequence(seq, start, n, start + n == prompt_len)


def test_padding_rows_are_token_0_at_position_0_writing_no_kv_outside_every_sequence():
    bm = BlockManager(64, BLOCK)
    batch = build_batch([_chunk(7, 0, 7, bm, "a"), _chunk(9, 8, 1, bm, "b")], BLOCK)
    ids, positions, meta = pad_rows(batch.input_ids, batch.positions, batch.meta, 16)
    assert ids.shape == positions.shape == meta.slot_mapping.shape == (16,)
    assert ids[:8].tolist() == batch.input_ids.tolist() and ids[8:].tolist() == [0] * 8
    assert positions[:8].tolist() == batch.positions.tolist() and positions[8:].tolist() == [0] * 8
    assert meta.slot_mapping[:8].tolist() == batch.meta.slot_mapping.tolist()
    assert meta.slot_mapping[8:].tolist() == [-1] * 8
    # the sequences still cover the real rows alone
    assert meta.query_start_loc.tolist() == [0, 7, 8] == batch.meta.query_start_loc.tolist()
    assert meta.seq_lens_cpu == batch.meta.seq_lens_cpu
    same = pad_rows(batch.input_ids, batch.positions, batch.meta, 8)  # already a bucket
    assert same[0] is batch.input_ids and same[2] is batch.meta


# ---- on a GPU ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_padded_eager_steps_serve_what_unpadded_ones_do(peaked_qwen3, tmp_path):
    """Prompts prefilled together, and beside running decodes, with the eager steps'
    rows padded to buckets: the same greedy and seeded outputs as without padding (the
    peaked model's margins hold across cuBLAS kernels), and the warm-up met the buckets."""
    from gpu_engines import assert_same_outputs, engines_differing_in

    plain, padded = engines_differing_in(
        "eager_row_buckets",
        (False, True),
        str(peaked_qwen3),
        tmp_path,
        tokenizer=None,
        enable_prefix_caching=False,
        warm_up=True,
    )
    assert plain.runner.row_buckets == [] and padded.runner.row_buckets[0] == 16
    assert padded.warm_up_seconds > 0
    gen = torch.Generator().manual_seed(5)
    # lengths whose sums are no bucket: every prefill step pads
    prompts = [
        torch.randint(0, 2048, (n,), generator=gen).tolist()
        for n in (3, 37, 90, 5, 61, 130, 7, 250)
    ]
    assert_same_outputs(padded, plain, prompts)
