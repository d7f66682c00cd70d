"""Per-step description of a flattened batch for paged attention.

Built by the model runner on the host, moved to the model's device once per step, and
read by every attention layer. Sequences appear in the same order as their tokens in the
flattened batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    def to(self, device: torch.device | str) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=self.query_start_loc.to(device, non_blocking=True),
            seq_lens=self.seq_lens.to(device, non_blocking=True),
            block_tables=self.block_tables.to(device, non_blocking=True),
            slot_mapping=self.slot_mapping.to(device, non_blocking=True),
            query_lens_cpu=self.query_lens_cpu,
            seq_lens_cpu=self.seq_lens_cpu,
            block_size=self.block_size,
        )
