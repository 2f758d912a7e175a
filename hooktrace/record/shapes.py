"""``shapes=True``: the dtypes and shapes of every forward call's tensor inputs and
outputs (csrc/shapes.cpp); ``info["shape_signatures"]``. Reading them:
:mod:`hooktrace.analysis.shapes`."""

from __future__ import annotations

from typing import Any

from hooktrace.record.component import Component, Option

__all__ = ["ShapesComponent"]


class ShapesComponent(Component):
    OPTIONS = (
        Option("shapes", False, "also record the dtypes and shapes of every forward call's "
               "tensor inputs and outputs (span args in_shapes/out_shapes; hooktrace summary "
               "--by-shape)", cli="switch"),
    )

    def prepare(self, session: Any, scope: Any) -> None:
        session.set_shapes(True)

    def run_info(self, info: dict[str, Any]) -> None:
        import hooktrace._C as _C

        info["shape_signatures"] = _C.shape_signatures()  # the signatures seen so far

    metadata = run_info
