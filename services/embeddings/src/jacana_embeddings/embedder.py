"""One loaded embedding model: tokenizer, encoder weights, pooling and heads.

Owns every tensor of the model (on ``config.device``). :meth:`Embedder.embed` is pure
compute over already-tokenized, length-checked inputs: it reads the weights and keeps
nothing between calls, so calls may run on several worker threads at once (the batcher's
``batches_in_flight``); :meth:`Embedder.tokenize` may run on any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from jacana_common.linear_backends import select_linear_backend
from jacana_embeddings.config import EmbedderConfig
from jacana_embeddings.encoder_graphs import EncoderGraphs
from jacana_embeddings.encoders import load_encoder
from jacana_embeddings.errors import ModelLoadError
from jacana_embeddings.heads import HEADS, Head, NormalizeHead
from jacana_embeddings.model_spec import read_pipeline
from jacana_embeddings.pooling import Pooling
from jacana_embeddings.tokenizer import TextTokenizer
from jacana_embeddings.varlen import PackedLayout, PaddedLayout, flatten_ids

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelInfo:
    """Static facts about the served model, as shown by GetModelInfo."""

    model_id: str
    architecture: str
    max_input_tokens: int
    dimension: int
    normalized: bool
    pooling: str
    matryoshka_dims: tuple[int, ...]
    vocab_size: int
    dtype: str
    device: str

    @property
    def supports_matryoshka(self) -> bool:
        return bool(self.matryoshka_dims)


class Embedder:
    """``embed(token id lists) -> float32 vectors [B, dimension]``."""

    def __init__(self, config: EmbedderConfig) -> None:
        spec = read_pipeline(config.model_dir)
        self.device = torch.device(config.device)
        dtype = _DTYPES[config.dtype]
        arch, self.encoder = load_encoder(spec.transformer_dir, dtype, self.device)
        try:
            self.encoder.dense = select_linear_backend(config.linear_backend, self.device, dtype)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        cfg = self.encoder.cfg
        self.pad_token_id = cfg.pad_token_id

        self.pooling = Pooling(config.pooling or spec.pooling_modes)
        self.heads: list[Head] = [
            HEADS[kind](folder).to(dtype, self.device) for kind, folder in spec.heads
        ]
        self._apply_normalize_override(config.normalize)
        dim = len(self.pooling.modes) * cfg.hidden_size
        for head in self.heads:
            dim = head.out_dim(dim)

        # The directory's own length is capped by the position table (as the reference
        # does); an explicit override beyond it is a configuration error.
        max_len = config.max_input_tokens or min(
            spec.max_seq_length or cfg.max_input_tokens, cfg.max_input_tokens
        )
        if max_len > cfg.max_input_tokens:
            raise ModelLoadError(
                f"max input tokens {max_len} exceeds the model's position table "
                f"({cfg.max_input_tokens})"
            )
        self.tokenizer = TextTokenizer(
            spec.transformer_dir / "tokenizer.json", max_len, lowercase=spec.do_lower_case
        )
        mdims = spec.matryoshka_dims if config.matryoshka_dims is None else config.matryoshka_dims
        if any(not 0 < d <= dim for d in mdims):
            raise ModelLoadError(f"Matryoshka dimensions {list(mdims)} must lie in 1..{dim}")
        self.info = ModelInfo(
            model_id=config.model_id,
            architecture=arch,
            max_input_tokens=max_len,
            dimension=dim,
            normalized=bool(self.heads) and self.heads[-1].normalizes,
            pooling=self.pooling.name,
            matryoshka_dims=tuple(sorted(set(mdims), reverse=True)),
            vocab_size=cfg.vocab_size,
            dtype=config.dtype,
            device=str(self.device),
        )
        self.graphs: EncoderGraphs | None = None
        self.graph_prepare_s = 0.0  # start-up time spent allocating (and capturing) them
        if config.graph_tokens > 0:
            self.graphs = EncoderGraphs(
                self._forward_padded,
                self.pad_token_id,
                self.device,
                max_len,
                config.graph_tokens,
            )
            self.graph_prepare_s = self.graphs.prepare()

    def _apply_normalize_override(self, normalize: bool | None) -> None:
        trailing = bool(self.heads) and self.heads[-1].normalizes
        if normalize is True and not trailing:
            self.heads.append(NormalizeHead())
        elif normalize is False and trailing:
            self.heads.pop()

    @property
    def linear_backend(self) -> str:
        """Name of the backend running the encoder's dense layers."""
        return self.encoder.dense.name

    def tokenize(self, texts: Sequence[str], truncate: bool) -> list[tuple[list[int], bool]]:
        """See :meth:`TextTokenizer.encode`."""
        return self.tokenizer.encode(texts, truncate)

    @torch.inference_mode()
    def embed(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """Vectors for non-empty, in-range token id lists; returns float32 ``[B, dimension]``.

        The inputs run packed (no padding in the token-wise layers); attention pads to the
        longest input of the batch, so callers still group inputs of similar length. With
        ``graph_tokens`` a batch that fits one of the padded grids runs there instead
        (:mod:`jacana_embeddings.encoder_graphs`; on a GPU, one graph replay).
        """
        if self.graphs is not None:
            vectors = self.graphs.run(batch)
            if vectors is not None:
                return vectors
        lengths = [len(ids) for ids in batch]
        input_ids = torch.from_numpy(flatten_ids(batch)).to(self.device)  # [T]
        return self._encode(input_ids, PackedLayout(lengths, self.device)).cpu().numpy()

    def _forward_padded(self, input_ids: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
        """The whole pass over a graph bucket's static tensors: ids [B*S] -> [B, D] float32."""
        layout.refresh()
        return self._encode(input_ids, layout)

    def _encode(self, input_ids: torch.Tensor, layout: PackedLayout | PaddedLayout) -> torch.Tensor:
        """Encoder, pooling and heads over one layout's tokens: ids [T] -> [B, D] float32."""
        hidden = self.encoder.forward_packed(input_ids, layout)  # [T, H]
        x = self.pooling(layout.to_padded(hidden), layout.key_mask)  # [B, P*H]
        for head in self.heads:
            x = head(x)  # [B, D]
        return x.float()
