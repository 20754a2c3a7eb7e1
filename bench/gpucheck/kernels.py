"""Every Triton kernel of :mod:`bench.comm.mstopk_triton` compiled for a GPU (sm_90) on any
machine, with its launcher's types and constants: a lowering error is found on a CPU."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from typing import Any
from unittest import mock

INPUTS = ("fp32", "bf16")  # the gradient dtypes the kernels read


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel as its launcher calls it: argument types, constants, launch options."""

    name: str
    signature: dict[str, str]  # argument -> Triton type ("*fp32", "i32", "constexpr")
    constants: dict[str, Any]
    options: dict[str, Any]
    inputs: tuple[str, ...] = ()  # the arguments that take the gradient's own dtype
    variant: str = ""  # which of the launcher's constant sets, on the row
    dtypes: tuple[str, ...] = INPUTS  # the gradient dtypes compiled for (with ``inputs``)


def _sig(fn: Any, types: str) -> dict[str, str]:
    """``fn``'s arguments with the space-separated Triton ``types`` (``c``: constexpr)."""
    return {
        a: "constexpr" if t == "c" else t for a, t in zip(fn.arg_names, types.split(), strict=True)
    }


def specs() -> list[Kernel]:
    """The kernels as launched: the paper's search, each constant set of the radix path."""
    from bench.comm import mstopk_triton as mt

    x = ("x_ptr",)
    out = [
        Kernel("_count_ge_kernel", _sig(mt._count_ge_kernel, "*fp32 *fp64 *i64 i32 c"),
               {"BLOCK": mt.COUNT_BLOCK}, {"num_warps": 8}),
        Kernel("_paper_step_kernel", _sig(mt._paper_step_kernel, "*fp64 *i64 i32"), {},
               {"num_warps": 1, "enable_fp_fusion": False}),
    ]  # fmt: skip
    w8 = {"num_warps": 8}
    group = _sig(mt._group_kernel, "*fp32 *fp32 *i32 *i64 i32 i32 i32 c c c")
    take = _sig(mt._take_kernel, "*i32 *fp32 *i32 *i32 *i64 i32 i32 i32 i32 c c")
    # groups of 64 bytes: 16 float32, 32 bfloat16; single elements at high density
    for g, add, dtypes in ((16, False, ("fp32",)), (16, True, ("fp32",)), (32, False, ("bf16",)),
                           (32, True, ("bf16",)), (1, False, INPUTS)):  # fmt: skip
        consts = {"HAS_ADD": add, "G": g, "GB": mt.TILE // g}
        label = f"G={g}" + (" +add" if add else "")
        out.append(Kernel("_group_kernel", group, consts, w8, x + ("add_ptr",), label, dtypes))
    for g, dtypes in ((16, ("fp32",)), (32, ("bf16",)), (1, INPUTS)):
        consts = {"G": g, "GB": mt.TILE // g}
        out.append(Kernel("_take_kernel", take, consts, w8, x, f"G={g}", dtypes))
    passes = _sig(mt._pass_kernel, "*i32 *i64 i32 i32 i32 c c")
    for counted in (False, True):
        consts = {"COUNTED": counted, "BLOCK": mt.KEY_BLOCK}
        out.append(Kernel("_pass_kernel", passes, consts, w8, (), f"counted={counted}"))
    outk = _sig(mt._out_kernel, "*i32 *i32 *fp32 *i64 *i64 *fp32 *u8 i32 c c")
    for every in (False, True):
        consts = {"ALL": every, "BLOCK": mt.OUT_BLOCK}
        out.append(Kernel("_out_kernel", outk, consts, {"num_warps": 4}, ("x_ptr", "oval_ptr"),
                          "all" if every else "select"))  # fmt: skip
    return out


def compile_one(spec: Kernel, dtype: str = "fp32", arch: int = 90) -> dict[str, Any]:
    """Compile ``spec``, its ``inputs`` of ``dtype``, for ``sm_<arch>``: its row."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bench.comm import mstopk_triton as mt

    sig = dict(spec.signature)
    for arg in spec.inputs:
        sig[arg] = f"*{dtype}"
    src = ASTSource(getattr(mt, spec.name), sig, constexprs=dict(spec.constants))
    row: dict[str, Any] = {"what": "compile", "kernel": spec.name, "input": dtype}
    if spec.variant:
        row["variant"] = spec.variant
    row["target"] = f"sm_{arch}"
    t0 = time.perf_counter()
    try:
        out = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=spec.options)
    except Exception as e:  # noqa: BLE001 - the row says what failed
        row.update(ok=False, seconds=time.perf_counter() - t0, error=f"{type(e).__name__}: {e}")
        return row
    row.update(ok=True, seconds=time.perf_counter() - t0, stages=",".join(out.asm))
    return row


def compile_all(arch: int = 90) -> list[dict[str, Any]]:
    """Every kernel for each input dtype it reads, in an empty Triton cache (the compiler's
    seconds, not a cache read)."""
    cases = [(s, d) for s in specs() for d in (s.dtypes if s.inputs else ("fp32",))]
    with tempfile.TemporaryDirectory(prefix="triton-") as tmp:
        with mock.patch.dict(os.environ, {"TRITON_CACHE_DIR": tmp}):
            return [compile_one(s, d, arch) for s, d in cases]
