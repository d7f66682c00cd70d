"""Probe kernels: the layer stream (``layer_stream.py``'s chain, o_proj to the next qkv at
batch 1) with a free-running weight producer, in Gluon (Triton's explicit-layout
dialect), Hopper only. Written against the GPU machine's Triton 3.6: Gluon is
experimental and its API moves (3.9 renamed ``thread_barrier`` and
``_reinterpret``), so these compile only there; ``layer_stream_probe_gpu.py`` checks
their outputs against the engine's kernels before timing them.

In the Triton kernel the weight loads are software pipelined inside the loop that
consumes them, so while a program waits at a grid barrier no new load is issued and HBM
idles once the few in flight land. Here one producer warp per program walks the same
tile sequence and issues each tile as a TMA copy into a ring of shared-memory slots as
soon as a slot is free, whatever the consumers are doing; the consumer warps wait on the
slot's mbarrier, multiply, and free the slot. Across a barrier the producer keeps
filling the ring, so the next matrix streams in while the vector is made whole.

Weights are read through 4-D descriptors [rows, chunks, 16, 256] (a TMA box has at most
256 elements a dimension): o, gate_up and qkv have one chunk a row, down three, so every
tile is [BLOCK_N, 1, 16, 256], BLOCK_N rows of one hidden-wide chunk.
"""

# ruff: noqa: E741, RUF005
from __future__ import annotations

import torch
from layer_stream import leader_sync_ptx, place, walk
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from jacana_engine.kernels._arrivals import arrival_counters
from jacana_engine.kernels._common import num_sms
from jacana_engine.kernels.activation import silu_mul_rounded
from jacana_engine.kernels.rmsnorm import rms_scale

COUNTERS = "layer_stream_ws"
# A kernel's ``vecs`` tuple ("_VECS order"): attention output, residual in, residual
# out, the post-attention and next RMSNorm weights, the o, gate_up and down scratch, qkv.
BOX = (16, 256)  # a hidden-wide chunk as TMA sees it (4096 = 16 x 256)


@gluon.jit
def _load_tile(descs, phase, row, chunk, bar, buf):
    """Start the TMA copy of matrix ``phase``'s tile at ``row`` (and hidden-wide ``chunk``
    of a down row) into ``buf``, completing ``bar``."""
    o_desc, gu_desc, d_desc, q_desc = descs
    if phase == 0:
        tma.async_copy_global_to_shared(o_desc, [row, 0, 0, 0], bar, buf)
    elif phase == 1:
        tma.async_copy_global_to_shared(gu_desc, [row, 0, 0, 0], bar, buf)
    elif phase == 2:
        tma.async_copy_global_to_shared(d_desc, [row, chunk, 0, 0], bar, buf)
    else:
        tma.async_copy_global_to_shared(q_desc, [row, 0, 0, 0], bar, buf)


@gluon.jit
def _producer(
    descs,
    bufs,
    ready,
    empty,
    H: gl.constexpr,
    I: gl.constexpr,
    QKV: gl.constexpr,
    BLOCK_N: gl.constexpr,
    INTERLEAVE: gl.constexpr,
):
    CHUNKS: gl.constexpr = I // H
    NUM_BUF: gl.constexpr = bufs.type.shape[0]
    tile_bytes: gl.constexpr = descs[0].block_type.nbytes
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    # layer_stream's walk and place are Triton functions: Gluon code may call them
    path, steps = walk(pid, programs, H, I, QKV, BLOCK_N, INTERLEAVE)
    for t in range(steps):
        slot = t % NUM_BUF
        mbarrier.wait(empty.index(slot), ((t // NUM_BUF) & 1) ^ 1)
        bar = ready.index(slot)
        buf = bufs.index(slot)
        mbarrier.expect(bar, tile_bytes)
        phase, chunk, block = place(t, path, CHUNKS)
        _load_tile(descs, phase, block * BLOCK_N, chunk, bar, buf)


_ARRIVE_AND_WAIT = gl.constexpr(leader_sync_ptx(arrive=True, block_barrier=False))
_WAIT = gl.constexpr(leader_sync_ptx(arrive=False, block_barrier=False))


@gluon.jit
def _leader_sync(ptr, target, PTX: gl.constexpr):
    """``leader_sync_ptx`` between two barriers of the consumer warps (a Gluon partition's
    barrier: PTX ``bar.sync 0`` would wait for the producer warp too)."""
    gl.thread_barrier()
    gl.inline_asm_elementwise(PTX, "=r,l,r", [ptr, target], dtype=gl.int32, is_pure=False, pack=1)
    gl.thread_barrier()


@gluon.jit
def _grid_barrier(counter_ptr, target, WAIT: gl.constexpr):
    """Arrive and wait for ``target`` arrivals; without ``WAIT`` only arrive (timing
    the barriers' cost)."""
    if WAIT:
        _leader_sync(counter_ptr, target, _ARRIVE_AND_WAIT)
    else:
        gl.thread_barrier()
        gl.atomic_add(counter_ptr, 1, sem="release")


@gluon.jit
def _layer_residual(o_ptr, res_in_ptr, d_ptr, ks, with_down, dtype: gl.constexpr):
    """The residual stream after attention (res_in + o), and after the MLP too (+ down)
    with ``with_down``, each sum rounded as HF rounds it."""
    h = (gl.load(o_ptr + ks).to(gl.float32) + gl.load(res_in_ptr + ks).to(gl.float32)).to(dtype)
    if with_down:
        h = (h.to(gl.float32) + gl.load(d_ptr + ks).to(gl.float32)).to(dtype)
    return h


@gluon.jit
def _phase_input(phase, vecs, eps, ks, which: gl.constexpr, H: gl.constexpr, I: gl.constexpr):
    """Chunk ``which`` of matrix ``phase``'s input vector (o, gate_up, down, qkv), from the
    scratch vectors the matrices before it wrote (complete by then). ``vecs``: the
    kernel's vectors (``_VECS`` order); ``eps``: (post-attention, next layer's)."""
    attn_ptr, res_in_ptr, _, g_post_ptr, g_next_ptr, o_ptr, gu_ptr, d_ptr, _ = vecs
    dtype: gl.constexpr = attn_ptr.dtype.element_ty
    if phase == 0:
        x = gl.load(attn_ptr + ks)
    elif phase == 2:
        gate = gl.load(gu_ptr + which * H + ks).to(gl.float32)
        x = silu_mul_rounded(gate, gl.load(gu_ptr + I + which * H + ks).to(gl.float32), dtype)
    else:
        hf = _layer_residual(o_ptr, res_in_ptr, d_ptr, ks, phase == 3, dtype).to(gl.float32)
        g = gl.where(phase == 3, g_next_ptr, g_post_ptr)
        rstd = gl.rsqrt(gl.sum(hf * hf, axis=0) / H + gl.where(phase == 3, eps[1], eps[0]))
        x = rms_scale(hf, rstd, gl.load(g + ks).to(gl.float32), dtype)
    return x


@gluon.jit
def _phase_inputs(phase, vecs, eps, ks, x1, x2, H: gl.constexpr, I: gl.constexpr):
    """(x0, x1, x2): matrix ``phase``'s input, chunk by chunk where it has several (down);
    ``x1`` and ``x2`` as given otherwise."""
    CHUNKS: gl.constexpr = I // H
    x0 = _phase_input(phase, vecs, eps, ks, 0, H, I)
    if phase == 2:
        if CHUNKS > 1:
            x1 = _phase_input(phase, vecs, eps, ks, 1, H, I)
        if CHUNKS > 2:
            x2 = _phase_input(phase, vecs, eps, ks, 2, H, I)
    return x0, x1, x2


@gluon.jit
def _out_ptr(phase, vecs):
    """Where matrix ``phase``'s product goes: the o, gate_up and down scratch, then qkv."""
    o_ptr, gu_ptr, d_ptr, qkv_ptr = vecs[5], vecs[6], vecs[7], vecs[8]
    return gl.where(
        phase == 0, o_ptr, gl.where(phase == 1, gu_ptr, gl.where(phase == 2, d_ptr, qkv_ptr))
    )


@gluon.jit
def _multiply_tile(
    bufs, empty, slot, x0, x1, x2, chunk, acc, TILE: gl.constexpr, BLOCK_N: gl.constexpr,
    H: gl.constexpr, COMPUTE: gl.constexpr,
):  # fmt: skip
    """A landed tile (its ready barrier waited on) times input chunk ``chunk``, its slot
    freed for the producer: the row sums [BLOCK_N], added to ``acc`` past chunk 0.
    Without ``COMPUTE`` the tile is not read (timing only)."""
    dtype: gl.constexpr = bufs.dtype
    if COMPUTE:
        flat = bufs.index(slot)._reinterpret(
            dtype, [BLOCK_N, H], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        )
        w = flat.load(TILE)
    else:
        w = gl.zeros([BLOCK_N, H], dtype, layout=TILE)
    fence_async_shared()
    mbarrier.arrive(empty.index(slot), count=1)
    x = gl.where(chunk == 0, x0, gl.where(chunk == 1, x1, x2)).to(gl.float32)
    part = gl.sum(w.to(gl.float32) * gl.expand_dims(x, 0), axis=1)  # [BLOCK_N]
    return gl.where(chunk == 0, part, acc + part)


@gluon.jit
def _consumer(
    vecs, eps, counter_ptr, bufs, ready, empty, H: gl.constexpr, I: gl.constexpr,
    QKV: gl.constexpr, BLOCK_N: gl.constexpr, NUM_WARPS: gl.constexpr, WAIT: gl.constexpr,
    COMPUTE: gl.constexpr, INTERLEAVE: gl.constexpr,
):  # fmt: skip
    CHUNKS: gl.constexpr = I // H
    NUM_BUF: gl.constexpr = bufs.type.shape[0]
    TILE: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, NUM_WARPS], [1, 0])  # [BLOCK_N, H]
    VEC: gl.constexpr = gl.SliceLayout(0, TILE)  # [H]
    ROWS: gl.constexpr = gl.SliceLayout(1, TILE)  # [BLOCK_N]
    attn_ptr, res_in_ptr, res_out_ptr, o_ptr, d_ptr = vecs[0], vecs[1], vecs[2], vecs[5], vecs[7]
    dtype: gl.constexpr = attn_ptr.dtype.element_ty
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    # layer_stream.walk, a Triton function: Gluon code may call one
    path, steps = walk(pid, programs, H, I, QKV, BLOCK_N, INTERLEAVE)
    s1, s2, s3 = path[0], path[1], path[2]
    ks = gl.arange(0, H, layout=VEC)
    rows = gl.arange(0, BLOCK_N, layout=ROWS)
    x0 = gl.load(attn_ptr + ks)  # written by the kernel before: launched after it
    x1 = x0
    x2 = x0
    acc = gl.zeros([BLOCK_N], gl.float32, layout=ROWS)
    for t in range(steps):
        if t == s1:
            _grid_barrier(counter_ptr, programs, WAIT)
            x0, x1, x2 = _phase_inputs(1, vecs, eps, ks, x1, x2, H, I)
        if t == s2:
            _grid_barrier(counter_ptr, 2 * programs, WAIT)
            x0, x1, x2 = _phase_inputs(2, vecs, eps, ks, x1, x2, H, I)
        if t == s3:
            _grid_barrier(counter_ptr, 3 * programs, WAIT)
            if pid == 0:
                h2 = _layer_residual(o_ptr, res_in_ptr, d_ptr, ks, True, dtype)
                gl.store(res_out_ptr + ks, h2)
            x0, x1, x2 = _phase_inputs(3, vecs, eps, ks, x1, x2, H, I)

        phase, chunk, block = place(t, path, CHUNKS)
        slot = t % NUM_BUF
        mbarrier.wait(ready.index(slot), (t // NUM_BUF) & 1)
        acc = _multiply_tile(bufs, empty, slot, x0, x1, x2, chunk, acc, TILE, BLOCK_N, H, COMPUTE)
        last = ((phase != 2) | (chunk == CHUNKS - 1)).to(gl.int32)
        out = _out_ptr(phase, vecs) + block * BLOCK_N + rows
        gl.store(out, acc.to(dtype), mask=rows * 0 + last > 0)

    gl.thread_barrier()
    arrived = gl.atomic_add(counter_ptr, 1, sem="acq_rel")
    if arrived == 4 * programs - 1:
        gl.store(counter_ptr, 0)


@gluon.jit
def _ring(desc, NUM_BUF: gl.constexpr):
    """The tile ring: NUM_BUF slots of ``desc``'s tile, and a ready and an empty mbarrier
    a slot (the producer's TMA completes ready; a consumer's read arrives on empty)."""
    bufs = gl.allocate_shared_memory(desc.dtype, [NUM_BUF] + desc.block_type.shape, desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return bufs, ready, empty


@gluon.jit
def _layer_stream_ws_kernel(
    vecs, eps, counter_ptr, o_desc, gu_desc, d_desc, q_desc, H: gl.constexpr,
    I: gl.constexpr, QKV: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr,
    NUM_WARPS: gl.constexpr, WAIT: gl.constexpr, COMPUTE: gl.constexpr,
    INTERLEAVE: gl.constexpr,
):  # fmt: skip
    """``vecs``: the "_VECS order" tuple; ``eps``: (post-attention, next layer's); the
    four matrices' descriptors (``_weight_descriptors``; Triton 3.6 launches none inside
    a tuple)."""
    descs = (o_desc, gu_desc, d_desc, q_desc)
    bufs, ready, empty = _ring(o_desc, NUM_BUF)
    gl.warp_specialize(
        [
            (
                _consumer,
                (
                    vecs,
                    eps,
                    counter_ptr,
                    bufs,
                    ready,
                    empty,
                    H,
                    I,
                    QKV,
                    BLOCK_N,
                    NUM_WARPS,
                    WAIT,
                    COMPUTE,
                    INTERLEAVE,
                ),
            ),
            (_producer, (descs, bufs, ready, empty, H, I, QKV, BLOCK_N, INTERLEAVE)),
        ],
        [1],
        [40],
    )


def _descriptor(weight: torch.Tensor, chunks: int, block_n: int, layout) -> TensorDescriptor:
    """[rows, chunks * 4096] as [rows, chunks, 16, 256], tiles of [block_n, 1, 16, 256]."""
    rows = weight.shape[0]
    shape = [rows, chunks, *BOX]
    strides = [weight.stride(0), BOX[0] * BOX[1], BOX[1], 1]
    return TensorDescriptor(weight, shape, strides, [block_n, 1, *BOX], layout)


_descs: dict[tuple, tuple] = {}


def _weight_descriptors(wo, wgu, wd, wqkv, block_n: int) -> tuple:
    """The four matrices' descriptors, made once per weight set (a graph replays them)."""
    key = (wo.data_ptr(), wgu.data_ptr(), wd.data_ptr(), wqkv.data_ptr(), block_n)
    if key not in _descs:
        layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=4)
        chunks = wd.shape[1] // wo.shape[1]
        _descs[key] = (
            _descriptor(wo, 1, block_n, layout),
            _descriptor(wgu, 1, block_n, layout),
            _descriptor(wd, chunks, block_n, layout),
            _descriptor(wqkv, 1, block_n, layout),
        )
    return _descs[key]


def _checked_sizes(attn, wd, wqkv) -> tuple[int, int, int]:
    """(hidden, intermediate, qkv width); raises ``ValueError`` unless the hidden size is
    the one the TMA box tiles (``BOX``)."""
    h = attn.shape[1]
    if h != BOX[0] * BOX[1]:
        raise ValueError(f"hidden size {h}: these kernels take {BOX[0] * BOX[1]}")
    return h, wd.shape[1], wqkv.shape[0]


def layer_stream_ws(
    attn,
    residual,
    wo,
    wgu,
    wd,
    wqkv,
    g_post,
    g_next,
    eps_post,
    eps_next,
    *,
    residual_out,
    qkv_out,
    scratch,
    block_n: int = 8,
    buffers: int = 3,
    num_warps: int = 8,
    max_registers: int | None = None,
    wait: bool = True,
    compute: bool = True,
    interleave: bool = False,
):
    """``layer_stream``'s contract, hidden size 4096 only, on an sm90 GPU (``interleave``:
    ``StreamConfig.interleave``)."""
    h, inter, qkv = _checked_sizes(attn, wd, wqkv)
    descs = _weight_descriptors(wo, wgu, wd, wqkv, block_n)
    o, gu, d = scratch
    counter = arrival_counters(COUNTERS, attn.device, 1)
    programs = min(num_sms(attn.device), h // block_n)
    vecs = (attn, residual, residual_out, g_post, g_next, o, gu, d, qkv_out)
    _layer_stream_ws_kernel[(programs,)](
        vecs,
        (eps_post, eps_next),
        counter,
        *descs,
        H=h,
        I=inter,
        QKV=qkv,
        BLOCK_N=block_n,
        NUM_BUF=buffers,
        NUM_WARPS=num_warps,
        WAIT=wait,
        COMPUTE=compute,
        INTERLEAVE=interleave,
        num_warps=num_warps,
        enable_fp_fusion=False,
        maxnreg=max_registers,
    )
    return qkv_out


# ---------------------------------------------------------------- dynamic tiles
# The same chain with the row blocks of each matrix handed out at run time: a producer
# claims the next row block of the current matrix from a counter, so programs that
# stream faster take more and every program finishes a matrix within about one tile of
# the others; a consumer waits, before a matrix's first tile, until the matrix before is
# complete (a count of consumed row blocks), not for a fixed share of every program.

_SENTINEL = gl.constexpr(-1)  # a ring slot's tile code: the producer is done


@gluon.jit
def _count_done(ptr):
    """After this program's stores of a row block: thread 0 adds one, with release order."""
    gl.thread_barrier()
    gl.inline_asm_elementwise(
        """{
        .reg .pred leader;
        .reg .u32 tid;
        mov.u32 tid, %tid.x;
        setp.eq.u32 leader, tid, 0;
        @leader red.release.gpu.global.add.s32 [$1], 1;
        mov.u32 $0, 0;
        }""",
        "=r,l",
        [ptr],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def _blocks(phase, H: gl.constexpr, I: gl.constexpr, QKV: gl.constexpr, BLOCK_N: gl.constexpr):
    """Row blocks of matrix ``phase`` (o, gate_up, down, qkv)."""
    return gl.where(
        phase == 0,
        H // BLOCK_N,
        gl.where(phase == 1, 2 * I // BLOCK_N, gl.where(phase == 2, H // BLOCK_N, QKV // BLOCK_N)),
    )


@gluon.jit
def _dyn_producer(
    descs,
    bufs,
    ready,
    empty,
    info,
    take_ptr,
    H: gl.constexpr,
    I: gl.constexpr,
    QKV: gl.constexpr,
    BLOCK_N: gl.constexpr,
):
    CHUNKS: gl.constexpr = I // H
    NUM_BUF: gl.constexpr = bufs.type.shape[0]
    ONE: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    tile_bytes: gl.constexpr = descs[0].block_type.nbytes
    t = 0
    phase = 0
    while phase < 4:
        block = gl.atomic_add(take_ptr + phase, 1)
        if block < _blocks(phase, H, I, QKV, BLOCK_N):
            chunks = gl.where(phase == 2, CHUNKS, 1)
            for c in range(chunks):
                slot = t % NUM_BUF
                mbarrier.wait(empty.index(slot), ((t // NUM_BUF) & 1) ^ 1)
                info.index(slot).store(
                    gl.full([1], phase * 16777216 + block * 4 + c, gl.int32, layout=ONE)
                )
                bar = ready.index(slot)
                buf = bufs.index(slot)
                mbarrier.expect(bar, tile_bytes)
                _load_tile(descs, phase, block * BLOCK_N, c, bar, buf)
                t += 1
        else:
            phase += 1
    slot = t % NUM_BUF
    mbarrier.wait(empty.index(slot), ((t // NUM_BUF) & 1) ^ 1)
    info.index(slot).store(gl.full([1], _SENTINEL, gl.int32, layout=ONE))
    mbarrier.arrive(ready.index(slot), count=1)


@gluon.jit
def _dyn_consumer(
    vecs, eps, counter_ptr, done_ptr, take_ptr, bufs, ready, empty, info, H: gl.constexpr,
    I: gl.constexpr, QKV: gl.constexpr, BLOCK_N: gl.constexpr, NUM_WARPS: gl.constexpr,
):  # fmt: skip
    CHUNKS: gl.constexpr = I // H
    NUM_BUF: gl.constexpr = bufs.type.shape[0]
    TILE: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, NUM_WARPS], [1, 0])
    VEC: gl.constexpr = gl.SliceLayout(0, TILE)
    ROWS: gl.constexpr = gl.SliceLayout(1, TILE)
    ONE: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])
    attn_ptr, res_in_ptr, res_out_ptr, o_ptr, d_ptr = vecs[0], vecs[1], vecs[2], vecs[5], vecs[7]
    dtype: gl.constexpr = attn_ptr.dtype.element_ty
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    ks = gl.arange(0, H, layout=VEC)
    rows = gl.arange(0, BLOCK_N, layout=ROWS)
    x0 = gl.load(attn_ptr + ks)
    x1 = x0
    x2 = x0
    cur = 0
    acc = gl.zeros([BLOCK_N], gl.float32, layout=ROWS)
    t = 0
    running = True
    while running:
        slot = t % NUM_BUF
        mbarrier.wait(ready.index(slot), (t // NUM_BUF) & 1)
        code = gl.max(info.index(slot).load(ONE), axis=0)
        if code < 0:
            mbarrier.arrive(empty.index(slot), count=1)
            running = False
        else:
            phase = code // 16777216
            block = (code % 16777216) // 4
            chunk = code % 4
            if phase != cur:  # the matrix before must be complete, then its input made
                _leader_sync(done_ptr + phase - 1, _blocks(phase - 1, H, I, QKV, BLOCK_N), _WAIT)
                x0, x1, x2 = _phase_inputs(phase, vecs, eps, ks, x1, x2, H, I)
                cur = phase
            acc = _multiply_tile(bufs, empty, slot, x0, x1, x2, chunk, acc, TILE, BLOCK_N, H, True)
            if (phase != 2) | (chunk == CHUNKS - 1):
                gl.store(_out_ptr(phase, vecs) + block * BLOCK_N + rows, acc.to(dtype))
                _count_done(done_ptr + phase)
        t += 1
    if pid == 0:  # the layer's residual: res_in + o + down, once down is complete
        _leader_sync(done_ptr + 2, _blocks(2, H, I, QKV, BLOCK_N), _WAIT)
        gl.store(res_out_ptr + ks, _layer_residual(o_ptr, res_in_ptr, d_ptr, ks, True, dtype))
    gl.thread_barrier()
    arrived = gl.atomic_add(counter_ptr, 1, sem="acq_rel")
    if arrived == programs - 1:  # everyone is out of the loop: ready for the next launch
        for p in gl.static_range(4):
            gl.store(done_ptr + p, 0)
            gl.store(take_ptr + p, 0)
        gl.store(counter_ptr, 0)


@gluon.jit
def _layer_stream_dyn_kernel(
    vecs, eps, counter_ptr, done_ptr, take_ptr, o_desc, gu_desc, d_desc, q_desc,
    H: gl.constexpr, I: gl.constexpr, QKV: gl.constexpr, BLOCK_N: gl.constexpr,
    NUM_BUF: gl.constexpr, NUM_WARPS: gl.constexpr,
):  # fmt: skip
    """``_layer_stream_ws_kernel``'s arguments, with the row blocks consumed (``done_ptr``)
    and claimed (``take_ptr``) of each matrix, [4] int32 each, zero between launches."""
    descs = (o_desc, gu_desc, d_desc, q_desc)
    bufs, ready, empty = _ring(o_desc, NUM_BUF)
    info = gl.allocate_shared_memory(gl.int32, [NUM_BUF, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    gl.warp_specialize(
        [
            (
                _dyn_consumer,
                (
                    vecs,
                    eps,
                    counter_ptr,
                    done_ptr,
                    take_ptr,
                    bufs,
                    ready,
                    empty,
                    info,
                    H,
                    I,
                    QKV,
                    BLOCK_N,
                    NUM_WARPS,
                ),
            ),
            (_dyn_producer, (descs, bufs, ready, empty, info, take_ptr, H, I, QKV, BLOCK_N)),
        ],
        [1],
        [40],
    )


def layer_stream_dyn(
    attn,
    residual,
    wo,
    wgu,
    wd,
    wqkv,
    g_post,
    g_next,
    eps_post,
    eps_next,
    *,
    residual_out,
    qkv_out,
    scratch,
    block_n: int = 8,
    buffers: int = 3,
    num_warps: int = 8,
):
    """``layer_stream_ws`` with row blocks handed out at run time."""
    h, inter, qkv = _checked_sizes(attn, wd, wqkv)
    descs = _weight_descriptors(wo, wgu, wd, wqkv, block_n)
    o, gu, d = scratch
    counters = arrival_counters(COUNTERS + "_dyn", attn.device, 9)
    vecs = (attn, residual, residual_out, g_post, g_next, o, gu, d, qkv_out)
    _layer_stream_dyn_kernel[(num_sms(attn.device),)](
        vecs,
        (eps_post, eps_next),
        counters[0:1],
        counters[1:5],
        counters[5:9],
        *descs,
        H=h,
        I=inter,
        QKV=qkv,
        BLOCK_N=block_n,
        NUM_BUF=buffers,
        NUM_WARPS=num_warps,
        num_warps=num_warps,
        enable_fp_fusion=False,
    )
    return qkv_out
