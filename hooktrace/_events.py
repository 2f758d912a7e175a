"""The event record and clock conversion shared by recorder, trace file and reader.

The layout mirrors ``csrc/event.h`` byte for byte; see the drawing there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EVENT_DTYPE = np.dtype(
    [
        ("t", "<u8"),
        ("seq", "<u8"),
        ("id", "<u4"),
        ("tid", "<u4"),
        ("rf_tid", "<u4"),
        ("kind", "u1"),
        ("flags", "u1"),
        ("pad", "<u2"),
    ]
)
assert EVENT_DTYPE.itemsize == 32

ENTER = 1
EXIT = 2
NODE_BEGIN = 3
NODE_END = 4
STEP = 5  # a training step ended: seq = its number, id = 0
# Memory samples (trace(memory=True), hooktrace.analysis.memory): right after the event they
# belong to, same thread and t; seq = bytes allocated now, id | rf_tid << 32 = peak.
MEM_CPU = 6
MEM_CUDA = 7
# Kernel marks of compiled code (csrc/kernel_marks.h): id = the call site, an index
# into info["kernel_sites"]; seq = 0.
KERNEL_BEGIN = 8
KERNEL_END = 9
# Shape signatures of a forward call (trace(shapes=True), csrc/shapes.h, hooktrace.analysis.shapes):
# after its EXIT; id = module slot; seq = input | output << 32, indexes into
# info["shape_signatures"] (SHAPE_UNKNOWN: not known).
SHAPES = 10
SHAPE_UNKNOWN = 0xFFFFFFFF
# Numeric health of a call (trace(numerics=True), csrc/numerics.h, hooktrace.analysis.numerics):
# id = module slot; seq = abs-max | rms << 32 (float32 bits); rf_tid = non-finite values.
NUMERICS = 12
NUM_BACKWARD = 1  # NUMERICS flags: the gradient of the call's inputs (else its output)
NUM_SKIPPED = 2  # no floating-point tensor (integer/boolean output, no input needing grad)
NUM_FAILED = 4  # a reduction raised (a tensor that cannot be reduced): stats are zero
NUM_DEFERRED = 8  # the stats follow in a NUMERICS_VALUE event whose id is this rf_tid
NUM_NOT_WALKED = 16  # the call held containers nested deeper than the walk goes (4)
NUM_FLAGS = NUM_BACKWARD | NUM_SKIPPED | NUM_FAILED | NUM_DEFERRED | NUM_NOT_WALKED
# A deferred NUMERICS event's statistics, recorded when the session flushed them (at the
# next step mark or the end): id = the call's id; seq, rf_tid, flags as NUMERICS'.
NUMERICS_VALUE = 13
# Device time (trace(gpu=True), csrc/gpu_time.h, reading.GpuSpans). GPU_MARK: a timing
# event was recorded on a device stream: after a forward call's ENTER, before its EXIT
# (flag GPU_EXIT), or in backward where the autograd nodes' module changed (flag
# GPU_BACKWARD; id GPU_NO_MODULE: no module from there on); id = module slot, seq = the
# stream id (int64), rf_tid = the mark's id (unique in the run, modulo 2**32).
# GPU_KERNEL: around a kernel call site of compiled code (KERNEL_BEGIN/END's sites):
# id = the site; GPU_KERNEL | GPU_EXIT after the kernel.
GPU_MARK = 14
GPU_EXIT = 1
GPU_BACKWARD = 2
GPU_KERNEL = 4
# the combinations a recorder writes
GPU_MARK_FLAGS = (0, GPU_EXIT, GPU_BACKWARD, GPU_KERNEL, GPU_KERNEL | GPU_EXIT)
GPU_NO_MODULE = 0xFFFFFFFF
# A GPU_MARK's device time, recorded when the run resolved it (next step mark or the
# end): id = the mark's id, seq = int64 Unix ns (device clock aligned to the host's),
# rf_tid = the device index.
GPU_TIME = 15
# Kernel busy time from CUPTI (trace(gpu=True) on CUDA, csrc/cupti.h,
# hooktrace.analysis.kernel_time). CUPTI_LAUNCH: a launch on the launching thread: id =
# its correlation id. CUPTI_KERNEL: a device record (kernel, memcpy, memset): id = its
# launch's correlation id, seq = start (CUPTI ns, info["kernels"]["clock"] maps them to
# Unix ns), rf_tid = duration ns (2**32-1: at least), flags = kind (1 kernel, 2 memcpy, 3
# memset) | device << 2; always followed on its thread by CUPTI_KERNEL_MORE: id = stream,
# seq = graph node id (0: none), rf_tid = name index into info["kernels"]["names"].
# CUPTI_GRAPH_NODE: seq = a graph node's id; flags 1: created (during a capture, on the
# capturing thread), 2: cloned from the node whose id is id | rf_tid << 32.
CUPTI_LAUNCH = 16
CUPTI_KERNEL = 17
CUPTI_KERNEL_MORE = 18
CUPTI_GRAPH_NODE = 19
VALID_KINDS = (ENTER, EXIT, NODE_BEGIN, NODE_END, STEP, MEM_CPU, MEM_CUDA, KERNEL_BEGIN,
               KERNEL_END, SHAPES, NUMERICS, NUMERICS_VALUE, GPU_MARK, GPU_TIME, CUPTI_LAUNCH,
               CUPTI_KERNEL, CUPTI_KERNEL_MORE, CUPTI_GRAPH_NODE)

FLAG_ERROR = 1  # EXIT: forward raised
FLAG_NO_GRAD = 2  # ENTER: grad mode was off (torch.no_grad, inference_mode)
FLAG_EVAL_MODE = 4  # ENTER: the module's training attribute was False
ENTER_FLAGS = FLAG_NO_GRAD | FLAG_EVAL_MODE


@dataclass(frozen=True)
class Clock:
    """Linear map from raw approximate-clock ticks to Unix nanoseconds.

    ``unix_ns = unix_ns0 + round((ticks - ticks0) * ns_per_tick)``; built from
    ``c10::ApproximateClockToUnixTimeConverter`` around the recording session, the
    same conversion torch.profiler applies to its own events.
    """

    ticks0: int
    unix_ns0: int
    ns_per_tick: float

    def to_unix_ns(self, ticks: np.ndarray) -> np.ndarray:
        """Convert an array of ticks (uint64) to int64 Unix ns."""
        # uint64 subtraction wraps modulo 2**64; viewed as int64 it is the signed delta.
        delta = (np.asarray(ticks, dtype=np.uint64) - np.uint64(self.ticks0)).view(np.int64)
        return np.int64(self.unix_ns0) + np.rint(delta * self.ns_per_tick).astype(np.int64)


# What a module's forward span covers (issue #16), recorded as info["span_definition"]:
# 1 = its `forward` alone, module hooks outside (trace() before the definition was
# recorded); 2 = its whole call: global and module forward pre-hooks, forward (or the
# compiled call) and forward hooks, in every scope (`hooktrace run` always did this).
SPAN_DEFINITION = 2
SPAN_DEFINITIONS = {1: "forward only, module hooks outside",
                    2: "the whole call, hooks included"}


def span_definition(info: dict[str, object]) -> int:
    """The span definition a run was recorded under (files from before it was
    recorded: the global mode's spans were whole calls, trace()'s were not)."""
    value = info.get("span_definition")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return 2 if info.get("mode") == "global" else 1
