"""Per-step description of a flattened batch for paged attention.

Built by the model runner on the host, moved to the model's device once per step, and
read by every attention layer. Sequences appear in the same order as their tokens in the
flattened batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def kv_slots(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """The flat KV slots (``block * block_size + offset``) of positions ``[start, end)``
    of a sequence whose blocks are ``block_table``."""
    slots: list[int] = []
    pos = start
    while pos < end:  # slots run contiguously inside a block: one range a block
        block, offset = divmod(pos, block_size)
        take = min(end - pos, block_size - offset)
        base = block_table[block] * block_size + offset
        slots.extend(range(base, base + take))
        pos += take
    return slots


@dataclass
class AttentionMetadata:
    """Where each sequence's queries and K/V live for one forward pass.

    query_start_loc: [B + 1] int32; tokens of sequence i are ``[qsl[i], qsl[i+1])``.
    seq_lens: [B] int32; KV length of sequence i after this step (cached + new tokens).
    block_tables: [B, max_blocks] int32; physical block ids per sequence, padded with 0.
    slot_mapping: [T] int64; flat KV slot (``block * block_size + offset``) of each new token.
    query_lens_cpu / seq_lens_cpu: host copies of the per-sequence lengths, for code
        that loops over sequences without a device sync.
    block_size: tokens per KV block.
    max_query_len / max_seq_len: host-side upper bounds of the per-sequence query and KV
        lengths (size kernel grids without reading device tensors); None derives them
        from the host lists.
    decode_num_splits: split-K factor for decode-only batches, fixed by the model runner
        so that a captured CUDA graph and an eager step of the same padded size compute
        the same sums; None lets the kernel choose.
    prefill_tiles / prefill_block_m: the prefill kernel's tile table [programs, 2] int32
        on the device and the query rows per program it was built for
        (``attention_tiles.prefill_tiles``): set by a captured graph from its
        static buffers, else filled by the first attention layer that needs them from the
        host lists (one small copy a step, read by every layer).
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    block_size: int
    max_query_len: int | None = None
    max_seq_len: int | None = None
    decode_num_splits: int | None = None
    prefill_tiles: torch.Tensor | None = None
    prefill_block_m: int | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def query_len_bound(self) -> int:
        if self.max_query_len is not None:
            return self.max_query_len
        return max(self.query_lens_cpu, default=0)

    @property
    def seq_len_bound(self) -> int:
        if self.max_seq_len is not None:
            return self.max_seq_len
        return max(self.seq_lens_cpu, default=0)

    def to(self, device: torch.device | str) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=self.query_start_loc.to(device, non_blocking=True),
            seq_lens=self.seq_lens.to(device, non_blocking=True),
            block_tables=self.block_tables.to(device, non_blocking=True),
            slot_mapping=self.slot_mapping.to(device, non_blocking=True),
            query_lens_cpu=self.query_lens_cpu,
            seq_lens_cpu=self.seq_lens_cpu,
            block_size=self.block_size,
            max_query_len=self.max_query_len,
            max_seq_len=self.max_seq_len,
            decode_num_splits=self.decode_num_splits,
            prefill_tiles=(
                None
                if self.prefill_tiles is None
                else self.prefill_tiles.to(device, non_blocking=True)
            ),
            prefill_block_m=self.prefill_block_m,
        )
