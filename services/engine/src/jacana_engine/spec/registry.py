"""Proposers and transports by name: the one place a ``SpeculativeConfig`` becomes a
:class:`Proposer`.

Each entry builds its object from the config, so adding a proposer (or a transport) is one
entry here and one module; nothing is registered as a side effect of importing a module.
The remote transport wraps the proposer the drafter service runs under the same name.
"""

from __future__ import annotations

from collections.abc import Callable

from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.spec.ngram import NgramProposer
from jacana_engine.spec.proposer import Proposer
from jacana_engine.spec.suffix import SuffixProposer

ProposerFactory = Callable[[SpeculativeConfig], Proposer]


def _draft_model(c: SpeculativeConfig) -> Proposer:
    from jacana_engine.config import EngineConfig  # imported here: config embeds ours
    from jacana_engine.loader import load_model
    from jacana_engine.spec.draft_model import DraftModelProposer

    if not c.draft_model:
        raise ValueError("the draft_model proposer needs a draft model path (draft_model)")
    config = EngineConfig(model=c.draft_model, dtype=c.draft_dtype, device=c.draft_device)
    return DraftModelProposer(
        load_model(config), c.draft_num_kv_blocks, max_draft=c.num_speculative_tokens
    )


PROPOSERS: dict[str, ProposerFactory] = {
    "ngram": lambda c: NgramProposer(c.ngram_min, c.ngram_max),
    "suffix": lambda c: SuffixProposer(
        c.suffix_max_depth, c.suffix_min_prob, c.suffix_max_cached_requests
    ),
    "draft_model": _draft_model,
}


def proposer_names() -> tuple[str, ...]:
    """Every accepted ``proposer`` setting, "none" included."""
    return ("none", *PROPOSERS)


def create_local_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer ``config.proposer`` names, in this process; ``ValueError`` lists the
    known ones."""
    factory = PROPOSERS.get(config.proposer)
    if factory is None:
        raise ValueError(
            f"unknown speculative proposer {config.proposer!r}; known: {', '.join(PROPOSERS)}"
        )
    return factory(config)


def _remote(config: SpeculativeConfig) -> Proposer:
    from jacana_engine.spec.remote import RemoteProposer  # grpc only when asked for

    if config.proposer not in PROPOSERS:  # the name must be one the drafter can run
        raise ValueError(
            f"unknown speculative proposer {config.proposer!r}; known: {', '.join(PROPOSERS)}"
        )
    return RemoteProposer(
        config.drafter_address,
        config.proposer,
        deadline_s=config.drafter_deadline_s,
        retry_interval_s=config.drafter_retry_s,
    )


TRANSPORTS: dict[str, ProposerFactory] = {"inprocess": create_local_proposer, "remote": _remote}


def create_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer for ``config`` behind its transport."""
    factory = TRANSPORTS.get(config.transport)
    if factory is None:
        raise ValueError(
            f"unknown speculative transport {config.transport!r}; known: {', '.join(TRANSPORTS)}"
        )
    return factory(config)
