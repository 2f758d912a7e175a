"""The recording features, one component each (record/component.py), in the order they
are prepared and installed (torn down in reverse). A new feature is its own file under
``record/`` and one line here: its options (declared in the file) reach
``RecordOptions``, ``hooktrace run``'s flags, ``HOOKTRACE_OPTIONS`` and the trainer
callbacks from there (record/options.py).

No module listed here imports torch or the native core at its top: ``hooktrace run
--help`` reads the declarations."""

from __future__ import annotations

from hooktrace.record.aggregate import AggregateComponent
from hooktrace.record.backward import BackwardComponent
from hooktrace.record.component import Component, Declares
from hooktrace.record.core_options import CoreOptions
from hooktrace.record.emit import EmitProfilerComponent
from hooktrace.record.flops import FlopsComponent
from hooktrace.record.gpu_time import GpuTimeComponent
from hooktrace.record.kernel_marks import KernelMarksComponent
from hooktrace.record.memory import MemoryComponent
from hooktrace.record.numerics import NumericsComponent
from hooktrace.record.shapes import ShapesComponent

__all__ = ["COMPONENTS", "declarers"]

COMPONENTS: tuple[type[Component], ...] = (
    MemoryComponent, EmitProfilerComponent, BackwardComponent, KernelMarksComponent,
    NumericsComponent, ShapesComponent, FlopsComponent, GpuTimeComponent, AggregateComponent)


def declarers() -> tuple[type[Declares], ...]:
    """What declares the recording options: the core's, then every component's."""
    return (CoreOptions, *COMPONENTS)
