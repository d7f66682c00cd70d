"""``kernels/_trace``: per-program timestamps for ``bench/program_timeline_gpu.py``. Off
unless a recording is open; launches take rows in order; the stamps compile into the
Hopper code only when asked; on a GPU a traced launch computes the same bits and stamps
each program's events in order."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.kernels import _trace
from jacana_engine.kernels.skinny_gemm import SkinnyConfig, skinny_linear


def test_launches_take_the_next_rows_and_a_full_buffer_refuses():
    rec = _trace.Recording(torch.zeros(10, _trace.FIELDS, dtype=torch.int64))
    first = rec.take("a", 4)
    second = rec.take("b", 6)
    first.fill_(1)
    second.fill_(2)
    assert [(x.name, x.first, x.programs) for x in rec.launches] == [("a", 0, 4), ("b", 4, 6)]
    assert rec.buffer[:4].eq(1).all() and rec.buffer[4:].eq(2).all()  # views of the buffer
    with pytest.raises(RuntimeError, match="full"):
        rec.take("c", 1)
    rec.clear()
    assert rec.buffer.eq(0).all()


def test_tracing_is_off_without_a_recording_and_off_cuda():
    x = torch.zeros(3)
    assert _trace.trace_slot("k", 8, x) == (x, False)
    with _trace.recording(torch.device("cpu"), capacity=16) as rec:
        rows, traced = _trace.trace_slot("k", 8, x)
        assert rows is x and not traced and rec.launches == []
        with pytest.raises(RuntimeError, match="already open"), _trace.recording(x.device):
            pass
    assert _trace._active is None


def test_the_stamps_are_in_the_hopper_code_only_when_traced():
    from hopper_codegen import hopper_ptx_counts

    counts = hopper_ptx_counts()
    assert counts["skinny_traced"]["%globaltimer"] == 4  # start, waited, worked, end
    untraced = {case: c["%globaltimer"] for case, c in counts.items() if case != "skinny_traced"}
    assert set(untraced.values()) == {0}, untraced  # what serving launches reads no timer


@pytest.mark.gpu
def test_a_traced_launch_gives_the_same_bits_and_ordered_stamps(gpu, seed):
    dev = torch.device("cuda")
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(6144, 4096, device=dev, dtype=torch.bfloat16) * 4096**-0.5
    cfg = SkinnyConfig(1, 4, 2048, False, pdl=True, prefetch_tiles=1)
    plain = skinny_linear(x, w, config=cfg)
    with _trace.recording(dev) as rec:
        traced = skinny_linear(x, w, config=cfg)
    torch.cuda.synchronize()
    assert torch.equal(plain, traced), f"seed {seed}"
    (launch,) = rec.launches
    assert launch.name == "gemv 6144x4096" and launch.programs == 6144 // 4
    rows = rec.buffer[: launch.programs].cpu()
    start, waited, worked, end, sm = rows.unbind(1)
    assert (start > 0).all()
    assert (start <= waited).all() and (waited <= worked).all() and (worked <= end).all()
    span_ns = int(end.max() - start.min())
    assert 0 < span_ns < 10_000_000, span_ns  # one GEMV: microseconds, not a stale stamp
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    assert int(sm.min()) >= 0 and int(sm.max()) < sms
