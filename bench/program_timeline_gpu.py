"""Where the batch-1 decode step's time goes between kernels, program by program (CUDA GPU).

The ablations (``graph_ablation_gpu.py``) say what each kind of launch costs the step by
leaving it out; they cannot say whether that cost is the wait for the kernel before, the
ramp of a GEMV's weight stream, or its last programs. Here the batch-1 decode graph (the
lm_head and argmax in it) is captured with per-program timestamps
(``jacana_engine.kernels._trace``: when each program of the skinny GEMVs, the RMSNorms
and the decode attention started, passed its wait, finished its work and issued its last
store, on the GPU's global timer) and replayed over a real context; the last replay's
stamps are read back. Per launch, against the launch before it (``prev``):

- ``release``: from prev's last program's end to this launch's first program past its
  wait: what a dependency costs beyond the work on either side of it;
- ``critical``: from prev's last end to this launch's last end: this launch's share of
  the chain (the launches' ``critical`` add up to the traced part of the step);
- ``early``: the share of its programs that started before prev's last end (with PDL,
  resident and loading their first weight tiles while prev still ran);
- ``window`` (median, and ``window_p10`` its 10th percentile): how long a program was
  resident before prev's last end, the time it had to load what it may before its
  wait; ``first_start``: the same for its first program; ``prev_span``: prev's own span
  from its first program past its wait to its last end;
- ``first_work``: median time from a program's wait to its work done, for the programs
  that passed the wait first (a GEMV's ramp: what its early tiles did not hide);
- ``tail``: from the median program's end to the last one's;
- for GEMVs, ``ideal``: its weight bytes at ``--rate`` (the lm_head's streaming rate by
  default) and ``rate``: the bytes over ``critical``.

Timestamps perturb what they time slightly (a few stores a program, a few registers);
compare launches within one run. The timer's resolution is measured and reported.

Writes ``program_timeline_gpu.{json,md}``: each kind of launch (its name and the one
before it) with the medians of these over the layers, and the first layer launch by
launch.

Usage: python bench/program_timeline_gpu.py [--model qwen3-8b] [--contexts 320 2048]
[--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import RESULTS_DIR, environment, write_results
from graph_picks_gpu import one_row_engine

LM_HEAD_RATE = 4.45e12  # bytes/s: the lm_head GEMV's streaming rate on an H200 (gpu_targets.md)


def launch_rows(buffer: np.ndarray, launches: list) -> list[dict[str, Any]]:
    """The launches a replay stamped (rows with a start), each with its stamps as arrays
    of nanoseconds: {name, start, waited, worked, end, sm}."""
    from jacana_engine.kernels._trace import COLUMNS

    found = []
    for launch in launches:
        rows = buffer[launch.first : launch.first + launch.programs]
        if not (rows[:, 0] > 0).all():  # not replayed by the graph (a warm-up launch)
            continue
        found.append({"name": launch.name, **{c: rows[:, i] for i, c in enumerate(COLUMNS)}})
    return found


def weight_bytes(name: str) -> int | None:
    """A GEMV launch's bf16 weight bytes from its name (``gemv NxK[ gated]``)."""
    if not name.startswith("gemv "):
        return None
    n, k = name.split()[1].split("x")
    return int(n) * int(k) * 2


def per_launch(found: list[dict[str, Any]], rate: float) -> list[dict[str, Any]]:
    """The measures of the module docstring for each launch after the first, in µs."""
    out = []
    for prev, cur in itertools.pairwise(found):
        prev_end = prev["end"].max()
        waited = np.sort(cur["waited"])
        first = cur["waited"] <= np.quantile(cur["waited"], 0.1)
        row = {
            "name": cur["name"],
            "after": prev["name"],
            "programs": float(len(cur["start"])),
            "release_us": (waited[0] - prev_end) / 1e3,
            "critical_us": (cur["end"].max() - prev_end) / 1e3,
            "early": float((cur["start"] < prev_end).mean()),
            # how long a program sat resident before prev's last end (its time to load
            # what it may before its wait): the median and the 10th percentile, and the
            # first program's
            "window_us": float(np.median(np.maximum(prev_end - cur["start"], 0))) / 1e3,
            "window_p10_us": float(np.quantile(np.maximum(prev_end - cur["start"], 0), 0.1)) / 1e3,
            "first_start_us": float(prev_end - cur["start"].min()) / 1e3,
            # prev's span from its first program past its wait to its last end
            "prev_span_us": float(prev_end - prev["waited"].min()) / 1e3,
            "first_work_us": float(np.median(cur["worked"][first] - cur["waited"][first])) / 1e3,
            "wait_spread_us": (waited[-1] - waited[0]) / 1e3,
            "tail_us": (cur["end"].max() - np.median(cur["end"])) / 1e3,
            "sms": float(len(np.unique(cur["sm"]))),
        }
        nbytes = weight_bytes(cur["name"])
        if nbytes is not None:
            row["ideal_us"] = nbytes / rate * 1e6
            row["rate_tb_s"] = nbytes / (row["critical_us"] * 1e-6) / 1e12
        out.append(row)
    return out


def by_kind(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over the layers of each kind of launch (its name and the one before it), in
    the order the step first meets them, with how many times a step runs it."""
    kinds: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        kinds.setdefault((row["name"], row["after"]), []).append(row)
    table = []
    for (name, after), group in kinds.items():
        keys = [k for k, v in group[0].items() if isinstance(v, float)]
        table.append(
            {
                "name": name,
                "after": after,
                "count": len(group),
                **{k: statistics.median(r[k] for r in group) for k in keys},
            }
        )
    return table


def timer_resolution_ns(found: list[dict[str, Any]]) -> int:
    """The smallest positive step between any two stamps of the replay."""
    stamps = np.unique(np.concatenate([f[c] for f in found for c in ("start", "waited", "end")]))
    steps = np.diff(stamps)
    return int(steps[steps > 0].min()) if (steps > 0).any() else 0


def read_replay(rec, graphs, context: int, replays: int, rate: float) -> dict[str, Any]:
    """One context's record: the traced graph's replay time, then one replay's stamps."""
    traced_ms = 1e3 * graphs.replay_seconds(1, context, replays, 3)
    rec.clear()
    graphs.replay_seconds(1, context, 1, 1)
    torch.cuda.synchronize()
    found = launch_rows(rec.buffer.cpu().numpy(), rec.launches)
    rows = per_launch(found, rate)
    first_start = min(f["start"].min() for f in found)
    kind = (rows[0]["name"], rows[0]["after"])
    layer_len = next(
        (i for i, r in enumerate(rows[1:], 1) if (r["name"], r["after"]) == kind), len(rows)
    )
    return {
        "context": context,
        "traced_graph_ms": traced_ms,
        "traced_span_ms": (max(f["end"].max() for f in found) - first_start) / 1e6,
        "critical_sum_ms": sum(r["critical_us"] for r in rows) / 1e3,
        "launches": len(found),
        "timer_resolution_ns": timer_resolution_ns(found),
        "kinds": by_kind(rows),
        "first_layer": rows[:layer_len],
    }


def measure(model_name: str, contexts: list[int], replays: int, rate: float) -> dict[str, Any]:
    """The untraced graph's time, then a traced graph's record at each context."""
    from jacana_engine.kernels._trace import recording

    engine = one_row_engine(model_name)
    runner = engine.runner
    untraced_ms = {c: 1e3 * runner.one_row_graph_seconds(c, replays, 3) for c in contexts}
    with recording(torch.device("cuda"), capacity=1 << 22) as rec:
        graphs = runner.decode_graphs([1], head=True)
        graphs.capture()
    runs = [read_replay(rec, graphs, c, replays, rate) for c in contexts]
    for run in runs:
        run["graph_ms"] = untraced_ms[run["context"]]
    return {"model": model_name, "rate_tb_s": rate / 1e12, "runs": runs}


COLUMNS_MD = [
    ("count", "{}"), ("programs", "{:.0f}"), ("critical_us", "{:.2f}"), ("release_us", "{:.2f}"),
    ("early", "{:.2f}"), ("window_us", "{:.2f}"), ("window_p10_us", "{:.2f}"),
    ("first_start_us", "{:.2f}"), ("prev_span_us", "{:.2f}"),
    ("first_work_us", "{:.2f}"), ("wait_spread_us", "{:.2f}"),
    ("tail_us", "{:.2f}"), ("ideal_us", "{:.2f}"), ("rate_tb_s", "{:.2f}"),
]  # fmt: skip


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"# Per-program timeline of the {doc['model']} batch-1 decode graph",
        "",
        f"Environment: `{doc['environment']}`. GEMV ideal at {doc['rate_tb_s']:.2f} TB/s.",
    ]
    for run in doc["runs"]:
        lines += [
            "",
            f"## {run['context']}-token context",
            "",
            f"Graph {run['graph_ms']:.3f} ms untraced, {run['traced_graph_ms']:.3f} ms traced; "
            f"{run['launches']} traced launches, {run['traced_span_ms']:.3f} ms from the first "
            f"start to the last end, their critical times add to {run['critical_sum_ms']:.3f} "
            f"ms; timer resolution {run['timer_resolution_ns']} ns. µs, medians over the layers:",
            "",
            "| launch | after | " + " | ".join(c for c, _ in COLUMNS_MD) + " |",
            "|---|---|" + "---|" * len(COLUMNS_MD),
        ]
        for kind in run["kinds"]:
            cells = [fmt.format(kind[c]) if c in kind else "–" for c, fmt in COLUMNS_MD]
            lines.append(f"| {kind['name']} | {kind['after']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument(
        "--contexts", type=int, nargs="+", default=[320, 2048], help="KV tokens a replay attends"
    )
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--rate", type=float, default=LM_HEAD_RATE, help="GEMV ideal, bytes/s")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default="program_timeline_gpu")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    measured = measure(args.model, args.contexts, args.replays, args.rate)
    doc = {"environment": environment(), **measured}
    table = render(doc)
    write_results(args.out, args.name, doc, table)
    print(table)


if __name__ == "__main__":
    main()
