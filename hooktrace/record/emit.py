"""``emit_profiler=True``: a ``torch.profiler`` user-scope range per module call, opened
from C++ under the module's name (its table handed to the session before it starts)."""

from __future__ import annotations

from typing import Any

from hooktrace.record.component import Component, Option

__all__ = ["EmitProfilerComponent"]


class EmitProfilerComponent(Component):
    OPTIONS = (
        Option("emit_profiler", False, "also open a torch.profiler range per module call",
               callbacks=False),
    )

    def prepare(self, session: Any, scope: Any) -> None:
        if scope.kind == "model":
            session.set_emit_names(scope.emit_names())
        else:  # a process scope names modules as they are first called
            session.set_emit_names([])
            scope.on_new_slot = lambda slot, name: session.add_emit_name(name)
