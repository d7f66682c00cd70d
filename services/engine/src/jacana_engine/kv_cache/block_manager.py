"""Fixed-size KV block pool: a free list, per-block reference counts, per-sequence tables.

State ownership (all host-side Python, no tensors):
- ``BlockManager`` owns the pool: every :class:`Block`, its reference count and the free
  list. It is the only writer of ``Sequence.block_table``.
- ``Sequence.block_table`` (owned by the sequence, written here) lists the physical block
  ids that hold the sequence's tokens in order: token ``i`` lives in block
  ``block_table[i // block_size]`` at offset ``i % block_size``.

A sequence's table only ever grows to cover ``num_computed_tokens + num_new_tokens``: the
slots the next forward pass writes K/V into. Tokens that are known but not yet computed
(a sampled token waiting for its decode step) need no slot yet.

Reference counts and ``Block.block_hash`` exist so prefix caching can share full blocks
between sequences later; today every used block has exactly one owner.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jacana_engine.sequence import Sequence


class OutOfBlocksError(RuntimeError):
    """An allocation was attempted without checking ``can_allocate`` first (a bug)."""


@dataclass
class Block:
    """One physical KV block: ``block_size`` token slots in every layer's cache."""

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # content hash of a full block, for prefix caching


class BlockManager:
    """Hands out KV blocks to sequences and takes them back.

    Verbs: ``can_allocate`` / ``allocate`` grow a table for a chunk of new tokens,
    ``can_append`` / ``append_slot`` are the one-token (decode) case, ``deallocate``
    returns all of a sequence's blocks to the free list.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Freed blocks go to the back and allocation takes from the front, so the front is
        # always the least recently used block (the eviction order prefix caching wants).
        self._free: deque[int] = deque(range(num_blocks))

    # ---- pool facts ---------------------------------------------------------------------

    @property
    def num_total_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self._free)

    @property
    def num_total_slots(self) -> int:
        """Token capacity of the whole pool."""
        return len(self.blocks) * self.block_size

    @property
    def free_block_ids(self) -> tuple[int, ...]:
        return tuple(self._free)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks ``seq`` lacks to compute ``num_new_tokens`` more tokens."""
        needed = self.blocks_for_tokens(seq.num_computed_tokens + num_new_tokens)
        return max(0, needed - len(seq.block_table))

    # ---- verbs --------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_new_blocks(seq, num_new_tokens) <= len(self._free)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow ``seq.block_table`` to cover its next ``num_new_tokens`` tokens."""
        n = self.num_new_blocks(seq, num_new_tokens)
        if n > len(self._free):
            raise OutOfBlocksError(f"{seq.request_id}: needs {n} blocks, {len(self._free)} free")
        for _ in range(n):
            block = self.blocks[self._free.popleft()]
            block.ref_count = 1
            block.block_hash = None
            seq.block_table.append(block.block_id)

    def can_append(self, seq: Sequence) -> bool:
        return self.can_allocate(seq, 1)

    def append_slot(self, seq: Sequence) -> None:
        """Make room for one decode token."""
        self.allocate(seq, 1)

    def deallocate(self, seq: Sequence) -> None:
        """Release every block of ``seq`` (last owner frees it) and empty its table."""
        # Reverse order: the sequence's tail blocks are the least likely to be shared, so
        # they should be evicted first once prefix caching keeps freed blocks reusable.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free.append(block_id)
        seq.block_table.clear()
