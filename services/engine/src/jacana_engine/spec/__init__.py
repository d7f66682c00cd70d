"""Speculative decoding: proposers behind one interface and a registry, verification rules
as pure functions, and the engine-side :class:`~jacana_engine.spec.speculator.Speculator`.

Modules: ``config`` (SpeculativeConfig) · ``proposer`` (the interface) · ``ngram`` ·
``suffix`` · ``draft_model`` · ``registry`` (proposers and transports by name) ·
``remote`` (the drafter service's stream as a proposer) · ``verify`` (greedy acceptance,
rejection sampling) · ``acceptance`` (dynamic k, counters) · ``speculator`` (draft /
verify / commit around an engine step).
"""
