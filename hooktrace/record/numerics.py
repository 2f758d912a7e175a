"""``numerics=True``: numeric health per module call (csrc/numerics.cpp): abs-max, RMS
and the count of non-finite values of every call's floating-point output, and of the
gradient of its inputs in backward. ``numerics_every=N`` measures steps 0, N, 2N, ...
only; statistics of off-CPU tensors are deferred and read once per step mark and at the
end. The first non-finite value is named on stderr (and dumped with
``dump_on=("nonfinite",)``). On a CUDA model the deferred statistics take one fused
Triton kernel per tensor when ``triton`` imports (record/fused_numerics.py;
``info["numerics"]["deferred_path"]`` says which). Reading them:
:mod:`hooktrace.analysis.numerics`."""

from __future__ import annotations

import os
import sys
from typing import Any

from hooktrace.record.component import Component, Option, Options, positive_int

__all__ = ["NumericsComponent"]


class NumericsComponent(Component):
    OPTIONS = (
        Option("numerics", False, "also record each module call's output abs-max, RMS and "
               "non-finite count, and of the gradient of its inputs (as trace(model, "
               "numerics=True)); the first NaN/Inf is named on stderr and in hooktrace "
               "summary --json (first_nonfinite)", cli="switch"),
        Option("numerics_every", 1, "with numerics, measure steps 0, N, 2N, ... only "
               "(default: every step)", check=positive_int("steps"), cli="int",
               flag_help="with --numerics, measure steps 0, N, 2N, ... only (default: every "
                         "step)"),
    )

    @classmethod
    def from_flags(cls, values: dict[str, Any]) -> None:
        if "nonfinite" in (values.get("dump_on") or ()):  # --dump-on nonfinite
            values["numerics"] = True

    @classmethod
    def check(cls, options: Options) -> None:
        if "nonfinite" in options.dump_on and not options.numerics:
            raise ValueError("dump_on='nonfinite' needs numerics=True (the values are checked "
                             "only then)")

    def __init__(self, recorder: Any) -> None:
        super().__init__(recorder)
        self._fused_reason: str | None = None  # why the deferred numerics are not fused
        self._native_at_start: dict[str, Any] = {}

    def prepare(self, session: Any, scope: Any) -> None:
        import hooktrace._C as _C

        self._fused_reason = _use_fused_numerics(scope)  # (process-wide, harmless)
        self._native_at_start = _C.numerics_native_state()  # (process-wide counters)

    def install(self, session: Any, scope: Any) -> None:
        self._session = session
        session.set_nonfinite_callback(self._on_first_nonfinite)
        session.set_numerics(True)  # step 0 is always measured

    def before_step(self) -> None:
        # the step's deferred statistics (off-CPU tensors, csrc/numerics.h): one read for
        # the step; at the end (flush) the same, while the session still records
        import hooktrace._C as _C

        _C.flush_numerics(self._session)

    flush = before_step

    def step(self, step_no: int) -> None:
        every = self.recorder.options.numerics_every
        if every > 1:
            self._session.set_numerics(step_no % every == 0)  # sampling

    def teardown(self) -> None:
        import hooktrace._C as _C

        session = self._session
        session.set_numerics(False)
        session.set_nonfinite_callback(None)
        _C.forget_numerics(session)

    def run_info(self, info: dict[str, Any]) -> None:
        info["numerics"] = {"every": self.recorder.options.numerics_every,
                            "backward": "input gradients",
                            **_deferred_path(self._fused_reason, self._native_at_start)}

    def _on_first_nonfinite(self, slot: int, backward: bool) -> None:
        """Called once by the native core (numerics.cpp), with the GIL, when the first
        non-finite value is seen: one line on stderr, and a dump if asked. The summary's
        ``first_nonfinite`` (hooktrace.analysis.numerics) is computed from the events, which also
        name the call and pick the innermost module of a tie."""
        recorder = self.recorder
        table = recorder.scope.modules_table()
        name = (table[slot][0] or "<root>") if slot < len(table) else f"<module {slot}>"
        phase, what = ("backward", "gradient of its inputs") if backward else ("forward", "output")
        print(f"hooktrace: first non-finite value: {name} {phase} ({what}), step "
              f"{recorder.current_step}", file=sys.stderr)
        recorder.dump_if_asked("nonfinite")


def _use_fused_numerics(scope: Any) -> str | None:
    """Hands the fused Triton reduction (record/fused_numerics.py) to the native core
    for the deferred numerics, when the traced model is on a CUDA device (a global
    trace: when CUDA is available), ``triton`` imports and ``HOOKTRACE_NUMERICS_FUSED``
    is not ``0``; else returns why not.
    Triton is imported only then (never on a CPU-only run). A launcher already
    registered (by an earlier trace, or a test) is kept; after a failure of the fused
    kernel in this process, the ATen ops stay in charge."""
    import torch

    import hooktrace._C as _C

    registered, error = _C.numerics_fused_state()
    if registered:
        return None
    if os.environ.get("HOOKTRACE_NUMERICS_FUSED", "") == "0":
        return "turned off (HOOKTRACE_NUMERICS_FUSED=0)"
    if error is not None:
        return f"the fused kernel failed earlier in this process ({error})"
    if not torch.cuda.is_available():
        return "no CUDA device: on the CPU each call's statistics are read at once"
    if scope.kind == "model":
        model = scope.model()
        on_cuda = any(t.is_cuda for t in (*model.parameters(), *model.buffers()))
        if not on_cuda:
            return "the model is not on a CUDA device"
    try:
        from hooktrace.record import fused_numerics

        fused_numerics.register()
    except Exception as e:  # (not installed, or an import that fails on this system)
        return f"triton is not usable ({type(e).__name__}: {e})".splitlines()[0]
    return None


def _native_info(at_start: dict[str, Any]) -> dict[str, Any]:
    """The fused kernel's launch from C++ in this run (issue #50): ``native_launches``
    (tensors the core launched itself), ``native_fallbacks`` (tensors a compiled variant
    could not take, and variants that did not compile: Triton's launcher took them)
    and, where there was one, ``native_note``: the first failure, one line."""
    import hooktrace._C as _C

    st = _C.numerics_native_state()
    fused = sys.modules.get("hooktrace.record.fused_numerics")
    failures: list[str] = getattr(fused, "native_compile_failures", [])
    out: dict[str, Any] = {
        "native_launches": int(st["launches"]) - int(at_start.get("launches", 0)),
        "native_fallbacks": int(st["fallbacks"]) - int(at_start.get("fallbacks", 0)) + len(failures)}
    note = st["error"] or (failures[0] if failures else None)
    if note:
        out["native_note"] = f"Triton's launcher took over: {note}"
    return out


def _deferred_path(reason: str | None, native_at_start: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """``info["numerics"]``'s word on the deferred (GPU) path: ``deferred_path``,
    "triton" (one fused kernel per tensor) or "aten" (five ATen ops per tensor), and
    ``deferred_note`` saying why not triton (a failure of the fused kernel included:
    the ATen ops took over from it); with triton, how the kernel was launched
    (:func:`_native_info`)."""
    import hooktrace._C as _C

    registered, error = _C.numerics_fused_state()
    if error is not None:
        return {"deferred_path": "aten",
                "deferred_note": f"the fused Triton kernel failed, the ATen ops took over: {error}"}
    if registered:
        return {"deferred_path": "triton", **_native_info(native_at_start or {})}
    return {"deferred_path": "aten", "deferred_note": reason or "no fused launcher registered"}
