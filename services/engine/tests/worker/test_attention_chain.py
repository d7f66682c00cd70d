"""``bench/attention_chain_gpu.py`` on the CPU: each variant sets what it names and undoes
it on leaving, and the table turns graph times into the attention's cost a layer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "bench"))
import attention_chain_gpu as chain


def test_each_variant_sets_its_launch_and_restores_it():
    from jacana_engine.kernels import decode_attention
    from jacana_engine.models.attention import DecoderAttention
    from jacana_engine.worker.model_runner import ModelRunner

    before = (
        ModelRunner._decode_splits,
        decode_attention._NUM_STAGES,
        DecoderAttention.attend_heads,
    )
    variants = chain.ATTENTION_VARIANTS
    assert list(variants)[:2] == ["engine", "no attention"]
    for name, stages in (
        ("1 split, 2 stages", 2),
        ("1 split, 3 stages", 3),
        ("1 split, 4 stages", 4),
    ):
        with variants[name]():
            assert ModelRunner._decode_splits(None, 1) == 1, name
            assert stages == decode_attention._NUM_STAGES, name
    with variants["4 splits"]():
        assert ModelRunner._decode_splits(None, 1) == 4
    with variants["no attention"]():
        assert DecoderAttention.attend_heads is not before[2]
    after = (
        ModelRunner._decode_splits,
        decode_attention._NUM_STAGES,
        DecoderAttention.attend_heads,
    )
    assert after == before


def test_the_table_gives_each_variant_its_cost_a_layer_over_no_attention():
    names = list(chain.ATTENTION_VARIANTS)
    # 2 layers; every variant 0.01 ms per position in the list over the graph without it
    row = {name: 1.0 + 0.01 * i for i, name in enumerate(names)}
    row["no attention"] = 1.0
    doc = {
        "environment": "cpu", "reps": 3, "replays": 20, "model": "tiny", "layers": 2,
        "splits_engine": 16, "rows": [{"context": 64, **row}],
    }  # fmt: skip
    table = chain.render(doc).splitlines()
    header = next(line for line in table if line.startswith("| context"))
    assert "no attention µs" not in header
    last = table[-1].split(" | ")
    assert last[0] == "| 64" and last[1] == "1.000" and last[2] == "1.000"
    # engine (index 0): 0 µs; then index i: 0.01 i ms over 2 layers, 5 i µs a layer
    assert [float(c.strip(" |")) for c in last[3:]] == pytest.approx(
        [0.0] + [5.0 * i for i in range(2, len(names))]
    )
