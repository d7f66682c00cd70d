"""Proposers by name: the one place a ``SpeculativeConfig.proposer`` becomes an object.

Each entry builds its proposer from the config, so adding a proposer is one entry here and
one module; nothing is registered as a side effect of importing a module.
"""

from __future__ import annotations

from collections.abc import Callable

from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.spec.ngram import NgramProposer
from jacana_engine.spec.proposer import Proposer
from jacana_engine.spec.suffix import SuffixProposer

ProposerFactory = Callable[[SpeculativeConfig], Proposer]

PROPOSERS: dict[str, ProposerFactory] = {
    "ngram": lambda c: NgramProposer(c.ngram_min, c.ngram_max),
    "suffix": lambda c: SuffixProposer(
        c.suffix_max_depth, c.suffix_min_prob, c.suffix_max_cached_requests
    ),
}


def proposer_names() -> tuple[str, ...]:
    """Every accepted ``proposer`` setting, "none" included."""
    return ("none", *PROPOSERS)


def create_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer ``config.proposer`` names; ``ValueError`` lists the known ones."""
    factory = PROPOSERS.get(config.proposer)
    if factory is None:
        raise ValueError(
            f"unknown speculative proposer {config.proposer!r}; known: {', '.join(PROPOSERS)}"
        )
    return factory(config)
