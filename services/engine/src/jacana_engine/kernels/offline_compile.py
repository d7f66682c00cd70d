"""Compile a Triton kernel for a GPU that is not here: its PTX and its resource usage.

The CUDA backend turns a kernel into PTX and a cubin (with the ``ptxas`` that ships in the
Triton wheel) without a device, so code generation can be checked on any machine: which
instructions a kernel's arithmetic became (a bf16 FMA where two roundings were meant),
whether its loads vectorize, how many registers a thread takes and so how many programs
fit on an SM at once. Run it outside the CPU interpreter (``TRITON_INTERPRET`` unset).

The launch specializations a real launch gets are given explicitly: constexprs by value,
and ``divisible`` arguments (16-byte aligned pointers, sizes and strides that are
multiples of 16), which is what lets a load of contiguous elements vectorize.
"""

from __future__ import annotations

import inspect
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HOPPER = GPUTarget("cuda", 90, 32)


@dataclass(frozen=True)
class SMLimits:
    """What one streaming multiprocessor holds (H100/H200 by default)."""

    registers: int = 65536
    register_unit: int = 256  # registers are handed to a warp in blocks of this many
    threads: int = 2048
    ctas: int = 32
    shared_bytes: int = 228 * 1024


def with_constexpr_defaults(fn, constexprs: dict[str, Any]) -> dict[str, Any]:
    """``constexprs`` plus the defaults of ``fn``'s constexpr parameters it leaves out (a
    launch compiles those as constants, not as arguments)."""
    defaults = {
        p.name: p.default
        for p in getattr(fn, "params", ())
        if p.is_constexpr and p.default is not inspect.Parameter.empty
    }
    return defaults | constexprs


def signature_for(
    fn, constexprs: dict[str, Any], *, pointers: dict[str, str] | None = None,
    floats: tuple[str, ...] = (),
) -> dict[str, str]:  # fmt: skip
    """``fn``'s signature: constexprs as such (those with defaults too, as a launch that
    leaves them out compiles them), ``*_ptr`` arguments ``*bf16`` unless named in
    ``pointers``, the ``floats`` ``fp32``, every other argument ``i32``."""
    pointers = pointers or {}
    constexprs = with_constexpr_defaults(fn, constexprs)
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, "*bf16")
        elif name in floats:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    return signature


def compile_for(
    fn, signature: dict[str, str], constexprs: dict[str, Any], *,
    divisible: tuple[str, ...] = (), target: GPUTarget = HOPPER, **options: Any,
):  # fmt: skip
    """The compiled kernel (``.asm["ptx"]``, ``.asm["cubin"]``, ``.metadata``); ``options``
    are launch options such as ``num_warps``, ``num_stages``, ``enable_fp_fusion``."""
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible}
    constexprs = with_constexpr_defaults(fn, constexprs)
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=target, options=options)


def compile_skinny(
    cfg, *, gated: bool = False, target: GPUTarget = HOPPER,
    constexprs: dict[str, Any] | None = None,
):  # fmt: skip
    """The skinny GEMM kernel that launch config ``cfg`` (a ``SkinnyConfig``, PDL as
    asked) runs (``kernels/skinny_gemm/``: tile, folded or activating) at one bf16 row,
    compiled as a launch on 16-byte aligned tensors with sizes and strides of 16s would
    specialize it; ``constexprs`` overrides the kernel's others."""
    from jacana_engine.kernels.skinny_gemm import activating, folded, tile

    shared = dict(BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PDL=cfg.pdl)
    if cfg.activates:
        fn = activating._activating_kernel
        own = dict(FOLD=cfg.k_fold, PEEL=int(cfg.pdl))
    elif cfg.k_fold > 1:
        fn = folded._folded_kernel
        own = dict(FOLD=cfg.k_fold, GATED=gated, PEEL=int(cfg.pdl))
    else:
        fn = tile._tile_kernel
        own = dict(
            M=1, BLOCK_M=cfg.block_m, USE_DOT=cfg.use_dot, PRECISION="tf32", GATED=gated,
            PEEL=cfg.prefetch_tiles if cfg.pdl else 0, LOOKAHEAD=cfg.lookahead,
        )  # fmt: skip
    constexprs = shared | own | (constexprs or {})
    signature = signature_for(fn, constexprs)
    divisible = tuple(n for n, t in signature.items() if t not in ("constexpr", "fp32"))
    return compile_for(
        fn, signature, constexprs, divisible=divisible, target=target,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def ptx_count(kernel, instruction: str) -> int:
    """How many PTX lines of ``kernel`` hold ``instruction`` (e.g. ``fma.rn.bf16``)."""
    return sum(instruction in line for line in kernel.asm["ptx"].splitlines())


def registers_per_thread(kernel) -> int:
    """Registers per thread of the cubin, as ``cuobjdump --dump-resource-usage`` reads it."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run(
            [str(cuobjdump), "--dump-resource-usage", str(path)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    for line in usage.splitlines():
        if "REG:" in line:
            return int(line.split("REG:")[1].split()[0])
    raise ValueError(f"no register count in cuobjdump's output: {usage[-500:]}")


def ctas_per_sm(registers: int, threads: int, shared_bytes: int, sm: SMLimits = SMLimits()) -> int:
    """Programs of ``threads`` threads that fit on one SM at once, by registers (allocated
    per warp in ``register_unit`` blocks), threads, CTA slots and shared memory."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // sm.register_unit) * sm.register_unit
    by_registers = sm.registers // (per_warp * warps) if registers else sm.ctas
    by_shared = sm.shared_bytes // shared_bytes if shared_bytes else sm.ctas
    return min(by_registers, sm.threads // (warps * 32), sm.ctas, by_shared)
