"""Output file names that never collide between processes or ranks (issue #10).

``output_path(template, suffix, rank)``: ``None`` gives the default
``hooktrace-<host>_<pid>[_rank<R>]<suffix>`` in the current folder; a folder
(existing, or a name ending in ``/``) gets that default name inside it; any
other name has ``{rank}``, ``{pid}`` and ``{host}`` replaced, and when a rank
is given and the name has no ``{rank}``, ``_rank<R>`` goes before its
extension (and the suffix is added to a name without one), so ranks writing
"the same" file write one each. ``rank_files_of(name)`` finds those files again
from the name given to ``-o``.

Example:
    >>> output_path("out/run.htrace", ".htrace", rank=1).as_posix()
    'out/run_rank1.htrace'
    >>> output_path("out/run", ".htrace", rank=1).as_posix()
    'out/run_rank1.htrace'
    >>> output_path("t.json.gz", ".json", rank=None).as_posix()
    't.json.gz'
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["env_rank", "output_path", "process_stem", "rank_files_of"]

_EXTENSIONS = (".json.gz", ".htrace", ".json", ".pftrace", ".gz")


def env_rank() -> int | None:
    """The process's rank as torchrun (and most launchers) set it in ``RANK``."""
    rank = os.environ.get("RANK")
    return int(rank) if rank is not None and rank.strip().isdigit() else None


def process_stem(rank: int | None) -> str:
    """``<host>_<pid>[_rank<R>]``: this process in a file name, shared by every writer
    (outputs, windows, dumps) so no two processes or ranks collide."""
    return f"{socket.gethostname()}_{os.getpid()}" + (f"_rank{rank}" if rank is not None else "")


def output_path(template: str | os.PathLike[str] | None, suffix: str, rank: int | None) -> Path:
    host, pid = socket.gethostname(), str(os.getpid())
    default = f"hooktrace-{process_stem(rank)}{suffix}"
    if template is None:
        return Path(default)
    text = os.fspath(template)
    if text.endswith(("/", os.sep)) or os.path.isdir(text):
        return Path(text) / default
    name = text.replace("{pid}", pid).replace("{host}", host)
    if "{rank}" in name:
        return Path(name.replace("{rank}", str(rank if rank is not None else 0)))
    path = Path(name)
    if rank is None:
        return path
    stem, ext = _split_extension(path.name)
    return path.with_name(f"{stem}_rank{rank}{ext or suffix}")


def _split_extension(name: str) -> tuple[str, str]:
    for known in _EXTENSIONS:
        if name.endswith(known) and name != known:
            return name[: -len(known)], known
    return name, ""


def rank_files_of(name: str | os.PathLike[str]) -> list[str]:
    """The per-rank ``.htrace`` files ``hooktrace run -o NAME`` wrote under torchrun
    (``NAME_rank<R>.htrace``, or ``STEM_rank<R>.htrace`` for ``NAME = STEM.htrace``),
    sorted by rank; empty when there are none or ``NAME`` itself exists."""
    text = os.fspath(name)
    if os.path.exists(text):
        return []
    path = Path(text)
    stem, ext = _split_extension(path.name)
    if ext not in ("", ".htrace"):
        return []
    ranked = ((f.name[len(stem) + len("_rank"):-len(".htrace")], os.fspath(f))
              for f in path.parent.glob(f"{stem}_rank*.htrace") if f.is_file())
    return [f for _, f in sorted((int(rank), f) for rank, f in ranked if rank.isdigit())]


def is_aggregate_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an ``aggregate=`` folder (``trace(aggregate=DIR)`` /
    ``hooktrace run --aggregate DIR``): it holds ``aggregates/part-*.parquet``, and
    ``steps/step-N_<run>.htrace`` for the steps kept whole. One whose run has not written
    a part yet (killed before the first, or still running) is one too: the recording made
    ``aggregates/``, ``steps/`` and ``live/`` when it started (its kept steps are not
    ranks: issue #47)."""
    top = os.fspath(path)
    folder = os.path.join(top, "aggregates")
    if not os.path.isdir(folder):
        return False
    return (any(f.endswith(".parquet") for f in os.listdir(folder))
            or os.path.isdir(os.path.join(top, "steps"))
            or os.path.isdir(os.path.join(top, "live")))


def has_aggregate_parts(path: str | os.PathLike[str]) -> bool:
    """Whether an ``aggregate=`` folder holds a part yet."""
    folder = os.path.join(os.fspath(path), "aggregates")
    return os.path.isdir(folder) and any(f.endswith(".parquet") and not f.startswith(".")
                                         for f in os.listdir(folder))


def aggregate_dir_problem(path: str | os.PathLike[str]) -> str:
    """The one line for an ``aggregate=`` folder given where a trace (or a folder of
    rank traces) was expected: its kept steps are single steps, not the run's ranks."""
    name = os.fspath(path).rstrip("/") or "/"
    return (f"{name}: an aggregate= folder (per-window rows, not a trace): give a step it "
            f"kept whole ({os.path.join(name, 'steps', 'step-N_<run>.htrace')}), or read its "
            f"rows with hooktrace summary/report/query {name}")
