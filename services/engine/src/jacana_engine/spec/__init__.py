"""Speculative decoding: proposers (n-gram, suffix) behind one interface and a registry,
verification rules as pure functions, and the engine-side :class:`Speculator`.

Modules: ``config`` (SpeculativeConfig) · ``proposer`` (the interface) · ``ngram`` ·
``suffix`` · ``registry`` · ``verify`` (greedy acceptance, rejection sampling) ·
``acceptance`` (dynamic k, counters) · ``speculator`` (draft / verify / commit around a step).
"""
