"""``backward=True``: autograd nodes are recorded (the reader turns them into
per-module backward spans, ``"cat": "hooktrace.backward"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import hooktrace._C as _C
from hooktrace.record.component import Component

if TYPE_CHECKING:
    from hooktrace.record.options import RecordOptions

__all__ = ["BackwardComponent"]


class BackwardComponent(Component):
    @classmethod
    def enabled(cls, options: RecordOptions) -> bool:
        return options.backward

    def install(self, session: Any, scope: Any) -> None:
        self._session = session
        _C.add_backward_session(session)

    def teardown(self) -> None:
        _C.remove_backward_session(self._session)
