"""A step's model inputs on the host: the scheduled chunks flattened end to end.

:func:`build_batch` is pure: it reads the sequences (token ids, block tables) and writes
nothing. The runner moves the result to the device once per step (CUDA-graph steps stage
their inputs in ``decode_graphs.DecodeStaging`` / ``prefill_graphs.PrefillStaging``
instead, laid out the same way).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.worker.attention_metadata import AttentionMetadata, kv_slots


@dataclass
class Batch:
    """Host tensors of one step.

    input_ids / positions: [T] int64, the scheduled tokens of every sequence end to end.
    meta: attention metadata (host copy).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata


def build_batch(scheduled: Seq[ScheduledSequence], block_size: int) -> Batch:
    """Flatten a step's chunks into model inputs. Pure: reads sequences, writes nothing."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    for s in scheduled:
        start, end = s.start, s.start + s.num_new_tokens
        table = s.seq.block_table
        input_ids.extend(s.known_token_ids())  # drafts to verify included
        positions.extend(range(start, end))
        slots.extend(kv_slots(table, start, end, block_size))
        query_start.append(query_start[-1] + s.num_new_tokens)
        seq_lens.append(end)

    max_blocks = max((len(s.seq.block_table) for s in scheduled), default=0)
    # One tensor from zero-padded rows (a tensor per row costs ~5 µs each).
    block_tables = torch.tensor(
        [t + [0] * (max_blocks - len(t)) for t in (s.seq.block_table for s in scheduled)],
        dtype=torch.int32,
    ).reshape(len(scheduled), max_blocks)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(query_start, dtype=torch.int32),  # [B + 1]
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),  # [B]
        block_tables=block_tables,  # [B, max_blocks]
        slot_mapping=torch.tensor(slots, dtype=torch.int64),  # [T]
        query_lens_cpu=[s.num_new_tokens for s in scheduled],
        seq_lens_cpu=seq_lens,
        block_size=block_size,
    )
    return Batch(
        input_ids=torch.tensor(input_ids, dtype=torch.int64),  # [T]
        positions=torch.tensor(positions, dtype=torch.int64),  # [T]
        meta=meta,
    )
