"""Start-up warm-up: serve a few dummy requests so serving never compiles a kernel.

Triton compiles a kernel once per specialization (its constexprs, the dtypes of its
tensors, and the 1 / multiple-of-16 / 16-byte-alignment of its other arguments). Graph
capture compiles the decode steps' and the prefill graphs' kernels, but several
variants only run on traffic: the sampling kernel with and without its top-k/top-p/min-p
threshold, torch's sort and top-k over several rows (CUDA loads their kernels on first use,
46 ms in one served step), the argmax over float32 logits (a prefill's first token), and
eager prefill attention (steps no prefill graph holds, or graphs off) at each query-block
size ``choose_block_m`` picks. The first step that meets one stalls for the compile
(0.5-1.5 s on an H200's host) with its whole batch behind it;
``research/compile_stability_gpu.py`` checks that serving compiles nothing after warm-up.

``WARM_UP_GROUPS`` names each group of requests and what it reaches; each group runs alone
to completion (so a batch never mixes the paths it is meant to separate). The engine calls
:func:`warm_up` before it reports ready and then resets its bookkeeping, so the dummy
requests leave no trace in counters, the prefix cache or the request seed source.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from jacana_engine.sample.params import SamplingParams

log = logging.getLogger(__name__)

_SHORT_PROMPT = 8  # tokens: one block, a small prefill grid
_NEW_TOKENS = 3  # a prefill step, then decode steps (overlapped ones included)
_MANY_SEQS = 16  # sequences in the large-grid prefill step
_LONG_PROMPT = 1024  # tokens of that step's longest prompt, where the budget allows


@dataclass(frozen=True)
class WarmUpLimits:
    """What bounds the dummy requests: the engine's own limits."""

    vocab_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_request_tokens: int  # prompt + output of one request


Requests = list[tuple[list[int], SamplingParams]]


def _prompt(length: int, salt: int, vocab: int) -> list[int]:
    """Deterministic token ids, distinct per ``salt`` (no prefix-cache hits between groups)."""
    return [(salt * 7919 + i * 104729) % vocab for i in range(length)]


def _params(**sampling) -> SamplingParams:
    """A dummy request's parameters: ``_NEW_TOKENS`` tokens, seeded, EOS ignored."""
    return SamplingParams(max_tokens=_NEW_TOKENS, seed=0, ignore_eos=True, **sampling)


def _single(**sampling) -> Callable[[WarmUpLimits, int], Requests]:
    """A group of one short prompt sampled with ``sampling``."""

    def build(limits: WarmUpLimits, salt: int) -> Requests:
        return [(_prompt(_SHORT_PROMPT, salt, limits.vocab_size), _params(**sampling))]

    return build


def _several(count: int, **sampling) -> Callable[[WarmUpLimits, int], Requests]:
    """A group of ``count`` short prompts (fewer where ``max_num_seqs`` is smaller, none
    below two) sampled alike with ``sampling``, prefilled in one step: prefill attention
    of several sequences, and the sampler's torch operators over several rows (their CUDA
    kernels differ from one row's and load on first use)."""

    def build(limits: WarmUpLimits, salt: int) -> Requests:
        n = min(count, limits.max_num_seqs)
        if n < 2:
            return []
        vocab = limits.vocab_size
        return [
            (_prompt(_SHORT_PROMPT, salt * 100 + i, vocab), _params(**sampling)) for i in range(n)
        ]

    return build


def _many_with_a_long_one(limits: WarmUpLimits, salt: int) -> Requests:
    """One step of many prompts, one of them long: a prefill grid of many programs."""
    count = min(limits.max_num_seqs, _MANY_SEQS)
    room = limits.max_num_batched_tokens - (count - 1) * _SHORT_PROMPT
    long = min(_LONG_PROMPT, room, limits.max_request_tokens - _NEW_TOKENS)
    if count < 2 or long <= _SHORT_PROMPT:
        return []
    lengths = [long] + [_SHORT_PROMPT] * (count - 1)
    vocab = limits.vocab_size
    return [
        (_prompt(n, salt * count + i, vocab), _params(temperature=0.0))
        for i, n in enumerate(lengths)
    ]


# top-k, top-p and min-p at once: the sampler's threshold path
_FILTERED = dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05)

# (name, what it reaches, the requests); each group runs alone, in this order.
WARM_UP_GROUPS: tuple[tuple[str, str, Callable[[WarmUpLimits, int], Requests]], ...] = (
    ("greedy", "argmax of float32 prefill logits, in-graph argmax", _single(temperature=0.0)),
    ("plain draw", "sampling kernel without a threshold", _single(temperature=1.0)),
    (
        "filtered draw",
        "sampling kernel with the top-k/top-p/min-p threshold",
        _single(**_FILTERED),
    ),
    (
        "filtered draws",
        "the filters' sort and top-k over several rows (a first use loaded 46 ms of CUDA "
        "modules in a served step)",
        _several(3, **_FILTERED),
    ),
    (
        "processed draw",
        "penalties and logprobs (the full sampler)",
        _single(temperature=1.0, repetition_penalty=1.1, presence_penalty=0.5, logprobs=2),
    ),
    (
        "two prompts",
        "prefill attention of two sequences, small grid",
        _several(2, temperature=0.0),
    ),
    ("many prompts", "prefill attention of many sequences, large grid", _many_with_a_long_one),
)


def warm_up_requests(limits: WarmUpLimits) -> list[tuple[str, Requests]]:
    """The groups to run for these limits (a group the limits cannot hold is left out)."""
    groups = []
    for salt, (name, _, build) in enumerate(WARM_UP_GROUPS):
        requests = [
            (p, sp)
            for p, sp in build(limits, salt)
            if len(p) + _NEW_TOKENS <= limits.max_request_tokens
        ]
        if requests:
            groups.append((name, requests))
    return groups


def warm_up_prompt_groups(limits: WarmUpLimits) -> list[list[list[int]]]:
    """The prompts of the groups whose prompt shapes differ (the sampling groups share
    one): what a draft model, which only runs forwards, needs to see."""
    seen: set[tuple[int, ...]] = set()
    groups = []
    for _, requests in warm_up_requests(limits):
        shape = tuple(len(p) for p, _ in requests)
        if shape not in seen:
            seen.add(shape)
            groups.append([p for p, _ in requests])
    return groups


def warm_up(
    generate: Callable[[list[list[int]], list[SamplingParams]], object], limits: WarmUpLimits
) -> float:
    """Run every group through ``generate`` (an idle engine's ``generate``); returns the
    wall seconds it took."""
    started = time.perf_counter()
    for name, requests in warm_up_requests(limits):
        t0 = time.perf_counter()
        generate([p for p, _ in requests], [sp for _, sp in requests])
        log.debug("warm-up %s: %.2fs", name, time.perf_counter() - t0)
    return time.perf_counter() - started
