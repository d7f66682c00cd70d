"""The decoder state of every row being decoded, across windows, stepped together.

A *window* is one 30 s encoder output being decoded; its *rows* are its hypotheses (one for
greedy decoding, the beams of a beam search, the samples of best-of-n). ``DecoderBatch``
owns, on the model's device:

- ``self_k`` / ``self_v``: [layers, rows, heads, capacity, head_dim], each row's
  self-attention keys/values, valid up to that row's length (its own position: windows'
  prompts differ in length, so rows sit at different positions);
- per window, ``cross_k`` / ``cross_v``: [layers, 1, heads, n_audio_ctx, head_dim], computed
  once from its encoder output and shared by all of its rows (beams do not copy the audio).

Invariants: a window's rows are contiguous, in the order windows were added; a row's slots
past its length hold stale values that attention masks out; the capacity grows on demand up
to the model's n_text_ctx. One thread owns a batch (a solo decode, or the decode loop of
``batching.py``); nothing here is thread-safe.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from jacana_asr.whisper_model import WhisperModel, _DecoderLayer

_CAPACITY_STEP = 64  # positions added when a row outgrows the self-attention buffer


@dataclass
class _Window:
    key: Hashable
    rows: int
    cross_k: torch.Tensor  # [layers, 1, heads, n_audio_ctx, head_dim]
    cross_v: torch.Tensor


class DecoderBatch:
    """Rows of several windows, advanced one token per row per ``step``."""

    def __init__(self, model: WhisperModel) -> None:
        self.model = model
        cfg = model.config
        self._heads = cfg.n_decoder_heads
        self._head_dim = cfg.d_model // cfg.n_decoder_heads
        self._layers = cfg.n_decoder_layers
        self._windows: list[_Window] = []
        self._lengths: list[int] = []  # per row: positions already in the cache
        self.self_k = self._empty(0, 0)
        self.self_v = self._empty(0, 0)

    @property
    def rows(self) -> int:
        return len(self._lengths)

    def span(self, key: Hashable) -> tuple[int, int]:
        """[start, stop) of the window's rows."""
        start = 0
        for window in self._windows:
            if window.key == key:
                return start, start + window.rows
            start += window.rows
        raise KeyError(key)

    def keys(self) -> list[Hashable]:
        return [w.key for w in self._windows]

    @torch.inference_mode()
    def add(
        self,
        key: Hashable,
        audio: torch.Tensor,
        context: Sequence[int],
        rows: int,
        logits_at: int | None = None,
    ) -> torch.Tensor | None:
        """Add a window: ``rows`` copies of the decoder state after ``context``.

        audio: encoder output [1, n_audio_ctx, d_model]. context: the prompt tokens fed
        before the first step (may be empty). Returns the raw logits [vocab] at position
        ``logits_at`` of the context (None when not asked).
        """
        if any(w.key == key for w in self._windows):
            raise ValueError(f"window {key!r} is already in the batch")
        if rows < 1:
            raise ValueError("a window needs at least one row")
        layers = self.model.decoder.layers
        cross = [layer.cross_keys_values(audio.to(self.model.device)) for layer in layers]
        window = _Window(
            key,
            rows,
            torch.stack([k for k, _ in cross]),
            torch.stack([v for _, v in cross]),
        )
        n = len(context)
        self_k, self_v = self._empty(1, n), self._empty(1, n)
        logits = None
        if n:
            tokens = torch.tensor([list(context)], device=self.model.device)
            hidden = _forward(self.model, tokens, [0], self_k, self_v, [window], [(0, 1)])
            if logits_at is not None:
                logits = self._logits(hidden[0, logits_at])
        self._append(window, self_k, self_v, [n] * rows)
        return logits

    @torch.inference_mode()
    def step(self, inputs: Sequence[int]) -> torch.Tensor:
        """inputs: one token per row, in row order -> logits [rows, vocab] (float32)."""
        if len(inputs) != self.rows:
            raise ValueError(f"{len(inputs)} inputs for {self.rows} rows")
        self._reserve(max(self._lengths) + 1)
        tokens = torch.tensor(list(inputs), device=self.model.device)[:, None]  # [rows, 1]
        hidden = _forward(
            self.model,
            tokens,
            self._lengths,
            self.self_k,
            self.self_v,
            self._windows,
            self._spans(),
        )
        self._lengths = [n + 1 for n in self._lengths]
        return self._logits(hidden[:, 0])

    @torch.inference_mode()
    def continue_rows(self, key: Hashable, sources: Sequence[int]) -> None:
        """The window's next rows continue its rows ``sources`` (window-relative): a beam
        reorder, rows that ended dropped, or one row expanded into several."""
        start, stop = self.span(key)
        if list(sources) == list(range(stop - start)):
            return
        if not sources:
            self.remove(key)
            return
        window = next(w for w in self._windows if w.key == key)
        if len(sources) == stop - start:  # same rows, some overwritten: copy only those
            moved = [(start + i, start + s) for i, s in enumerate(sources) if s != i]
            dst = torch.tensor([d for d, _ in moved], device=self.model.device)
            src = torch.tensor([s for _, s in moved], device=self.model.device)
            used = max(self._lengths[start:stop])
            self.self_k[:, dst, :, :used] = self.self_k[:, src, :, :used]
            self.self_v[:, dst, :, :used] = self.self_v[:, src, :, :used]
            for d, s in moved:
                self._lengths[d] = self._lengths[s]
            return
        order = [*range(start), *(start + s for s in sources), *range(stop, self.rows)]
        window.rows = len(sources)
        self._select(order)

    @torch.inference_mode()
    def remove(self, key: Hashable) -> None:
        start, stop = self.span(key)
        self._windows = [w for w in self._windows if w.key != key]
        self._select([*range(start), *range(stop, self.rows)])

    # -- storage --------------------------------------------------------------------

    def _empty(self, rows: int, capacity: int) -> torch.Tensor:
        shape = (self._layers, rows, self._heads, capacity, self._head_dim)
        # zeros, not empty: masked slots are multiplied by 0 and must not hold NaN
        return torch.zeros(shape, device=self.model.device, dtype=self.model.dtype)

    def _reserve(self, positions: int) -> None:
        capacity = self.self_k.shape[3]
        if positions <= capacity:
            return
        limit = self.model.config.n_text_ctx
        if positions > limit:
            raise ValueError(f"decoder context is {limit} tokens; asked {positions}")
        grown = min(limit, max(positions, capacity + _CAPACITY_STEP))
        self.self_k = _pad_capacity(self.self_k, grown)
        self.self_v = _pad_capacity(self.self_v, grown)

    def _append(self, window: _Window, k: torch.Tensor, v: torch.Tensor, lengths) -> None:
        # k, v: [layers, 1, heads, positions, head_dim], copied into each of the new rows
        capacity = max(self.self_k.shape[3], k.shape[3])
        k = k.expand(-1, len(lengths), -1, -1, -1)
        v = v.expand(-1, len(lengths), -1, -1, -1)
        self.self_k = torch.cat(
            [_pad_capacity(self.self_k, capacity), _pad_capacity(k, capacity)], dim=1
        )
        self.self_v = torch.cat(
            [_pad_capacity(self.self_v, capacity), _pad_capacity(v, capacity)], dim=1
        )
        self._windows.append(window)
        self._lengths.extend(lengths)

    def _select(self, order: list[int]) -> None:
        used = max((self._lengths[i] for i in order), default=0)
        index = torch.tensor(order, dtype=torch.long, device=self.model.device)
        self.self_k = self.self_k[:, :, :, :used].index_select(1, index)
        self.self_v = self.self_v[:, :, :, :used].index_select(1, index)
        self._lengths = [self._lengths[i] for i in order]

    def _spans(self) -> list[tuple[int, int]]:
        spans, start = [], 0
        for window in self._windows:
            spans.append((start, start + window.rows))
            start += window.rows
        return spans

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        decoder = self.model.decoder
        return (decoder.norm(hidden) @ decoder.projection.T).float()


def _pad_capacity(x: torch.Tensor, capacity: int) -> torch.Tensor:
    # x: [layers, rows, heads, positions, head_dim] -> positions == capacity (zeros added)
    missing = capacity - x.shape[3]
    return F.pad(x, (0, 0, 0, missing)) if missing > 0 else x


def _forward(
    model: WhisperModel,
    tokens: torch.Tensor,
    lengths: Sequence[int],
    self_k: torch.Tensor,
    self_v: torch.Tensor,
    windows: Sequence[_Window],
    spans: Sequence[tuple[int, int]],
) -> torch.Tensor:
    """tokens: [rows, new] at positions lengths[row]... -> hidden [rows, new, d_model].

    Writes the new keys/values into self_k / self_v (which must have room for them).
    """
    decoder = model.decoder
    rows, new = tokens.shape
    device = tokens.device
    start = torch.tensor(list(lengths), device=device)[:, None]  # [rows, 1]
    positions = start + torch.arange(new, device=device)[None, :]  # [rows, new]
    end = max(lengths) + new
    # mask[row, 0, q, key]: a query sees its own row's keys up to its own position
    keys = torch.arange(end, device=device)
    mask = (keys[None, None, :] <= positions[:, :, None])[:, None]  # [rows, 1, new, end]
    row_index = torch.arange(rows, device=device)[:, None]  # [rows, 1]
    x = decoder.embeddings[tokens] + decoder.positions[positions]  # [rows, new, d_model]
    for index, layer in enumerate(decoder.layers):
        x = _layer(layer, x, index, self_k, self_v, row_index, positions, end, mask, windows, spans)
    return x


def _layer(
    layer: _DecoderLayer,
    x: torch.Tensor,
    index: int,
    self_k: torch.Tensor,
    self_v: torch.Tensor,
    row_index: torch.Tensor,
    positions: torch.Tensor,
    end: int,
    mask: torch.Tensor,
    windows: Sequence[_Window],
    spans: Sequence[tuple[int, int]],
) -> torch.Tensor:
    # x: [rows, new, d_model]
    heads = layer.n_heads
    q, k, v = layer.self_qkv(layer.self_norm(x)).chunk(3, dim=-1)
    rows, new, d_model = q.shape
    head_dim = d_model // heads
    # [rows, new, d_model] -> [rows, new, heads, head_dim]: the layout of self_k[i][row, :, pos]
    self_k[index][row_index, :, positions] = k.view(rows, new, heads, head_dim)
    self_v[index][row_index, :, positions] = v.view(rows, new, heads, head_dim)
    q = q.view(rows, new, heads, head_dim).transpose(1, 2)  # [rows, heads, new, head_dim]
    attended = F.scaled_dot_product_attention(
        q, self_k[index, :, :, :end], self_v[index, :, :, :end], attn_mask=mask
    )
    x = x + layer.self_out(attended.transpose(1, 2).reshape(rows, new, d_model))

    # Cross-attention, one window at a time: its rows' queries become one query sequence
    # against the window's single copy of the audio keys/values.
    q = layer.cross_q(layer.cross_norm(x)).view(rows, new, heads, head_dim)
    outputs = []
    for window, (start, stop) in zip(windows, spans, strict=True):
        n = stop - start
        qw = q[start:stop].permute(2, 0, 1, 3).reshape(1, heads, n * new, head_dim)
        out = F.scaled_dot_product_attention(qw, window.cross_k[index], window.cross_v[index])
        outputs.append(out.reshape(heads, n, new, head_dim).permute(1, 2, 0, 3))
    attended = torch.cat(outputs) if len(outputs) > 1 else outputs[0]  # [rows, new, heads, hd]
    x = x + layer.cross_out(attended.reshape(rows, new, d_model))
    return layer.ffn(x)
