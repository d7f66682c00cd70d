"""A probe kernel: one decode row's GEMV chain from o_proj to the next layer's qkv in one
persistent launch (measured against the separate kernels by
``layer_stream_probe_gpu.py``; the engine does not use it).

At batch 1 a decoder layer is bound by streaming its weights from HBM, and a chain of
separate GEMV launches loses HBM time at every dependency: the last programs of one
launch drain, the next launch waits for the whole grid, then its first loads take an
HBM round trip. This kernel runs ``o -> add + RMSNorm -> gate_up -> SiLU-and-mul ->
down -> add + RMSNorm -> qkv`` (the next layer's) as one grid of resident programs that
each walk a flat sequence of weight tiles across all four matrices. The tile loads are
software pipelined ``STAGES`` deep (``cp.async`` into shared memory), so while a program
waits at the grid barrier between two GEMVs its next matrix's first tiles are already
on their way: HBM keeps streaming across the dependency.

Between GEMVs every program recomputes the small step itself from the full vector the
barrier made visible (the residual add and RMSNorm, or SiLU-and-mul), rounded as HF
rounds it (``rmsnorm.rms_scale``, ``activation.silu_mul_rounded``); program 0 stores the
layer's new residual. A GEMV row is summed in float32 and rounded once, as the skinny
GEMM does (in another order, so a product may round to its neighbour).

The grid barrier spins on an arrival counter, so every program must be resident at
once: the grid is as many programs as fit on the SMs together (``_programs``). Under the CPU
interpreter programs run one after another, so only a grid of one program can run there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._arrivals import arrival_counters
from jacana_engine.kernels._common import check_last_dim_contiguous, num_sms
from jacana_engine.kernels._pdl import pdl_launch
from jacana_engine.kernels.activation import silu_mul_rounded
from jacana_engine.kernels.offline_compile import ctas_per_sm
from jacana_engine.kernels.rmsnorm import rms_scale

COUNTERS = "layer_stream"


@dataclass(frozen=True)
class StreamConfig:
    """Launch parameters: rows a tile (of one hidden-wide chunk), pipeline depth, warps,
    a register cap per thread (0: the compiler's choice; a lower one lets two programs
    share an SM), and programs per SM (0: as many as fit, at most ``MAX_PER_SM``)."""

    block_n: int = 8
    stages: int = 3
    num_warps: int = 8
    max_registers: int = 0
    per_sm: int = 0
    wait: int = 7  # bit k: barrier k+1 waits; the others do not (wrong results: timing only)
    max_programs: int = 0  # 0: no cap (a cap can divide every matrix's row blocks evenly)
    # row blocks dealt out in turn (program p takes p, p + P, p + 2P, ...) rather than in
    # one contiguous share each: the programs then read one narrow window of a matrix
    # together, as a grid of many short programs does, not P places far apart
    interleave: bool = False
    # with this many steps' lead (> stages to matter; 0: off) each step also asks L2 for
    # a later tile (``cp.async.bulk.prefetch.L2``): while a program waits at a grid
    # barrier its pipelined loads stop, but HBM keeps filling L2 with what comes next
    l2_ahead: int = 0


MAX_PER_SM = 4


def leader_sync_ptx(*, arrive: bool, block_barrier: bool) -> str:
    """One PTX block for a grid barrier's halves: thread 0 of the program (with
    ``arrive``) fences and adds one to the counter at $1, then spins until it holds at
    least $2 and fences again; with ``block_barrier`` the program's threads meet before
    (so every thread's stores precede the arrival) and after (so none reads before the
    wait is over). Thread 0 alone polls: a program's 256 threads polling one L2 line
    would slow every arrival. Output $0 is a dummy 0."""
    meet = "bar.sync 0;" if block_barrier else ""
    add = "fence.acq_rel.gpu;\nred.relaxed.gpu.global.add.s32 [$1], 1;" if arrive else ""
    return f"""{{
    .reg .pred leader, done;
    .reg .u32 tid;
    .reg .s32 seen;
    {meet}
    mov.u32 tid, %tid.x;
    setp.eq.u32 leader, tid, 0;
    @!leader bra released;
    {add}
    spin:
    ld.acquire.gpu.global.b32 seen, [$1];
    setp.ge.s32 done, seen, $2;
    @!done bra spin;
    fence.acq_rel.gpu;
    released:
    {meet}
    mov.u32 $0, 0;
    }}"""


_ARRIVE_AND_WAIT = tl.constexpr(leader_sync_ptx(arrive=True, block_barrier=True))


@triton.jit
def _grid_barrier(counter_ptr, target, INTERPRET: tl.constexpr, WAIT: tl.constexpr = 1):
    """Arrive, then wait until ``target`` arrivals are counted; after it the other
    programs' stores before their arrivals are visible. In one PTX block
    (``leader_sync_ptx``): Triton's own block barrier or a ``while`` inside a loop
    would keep the loop from being pipelined. The interpreter runs a grid of one
    program: its own arrival is the count."""
    if INTERPRET or not WAIT:
        tl.atomic_add(counter_ptr, 1, sem="release")
    else:
        tl.inline_asm_elementwise(
            _ARRIVE_AND_WAIT, "=r,l,r", [counter_ptr, target], dtype=tl.int32, is_pure=False,
            pack=1,
        )  # fmt: skip


@triton.jit
def _share(total, pid, programs, INTERLEAVE: tl.constexpr):
    """(first, count, step) of program ``pid``'s row blocks of ``total``: its i-th block is
    first + i * step. In turn (``INTERLEAVE``): pid, pid + programs, ...; else an even
    contiguous share."""
    if INTERLEAVE:
        first = pid
        count = (total - pid + programs - 1) // programs
        step = programs
    else:
        first = pid * total // programs
        count = (pid + 1) * total // programs - first
        step = 1
    return first, count, step


@triton.jit
def walk(pid, programs, H: tl.constexpr, I: tl.constexpr, QKV: tl.constexpr,  # noqa: E741
         BLOCK_N: tl.constexpr, INTERLEAVE: tl.constexpr):  # fmt: skip
    """Program ``pid``'s walk through o, gate_up, down (``I // H`` steps a row block) and
    qkv: (s1, s2, s3, each matrix's first row block, the step between its row blocks) as
    ``_tile`` takes it, and the walk's length. Also the Gluon kernels' (layer_stream_ws)."""
    CHUNKS: tl.constexpr = I // H
    o_lo, o_n, step = _share(H // BLOCK_N, pid, programs, INTERLEAVE)
    gu_lo, gu_n, _ = _share(2 * I // BLOCK_N, pid, programs, INTERLEAVE)
    d_lo, d_n, _ = _share(H // BLOCK_N, pid, programs, INTERLEAVE)
    q_lo, q_n, _ = _share(QKV // BLOCK_N, pid, programs, INTERLEAVE)
    s1 = o_n
    s2 = s1 + gu_n
    s3 = s2 + d_n * CHUNKS
    return (s1, s2, s3, o_lo, gu_lo, d_lo, q_lo, step), s3 + q_n


@triton.jit
def place(j, walk, CHUNKS: tl.constexpr):
    """Step ``j`` of a walk (``walk``'s first result): (matrix 0-3, chunk of a down row,
    row block). Also the Gluon kernels' (layer_stream_ws)."""
    s1, s2, s3, o_lo, gu_lo, d_lo, q_lo, step = walk
    phase = (j >= s1).to(tl.int32) + (j >= s2).to(tl.int32) + (j >= s3).to(tl.int32)
    chunk = tl.where(phase == 2, (j - s2) % CHUNKS, 0)
    block = tl.where(
        phase == 0,
        o_lo + j * step,
        tl.where(
            phase == 1,
            gu_lo + (j - s1) * step,
            tl.where(phase == 2, d_lo + (j - s2) // CHUNKS * step, q_lo + (j - s3) * step),
        ),
    )
    return phase, chunk, block


@triton.jit
def _tile(j, walk, weights, rows, H: tl.constexpr, I: tl.constexpr, CHUNKS: tl.constexpr,  # noqa: E741
          BLOCK_N: tl.constexpr):  # fmt: skip
    """Step ``j`` of a program's walk: (matrix 0-3, chunk of a down row, first row, the
    [BLOCK_N] pointers to its rows' chunk). ``walk``: (s1, s2, s3, each matrix's first row
    block, step between row blocks); ``weights``: the four matrices."""
    wo_ptr, wgu_ptr, wd_ptr, wqkv_ptr = weights
    phase, chunk, block = place(j, walk, CHUNKS)
    row0 = block * BLOCK_N
    w_base = tl.where(
        phase == 0,
        wo_ptr,
        tl.where(phase == 1, wgu_ptr, tl.where(phase == 2, wd_ptr, wqkv_ptr)),
    )
    stride = tl.where(phase == 2, I, H)
    return phase, chunk, row0, w_base + (row0 + rows).to(tl.int64)[:, None] * stride + chunk * H


@triton.jit
def _prefetch_tile_to_l2(w_rows, H: tl.constexpr):
    """Ask L2 for the [BLOCK_N, H] tile at ``w_rows`` ([BLOCK_N, 1] row pointers) in
    256-byte pieces, about one a thread (``cp.async.bulk.prefetch.L2``: a hint, no
    registers held until it lands)."""
    elem: tl.constexpr = w_rows.dtype.element_ty.primitive_bitwidth // 8
    PIECES: tl.constexpr = H * elem // 256
    ptrs = w_rows.to(tl.pointer_type(tl.int8)) + tl.arange(0, PIECES)[None, :] * 256
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], 256;\n\tmov.u32 $0, 0;",
        "=r,l",
        [ptrs],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _layer_stream_kernel(
    attn_ptr,  # [H] attention output, o_proj's input
    res_in_ptr,  # [H] residual stream entering the layer (read only)
    res_out_ptr,  # [H] residual stream leaving it: res_in + o + down (program 0 stores)
    wo_ptr,  # [H, H]
    wgu_ptr,  # [2I, H] gate rows then up rows
    wd_ptr,  # [H, I]
    wqkv_ptr,  # [QKV, H] the next layer's
    g_post_ptr,  # [H] post-attention RMSNorm weight
    g_next_ptr,  # [H] the next layer's input RMSNorm weight
    o_ptr,  # [H] scratch: o_proj's output
    gu_ptr,  # [2I] scratch: gate_up's output
    d_ptr,  # [H] scratch: down's output
    qkv_ptr,  # [QKV] output
    counter_ptr,  # int32, 0 between launches
    eps_post,
    eps_next,
    H: tl.constexpr,
    I: tl.constexpr,  # noqa: E741 (the intermediate size, a multiple of H)
    QKV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
    PDL: tl.constexpr,
    INTERPRET: tl.constexpr,  # the CPU interpreter (a grid of one program)
    WAIT: tl.constexpr = 7,  # bit k: barrier k+1 waits (others only arrive: timing their cost)
    INTERLEAVE: tl.constexpr = False,  # StreamConfig.interleave
    L2_AHEAD: tl.constexpr = 0,  # StreamConfig.l2_ahead
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    dtype = attn_ptr.dtype.element_ty
    CHUNKS: tl.constexpr = I // H  # down's rows are this many hidden-wide chunks
    ks = tl.arange(0, H)  # [H]
    rows = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    if PDL:  # the next kernel may launch now; it waits for all of this one
        tl.extra.cuda.gdc_launch_dependents()

    # this program's row blocks of each matrix, and where each phase starts in its walk
    path, steps = walk(pid, programs, H, I, QKV, BLOCK_N, INTERLEAVE)
    s1, s2, s3 = path[0], path[1], path[2]
    weights = (wo_ptr, wgu_ptr, wd_ptr, wqkv_ptr)

    # the GEMV's input, chunk by chunk (down: 3), and the residual after attention: all
    # rounded to the activation dtype already, so held in it (half the registers)
    x0 = tl.zeros([H], dtype=dtype)
    x1 = tl.zeros([H], dtype=dtype)
    x2 = tl.zeros([H], dtype=dtype)
    h1 = tl.zeros([H], dtype=dtype)
    acc_d = tl.zeros([BLOCK_N], dtype=tl.float32)  # down's row sums over its chunks
    for j in tl.range(0, steps, num_stages=STAGES):
        # Which matrix and tile: weight loads depend on j only, so the pipeline issues
        # them STAGES - 1 steps ahead, across the barriers below.
        phase, chunk, row0, w_rows = _tile(j, path, weights, rows, H, I, CHUNKS, BLOCK_N)
        if L2_AHEAD > 0:  # the tile L2_AHEAD steps on (the last one again near the end)
            ahead = _tile(
                tl.minimum(j + L2_AHEAD, steps - 1), path, weights, rows, H, I, CHUNKS, BLOCK_N
            )
            _prefetch_tile_to_l2(ahead[3], H)
        w = tl.load(w_rows + ks[None, :])  # [BLOCK_N, H]

        if j == 0:  # o_proj's input: written by the kernel before (attention)
            if PDL:
                tl.extra.cuda.gdc_wait()
            x0 = tl.load(attn_ptr + ks)
        if j == s1:  # gate_up's input: RMSNorm(res_in + o), every program for itself
            _grid_barrier(counter_ptr, programs, INTERPRET, WAIT & 1)
            o = tl.load(o_ptr + ks).to(tl.float32)
            res = tl.load(res_in_ptr + ks).to(tl.float32)
            h1 = (o + res).to(dtype)
            h1f = h1.to(tl.float32)
            rstd = tl.rsqrt(tl.sum(h1f * h1f, axis=0) / H + eps_post)
            g = tl.load(g_post_ptr + ks).to(tl.float32)
            x0 = rms_scale(h1f, rstd, g, dtype)
        if j == s2:  # down's input: SiLU(gate) * up, chunk by chunk
            _grid_barrier(counter_ptr, 2 * programs, INTERPRET, WAIT & 2)
            x0 = silu_mul_rounded(
                tl.load(gu_ptr + ks).to(tl.float32), tl.load(gu_ptr + I + ks).to(tl.float32), dtype
            )
            if CHUNKS > 1:
                x1 = silu_mul_rounded(
                    tl.load(gu_ptr + H + ks).to(tl.float32),
                    tl.load(gu_ptr + I + H + ks).to(tl.float32),
                    dtype,
                )
            if CHUNKS > 2:
                x2 = silu_mul_rounded(
                    tl.load(gu_ptr + 2 * H + ks).to(tl.float32),
                    tl.load(gu_ptr + I + 2 * H + ks).to(tl.float32),
                    dtype,
                )
        if j == s3:  # the next qkv's input: RMSNorm(h1 + down)
            _grid_barrier(counter_ptr, 3 * programs, INTERPRET, WAIT & 4)
            d = tl.load(d_ptr + ks).to(tl.float32)
            h2 = (h1.to(tl.float32) + d).to(dtype)
            if pid == 0:
                tl.store(res_out_ptr + ks, h2)
            h2 = h2.to(tl.float32)
            rstd = tl.rsqrt(tl.sum(h2 * h2, axis=0) / H + eps_next)
            g = tl.load(g_next_ptr + ks).to(tl.float32)
            x0 = rms_scale(h2, rstd, g, dtype)

        x = tl.where(chunk == 0, x0, tl.where(chunk == 1, x1, x2))
        part = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)  # [BLOCK_N]
        acc_d = tl.where(chunk == 0, part, acc_d + part)
        out_base = tl.where(
            phase == 0, o_ptr, tl.where(phase == 1, gu_ptr, tl.where(phase == 2, d_ptr, qkv_ptr))
        )
        last_chunk = ((phase != 2) | (chunk == CHUNKS - 1)).to(tl.int32)
        tl.store(out_base + row0 + rows, acc_d.to(dtype), mask=rows * 0 + last_chunk > 0)

    # every program arrives once more; the last resets the counter for the next launch
    # (all have passed the third barrier by then)
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
    if arrived == 4 * programs - 1:
        tl.store(counter_ptr, 0)


# (device, launch specialization) -> programs that fit on one SM at once
_fit: dict[tuple, int] = {}


def _programs(
    kernel_args: tuple,
    launch: dict,
    device: torch.device,
    config: StreamConfig,
    rows: tuple[int, ...],
) -> int:
    """Programs of a launch: every one must be resident at once (the barrier waits for all),
    so as many per SM as the compiled kernel's registers and shared memory allow (or
    ``config.per_sm`` if fewer), times the SMs; never more than the fewest row blocks of
    a matrix (every program takes part in every phase). One under the interpreter."""
    if device.type != "cuda":
        return 1
    key = (device, kernel_args[0].dtype, tuple(sorted(launch.items())))
    if key not in _fit:
        kernel = _layer_stream_kernel.warmup(*kernel_args, grid=(1,), **launch)
        kernel._init_handles()
        _fit[key] = ctas_per_sm(kernel.n_regs, config.num_warps * 32, kernel.metadata.shared)
    per_sm = min(_fit[key], config.per_sm or MAX_PER_SM)
    if per_sm < 1:
        raise RuntimeError(f"layer_stream {config} does not fit on an SM")
    programs = per_sm * num_sms(device)
    if config.max_programs:
        programs = min(programs, config.max_programs)
    return max(1, min(programs, min(rows) // config.block_n))


def layer_stream(
    attn: torch.Tensor,  # [1, H]
    residual: torch.Tensor,  # [1, H] entering the layer
    wo: torch.Tensor,  # [H, H]
    wgu: torch.Tensor,  # [2I, H]
    wd: torch.Tensor,  # [H, I]
    wqkv: torch.Tensor,  # [QKV, H]
    g_post: torch.Tensor,  # [H]
    g_next: torch.Tensor,  # [H]
    eps_post: float,
    eps_next: float,
    *,
    residual_out: torch.Tensor,  # [1, H] leaving the layer (not ``residual``)
    qkv_out: torch.Tensor,  # [1, QKV]
    scratch: tuple[
        torch.Tensor, torch.Tensor, torch.Tensor
    ],  # o [1, H], gate_up [1, 2I], down [1, H]
    config: StreamConfig = StreamConfig(),
    pdl: bool = False,
) -> torch.Tensor:  # qkv_out
    """One row through o_proj, the post-attention add + RMSNorm, the gated MLP, the add
    + RMSNorm of the next layer and its qkv projection; ``residual_out`` gets the
    layer's residual stream. Raises ``ValueError`` on shapes the kernel does not take
    (I a multiple of H, at most 3 chunks; every row count a multiple of ``block_n``)."""
    h = attn.shape[-1]
    inter = wd.shape[1]
    qkv = wqkv.shape[0]
    if attn.shape != (1, h) or residual.shape != (1, h) or residual_out.shape != (1, h):
        raise ValueError("layer_stream takes one row: attn, residual and residual_out [1, H]")
    if residual_out.data_ptr() == residual.data_ptr():
        raise ValueError("residual_out must not alias residual (programs read it throughout)")
    if wo.shape != (h, h) or wgu.shape != (2 * inter, h) or wd.shape != (h, inter):
        raise ValueError(f"weights {wo.shape} {wgu.shape} {wd.shape} do not chain for H={h}")
    if wqkv.shape[1] != h or qkv_out.shape != (1, qkv):
        raise ValueError(f"wqkv {tuple(wqkv.shape)} / qkv_out {tuple(qkv_out.shape)} mismatch")
    if inter % h or inter // h > 3:
        raise ValueError(f"intermediate size {inter} must be 1-3 times the hidden size {h}")
    if h & (h - 1):
        raise ValueError(f"hidden size {h} must be a power of two")
    for rows in (h, 2 * inter, qkv):
        if rows % config.block_n:
            raise ValueError(f"{rows} rows are not a multiple of block_n={config.block_n}")
    for name, t in (("wo", wo), ("wgu", wgu), ("wd", wd), ("wqkv", wqkv)):
        check_last_dim_contiguous(name, t)
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    o, gu, d = scratch
    for name, t, width in (
        ("attn", attn, h), ("residual", residual, h), ("residual_out", residual_out, h),
        ("qkv_out", qkv_out, qkv), ("scratch o", o, h), ("scratch gate_up", gu, 2 * inter),
        ("scratch down", d, h),
    ):  # fmt: skip
        if t.shape != (1, width) or t.dtype != attn.dtype:
            raise ValueError(
                f"{name} must be [1, {width}] {attn.dtype}, got {tuple(t.shape)} {t.dtype}"
            )
        check_last_dim_contiguous(name, t)
    counter = arrival_counters(COUNTERS, attn.device, 1)
    args = (
        attn, residual, residual_out, wo, wgu, wd, wqkv, g_post, g_next,
        o, gu, d, qkv_out, counter, eps_post, eps_next,
    )  # fmt: skip
    on_cuda = attn.device.type == "cuda"
    launch = dict(
        H=h, I=inter, QKV=qkv, BLOCK_N=config.block_n, STAGES=config.stages,
        INTERPRET=not on_cuda, WAIT=config.wait, INTERLEAVE=config.interleave,
        L2_AHEAD=config.l2_ahead if on_cuda else 0, num_warps=config.num_warps,
        enable_fp_fusion=False,
        **pdl_launch(pdl, attn.device),
    )  # fmt: skip
    if on_cuda and config.max_registers:
        launch["maxnreg"] = config.max_registers
    programs = _programs(args, launch, attn.device, config, (h, 2 * inter, qkv))
    _layer_stream_kernel[(programs,)](*args, **launch)
    return qkv_out
