"""Turns a scheduler plan into one forward pass: batch tensors, model, logits, sampling.

State ownership: the runner owns the model and the KV cache tensors (on the model's
device, one ``[2, num_blocks, block_size, n_kv_heads, head_dim]`` tensor per layer, in the
model dtype). Batch tensors are built on the host (:func:`build_batch`, a pure function),
moved to the device once per step, and dropped after the step. Block ids come from the
sequences' block tables (host state owned by the block manager).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from jacana_engine.attention_metadata import AttentionMetadata
from jacana_engine.config import EngineConfig
from jacana_engine.loader import torch_dtype
from jacana_engine.models.base import CausalLM, ModelConfig
from jacana_engine.sampler import Sampler
from jacana_engine.scheduler import ScheduledSequence

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """Host tensors of one step.

    input_ids / positions: [T] int64, the scheduled tokens of every sequence end to end.
    meta: attention metadata (host copy).
    logits_indices: [N] int64, row in ``[0, T)`` of the last token of each sequence that
        samples this step, in batch order.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor


def build_batch(scheduled: Seq[ScheduledSequence], block_size: int) -> Batch:
    """Flatten a step's chunks into model inputs. Pure: reads sequences, writes nothing."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    logits_indices: list[int] = []
    for s in scheduled:
        start, end = s.start, s.start + s.num_new_tokens
        table = s.seq.block_table
        input_ids.extend(s.seq.token_slice(start, end))
        positions.extend(range(start, end))
        # Slots run contiguously inside a block, so extend one block's range at a time.
        pos = start
        while pos < end:
            block, offset = divmod(pos, block_size)
            take = min(end - pos, block_size - offset)
            base = table[block] * block_size + offset
            slots.extend(range(base, base + take))
            pos += take
        query_start.append(query_start[-1] + s.num_new_tokens)
        seq_lens.append(end)
        if s.samples:
            logits_indices.append(query_start[-1] - 1)

    max_blocks = max((len(s.seq.block_table) for s in scheduled), default=0)
    block_tables = torch.zeros((len(scheduled), max_blocks), dtype=torch.int32)
    for i, s in enumerate(scheduled):
        table = s.seq.block_table
        block_tables[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
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
        logits_indices=torch.tensor(logits_indices, dtype=torch.int64),  # [N]
    )


def kv_block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block takes across all layers (K and V)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim * elem


def num_kv_blocks(config: EngineConfig, model_config: ModelConfig) -> int:
    """Pool size: ``config.num_kv_blocks`` or as many blocks as the byte budget holds."""
    if config.num_kv_blocks is not None:
        n = config.num_kv_blocks
    else:
        per_block = kv_block_bytes(model_config, config.block_size, torch_dtype(config.dtype))
        n = config.kv_cache_memory_bytes // per_block
    if n < 1:
        raise ValueError(
            "the KV cache holds no block: raise kv_cache_memory_bytes or num_kv_blocks"
        )
    return n


class ModelRunner:
    """Owns the model and its paged KV cache; runs one planned step at a time."""

    def __init__(
        self, model: CausalLM, config: EngineConfig, sampler: Sampler, max_model_len: int
    ) -> None:
        self.model = model
        self.sampler = sampler
        self.device = torch.device(config.device)
        self.dtype = torch_dtype(config.dtype)
        self.block_size = config.block_size
        cfg = model.config
        self.num_blocks = num_kv_blocks(config, cfg)
        shape = (2, self.num_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        # kv_caches[layer]: [2 (K, V), num_blocks, block_size, n_kv_heads, head_dim]
        self.kv_caches = [
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(cfg.num_hidden_layers)
        ]
        tokens = self.num_blocks * self.block_size
        nbytes = sum(t.numel() * t.element_size() for t in self.kv_caches)
        log.info(
            "KV cache: %d blocks x %d tokens = %d tokens, %.1f MiB on %s; "
            "max concurrency at max_model_len %d: %.2fx",
            self.num_blocks,
            self.block_size,
            tokens,
            nbytes / 2**20,
            self.device,
            max_model_len,
            tokens / max_model_len,
        )

    @torch.inference_mode()
    def execute(self, scheduled: Seq[ScheduledSequence]) -> list[int]:
        """Run one step; returns the sampled token of each sampling sequence, in order."""
        if not scheduled:
            return []
        batch = build_batch(scheduled, self.block_size)
        non_blocking = self.device.type == "cuda"
        hidden = self.model.forward(  # [T, hidden]
            batch.input_ids.to(self.device, non_blocking=non_blocking),
            batch.positions.to(self.device, non_blocking=non_blocking),
            self.kv_caches,
            batch.meta.to(self.device),
        )
        sampling = [s.seq for s in scheduled if s.samples]
        if not sampling:
            return []
        last = hidden[batch.logits_indices.to(self.device)]  # [N, hidden]
        logits = self.model.compute_logits(last)  # [N, vocab] float32
        token_ids = self.sampler(  # [N]
            logits,
            [seq.sampling_params for seq in sampling],
            [seq.generator for seq in sampling],
        )
        return token_ids.tolist()
