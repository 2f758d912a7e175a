"""``emit_profiler=True``: a ``torch.profiler`` user-scope range per module call, opened
from C++ under the module's name (its table handed to the session before it starts)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.record.component import Component

if TYPE_CHECKING:
    from hooktrace.record.options import RecordOptions

__all__ = ["EmitProfilerComponent"]


class EmitProfilerComponent(Component):
    @classmethod
    def enabled(cls, options: RecordOptions) -> bool:
        return options.emit_profiler

    def prepare(self, session: Any, scope: Any) -> None:
        if scope.kind == "model":
            session.set_emit_names(scope.emit_names())
        else:  # a process scope names modules as they are first called
            session.set_emit_names([])
            scope.on_new_slot = lambda slot, name: session.add_emit_name(name)
