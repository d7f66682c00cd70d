"""One-row decode GEMM picks timed inside the batch-1 decode graph.

``decode_gemm.tune_decode_gemms`` times each weight shape's candidate launch configs as a
chain of that shape's GEMVs, one a layer: there each GEMV follows another GEMV. In a
decode step each follows a small kernel (an RMSNorm, decode attention) or another
shape's GEMV, and a dependent launch's early tiles fill that kernel's latency
differently. On an H200 the chain picked a Qwen3-8B batch-1 graph of 3.90 ms where the
graph itself preferred configs worth 3.86 ms.

:func:`tune_one_row_in_graph` therefore times what a step takes: for each weight shape,
in the order the forward meets them, every one-row candidate (and cuBLAS) is set on all
layers of that shape and a batch-1 graph is captured afresh and timed (the caller's
``graph_seconds``). Coordinate descent: a shape's best is kept while the next is
searched. Batch 1 only: it is the latency-bound case, and larger batches keep the
chain's picks.

Those timings are short and the card is cool. Served without pause, a batch-1 decode
draws an H200 to its 700 W power cap within about half a second and its SM clock falls
to 1,480-1,900 MHz (``research/b1_band.py`` measures it); what a choice costs in
energy then costs time. A narrow tile reads x again in every program (BLOCK_N rows a
program: x once per BLOCK_N weight rows) and draws more power for the same bytes of
weight. So with a ``sustained_seconds`` timer the search's best is set against its lean
twin (:func:`lean_assignment`: each group on its fastest choice of at least
``LEAN_BLOCK_N`` rows a tile, within ``LEAN_TOLERANCE`` of the best), each replayed back
to back long enough for the card to settle, and the one faster under that load is kept
(:func:`sustained_choice`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from jacana_engine.layers.linear import Linear

if TYPE_CHECKING:
    from jacana_engine.kernels.skinny_gemm import SkinnyConfig
    from jacana_engine.tuning.cache import TuningCache

log = logging.getLogger(__name__)

CUBLAS = None  # the choice "no skinny config at one row": the layer runs on cuBLAS
# Choices a screened search times in full, per group. The best few of a group lie within
# 0.1-0.4% of each other in the graph (Qwen3-8B, H200), a screen's noise is of that
# order, so its three fastest go on to the full timing.
FINALISTS = 3
LEAN_BLOCK_N = 8  # rows a tile at least: x is read again for at most 1/8 of the weight
LEAN_TOLERANCE = 0.01  # a lean choice competes within 1% of its group's best graph time
SUSTAINED_ROUNDS = 2  # the best and its lean twin each timed under load this many times, in turn


def shape_groups(model: nn.Module, exclude: tuple[nn.Module, ...] = ()) -> dict[str, list[Linear]]:
    """The model's ``Linear`` layers grouped by weight shape (and gated input), in the
    order the forward meets them: {label: [layers]}, labels as ``describe_decode_gemms``
    writes them. ``exclude``: layers left out (the lm_head, for a graph of the forward
    alone)."""
    groups: dict[str, list[Linear]] = {}
    for module in model.modules():
        if isinstance(module, Linear) and not any(module is e for e in exclude):
            n, k = module.weight.shape
            groups.setdefault(f"{n}x{k}{' gated' if module.gated_input else ''}", []).append(module)
    return groups


def descend(
    choices: Mapping[str, list[Any]],
    start: Mapping[str, Any],
    time_of: Callable[[dict[str, Any]], float],
    screen_of: Callable[[dict[str, Any]], float] | None = None,
    finalists: int = FINALISTS,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Coordinate descent: for each group in ``choices``' order, time every choice with
    the other groups at their current best (``start`` at first) and keep the fastest.
    With ``screen_of`` (a quicker, noisier timing) every choice is screened with it and
    only the ``finalists`` fastest are timed with ``time_of``. Returns (the best
    assignment, one row per timing: group, choice, seconds, stage "screen" or "final")."""
    best = dict(start)
    rows = []

    def timings(
        group: str, options: list[Any], timer: Callable, stage: str
    ) -> list[tuple[float, Any]]:
        """(seconds, option) of each of ``group``'s ``options``, fastest first."""
        timed = []
        for option in options:
            seconds = timer({**best, group: option})
            timed.append((seconds, option))
            rows.append({"group": group, "choice": option, "seconds": seconds, "stage": stage})
        return sorted(timed, key=lambda t: t[0])

    for group, options in choices.items():
        if screen_of is not None and len(options) > finalists:
            screened = timings(group, options, screen_of, "screen")
            options = [option for _, option in screened[:finalists]]
        best[group] = timings(group, options, time_of, "final")[0][1]
    return best, rows


def apply_one_row(groups: Mapping[str, list[Linear]], assignment: Mapping[str, Any]) -> None:
    """Set each group's one-row choice (a config, or ``CUBLAS``) on all its layers; other
    row counts keep theirs."""
    for group, layers in groups.items():
        choice = assignment[group]
        for layer in layers:
            configs = {m: c for m, c in layer.skinny_configs.items() if m != 1}
            if choice is not CUBLAS:
                configs[1] = choice
            layer.skinny_configs = configs


def one_row_choices(groups: Mapping[str, list[Linear]], pdl: bool) -> dict[str, list[Any]]:
    """Per group what the search tries: cuBLAS, then the kernel's one-row candidates
    (only the dependent launches where ``pdl``: a plain launch breaks the chain), for a
    group of gated MLPs' gate_up (``Linear.gated_output``) the activating ones too: only
    the graph can weigh them, since what they save is the down projection's work."""
    from jacana_engine.kernels.skinny_gemm import candidate_configs

    choices = {}
    for group, layers in groups.items():
        n, k = layers[0].weight.shape
        activating = all(layer.gated_output for layer in layers)
        every = candidate_configs(1, n, k, pdl=pdl, folded=True, activating=activating)
        choices[group] = [CUBLAS, *([c for c in every if c.pdl] or every)]
    return choices


@dataclass
class InGraphSearch:
    """What :func:`search_one_row` found: the chain's picks (``start``) and the best
    assignment, each with its graph time, and every timing of the descent."""

    start: dict[str, Any]
    best: dict[str, Any]
    start_seconds: float
    best_seconds: float
    rows: list[dict[str, Any]]


def search_one_row(
    groups: Mapping[str, list[Linear]],
    graph_seconds: Callable[[], float],
    *,
    pdl: bool,
    screen_seconds: Callable[[], float] | None = None,
) -> InGraphSearch:
    """Coordinate descent over ``groups``' one-row choices, from the picks the layers
    hold, timing each assignment with ``graph_seconds()`` (which captures a fresh batch-1
    graph as the layers stand); with ``screen_seconds`` (the same, fewer replays) every
    choice is screened and a group's ``FINALISTS`` fastest timed in full. A choice that
    fails to capture or run is skipped. The layers are left with the last assignment
    timed (the best)."""
    start = {g: layers[0].skinny_configs.get(1, CUBLAS) for g, layers in groups.items()}

    def timer(seconds_of: Callable[[], float]) -> Callable[[dict[str, Any]], float]:
        def time_of(assignment: dict[str, Any]) -> float:
            apply_one_row(groups, assignment)
            try:
                return seconds_of()
            except Exception as exc:  # a candidate that fails to compile, capture or launch
                log.warning("in-graph choice skipped: %s: %s", type(exc).__name__, exc)
                return float("inf")

        return time_of

    time_of = timer(graph_seconds)
    screen_of = timer(screen_seconds) if screen_seconds is not None else None
    start_seconds = time_of(start)
    best, rows = descend(one_row_choices(groups, pdl), start, time_of, screen_of)
    return InGraphSearch(start, best, start_seconds, time_of(best), rows)


def lean_assignment(
    best: Mapping[str, Any],
    rows: list[dict[str, Any]],
    *,
    min_block_n: int = LEAN_BLOCK_N,
    tolerance: float = LEAN_TOLERANCE,
) -> dict[str, Any]:
    """``best`` with each group whose skinny choice has fewer than ``min_block_n`` rows a
    tile moved to the fastest of its timed choices (``rows``, the descent's; a choice's
    last timing counts) that has at least that many, if one timed within ``tolerance`` of
    the group's best; other groups, and cuBLAS, as they are."""
    last: dict[tuple[str, Any], float] = {}
    for row in rows:  # a full timing after a screen replaces the screen's
        last[(row["group"], row["choice"])] = row["seconds"]
    lean = dict(best)
    for group, choice in best.items():
        if choice is CUBLAS or choice.block_n >= min_block_n:
            continue
        timed = {c: s for (g, c), s in last.items() if g == group}
        limit = timed.get(choice, min(timed.values(), default=0.0)) * (1 + tolerance)
        wide = [
            (s, i, c)
            for i, (c, s) in enumerate(timed.items())
            if c is not CUBLAS and c.block_n >= min_block_n and s <= limit
        ]
        if wide:
            lean[group] = min(wide)[2]
    return lean


def sustained_choice(
    groups: Mapping[str, list[Linear]],
    best: dict[str, Any],
    lean: dict[str, Any],
    sustained_seconds: Callable[[], float],
    rounds: int = SUSTAINED_ROUNDS,
) -> dict[str, Any]:
    """``lean`` if it runs faster than ``best`` under sustained load, else ``best``: each
    set on the layers and timed with ``sustained_seconds`` (a graph replayed back to back
    until the card settles), in turn, ``rounds`` times; the lower mean wins. ``best``
    where they are the same or a timing fails."""
    if lean == best:
        return best
    times: dict[str, list[float]] = {"best": [], "lean": []}
    for _ in range(rounds):
        for name, assignment in (("best", best), ("lean", lean)):
            apply_one_row(groups, assignment)
            try:
                times[name].append(sustained_seconds())
            except Exception as exc:  # no graph to time: keep what the search found
                log.warning("sustained timing skipped: %s: %s", type(exc).__name__, exc)
                return best
    best_s, lean_s = (sum(t) / len(t) for t in times.values())
    log.info(
        "batch-1 graph under sustained load: %.3f ms with the search's best, %.3f ms with "
        "its lean twin (%s)",
        1e3 * best_s,
        1e3 * lean_s,
        _labels({g: c for g, c in lean.items() if c != best[g]}),
    )
    return lean if lean_s < best_s else best


def tune_one_row_in_graph(
    model: nn.Module,
    graph_seconds: Callable[[], float],
    *,
    pdl: bool,
    exclude: tuple[nn.Module, ...] = (),
    cache: TuningCache | None = None,
    screen_seconds: Callable[[], float] | None = None,
    sustained_seconds: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Search every shape's one-row choice in the graph (module docstring; screened with
    ``screen_seconds`` where given) and leave the best set on the layers, or the chain's
    picks unless the best's second timing beats theirs (noise, or no graph that could
    run); with ``sustained_seconds``, that best or its lean twin, whichever is faster
    under sustained load (:func:`sustained_choice`). Returns the choice per group. With
    a ``cache`` the answer is kept per group, keyed by the whole graph's shapes, and read
    back next time."""
    groups = shape_groups(model, exclude)
    if not groups:
        return {}
    keys = _cache_keys(groups, pdl, cache)
    remembered = [cache.get(key) for key in keys.values()] if cache is not None else [None]
    if all(choice is not None for choice in remembered):
        best = {g: choice.get(1, CUBLAS) for g, choice in zip(groups, remembered, strict=True)}
        apply_one_row(groups, best)
        log.info("one-row decode GEMMs from the tuning cache: %s", _labels(best))
        return best
    found = search_one_row(groups, graph_seconds, pdl=pdl, screen_seconds=screen_seconds)
    best, seconds = found.best, found.best_seconds
    if not seconds < found.start_seconds:  # a tie, noise, or no graph that ran at all
        best, seconds = found.start, found.start_seconds
    log.info(
        "one-row decode GEMMs timed in the batch-1 graph: %.3f ms with the chain's picks, "
        "%.3f ms with %s",
        1e3 * found.start_seconds,
        1e3 * seconds,
        _labels(best),
    )
    if sustained_seconds is not None:
        best = sustained_choice(groups, best, lean_assignment(best, found.rows), sustained_seconds)
    apply_one_row(groups, best)
    if cache is not None:
        for group, key in keys.items():
            cache.put(key, {} if best[group] is CUBLAS else {1: best[group]})
    return best


def _cache_keys(
    groups: Mapping[str, list[Linear]], pdl: bool, cache: TuningCache | None
) -> dict[str, str]:
    """A tuning-cache key per group: its weight, and the graph around it (every group's
    label and layer count, in order)."""
    if cache is None:
        return {}
    graph = json.dumps([[g, len(layers)] for g, layers in groups.items()])
    return {
        g: cache.key("in-graph", layers[0].weight, [1], pdl=pdl, graph=graph)
        for g, layers in groups.items()
    }


def _labels(assignment: Mapping[str, Any]) -> str:
    return ", ".join(f"{g} {choice_label(c)}" for g, c in assignment.items())


def choice_label(choice: SkinnyConfig | None) -> str:
    """A choice's name in records: ``cuBLAS`` or the config's label."""
    from jacana_engine.tuning.decode_gemm import config_label

    return "cuBLAS" if choice is CUBLAS else config_label(choice)
