"""Every Triton kernel of the selection, compiled for a GPU without launching it.

Triton's compiler runs on any machine: :func:`compile_all` lowers each kernel of
:mod:`bench.comm.mstopk_triton` with the argument types and constants its launcher uses
(float32 and bfloat16 inputs) for a target GPU (default: the H200's sm_90) through every
stage to the binary, timing each.  A lowering error is then found on a CPU, before any GPU
time is spent.  Needs torch and Triton only.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from typing import Any

INPUTS = ("fp32", "bf16")  # the gradient dtypes the kernels read (the x_ptr argument)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel as its launcher calls it: argument types, constants, launch options."""

    name: str
    signature: dict[str, str]  # argument -> Triton type ("*fp32", "i32", "constexpr")
    constants: dict[str, Any]
    options: dict[str, Any]
    reads_input: bool = False  # x_ptr takes the gradient's own dtype


def specs() -> list[Kernel]:
    """The kernels of ``mstopk_triton`` with the arguments their launchers pass."""
    from bench.comm import mstopk_triton as mt
    from bench.comm.selection_tiled import BINS1, FINE, SHIFT1, SHIFT2

    c = "constexpr"
    return [
        Kernel(
            "_colmax_kernel",
            {"x_ptr": "*fp32", "out_ptr": "*fp32", "rows": "i32", "cols": "i32", "BLOCK": c},
            {"BLOCK": mt.BLOCK},
            {"num_warps": 4},
            reads_input=True,
        ),
        Kernel(
            "_count_ge_kernel",
            {"x_ptr": "*fp32", "f_ptr": "*fp64", "i_ptr": "*i64", "n": "i32", "BLOCK": c},
            {"BLOCK": mt.COUNT_BLOCK},
            {"num_warps": 8},
        ),
        Kernel(
            "_paper_step_kernel",
            {"f_ptr": "*fp64", "i_ptr": "*i64", "k": "i32"},
            {},
            {"num_warps": 1, "enable_fp_fusion": False},
        ),
        Kernel(
            "_colmax_hist_kernel",
            {
                "x_ptr": "*fp32",
                "out_ptr": "*fp32",
                "hist_ptr": "*i32",
                "rows": "i32",
                "cols": "i32",
                "BLOCK": c,
                "BINS": c,
                "SHIFT": c,
            },
            {"BLOCK": mt.HIST_BLOCK, "BINS": BINS1, "SHIFT": SHIFT1},
            {"num_warps": 8},
            reads_input=True,
        ),
        Kernel(
            "_refine_kernel",
            {
                "colmax_ptr": "*fp32",
                "b1_ptr": "*i32",
                "fine_ptr": "*i32",
                "cols": "i32",
                "BLOCK": c,
                "SHIFT1": c,
                "SHIFT2": c,
                "FINE": c,
            },
            {"BLOCK": mt.BLOCK, "SHIFT1": SHIFT1, "SHIFT2": SHIFT2, "FINE": FINE},
            {"num_warps": 4},
        ),
        Kernel(
            "_compact_kernel",
            {
                "x_ptr": "*fp32",
                "colmax_ptr": "*fp32",
                "thr_ptr": "*fp32",
                "abs_ptr": "*fp32",
                "idx_ptr": "*i64",
                "count_ptr": "*i64",
                "rows": "i32",
                "cols": "i32",
                "cap": "i32",
                "BLOCK": c,
                "ROWS": c,
            },
            {"BLOCK": mt.COMPACT_BLOCK, "ROWS": 16},  # up to 16 rows (rows_for's tiles)
            {"num_warps": 4},
            reads_input=True,
        ),
    ]


def compile_one(spec: Kernel, dtype: str = "fp32", arch: int = 90) -> dict[str, Any]:
    """Compile ``spec`` with ``x_ptr`` of ``dtype`` for ``sm_<arch>``: its row (seconds,
    the stages made, or the error)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bench.comm import mstopk_triton as mt

    sig = dict(spec.signature)
    if spec.reads_input:
        sig["x_ptr"] = f"*{dtype}"
    src = ASTSource(getattr(mt, spec.name), sig, constexprs=dict(spec.constants))
    row: dict[str, Any] = {"what": "compile", "kernel": spec.name, "input": dtype}
    row["target"] = f"sm_{arch}"
    t0 = time.perf_counter()
    try:
        out = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=spec.options)
    except Exception as e:  # noqa: BLE001 - the row says what failed
        row.update(ok=False, seconds=time.perf_counter() - t0, error=f"{type(e).__name__}: {e}")
        return row
    row.update(ok=True, seconds=time.perf_counter() - t0, stages=",".join(out.asm))
    return row


def compile_all(arch: int = 90, fresh: bool = True) -> list[dict[str, Any]]:
    """:func:`compile_one` of every kernel, for each input dtype it reads; ``fresh``: in an
    empty Triton cache, so that the seconds are the compiler's, not a cache read."""
    cases = [(s, d) for s in specs() for d in (INPUTS if s.reads_input else ("fp32",))]
    if not fresh:
        return [compile_one(s, d, arch) for s, d in cases]
    old = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="triton-") as tmp:
        os.environ["TRITON_CACHE_DIR"] = tmp
        try:
            return [compile_one(s, d, arch) for s, d in cases]
        finally:
            if old is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = old
