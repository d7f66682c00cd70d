"""``kernels/offline_compile``: the occupancy arithmetic and the signatures it builds
(compiling itself runs in ``test_decode_rotation``'s sm90 PTX check)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from jacana_engine.kernels.offline_compile import SMLimits, ctas_per_sm, signature_for


@pytest.mark.parametrize(
    ("registers", "threads", "shared", "want"),
    [
        (80, 128, 4096, 6),  # 80 x 32 = 2,560 registers a warp, 10 blocks of 256: 6 CTAs
        (85, 128, 4096, 5),  # 2,720 rounds up to 2,816 a warp: 5 CTAs
        (121, 128, 4096, 4),
        (32, 128, 4096, 16),  # threads bind first: 2,048 / 128
        (32, 32, 4096, 32),  # then the CTA slots
        (32, 128, 100 * 1024, 2),  # then shared memory: 228 KiB / 100 KiB
    ],
)
def test_programs_per_sm_follow_the_first_limit_reached(registers, threads, shared, want):
    assert ctas_per_sm(registers, threads, shared) == want


def test_a_smaller_sm_holds_fewer():
    assert ctas_per_sm(80, 128, 0, SMLimits(registers=32768)) == 3


def test_the_signature_names_pointers_floats_and_constexprs():
    class Fn:
        arg_names = ("x_ptr", "idx_ptr", "eps", "n", "BLOCK")

    assert signature_for(Fn, {"BLOCK": 64}, pointers={"idx_ptr": "*i32"}, floats=("eps",)) == {
        "x_ptr": "*bf16",
        "idx_ptr": "*i32",
        "eps": "fp32",
        "n": "i32",
        "BLOCK": "constexpr",
    }
