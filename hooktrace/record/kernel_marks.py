"""Kernel marks of compiled code (always on): the session receives the marks that
compiled regions' kernels record (record/kernels.py registers their call sites), and
the run's info names those sites (``kernel_sites``) and the torch.compile compiles
while recording (``compiles``: [start, end, thread id, trigger], record/dispatch.py)."""

from __future__ import annotations

from typing import Any

from hooktrace.record.component import Component

__all__ = ["KernelMarksComponent"]


class KernelMarksComponent(Component):
    def install(self, session: Any, scope: Any) -> None:
        import hooktrace._C as _C

        self._session = session
        _C.add_kernel_session(session)

    def teardown(self) -> None:
        import hooktrace._C as _C

        _C.remove_kernel_session(self._session)

    def run_info(self, info: dict[str, Any]) -> None:
        from hooktrace.record import dispatch, kernels

        if kernels.site_count():
            info["kernel_sites"] = kernels.sites()
        found = dispatch.compiles_since(self.recorder.start_unix_ns or 0)
        if found:
            info["compiles"] = found

    metadata = run_info
