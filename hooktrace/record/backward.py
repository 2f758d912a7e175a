"""``backward=True``: autograd nodes are recorded (the reader turns them into
per-module backward spans, ``"cat": "hooktrace.backward"``)."""

from __future__ import annotations

from typing import Any

from hooktrace.record.component import Component, Option

__all__ = ["BackwardComponent"]


class BackwardComponent(Component):
    OPTIONS = (
        Option("backward", True, "record autograd nodes (per-module backward spans)",
               cli="switch", flag_help="do not record autograd nodes (forward spans only)",
               callbacks=False),  # (the callbacks' own keyword)
    )

    def install(self, session: Any, scope: Any) -> None:
        import hooktrace._C as _C

        self._session = session
        _C.add_backward_session(session)

    def teardown(self) -> None:
        import hooktrace._C as _C

        _C.remove_backward_session(self._session)
