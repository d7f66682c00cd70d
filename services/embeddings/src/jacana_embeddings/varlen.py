"""Packed ("varlen") batches: the inputs of a batch laid end to end, without padding.

Token-wise work (embeddings, every linear layer, LayerNorm, the MLP) runs on the packed
``[T, H]`` rows, so its cost follows the real token count whatever the mix of lengths.
Only attention needs one row per input: :class:`PackedLayout` scatters packed rows into
a right-padded ``[B, S, ...]`` tensor for it and gathers the real rows back.

A layout is built on the host from the input lengths and its index tensors are moved to
the compute device once per batch; it holds no weights and is not shared across batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch


class PackedLayout:
    """Where each of ``T = sum(lengths)`` packed tokens sits in the padded ``[B, S]`` grid.

    ``dense`` is true when every input has the same length: then packed and padded rows
    coincide and the scatter/gather are plain reshapes (and attention needs no mask).
    """

    def __init__(self, lengths: Sequence[int], device: torch.device) -> None:
        if not lengths or min(lengths) < 1:
            raise ValueError("a packed batch needs at least one input, each non-empty")
        lens = np.asarray(lengths, dtype=np.int64)  # [B]
        self.batch_size = len(lens)
        self.max_len = int(lens.max())
        self.num_tokens = int(lens.sum())
        self.dense = self.num_tokens == self.batch_size * self.max_len
        starts = np.cumsum(lens) - lens  # [B]: packed index of each input's first token
        flat = grid_positions(lens, self.max_len)  # [T]: padded cell (b * S + s) of each
        key_mask = np.arange(self.max_len)[None, :] < lens[:, None]  # [B, S]
        self.lengths = torch.from_numpy(lens).to(device)
        self.starts = torch.from_numpy(starts).to(device)
        self.key_mask = torch.from_numpy(key_mask).to(device)  # [B, S] bool
        self._flat = None if self.dense else torch.from_numpy(flat).to(device)
        # Input index of each packed token: [T] (segment ids, for position ids).
        self.segment = torch.from_numpy(np.repeat(np.arange(self.batch_size), lens)).to(device)

    @property
    def attention_mask(self) -> torch.Tensor | None:
        """``[B, 1, 1, S]`` bool key mask for SDPA, or None when nothing is padded."""
        return None if self.dense else self.key_mask[:, None, None, :]

    def to_padded(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [T, F] -> [B, S, F]``, zeros where the grid has no token."""
        if self.dense:
            return x.view(self.batch_size, self.max_len, x.shape[-1])
        out = x.new_zeros(self.batch_size * self.max_len, x.shape[-1])
        out.index_copy_(0, self._flat, x)
        return out.view(self.batch_size, self.max_len, x.shape[-1])

    def to_packed(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [B, S, ...] -> [T, F]`` (trailing dims flattened), the real tokens in
        packed order."""
        flat = x.reshape(self.batch_size * self.max_len, -1)
        return flat if self.dense else flat.index_select(0, self._flat)

    def positions(self) -> torch.Tensor:
        """``[T]``: each token's index inside its own input (0 for the first)."""
        t = torch.arange(self.num_tokens, device=self.starts.device)
        return t - self.starts[self.segment]

    def segment_cumsum(self, x: torch.Tensor) -> torch.Tensor:
        """Inclusive cumulative sum of ``x: [T]`` restarted at every input's first token."""
        total = torch.cumsum(x, dim=0)
        before = (total - x)[self.starts]  # [B]: the running sum just before each input
        return total - before[self.segment]


class PaddedLayout:
    """The padded ``[B, S]`` grid itself as the batch: every grid cell is a token.

    The interface of :class:`PackedLayout` (the encoder and pooling run on either), for
    a fixed grid whose tensors are allocated once and refilled in place, so a forward
    pass over it can be captured as a CUDA graph and replayed for any batch that fits.
    Token-wise work covers padding too (the price of a fixed shape). The inputs' lengths
    live on the device (``lengths``, [B]); :meth:`refresh` rebuilds the key mask from
    them as the pass's first step, so a replay needs only the ids and lengths uploaded.
    Rows past the batch's inputs are filler of length 1 (the pad id), so that every row
    attends to something and every pooling is defined; their outputs are discarded.
    """

    def __init__(self, batch_size: int, max_len: int, lengths: torch.Tensor) -> None:
        """``lengths``: [batch_size] int64 on the compute device, written by the caller."""
        self.batch_size = batch_size
        self.max_len = max_len
        self.num_tokens = batch_size * max_len
        self.dense = False
        self.lengths = lengths
        device = lengths.device
        self.key_mask = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self._columns = torch.arange(max_len, device=device)  # [S]
        self._positions = self._columns.repeat(batch_size)  # [B*S]

    def refresh(self) -> None:
        """Key mask from ``lengths``, in place (device work only: capturable)."""
        torch.lt(self._columns[None, :], self.lengths[:, None], out=self.key_mask)

    @property
    def attention_mask(self) -> torch.Tensor:
        """``[B, 1, 1, S]`` bool key mask for SDPA."""
        return self.key_mask[:, None, None, :]

    def to_padded(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [B*S, F] -> [B, S, F]`` (a view)."""
        return x.view(self.batch_size, self.max_len, x.shape[-1])

    def to_packed(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [B, S, ...] -> [B*S, F]``."""
        return x.reshape(self.num_tokens, -1)

    def positions(self) -> torch.Tensor:
        """``[B*S]``: each cell's index inside its row."""
        return self._positions

    def segment_cumsum(self, x: torch.Tensor) -> torch.Tensor:
        """Inclusive cumulative sum of ``x: [B*S]`` along each row."""
        return torch.cumsum(x.view(self.batch_size, self.max_len), dim=1).view(-1)


def flatten_ids(batch: Sequence[Sequence[int]]) -> np.ndarray:
    """``[T]`` int64: the inputs' token ids end to end. Inputs may be lists of ints or
    integer numpy arrays (tokenizer worker processes send arrays: they cross the process
    boundary as one buffer each instead of one Python int per token)."""
    if batch and all(isinstance(ids, np.ndarray) for ids in batch):
        return np.concatenate(batch).astype(np.int64, copy=False)
    total = sum(len(ids) for ids in batch)
    return np.fromiter(itertools.chain.from_iterable(batch), np.int64, total)


def grid_positions(lengths: Sequence[int], max_len: int) -> np.ndarray:
    """``[T]``: the flat ``[B, max_len]`` grid cell of each of the inputs' tokens laid end
    to end (row ``b * max_len`` plus the token's index in its input)."""
    lens = np.asarray(lengths, dtype=np.int64)
    starts = np.cumsum(lens) - lens
    return np.arange(int(lens.sum())) + np.repeat(np.arange(len(lens)) * max_len - starts, lens)
