"""A sampled token's effect on its request: stop rules and the released text.

Pure with respect to the engine: :func:`apply_token` reads and extends one
:class:`Sequence` (its output ids, its detokenizer) and reports whether the request is
done; counting, freeing blocks and the scheduler's bookkeeping stay with the caller
(``LLMEngine._append_token``).
"""

from __future__ import annotations

from collections.abc import Set

from jacana_engine.core.outputs import FinishReason, RequestOutput, TokenLogprob
from jacana_engine.core.sequence import Sequence


def apply_token(
    seq: Sequence,
    token_id: int,
    logprob: TokenLogprob | None,
    eos_token_ids: Set[int],
    first: bool,
) -> RequestOutput:
    """Add ``token_id`` to ``seq`` unless it stops the request, then build the step's delta.

    A stop token id or EOS (unless ``ignore_eos``) ends the request and is not appended; a
    stop string ends it on the token that completes it; ``max_tokens`` ends it with
    ``length``. On the last token the detokenizer releases the text it held back as a
    possible stop-string start. ``first``: this is the request's first output (it carries
    the prompt logprobs). ``seq.matched_stop`` is set when the request finishes.
    """
    sp = seq.sampling_params
    detok = seq.detokenizer
    new_ids: list[int] = []
    text = ""
    reason: FinishReason | None = None
    matched: str | int | None = None
    if token_id in sp.stop_token_ids or (not sp.ignore_eos and token_id in eos_token_ids):
        reason, matched = FinishReason.STOP, token_id
    else:
        seq.output_token_ids.append(token_id)
        new_ids.append(token_id)
        if detok is not None:
            text, stop = detok.push(token_id)
            if stop is not None:
                reason, matched = FinishReason.STOP, stop
        if reason is None and seq.num_output_tokens >= seq.max_tokens:
            reason = FinishReason.LENGTH
    if reason is not None:
        if detok is not None:  # release text held back as a possible stop string start
            tail = detok.flush()
            text += tail.text
            if tail.stop is not None:
                reason, matched = FinishReason.STOP, tail.stop
        seq.matched_stop = matched
    return RequestOutput(
        request_id=seq.request_id,
        new_token_ids=new_ids,
        new_text=text,
        finished=reason is not None,
        finish_reason=reason,
        num_prompt_tokens=seq.num_prompt_tokens,
        num_output_tokens=seq.num_output_tokens,
        num_cached_tokens=seq.num_cached_tokens,
        matched_stop=matched,
        logprobs=None if sp.logprobs is None else [logprob] if new_ids and logprob else [],
        prompt_logprobs=seq.prompt_logprobs if first and sp.prompt_logprobs is not None else None,
    )
