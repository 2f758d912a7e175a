"""``shapes=True``: the dtypes and shapes of every forward call's tensor inputs and
outputs (csrc/shapes.cpp); ``info["shape_signatures"]``. Reading them:
:mod:`hooktrace.shapes`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import hooktrace._C as _C
from hooktrace.record.component import Component

if TYPE_CHECKING:
    from hooktrace.record.options import RecordOptions

__all__ = ["ShapesComponent"]


class ShapesComponent(Component):
    @classmethod
    def enabled(cls, options: RecordOptions) -> bool:
        return options.shapes

    def prepare(self, session: Any, scope: Any) -> None:
        session.set_shapes(True)

    def run_info(self, info: dict[str, Any]) -> None:
        info["shape_signatures"] = _C.shape_signatures()  # the signatures seen so far

    metadata = run_info
