"""The committed gRPC stubs are exactly what the .proto sources generate."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "tools/gen_proto.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_proto_sources(tmp_path):
    gen = _load_generator()
    written = gen.generate(tmp_path)
    assert written, "generator wrote nothing"
    committed = gen.DEFAULT_OUT
    for rel in written:
        fresh = (tmp_path / rel).read_text()
        current = committed / rel
        assert current.exists(), f"{rel} missing: run `make proto`"
        assert current.read_text() == fresh, f"{rel} drifted from proto/: run `make proto`"
    stale = {p.relative_to(committed) for p in committed.rglob("*_pb2*.py*")} - set(written)
    assert not stale, f"stubs without a .proto source: {sorted(map(str, stale))}"
