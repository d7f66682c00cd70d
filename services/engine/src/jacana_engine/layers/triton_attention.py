"""Paged attention through the Triton kernels: the GPU path, and graph-capturable.

Per layer and step: ``kv_cache_write`` stores the new tokens' K/V (unless the rotary
kernel already did: ``kv_written``), then one launch attends every sequence. A
decode-only batch (every query length 1) takes the split-K decode kernel; anything else
(prefill chunks, prefix-cache hits, mixed batches) takes the variable-length prefill
kernel, which also serves decode rows. Grids are sized from host bounds carried by the
metadata, never from device tensors, so nothing syncs and a decode step of a fixed
padded size launches the same grids every time (CUDA graphs). The prefill kernel's tile
table is the step's: built once from the host lists by the first layer and kept on the
metadata for the rest (``_prefill_tiles``), or a captured graph's own.

Stateless: the cache tensors belong to the model runner, the metadata to the step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from jacana_engine.layers.attention_backend import AttentionBackend
from jacana_engine.worker.attention_metadata import AttentionMetadata

if TYPE_CHECKING:
    from jacana_engine.kernels.decode_rotation import DecodeRotation


class TritonAttentionBackend(AttentionBackend):
    """KV write + paged prefill/decode attention kernels (``jacana_engine.kernels``)."""

    name = "triton"
    graph_safe = True
    accepts_written_kv = True

    def __init__(self) -> None:
        # Imported here so that choosing the torch backend never loads Triton code.
        from jacana_engine.kernels.decode_attention import paged_decode_attention
        from jacana_engine.kernels.kv_cache_write import kv_cache_write
        from jacana_engine.kernels.prefill_attention import paged_prefill_attention

        self._write = kv_cache_write
        self._decode = paged_decode_attention
        self._prefill = paged_prefill_attention

    def forward(
        self,
        q: torch.Tensor,  # [T, n_heads, head_dim], may be a strided view of a fused QKV
        k: torch.Tensor,  # [T, n_kv_heads, head_dim]
        v: torch.Tensor,  # [T, n_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        kv_written: bool = False,
        rotation: DecodeRotation | None = None,
    ) -> torch.Tensor:  # [T, n_heads, head_dim], contiguous, in q's dtype
        if rotation is not None and not self._is_decode(meta, q.shape[0]):
            raise ValueError("a rotation folds into decode steps only")
        if not kv_written and rotation is None:
            self._write(k, v, kv_cache, meta.slot_mapping)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        max_query_len = meta.query_len_bound
        if self._is_decode(meta, q.shape[0]):
            return self._decode(
                q,
                kv_cache,
                meta.seq_lens,
                meta.block_tables,
                scale,
                num_splits=meta.decode_num_splits,
                max_seq_len=meta.seq_len_bound,
                out=out,
                pdl=self.dependent_launch,
                rotation=rotation,
                min_split_tiles=self._min_split_tiles(q.shape[-1]),
            )
        tiles, block_m = self._prefill_tiles(meta, q, kv_cache.shape[3])
        return self._prefill(
            q,
            kv_cache,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            scale,
            max_query_len=max_query_len,
            out=out,
            block_m=block_m,
            tiles=tiles,
        )

    @staticmethod
    def _prefill_tiles(
        meta: AttentionMetadata, q: torch.Tensor, n_kv: int
    ) -> tuple[torch.Tensor, int]:  # ([programs, 2] int32 on q's device, block_m)
        """The step's prefill tile table: the metadata's, else built from its host lists
        and kept there for the step's other layers (not inside a graph capture: the copy
        would be captured from a host buffer that does not outlive it)."""
        if meta.prefill_tiles is None:
            from jacana_engine.kernels._common import num_sms
            from jacana_engine.kernels.attention_tiles import prefill_tiles
            from jacana_engine.kernels.prefill_attention import prefill_block_m

            if q.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("a captured step's metadata needs its prefill tile table")
            _, n_heads, head_dim = q.shape
            block_m = prefill_block_m(
                meta.num_seqs, meta.query_len_bound, n_heads, n_kv, head_dim, num_sms(q.device)
            )
            table = prefill_tiles(meta.query_lens_cpu, block_m // (n_heads // n_kv))
            meta.prefill_tiles = torch.from_numpy(table).to(q.device, non_blocking=True)
            meta.prefill_block_m = block_m
        return meta.prefill_tiles, meta.prefill_block_m

    def rotates_decode(self, meta: AttentionMetadata, num_tokens: int) -> bool:
        return self.fold_rope and self._is_decode(meta, num_tokens)

    def _min_split_tiles(self, head_dim: int) -> int:
        from jacana_engine.kernels.decode_attention import cudnn_min_split_tiles

        return cudnn_min_split_tiles(head_dim) if self.exact_decode else 1

    @staticmethod
    def _is_decode(meta: AttentionMetadata, num_tokens: int) -> bool:
        """Every sequence of the step has one query: the decode kernel's case."""
        return meta.query_len_bound == 1 and num_tokens == meta.seq_lens.shape[0]
