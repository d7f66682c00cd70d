"""Fixtures of the kernel tests.

Kernels run on CUDA when there is a GPU, else under Triton's CPU interpreter. Triton
reads ``TRITON_INTERPRET`` when a kernel is decorated, i.e. when ``jacana_engine.kernels.*``
is first imported, so it is set here, at collection, before any test module imports them.

Each test draws fresh random inputs from a new seed, printed in failure messages; set
``JACANA_KERNEL_TEST_SEED`` to replay one.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def seed() -> int:
    """A fresh seed, applied to torch's global generators."""
    value = int(os.environ.get("JACANA_KERNEL_TEST_SEED", random.SystemRandom().getrandbits(31)))
    torch.manual_seed(value)
    return value


@pytest.fixture
def gpu() -> None:
    """For ``@pytest.mark.gpu`` tests: skip where no CUDA device is present."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def _close_report(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    out64, ref64 = out.double(), ref.double()
    if not torch.isfinite(out64).all():
        return float("inf"), float("inf")
    diff = out64 - ref64
    rel_l2 = float(diff.norm() / ref64.norm().clamp_min(1e-30))
    max_rel = float(diff.abs().max() / ref64.abs().max().clamp_min(1e-30))
    return rel_l2, max_rel


class Checks:
    """Assertions shared by the kernel tests; every message names the seed."""

    @staticmethod
    def close(out, ref, *, rel_l2: float, max_rel: float, seed: int, what: str = "") -> None:
        """‖out − ref‖/‖ref‖ <= rel_l2 and max|out − ref| / max|ref| <= max_rel; NaN fails."""
        got_l2, got_max = _close_report(out, ref)
        assert got_l2 <= rel_l2 and got_max <= max_rel, (
            f"{what} seed={seed}: rel_l2={got_l2:.3g} (<= {rel_l2:g}), "
            f"max_rel={got_max:.3g} (<= {max_rel:g})"
        )

    @staticmethod
    def ulps(out, ref, *, ulps: float, seed: int, what: str = "") -> None:
        """Elementwise |out − ref| <= ulps units of ref's dtype at ref's magnitude."""
        assert torch.isfinite(out).all(), f"{what} seed={seed}: non-finite output"
        eps = torch.finfo(out.dtype).eps  # spacing just above 1.0
        bound = ulps * eps * ref.double().abs() + 1e-30
        bad = (out.double() - ref.double()).abs() > bound
        assert not bad.any(), (
            f"{what} seed={seed}: {int(bad.sum())}/{bad.numel()} elements off by more than "
            f"{ulps} ulp; worst |diff|={float((out.double() - ref.double()).abs().max()):.3g}"
        )

    @staticmethod
    def mostly_equal(out, ref, *, max_fraction: float, seed: int, what: str = "") -> None:
        """At most ``max_fraction`` of the elements differ from ref rounded to out's dtype."""
        differ = out != ref.to(out.dtype)
        frac = float(differ.double().mean())
        assert frac <= max_fraction, (
            f"{what} seed={seed}: {frac:.3%} of elements differ (<= {max_fraction:.3%})"
        )


@pytest.fixture
def checks() -> type[Checks]:
    return Checks


class PagedBatch:
    """A random paged KV layout: scattered blocks, tokens crossing block boundaries.

    Sequence i has ``seq_lens[i]`` tokens of which the last ``query_lens[i]`` are this
    step's queries; block tables are padded with block 0 and the pool is shuffled.
    """

    def __init__(
        self,
        query_lens: list[int],
        seq_lens: list[int],
        *,
        block_size: int,
        n_kv: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        spare_blocks: int = 3,
    ) -> None:
        self.query_lens, self.seq_lens, self.block_size = query_lens, seq_lens, block_size
        per_seq = [-(-s // block_size) for s in seq_lens]
        num_blocks = sum(per_seq) + spare_blocks
        pool = torch.randperm(num_blocks).tolist()
        width = max(per_seq)
        tables, slots, start = [], [], 0
        for n_blocks, q_len, s_len in zip(per_seq, query_lens, seq_lens, strict=True):
            blocks = pool[start : start + n_blocks]
            start += n_blocks
            tables.append(blocks + [0] * (width - n_blocks))
            slots += [
                blocks[p // block_size] * block_size + p % block_size
                for p in range(s_len - q_len, s_len)
            ]
        self.block_tables = torch.tensor(tables, dtype=torch.int32, device=device)
        self.slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
        qsl = [0]
        for q_len in query_lens:
            qsl.append(qsl[-1] + q_len)
        self.query_start_loc = torch.tensor(qsl, dtype=torch.int32, device=device)
        self.seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        shape = (2, num_blocks, block_size, n_kv, head_dim)
        self.kv_cache = torch.randn(shape, device=device).to(dtype)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


@pytest.fixture
def paged_batch() -> type[PagedBatch]:
    """Factory: ``paged_batch(query_lens, seq_lens, block_size=..., ...)``."""
    return PagedBatch
