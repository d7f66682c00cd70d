"""Paged KV-cache bookkeeping (host-side only): which physical blocks each sequence owns,
which full blocks hold a cached prefix, and how many blocks the pool gets.

The KV tensors themselves live on the device and are owned by the model runner; this
package hands out block ids and sizes the pool (:mod:`sizing`).
"""

from jacana_engine.kv_cache.block_manager import NO_MATCH, Block, BlockManager, PrefixMatch

__all__ = ["NO_MATCH", "Block", "BlockManager", "PrefixMatch"]
