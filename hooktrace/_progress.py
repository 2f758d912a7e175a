"""Progress bars for long work on a terminal (tqdm), and nothing anywhere else.

A bar is shown only when standard error is a terminal and the work is large
(``PROGRESS_MIN_EVENTS``): short commands stay quiet, and logs and pipes never
receive carriage-return noise. Writers report progress through a wrapped
``write`` callable, so the C++ formatters need no callback of their own.

Example:
    >>> import io
    >>> buf = io.BytesIO()
    >>> with progress_write(buf.write, total_bytes=10, events=5, desc="x") as write:
    ...     _ = write(b"abc")
    >>> buf.getvalue()
    b'abc'
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["PROGRESS_MIN_EVENTS", "WriteTo", "progress_write", "wants_progress"]

# Below this many events an export takes well under a second (6-7 M events/s,
# benchmarks/RESULTS.md): a bar would only flash.
PROGRESS_MIN_EVENTS = 1_000_000


class WriteTo:
    """A file-like object whose ``write`` is the given callable (for writers taking a file)."""

    def __init__(self, write: Callable[[bytes], Any]) -> None:
        self.write = write


def wants_progress(events: int) -> bool:
    """Whether work on ``events`` events should show a bar (stderr is a TTY, work is large)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return events >= PROGRESS_MIN_EVENTS and callable(isatty) and bool(isatty())


@contextmanager
def progress_write(write: Callable[[bytes], Any], *, total_bytes: int, events: int,
                   desc: str) -> Iterator[Callable[[bytes], Any]]:
    """``write``, counting bytes into a tqdm bar of about ``total_bytes`` when
    :func:`wants_progress` (``events``); else ``write`` itself."""
    if not wants_progress(events):
        yield write
        return
    from tqdm import tqdm

    with tqdm(total=total_bytes, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
              file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        def counted(data: bytes) -> Any:
            bar.update(len(data))
            return write(data)

        yield counted
        # The total is an estimate: end the bar at what was really written.
        bar.total = bar.n
        bar.refresh()
