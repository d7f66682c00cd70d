"""The embeddings service core, independent of the transport: validate, tokenize, batch,
shape the output.

Validation happens before anything is queued, so a bad input never costs a forward
pass and never fails the other inputs of a batch. Tokenization runs off the event loop,
the texts of concurrent requests together (:class:`TokenizeQueue`), so the loop stays
free for I/O at high request rates; the forward pass runs on the batcher's worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from jacana_embeddings.batcher import DynamicBatcher
from jacana_embeddings.embedder import Embedder, ModelInfo
from jacana_embeddings.errors import InvalidRequestError, ModelNotFoundError
from jacana_embeddings.tokenize_queue import TokenizeQueue
from jacana_embeddings.tokenize_workers import encode_in_worker, start_tokenizer_workers

# Tokenizer calls at once: each spreads its texts over every core already; a second one
# overlaps the Python-side work of the first.
_TOKENIZE_THREADS = 2


@dataclass(frozen=True)
class EmbedResult:
    """Vectors ``[N, dimension]`` float32 in request order, with per-input token counts."""

    vectors: np.ndarray
    num_tokens: list[int]
    truncated: list[bool]

    @property
    def dimension(self) -> int:
        return self.vectors.shape[1]

    @property
    def prompt_tokens(self) -> int:
        return sum(self.num_tokens)


def resolve_dimensions(info: ModelInfo, dimensions: int | None) -> int | None:
    """The output size to cut vectors to, or None for the model's own.

    Raises :class:`InvalidRequestError` (param ``dimensions``) when the model cannot give
    that size: only Matryoshka models accept sizes below their own.
    """
    if dimensions is None or dimensions == info.dimension:
        return None
    if dimensions < 1 or dimensions > info.dimension:
        raise InvalidRequestError(
            f"dimensions must be between 1 and {info.dimension} for model {info.model_id}",
            "dimensions",
        )
    if not info.supports_matryoshka:
        raise InvalidRequestError(
            f"model {info.model_id} does not support 'dimensions' (it was not trained for "
            f"Matryoshka truncation); omit it or send {info.dimension}",
            "dimensions",
        )
    return dimensions


def shorten(vectors: np.ndarray, dimensions: int, renormalize: bool) -> np.ndarray:
    """Matryoshka truncation: keep the first ``dimensions`` values, rescale to unit norm."""
    out = np.ascontiguousarray(vectors[:, :dimensions])  # [N, dimensions]
    if renormalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out /= np.maximum(norms, 1e-12)
    return out


class EmbeddingService:
    """``await embed(...) -> EmbedResult`` for one loaded model behind one batcher."""

    def __init__(
        self,
        embedder: Embedder,
        batcher: DynamicBatcher,
        max_inputs: int,
        tokenizer_processes: int = 0,
    ) -> None:
        """``tokenizer_processes``: tokenize in that many worker processes
        (``tokenize_workers.py``, started here); 0 tokenizes on threads of this one."""
        self.embedder = embedder
        self.batcher = batcher
        self.info = embedder.info
        self.max_inputs = max_inputs
        if tokenizer_processes:
            tokenizer, n = embedder.tokenizer, tokenizer_processes
            self.tokenize_queue = TokenizeQueue(
                encode_in_worker,
                n,
                executor=start_tokenizer_workers(tokenizer, n),
                # a replacement must not stall the event loop on its spawns
                replace_executor=lambda: start_tokenizer_workers(tokenizer, n, False),
            )
        else:
            self.tokenize_queue = TokenizeQueue(
                embedder.tokenizer.encode_requests, _TOKENIZE_THREADS
            )

    async def close(self) -> None:
        """Stop batching and tokenizing; callers still waiting get an error."""
        await self.batcher.close()
        await self.tokenize_queue.close()

    async def embed(
        self,
        *,
        texts: Sequence[str] | None = None,
        token_ids: Sequence[Sequence[int]] | None = None,
        truncate: bool = False,
        dimensions: int | None = None,
        model: str = "",
    ) -> EmbedResult:
        """Embed either ``texts`` or ``token_ids`` (used as given, no special tokens added).

        Raises InvalidRequestError / ModelNotFoundError / OverloadedError.
        """
        if model and model != self.info.model_id:
            raise ModelNotFoundError(
                f"model {model!r} is not served here (this service serves {self.info.model_id!r})",
                "model",
            )
        if (texts is None) == (token_ids is None):
            raise InvalidRequestError("send either texts or token ids", "input")
        count = len(texts if texts is not None else token_ids)
        if count == 0:
            raise InvalidRequestError("input must not be empty", "input")
        if count > self.max_inputs:
            raise InvalidRequestError(
                f"at most {self.max_inputs} inputs per request (got {count})", "input"
            )
        out_dim = resolve_dimensions(self.info, dimensions)
        if texts is not None:
            encoded = await self.tokenize_queue.encode(texts, truncate)
        else:
            encoded = self._check_token_ids(token_ids, truncate)
        ids = [e[0] for e in encoded]
        vectors = await self.batcher.embed(ids)
        if out_dim is not None:
            vectors = shorten(vectors, out_dim, renormalize=self.info.normalized)
        return EmbedResult(vectors, [len(i) for i in ids], [e[1] for e in encoded])

    def _check_token_ids(
        self, inputs: Sequence[Sequence[int]], truncate: bool
    ) -> list[tuple[list[int], bool]]:
        limit, vocab = self.info.max_input_tokens, self.info.vocab_size
        out = []
        for i, ids in enumerate(inputs):
            if len(ids) == 0:
                raise InvalidRequestError(f"input[{i}] is an empty token list", "input")
            if max(ids) >= vocab or min(ids) < 0:
                raise InvalidRequestError(
                    f"input[{i}] has a token id outside this model's vocabulary (0..{vocab - 1})",
                    "input",
                )
            if len(ids) > limit and not truncate:
                raise InvalidRequestError(
                    f"input[{i}] has {len(ids)} tokens, more than this model's maximum of "
                    f"{limit}; shorten it or send truncate=true",
                    "input",
                )
            out.append((list(ids[:limit]), len(ids) > limit))
        return out
