"""Content hashes of full KV blocks, chained so that one hash names a whole prefix.

Block ``i`` of a sequence holds tokens ``[i * block_size, (i + 1) * block_size)``. Its
hash covers those token ids *and* the hash of block ``i - 1``, so two blocks share a hash
only when every token before them matches too (attention makes a block's K/V depend on
the whole prefix, not just its own tokens). The first block's parent is derived from the
request's cache salt: requests with different salts never share a block, which lets a
tenant keep its prompts out of everyone else's cache hits (timing side channels).

The digest is BLAKE2b-128 rather than Python's ``hash()``: a collision would silently
serve another prompt's K/V, and 128 bits make that practically impossible. Hashes are
plain ``int``s, host-side, never persisted; nothing here touches tensors.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence

_DIGEST_BYTES = 16


def root_hash(cache_salt: str | None) -> int:
    """The parent hash of a sequence's first block; an empty salt is no salt."""
    salt = (cache_salt or "").encode()
    h = hashlib.blake2b(b"jacana-kv-root", digest_size=_DIGEST_BYTES)
    h.update(struct.pack("<I", len(salt)))
    h.update(salt)
    return int.from_bytes(h.digest(), "little")


def block_hash(parent: int, token_ids: Sequence[int]) -> int:
    """Hash of one full block: its parent's hash, then its token ids (each < 2**32)."""
    h = hashlib.blake2b(parent.to_bytes(_DIGEST_BYTES, "little"), digest_size=_DIGEST_BYTES)
    h.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return int.from_bytes(h.digest(), "little")


def extend_block_hashes(
    hashes: list[int],
    token_slice: Callable[[int, int], Sequence[int]],
    block_size: int,
    num_blocks: int,
    cache_salt: str | None,
) -> None:
    """Append to ``hashes`` until it covers the first ``num_blocks`` full blocks.

    ``hashes`` is a memo (owned by the sequence) of the blocks hashed so far; tokens are
    only ever appended to a sequence, so earlier hashes never change. ``token_slice(a, b)``
    returns tokens ``[a, b)`` and must have all of the first ``num_blocks`` blocks.
    """
    parent = hashes[-1] if hashes else root_hash(cache_salt)
    for i in range(len(hashes), num_blocks):
        tokens = token_slice(i * block_size, (i + 1) * block_size)
        if len(tokens) != block_size:
            raise ValueError(f"block {i} is not full: {len(tokens)} of {block_size} tokens")
        parent = block_hash(parent, tokens)
        hashes.append(parent)
