"""The event kinds and flags the native core writes are the ones the reader knows:
``_C.EVENT_KINDS`` / ``_C.EVENT_FLAGS`` (csrc/bindings.cpp, from csrc/event.h,
numerics.h, gpu_time.h) equal hooktrace/_events.py's constants, name for name."""

from __future__ import annotations

from hooktrace import _events
from hooktrace._native import load_native

_C = load_native()


def test_every_native_event_kind_is_the_reader_s() -> None:
    kinds = _C.EVENT_KINDS
    assert {name: getattr(_events, name, None) for name in kinds} == kinds
    # and the reader accepts exactly these kinds
    assert sorted(_events.VALID_KINDS) == sorted(kinds.values())
    assert len(set(kinds.values())) == len(kinds)


def test_every_native_event_flag_is_the_reader_s() -> None:
    flags = _C.EVENT_FLAGS
    assert {name: getattr(_events, name, None) for name in flags} == flags
    # the reader's flag sets are built of the native flags
    assert _events.ENTER_FLAGS == flags["FLAG_NO_GRAD"] | flags["FLAG_EVAL_MODE"]
    assert _events.NUM_FLAGS == sum(v for k, v in flags.items() if k.startswith("NUM_"))
    gpu = flags["GPU_EXIT"] | flags["GPU_BACKWARD"] | flags["GPU_KERNEL"]
    assert all(f & ~gpu == 0 for f in _events.GPU_MARK_FLAGS)
    # the reader names no flag the core does not write
    readers = {n for n in vars(_events) if n.startswith(("FLAG_", "NUM_", "GPU_"))
               and isinstance(getattr(_events, n), int)}
    assert readers - set(flags) == {"NUM_FLAGS", "GPU_MARK", "GPU_TIME", "GPU_NO_MODULE"}
