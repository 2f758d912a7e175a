"""The deferred numerics of a tensor in one pass: a fused Triton reduction (#26 part 2).

The native core (csrc/numerics.cpp) reduces a tensor off the CPU without a host sync
and reads the results once per step. With ATen ops that takes five ops per tensor
(several passes); with :func:`launch`, one kernel launch and one pass: per block of
the tensor, the abs-max and the sum of squares (float64: a float32 value squared
cannot overflow there) over its finite elements, and its counts of NaN and of ±inf,
folded with atomics into the call's row of a per-step buffer the core hands out
(float64, four columns: ``ABSMAX, SUMSQ, NANS, INFS``; zeroed by the core, one launch
per 1024 rows). The core derives from a row exactly what the ATen path gives:
abs-max and sum of squares are NaN when a NaN was seen, else inf when an inf was,
else the finite ones; the non-finite count is ``NANS + INFS``.

:func:`register` hands :func:`launch` to the core (``_C.set_numerics_fused``); the
recorder does so only for a model on a CUDA device, when ``triton`` imports (it is
imported here, lazily: never on a CPU-only run) and ``HOOKTRACE_NUMERICS_FUSED`` is
not ``0``. On the first launch that raises
(e.g. Triton cannot compile for this GPU), the core unregisters it, takes the ATen
path for the rest of the process and says why in ``info["numerics"]``.

``TRITON_INTERPRET=1`` (or ``make_launcher(interpret=True)``) runs the kernel on CPU
tensors: tests register it with ``cpu=True`` to check it against a Python reference.
Input: a float32, bfloat16 or float16 tensor whose elements fill one dense range of
memory (contiguous, or any permutation of a contiguous tensor: the statistics do not
depend on the order); the core copies other layouts (``contiguous()``) first.
"""

from __future__ import annotations

import os
from typing import Any

import triton
import triton.language as tl

# the columns of a row of the per-step buffer
ABSMAX, SUMSQ, NANS, INFS = 0, 1, 2, 3
BLOCK = 4096  # elements per program (1024 in the interpreter: it is slow)



def _numerics_row(x_ptr, out_ptr, row, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    """One block of x: its finite abs-max and sum of squares, its NaN and ±inf
    counts, folded into ``out[row]``; a plain function, made a kernel by
    :func:`make_launcher` (compiled, or interpreted)."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    is_nan = x != x
    is_inf = tl.abs(x) > 3.4028234663852886e38  # (False for NaN)
    a = tl.where(is_nan | is_inf, 0.0, tl.abs(x))
    d = a.to(tl.float64)
    out = out_ptr + row * 4
    tl.atomic_max(out + 0, tl.max(a, axis=0).to(tl.float64))
    tl.atomic_add(out + 1, tl.sum(d * d, axis=0))
    nans = tl.sum(is_nan.to(tl.int32), axis=0)
    infs = tl.sum(is_inf.to(tl.int32), axis=0)
    if nans > 0:
        tl.atomic_add(out + 2, nans.to(tl.float64))
    if infs > 0:
        tl.atomic_add(out + 3, infs.to(tl.float64))


class FusedLauncher:
    """``launcher(x, out, row)``: one kernel over the dense tensor ``x`` (float32,
    bfloat16 or float16), folded into ``out[row]`` (``out``: float64, 4 columns, on
    x's device). ``kernel``: the Triton kernel (compiled, or interpreted)."""

    def __init__(self, interpret: bool | None = None) -> None:
        if interpret is None:
            interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        if interpret:
            from triton.runtime.interpreter import InterpretedFunction

            self.kernel: Any = InterpretedFunction(_numerics_row, do_not_specialize=["row"])
            self.block = 1024
        else:
            self.kernel = triton.jit(_numerics_row, do_not_specialize=["row"])
            self.block = BLOCK

    def __call__(self, x: Any, out: Any, row: int) -> None:
        n = x.numel()
        # (fp fusion: asked for, else Triton 3.9 warns that its default changes)
        self.kernel[(triton.cdiv(n, self.block),)](x, out, row, n, BLOCK=self.block,
                                                   enable_fp_fusion=False)


def make_launcher(interpret: bool | None = None) -> FusedLauncher:
    """A launcher (:class:`FusedLauncher`); ``interpret``: the Triton interpreter (CPU
    tensors; the tl functions work there only when ``TRITON_INTERPRET=1`` was set
    before triton was imported); default: ``TRITON_INTERPRET`` in the environment."""
    return FusedLauncher(interpret)


_launchers: dict[bool | None, FusedLauncher] = {}  # (one kernel object: compiled once)


def register(cpu: bool = False, interpret: bool | None = None) -> None:
    """Hands a launcher to the native core (``cpu``: for CPU tensors too, with the
    interpreter; tests). Raises ImportError when triton is not installed."""
    import hooktrace._C as _C

    launcher = _launchers.get(interpret)
    if launcher is None:
        launcher = _launchers[interpret] = make_launcher(interpret)
    _C.set_numerics_fused(launcher, cpu)


def unregister() -> None:
    import hooktrace._C as _C

    _C.set_numerics_fused(None, False)
