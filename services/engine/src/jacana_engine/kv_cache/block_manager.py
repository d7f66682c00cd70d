"""Fixed-size KV block pool with prefix caching: free list, reference counts, block tables.

State ownership (all host-side Python, no tensors; the K/V live in the model runner's
device tensors, addressed by block id):
- ``BlockManager`` owns the pool: every :class:`Block`, its reference count and content
  hash, the free list and the hash -> block table of cached prefixes. It is the only
  writer of ``Sequence.block_table``, ``Sequence.block_hashes`` and
  ``Sequence.num_committed_blocks``.
- ``Sequence.block_table`` lists the physical block ids holding the sequence's tokens in
  order: token ``i`` lives in block ``block_table[i // block_size]`` at offset
  ``i % block_size``.

A sequence's table only grows to cover ``num_computed_tokens + num_new_tokens``: the
slots the next forward pass writes K/V into. Between steps a running sequence holds
``ceil(num_computed_tokens / block_size)`` blocks: a verification step reserves slots for
its drafts, and ``trim`` hands back the whole blocks past the accepted length.

Prefix caching (``enable_prefix_caching``):
- *Commit*: once a block is full and its K/V computed (``commit`` after each step) it is
  registered under its chained content hash (:mod:`block_hash`), salted per request.
- *Match*: a sequence being admitted looks up the hashes of its leading full blocks and
  takes the longest run that is cached (``match_prefix``), reference-counted, so it skips
  their compute. The match never covers the last known token: its logits are needed.
- *Evict*: a block whose last owner leaves goes back to the free list but keeps its hash,
  so it can still be matched until the pool reallocates it. The free list is ordered for
  reuse: blocks without a hash first, then hashed blocks least recently freed first (LRU).
  Shared blocks are only ever full ones, which nobody writes again, so sharing needs no
  copy-on-write.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jacana_engine.kv_cache.block_hash import extend_block_hashes

if TYPE_CHECKING:
    from jacana_engine.core.sequence import Sequence


class OutOfBlocksError(RuntimeError):
    """An allocation was attempted without checking ``can_allocate`` first (a bug)."""


@dataclass
class Block:
    """One physical KV block: ``block_size`` token slots in every layer's cache."""

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # set while the block is registered in the prefix cache


@dataclass(frozen=True)
class PrefixMatch:
    """Cached blocks a sequence can start from: ``block_ids`` hold its first
    ``num_tokens`` tokens (a multiple of the block size)."""

    block_ids: tuple[int, ...] = ()
    num_tokens: int = 0


NO_MATCH = PrefixMatch()


class BlockManager:
    """Hands out KV blocks to sequences, shares cached prefixes, takes blocks back.

    Verbs: ``match_prefix`` finds the cached start of a sequence being admitted;
    ``can_allocate`` / ``allocate`` grow a table for a chunk of new tokens (taking a
    match's blocks first); ``can_append`` / ``append_slot`` are the one-token (decode)
    case; ``commit`` offers newly computed full blocks to the cache; ``trim`` gives back
    blocks reserved past what a sequence keeps (rejected drafts); ``deallocate``
    releases all of a sequence's blocks.
    """

    def __init__(
        self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in reuse order (front first); see the module docstring.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id, used or free
        self._num_free_cached = 0  # free blocks that still hold a registered hash
        self.prefix_queries_total = 0  # tokens of admitted sequences looked up
        self.prefix_hits_total = 0  # of those, tokens served from cached blocks

    # ---- pool facts ---------------------------------------------------------------------

    @property
    def num_total_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody owns, including cached ones that may still be matched."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self._free)

    @property
    def num_free_cached_blocks(self) -> int:
        """Free blocks that still hold a reusable prefix (evicted only when needed)."""
        return self._num_free_cached

    @property
    def num_total_slots(self) -> int:
        """Token capacity of the whole pool."""
        return len(self.blocks) * self.block_size

    @property
    def free_block_ids(self) -> tuple[int, ...]:
        """Free blocks in the order they will be reused."""
        return tuple(self._free)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks ``seq`` lacks to compute ``num_new_tokens`` more tokens."""
        needed = self.blocks_for_tokens(seq.num_computed_tokens + num_new_tokens)
        return max(0, needed - len(seq.block_table))

    # ---- prefix cache -------------------------------------------------------------------

    def match_prefix(self, seq: Sequence) -> PrefixMatch:
        """The longest cached run of ``seq``'s leading full blocks, for its admission.

        Reads the cache and memoizes ``seq``'s block hashes; takes nothing. Leaves at
        least the last token uncovered, so the step that follows yields logits.
        """
        if not self.enable_prefix_caching or seq.block_table:
            return NO_MATCH
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._hash_blocks(seq, max_blocks)
        ids: list[int] = []
        for h in seq.block_hashes[:max_blocks]:
            block_id = self._cached.get(h)
            if block_id is None:
                break
            ids.append(block_id)
        if not ids:
            return NO_MATCH
        return PrefixMatch(tuple(ids), len(ids) * self.block_size)

    def commit(self, seq: Sequence) -> None:
        """Register ``seq``'s full, computed blocks in the cache (call after each step).

        A block whose content is already cached under another block id stays private: the
        first copy keeps serving hits, this one is freed as a plain block.
        """
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if full <= seq.num_committed_blocks:
            return
        self._hash_blocks(seq, full)
        for i in range(seq.num_committed_blocks, full):
            block = self.blocks[seq.block_table[i]]
            h = seq.block_hashes[i]
            if block.block_hash is None and h not in self._cached:
                block.block_hash = h
                self._cached[h] = block.block_id
        seq.num_committed_blocks = full

    def _hash_blocks(self, seq: Sequence, num_blocks: int) -> None:
        if len(seq.block_hashes) < num_blocks:
            extend_block_hashes(
                seq.block_hashes, seq.token_slice, self.block_size, num_blocks, seq.cache_salt
            )

    # ---- verbs --------------------------------------------------------------------------

    def can_allocate(
        self,
        seq: Sequence,
        num_new_tokens: int,
        prefix: PrefixMatch = NO_MATCH,
        *,
        extra_free: int = 0,
    ) -> bool:
        """Whether ``allocate(seq, num_new_tokens, prefix)`` would succeed, were
        ``extra_free`` more blocks free (a caller weighing what preemption would free)."""
        return self._blocks_taken(seq, num_new_tokens, prefix) <= len(self._free) + extra_free

    def allocate(self, seq: Sequence, num_new_tokens: int, prefix: PrefixMatch = NO_MATCH) -> None:
        """Grow ``seq.block_table`` to cover its next ``num_new_tokens`` tokens.

        With a ``prefix`` (from :meth:`match_prefix`, for a sequence that owns no blocks
        yet) the table starts with the matched blocks and ``seq.num_computed_tokens``
        moves past them; the new tokens come after.
        """
        taken = self._blocks_taken(seq, num_new_tokens, prefix)
        if taken > len(self._free):
            free = len(self._free)
            raise OutOfBlocksError(f"{seq.request_id}: needs {taken} blocks, {free} free")
        if self.enable_prefix_caching and not seq.block_table:
            self._take_prefix(seq, prefix)
        for _ in range(self.num_new_blocks(seq, num_new_tokens)):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:  # evict the least recently used cached prefix
                del self._cached[block.block_hash]
                block.block_hash = None
                self._num_free_cached -= 1
            block.ref_count = 1
            seq.block_table.append(block_id)

    def can_append(self, seq: Sequence) -> bool:
        return self.can_allocate(seq, 1)

    def append_slot(self, seq: Sequence) -> None:
        """Make room for one decode token."""
        self.allocate(seq, 1)

    def deallocate(self, seq: Sequence) -> None:
        """Release every block of ``seq`` (the last owner frees it) and empty its table."""
        # Reverse order: a sequence's tail is the least likely to be shared, so among the
        # cached blocks it freed, its tail is evicted first.
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table.clear()
        seq.block_table_epoch += 1
        seq.num_committed_blocks = 0

    def trim(self, seq: Sequence, num_tokens: int) -> int:
        """Release ``seq``'s whole blocks past its first ``num_tokens`` tokens; returns
        how many left its table.

        For slots reserved but not kept (drafts the target rejected): afterwards the
        table holds exactly ``blocks_for_tokens(num_tokens)`` blocks when it held at least
        that many. Raises ``ValueError`` when ``num_tokens`` is below
        ``seq.num_computed_tokens`` (computed K/V would be dropped). Blocks past the
        computed length were never committed, so they carry no prefix-cache hash of
        ``seq``'s; a released block still follows the usual refcount rule.
        """
        if num_tokens < seq.num_computed_tokens:
            raise ValueError(
                f"{seq.request_id}: cannot trim to {num_tokens} tokens, "
                f"{seq.num_computed_tokens} are computed"
            )
        keep = self.blocks_for_tokens(num_tokens)
        dropped = seq.block_table[keep:]
        for block_id in reversed(dropped):
            self._release(block_id)
        del seq.block_table[keep:]
        if dropped:
            seq.block_table_epoch += 1
        seq.num_committed_blocks = min(seq.num_committed_blocks, keep)
        return len(dropped)

    # ---- helpers ------------------------------------------------------------------------

    def _release(self, block_id: int) -> None:
        """Drop one owner of ``block_id``; the last one puts it on the free list (plain
        blocks first in line for reuse, hashed ones at the LRU end)."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free[block_id] = None
            if block.block_hash is None:
                self._free.move_to_end(block_id, last=False)
            else:
                self._num_free_cached += 1

    def _blocks_taken(self, seq: Sequence, num_new_tokens: int, prefix: PrefixMatch) -> int:
        """Free-list entries an allocation consumes: new blocks plus matched blocks that
        nobody owns right now."""
        if not prefix.block_ids:
            return self.num_new_blocks(seq, num_new_tokens)
        if seq.block_table or seq.num_computed_tokens:
            raise ValueError(f"{seq.request_id}: a prefix match needs a sequence without blocks")
        idle = sum(1 for b in prefix.block_ids if self.blocks[b].ref_count == 0)
        total = self.blocks_for_tokens(prefix.num_tokens + num_new_tokens)
        return idle + total - len(prefix.block_ids)

    def _take_prefix(self, seq: Sequence, prefix: PrefixMatch) -> None:
        """Share ``prefix``'s blocks with ``seq`` and count the lookup."""
        self.prefix_queries_total += seq.num_tokens
        self.prefix_hits_total += prefix.num_tokens
        if not prefix.block_ids:
            return
        for block_id in prefix.block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
                self._num_free_cached -= 1
            block.ref_count += 1
            seq.block_table.append(block_id)
        seq.num_computed_tokens = prefix.num_tokens
        seq.num_committed_blocks = len(prefix.block_ids)
