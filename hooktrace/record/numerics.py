"""``numerics=True``: numeric health per module call (csrc/numerics.cpp): abs-max, RMS
and the count of non-finite values of every call's floating-point output, and of the
gradient of its inputs in backward. ``numerics_every=N`` measures steps 0, N, 2N, ...
only; statistics of off-CPU tensors are deferred and read once per step mark and at the
end. The first non-finite value is named on stderr (and dumped with
``dump_on=("nonfinite",)``). Reading them: :mod:`hooktrace.numerics`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import hooktrace._C as _C
from hooktrace.record.component import Component

if TYPE_CHECKING:
    from hooktrace.record.options import RecordOptions

__all__ = ["NumericsComponent"]


class NumericsComponent(Component):
    @classmethod
    def enabled(cls, options: RecordOptions) -> bool:
        return options.numerics

    @classmethod
    def check(cls, options: RecordOptions) -> None:
        if "nonfinite" in options.dump_on and not options.numerics:
            raise ValueError("dump_on='nonfinite' needs numerics=True (the values are checked "
                             "only then)")

    def install(self, session: Any, scope: Any) -> None:
        self._session = session
        session.set_nonfinite_callback(self._on_first_nonfinite)
        session.set_numerics(True)  # step 0 is always measured

    def before_step(self) -> None:
        # the step's deferred statistics (off-CPU tensors): one read for the step
        _C.flush_numerics(self._session)

    def step(self, step_no: int) -> None:
        every = self.recorder.options.numerics_every
        if every > 1:
            self._session.set_numerics(step_no % every == 0)  # sampling

    def flush(self) -> None:
        # deferred statistics (csrc/numerics.h) while the session still records
        _C.flush_numerics(self._session)

    def teardown(self) -> None:
        session = self._session
        session.set_numerics(False)
        session.set_nonfinite_callback(None)
        _C.forget_numerics(session)

    def run_info(self, info: dict[str, Any]) -> None:
        info["numerics"] = {"every": self.recorder.options.numerics_every,
                            "backward": "input gradients"}

    def _on_first_nonfinite(self, slot: int, backward: bool) -> None:
        """Called once by the native core (numerics.cpp), with the GIL, when the first
        non-finite value is seen: one line on stderr, and a dump if asked. The summary's
        ``first_nonfinite`` (hooktrace.numerics) is computed from the events, which also
        name the call and pick the innermost module of a tie."""
        recorder = self.recorder
        table = recorder._scope.modules_table()
        name = (table[slot][0] or "<root>") if slot < len(table) else f"<module {slot}>"
        phase, what = ("backward", "gradient of its inputs") if backward else ("forward", "output")
        print(f"hooktrace: first non-finite value: {name} {phase} ({what}), step "
              f"{recorder._step}", file=sys.stderr)
        if "nonfinite" in recorder._dump_on and recorder._state == "recording":
            recorder._dump("nonfinite", quiet_errors=True)
