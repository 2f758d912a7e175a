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

Launched from C++ (issue #50): Triton's Python launcher costs ~24 us of host time per
tensor (+14.6 % per step on GPT-2 124M, H200). On a CUDA tensor, the launcher compiles
the variant the tensor takes (its dtype; its pointer and size aligned to 16 or not) once
with ``triton.compile`` for the current GPU and hands the cubin to the core
(``_C.set_numerics_kernel``), which loads it with ``cuModuleLoadData`` and queues every
later tensor of that variant with ``cuLaunchKernel`` itself, without Python or the GIL
(csrc/numerics_launch.h: why not batched per phase, the parameter layout). Any failure
(a compile, the driver, a launch) falls back to this launcher, with one line
(``info["numerics"]["native_note"]``) and a count; ``HOOKTRACE_NUMERICS_NATIVE=0`` turns
the C++ launch off.

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


# The variants the core launches (csrc/numerics_launch.h numerics_kernel_key): key =
# 2 * dtype + (0: x 16-byte aligned and numel a multiple of 16, Triton's vector loads;
# 1: any). The signature is fixed (row 32-bit: < 1024; n 64-bit), not specialized per
# call as Triton's launcher does, so one cubin serves every tensor of the variant.
NATIVE_DTYPES = ("fp32", "bf16", "fp16")
NATIVE_KEYS = len(NATIVE_DTYPES) * 2


def native_signature(key: int) -> tuple[dict[str, str], dict[Any, list[list[Any]]]]:
    """The signature and the alignment attributes variant ``key`` is compiled with."""
    sig = {"x_ptr": f"*{NATIVE_DTYPES[key // 2]}", "out_ptr": "*fp64", "row": "i32",
           "n": "i64", "BLOCK": "constexpr"}
    attrs: dict[Any, list[list[Any]]] = {(1,): [["tt.divisibility", 16]]}  # (the buffer)
    if key % 2 == 0:
        attrs.update({(0,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]]})
    return sig, attrs


def param_layout(ptx: str, name: str) -> str:
    """The kernel's parameters as the core packs them (csrc/numerics_launch.h), read
    from its PTX: ``p`` a pointer, ``i`` 32 bits, ``l`` 64 bits, ``?`` another kind;
    e.g. ``ppilpp`` (x, out, row, n, then Triton's two hidden scratch pointers)."""
    start = ptx.find(f".entry {name}(")
    if start < 0:
        raise ValueError(f"no entry point {name} in the PTX")
    end = ptx.find(")", start)
    params = [line.strip() for line in ptx[start:end].splitlines()[1:]
              if line.strip().startswith(".param")]
    return "".join("p" if ".ptr" in line else
                   "l" if {".u64", ".b64", ".s64"} & set(line.split()) else
                   "i" if {".u32", ".b32", ".s32"} & set(line.split()) else "?" for line in params)


def compile_native(kernel: Any, key: int, target: Any = None) -> dict[str, Any]:
    """Variant ``key`` of the kernel compiled for ``target`` (default: the current GPU)
    as ``_C.set_numerics_kernel`` takes it: image (cubin), name, layout, num_warps,
    shared, block. Raises ValueError for a kernel the core would not launch as it is
    (a scratch buffer, clusters, cooperative or PDL launch, parameters it does not
    pack), and Triton's own errors."""
    from triton.compiler import ASTSource

    if target is None:
        target = triton.runtime.driver.active.get_current_target()
    sig, attrs = native_signature(key)
    src = ASTSource(kernel, signature=sig, constexprs={"BLOCK": BLOCK}, attrs=attrs)
    compiled = triton.compile(src, target=target, options={"enable_fp_fusion": False})
    md = compiled.metadata
    extras = {f: getattr(md, f, 0) for f in ("global_scratch_size", "profile_scratch_size",
                                             "launch_cooperative_grid", "launch_pdl")}
    if getattr(md, "num_ctas", 1) != 1 or any(extras.values()):
        raise ValueError(f"the kernel needs a launch the core does not make: {extras}, "
                         f"num_ctas {getattr(md, 'num_ctas', 1)}")
    layout = param_layout(compiled.asm["ptx"], md.name)
    return {"image": compiled.asm["cubin"], "name": md.name, "layout": layout,
            "num_warps": int(md.num_warps), "shared": int(md.shared), "block": BLOCK}


# Why the C++ launch is not used (a compile that failed, the first only): one line for
# info["numerics"]["native_note"]; how many variants failed to compile.
native_compile_failures: list[str] = []


class FusedLauncher:
    """``launcher(x, out, row)``: one kernel over the dense tensor ``x`` (float32,
    bfloat16 or float16), folded into ``out[row]`` (``out``: float64, 4 columns, on
    x's device). ``kernel``: the Triton kernel (compiled, or interpreted). ``native``
    (default: on unless ``HOOKTRACE_NUMERICS_NATIVE=0``; never in the interpreter):
    compile the variant a CUDA tensor takes for the core, which launches it from C++
    from then on; this launcher is called only for what the core could not launch."""

    def __init__(self, interpret: bool | None = None, native: bool | None = None) -> None:
        if interpret is None:
            interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        if native is None:
            native = os.environ.get("HOOKTRACE_NUMERICS_NATIVE", "") != "0"
        self.native = native and not interpret
        self.native_tried: set[int] = set()  # variants compiled (or that failed to)
        if interpret:
            from triton.runtime.interpreter import InterpretedFunction

            self.kernel: Any = InterpretedFunction(_numerics_row, do_not_specialize=["row"])
            self.block = 1024
        else:
            self.kernel = triton.jit(_numerics_row, do_not_specialize=["row"])
            self.block = BLOCK

    def native_takes(self, x: Any) -> bool:
        """Whether the core's C++ launch is for ``x`` (a CUDA tensor)."""
        return bool(x.is_cuda)

    def native_spec(self, key: int, x: Any) -> dict[str, Any]:
        """Variant ``key`` compiled for x's GPU (the core's device guard made it current)."""
        return compile_native(self.kernel, key)

    def __call__(self, x: Any, out: Any, row: int) -> None:
        if self.native and self.native_takes(x) and self._launch_native(x, out, row):
            return
        n = x.numel()
        # (fp fusion: asked for, else Triton 3.9 warns that its default changes)
        self.kernel[(triton.cdiv(n, self.block),)](x, out, row, n, BLOCK=self.block,
                                                   enable_fp_fusion=False)

    def _launch_native(self, x: Any, out: Any, row: int) -> bool:
        """The first tensor of a variant: compiles it for the core and launches it from
        C++ (the core launches the later ones without calling here). False: this
        launcher launches it (the variant failed to compile: one line, kept)."""
        import hooktrace._C as _C

        key = _C.numerics_kernel_key(x)
        if key < 0:
            return False
        if key not in self.native_tried:
            self.native_tried.add(key)
            try:
                spec = self.native_spec(key, x)
                _C.set_numerics_kernel(key, **spec)
            except Exception as e:  # (Triton's API, a target it cannot compile for)
                line = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                native_compile_failures.append(f"variant {key} did not compile: {line}")
                return False
        return bool(_C.numerics_launch_native(x, out, row))


def make_launcher(interpret: bool | None = None, native: bool | None = None) -> FusedLauncher:
    """A launcher (:class:`FusedLauncher`); ``interpret``: the Triton interpreter (CPU
    tensors; the tl functions work there only when ``TRITON_INTERPRET=1`` was set
    before triton was imported); default: ``TRITON_INTERPRET`` in the environment.
    ``native``: the core launches the kernel from C++ (CUDA tensors)."""
    return FusedLauncher(interpret, native)


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
