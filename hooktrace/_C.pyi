"""Type stubs for the native core (csrc/). Private: use the hooktrace package."""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

EVENT_SIZE: int

class Session:
    """Bounded per-thread event buffers; see csrc/session.h."""

    def __init__(self, capacity: int, policy: str = "drop", chunk_events: int = 4096) -> None: ...
    @property
    def id(self) -> int: ...
    @property
    def active(self) -> bool: ...
    @property
    def capacity(self) -> int: ...
    @property
    def chunk_events(self) -> int: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def clock(self) -> tuple[int, int, float]: ...
    def copy_events(self, out: np.ndarray) -> int: ...
    def record_step(self, step: int) -> None: ...
    def set_emit_names(self, names: list[str]) -> None: ...
    @property
    def emits(self) -> bool: ...

class StreamWriter:
    """Drains a session's chunks into a version 3 .htrace file; see csrc/stream_writer.h."""

    def __init__(self, session: Session, fd: int, period_ms: int = 10) -> None: ...
    def start(self) -> None: ...
    def flush(self) -> None: ...
    def stop(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...

class ForwardPreHook:
    slot: int
    def __init__(self, session: Session, slot: int) -> None: ...
    def __call__(self, module: Any, args: Any) -> None: ...

class ForwardHook:
    slot: int
    def __init__(self, session: Session, slot: int) -> None: ...
    def __call__(self, module: Any, args: Any, output: Any) -> None: ...

class ForwardWrapper:
    slot: int
    __wrapped__: Callable[..., Any]
    def __init__(self, session: Session, slot: int, wrapped: Callable[..., Any]) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

def now_ticks() -> int: ...
def add_backward_session(session: Session) -> None: ...
def remove_backward_session(session: Session) -> None: ...
def node_names() -> list[str]: ...
def build_spans(events: np.ndarray, t_ns: np.ndarray) -> dict[str, Any]: ...
def assign_lanes(
    start_ns: np.ndarray, end_ns: np.ndarray, group: np.ndarray, prefer: np.ndarray | None = None
) -> np.ndarray: ...
def write_chrome_events(
    write: Callable[[bytes], Any],
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    module: np.ndarray,
    tid: np.ndarray,
    call: np.ndarray,
    flags: np.ndarray,
    cat: np.ndarray,
    nodes: np.ndarray,
    names_json: Sequence[str],
    args_json: Sequence[str],
    cat_names: Sequence[str],
    base_ns: int,
    pid: int,
    chunk_bytes: int,
) -> int: ...
def write_chrome_nodes(
    write: Callable[[bytes], Any],
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    name: np.ndarray,
    tid: np.ndarray,
    seq: np.ndarray,
    pass_id: np.ndarray,
    module: np.ndarray,
    flags: np.ndarray,
    node_names_json: Sequence[str],
    module_names_json: Sequence[str],
    cat: str,
    base_ns: int,
    pid: int,
    chunk_bytes: int,
) -> int: ...
def write_perfetto_slices(
    write: Callable[[bytes], Any],
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    track: np.ndarray,
    name: np.ndarray,
    cat: np.ndarray,
    flags: np.ndarray,
    str_a: np.ndarray,
    str_b: np.ndarray,
    int_a: np.ndarray,
    int_b: np.ndarray,
    track_uuid: np.ndarray,
    names: Sequence[str],
    strings: Sequence[str],
    cat_names: Sequence[str],
    first_sequence_id: int,
    chunk_bytes: int,
) -> dict[str, int]: ...
