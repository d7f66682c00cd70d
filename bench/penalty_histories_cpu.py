"""Host time the penalties spend a step on their rows' histories: rebuilt from the Python
lists every step (the peer) vs kept as growing arrays (``GrowingHistories``).

Rows of Qwen3's vocabulary with a prompt and an output that grows by one token a step,
as in a decode batch where every request sets a repetition and a frequency penalty. Each
step both sides build the histories the two processors read (prompt + output, output)
and ``token_counts``' padded matrices on the ``meta`` device, so only the host's work is
timed (no counting runs). Median (min–max) over the steps of each window of output
lengths; both sides alternate within a step.

Writes ``bench/results/penalty_histories_cpu.{json,md}``.

Usage: python bench/penalty_histories_cpu.py [--rows 64] [--prompt 1024] [--steps 2048]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from common import (
    cpu_machine,
    cpu_machine_line,
    fmt_spread,
    package_versions,
    spread,
    write_results,
)

from jacana_engine.sample.logits_processors import GrowingHistories, token_counts

VOCAB = 151_936
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(eq=False)
class Row:
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)


def rebuilt(rows: list[Row]) -> None:
    """The peer: every history made again from the lists."""
    seen = [[*r.prompt_token_ids, *r.output_token_ids] for r in rows]
    token_counts(seen, VOCAB, torch.device("meta"))
    token_counts([r.output_token_ids for r in rows], VOCAB, torch.device("meta"))


def kept(rows: list[Row], seen: GrowingHistories, outputs: GrowingHistories) -> None:
    token_counts([seen(r) for r in rows], VOCAB, torch.device("meta"))
    token_counts([outputs(r) for r in rows], VOCAB, torch.device("meta"))


def run(n_rows: int, prompt: int, steps: int, windows: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    rows = [Row(torch.randint(0, VOCAB, (prompt,), generator=gen).tolist()) for _ in range(n_rows)]
    seen = GrowingHistories(lambda h: (h.prompt_token_ids, h.output_token_ids))
    outputs = GrowingHistories(lambda h: (h.output_token_ids,))
    times: dict[str, list[float]] = {"rebuilt": [], "kept": []}
    for step in range(steps):
        for r in rows:
            r.output_token_ids.append(int(torch.randint(0, VOCAB, (1,), generator=gen)))
        sides = [("rebuilt", lambda: rebuilt(rows)), ("kept", lambda: kept(rows, seen, outputs))]
        for name, fn in sides if step % 2 else sides[::-1]:
            start = time.perf_counter()
            fn()
            times[name].append(1e3 * (time.perf_counter() - start))
    width = steps // windows
    out = []
    for w in range(windows):
        part = slice(w * width, (w + 1) * width)
        a, b = spread(times["rebuilt"][part]), spread(times["kept"][part])
        out.append(
            {
                "outputs": [w * width + 1, (w + 1) * width],
                "rebuilt_ms": a,
                "kept_ms": b,
                "ratio": a["median"] / b["median"],
            }
        )
    return {"rows": n_rows, "prompt": prompt, "steps": steps, "windows": out}


def table(doc: dict) -> str:
    r = doc["result"]
    lines = [
        "# Penalties' history host time a step: rebuilt from lists vs kept as growing arrays",
        "",
        f"{r['rows']} rows, {r['prompt']}-token prompts, outputs growing one token a step; "
        "repetition (prompt + output) and frequency (output) histories, `token_counts` on "
        "the meta device. Median (min–max) of the steps in each window, ms.",
        "",
        "| output tokens | rebuilt | kept | rebuilt / kept |",
        "|---|---|---|---|",
    ]
    for w in r["windows"]:
        lo, hi = w["outputs"]
        lines.append(
            f"| {lo}–{hi} | {fmt_spread(w['rebuilt_ms'], 3)} | {fmt_spread(w['kept_ms'], 3)} "
            f"| {w['ratio']:.1f}x |"
        )
    lines += ["", cpu_machine_line(doc["machine"], doc["versions"], doc["date"])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=2048)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    load = os.getloadavg()
    result = run(args.rows, args.prompt, args.steps, args.windows)
    doc = {
        "result": result,
        "machine": cpu_machine(load),
        "versions": package_versions(),
        "date": dt.date.today().isoformat(),
    }
    json_path, md_path = write_results(args.out, "penalty_histories_cpu", doc, table(doc))
    print(table(doc))
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
