"""Paged KV-cache bookkeeping: which physical blocks each sequence owns (host-side only).

The KV tensors themselves live on the device and are owned by the model runner; this
package only hands out block ids.
"""

from jacana_engine.kv_cache.block_manager import Block, BlockManager

__all__ = ["Block", "BlockManager"]
