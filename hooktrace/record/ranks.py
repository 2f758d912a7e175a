"""Many ranks (issue #11), recording side: which rank a trace is, and its clock's offset.

The public spelling is :mod:`hooktrace.record.distributed` (``from hooktrace.record.distributed
import align_clocks``), which re-exports this module; the measurements a process
keeps are recorder state, so they live here, in ``record/`` (issue #27).

**Rank identity.** ``rank_info()`` is what every trace's metadata gets (the
recorder calls it when it builds ``info``): ``rank``, ``world_size``,
``local_rank``, ``local_world_size`` and ``backend`` from an initialized
``torch.distributed`` default group, else from the launcher's ``RANK`` /
``WORLD_SIZE`` / ``LOCAL_RANK`` environment (torchrun, SLURM wrappers), with
``rank_source`` saying which; nothing when neither is there (a single
process). ``hostname`` and ``pid`` are in every trace already.
``default_output_name("run")`` gives ``run.rank3.htrace`` (``DIR/`` gives
``DIR/rank3/trace.htrace``), so no two ranks of a job write the same file.

**Clock alignment.** Ranks on one host read one clock (Unix ns), but across
hosts NTP leaves errors up to milliseconds, more than the module spans being
compared. :func:`estimate_clock_offset` measures this process's offset to
rank 0 of the group with ``rounds + 1`` all-reduces of a ``world x 2`` int64
tensor in which each rank writes its own row:

* round k: each rank reads its clock (``send_k``), all-reduces, reads its
  clock again (``recv_k``); the next round's tensor also carries ``recv_k``.
* An all-reduce cannot finish on any rank before every rank has entered it.
  So rank 0's ``send_k`` precedes rank r's ``recv_k`` and rank r's ``send_k``
  precedes rank 0's ``recv_k`` in true time, which bounds
  ``theta = clock_r - clock_0`` to ``[send_r - recv_0, recv_r - send_0]``: a
  Cristian round trip, in both directions at once, for every rank in one
  collective (no rank 0 serving ranks in turn).
* The bounds of all rounds are intersected; the offset is the middle of the
  intersection and the uncertainty its half width, a hard bound (not a
  standard deviation) as long as the clocks do not drift or step during the
  measurement. One round's width is the two ranks' round trips added, so the
  uncertainty is about one round trip. If the intersection is empty (a clock
  stepped), the narrowest single round is used (``consistent`` False).

Cost, measured with gloo on loopback on the project's 2-core machine: one
all-reduce of this size takes 100-200 µs when the machine is quiet; in the
integration test's job (2 ranks, machine shared and loaded) the fastest round
trip was 257-463 µs, the uncertainty 266-444 µs and a whole measurement
(9 all-reduces) 28-72 ms. Across hosts add the network latency (tens of µs on
a cluster fabric), still far below NTP's milliseconds. The data is
``16 * world`` bytes per round: 160 KB at 10 000 ranks.

**Why an explicit call, not a ``trace()`` argument.** A collective hangs unless
every rank of the group calls it, and ``__enter__``/``__exit__`` of a trace
run on whatever ranks the user chose to trace. So the measurement is a
separate, explicit collective, :func:`align_clocks`, that the training script
(or a launcher integration) calls on every rank, typically once at the start
and once at the end of the traced block::

    with hooktrace.trace(model) as tr:
        hooktrace.record.distributed.align_clocks()       # every rank: start
        train()
        hooktrace.record.distributed.align_clocks()       # every rank: end
    tr.save(hooktrace.record.distributed.default_output_name("traces/run"))

Measurements are kept per process; a trace's metadata gets those taken while
it recorded (and the last one before it started): ``clock_sync`` (each
measurement) and the combined ``clock_offset_ns`` /
``clock_offset_uncertainty_ns``, the middle and half width of the hull of the
measurements' intervals, so drift between the start and end measurements is
inside the uncertainty. ``align_clocks(tr)`` after the block adds a
measurement to a finished trace directly. Mergers subtract
``clock_offset_ns`` from the rank's times (``hooktrace merge-ranks``).

**Testing on one host.** ``HOOKTRACE_TEST_CLOCK_OFFSET_NS="1:2500000"`` (rank:ns
pairs, comma-separated) makes rank 1 behave as if its clock were 2.5 ms ahead:
its trace's clock conversion, start/stop times and the clock readings of the
measurement are all shifted, and the trace says so in
``clock_offset_injected_ns``. Only for tests: a merge must then recover it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hooktrace._events import Clock

__all__ = [
    "DEFAULT_ROUNDS",
    "TEST_OFFSET_ENV",
    "ClockOffset",
    "align_clocks",
    "apply_test_clock_offset",
    "clock_offset_summary",
    "default_output_name",
    "estimate_clock_offset",
    "injected_offset_ns",
    "rank_info",
]

# 8 round trips: with gloo on loopback the fastest of 8 all-reduces is within ~20% of
# the fastest of 50 (measured: 98-130 µs vs 80 µs; quiet machine).
DEFAULT_ROUNDS = 8
TEST_OFFSET_ENV = "HOOKTRACE_TEST_CLOCK_OFFSET_NS"
# The measurements a process keeps (a trace takes those inside its interval).
_KEPT = 64

_lock = threading.Lock()
_measurements: list[ClockOffset] = []


@dataclass(frozen=True)
class ClockOffset:
    """One measurement of this rank's clock minus rank 0's (Unix ns).

    The true offset lies in ``offset_ns +- uncertainty_ns``. ``at_unix_ns`` is
    when it was taken (this rank's clock), ``rtt_min_ns`` the fastest round
    trip, ``cost_ns`` the wall time of the whole measurement, ``consistent``
    False when the rounds' bounds did not intersect (a clock stepped).
    """

    offset_ns: int
    uncertainty_ns: int
    at_unix_ns: int
    rounds: int
    rtt_min_ns: int
    cost_ns: int
    consistent: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or not value.strip().lstrip("-").isdigit():
        return None
    return int(value)


def _current_rank() -> int | None:
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return _env_int("RANK")


def rank_info(start_unix_ns: int | None = None, stop_unix_ns: int | None = None) -> dict[str, Any]:
    """This process's rank metadata, and the clock measurements of a run in
    ``[start, stop]`` (see the module docstring); ``{}`` outside a distributed job.

    Example:
        >>> import os
        >>> os.environ.update(RANK="3", WORLD_SIZE="8", LOCAL_RANK="1")
        >>> info = rank_info()
        >>> info["rank"], info["world_size"], info["local_rank"], info["rank_source"]
        (3, 8, 1, 'env')
        >>> for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"): del os.environ[k]
        >>> rank_info()
        {}
    """
    info: dict[str, Any] = {}
    if dist.is_available() and dist.is_initialized():
        info.update(rank=int(dist.get_rank()), world_size=int(dist.get_world_size()),
                    backend=str(dist.get_backend()), rank_source="torch.distributed")
    elif _env_int("RANK") is not None and _env_int("WORLD_SIZE") is not None:
        info.update(rank=_env_int("RANK"), world_size=_env_int("WORLD_SIZE"), rank_source="env")
    else:
        return info
    for key, env in (("local_rank", "LOCAL_RANK"), ("local_world_size", "LOCAL_WORLD_SIZE")):
        value = _env_int(env)
        if value is not None and value >= 0:
            info[key] = value
    if start_unix_ns is not None:
        with _lock:
            kept = list(_measurements)
        before = [m for m in kept if m.at_unix_ns < start_unix_ns]
        during = [m for m in kept if start_unix_ns <= m.at_unix_ns
                  and (stop_unix_ns is None or m.at_unix_ns <= stop_unix_ns)]
        chosen = before[-1:] + during
        if chosen:
            info["clock_sync"] = [m.to_json() for m in chosen]
            info.update(clock_offset_summary(chosen))
    return info


def clock_offset_summary(measurements: list[ClockOffset]) -> dict[str, int]:
    """``clock_offset_ns`` / ``clock_offset_uncertainty_ns`` of several measurements:
    the middle and half width of the hull of their intervals.

    Example:
        >>> a = ClockOffset(1000, 50, 0, 8, 100, 1500)
        >>> b = ClockOffset(1200, 30, 10**9, 8, 60, 1500)
        >>> clock_offset_summary([a, b])
        {'clock_offset_ns': 1090, 'clock_offset_uncertainty_ns': 140}
    """
    lo = min(m.offset_ns - m.uncertainty_ns for m in measurements)
    hi = max(m.offset_ns + m.uncertainty_ns for m in measurements)
    return {"clock_offset_ns": (lo + hi) // 2, "clock_offset_uncertainty_ns": (hi - lo + 1) // 2}


# -- the test-only artificial offset -------------------------------------------


def injected_offset_ns(rank: int | None) -> int:
    """The artificial clock offset set for ``rank`` by ``HOOKTRACE_TEST_CLOCK_OFFSET_NS``.

    Example:
        >>> import os
        >>> os.environ[TEST_OFFSET_ENV] = "1:2500000, 3:-700"
        >>> injected_offset_ns(1), injected_offset_ns(3), injected_offset_ns(0)
        (2500000, -700, 0)
        >>> del os.environ[TEST_OFFSET_ENV]
    """
    spec = os.environ.get(TEST_OFFSET_ENV)
    if not spec or rank is None:
        return 0
    for item in spec.split(","):
        key, sep, value = item.strip().partition(":")
        try:
            if sep and int(key) == rank:
                return int(value)
        except ValueError:
            raise ValueError(f"{TEST_OFFSET_ENV}={spec!r}: expected rank:ns pairs separated by "
                             f"commas, e.g. '1:2500000', found {item.strip()!r}") from None
    return 0


def apply_test_clock_offset(clock: Clock, info: dict[str, Any]) -> Clock:
    """The run's clock conversion, shifted by this rank's test-only offset (and
    ``info``'s start/stop times with it); ``clock`` itself when none is set."""
    shift = injected_offset_ns(_current_rank())
    if not shift:
        return clock
    for key in ("start_unix_ns", "stop_unix_ns"):
        if isinstance(info.get(key), int):
            info[key] += shift
    info["clock_offset_injected_ns"] = shift
    return Clock(clock.ticks0, clock.unix_ns0 + shift, clock.ns_per_tick)


def _now_ns(shift: int) -> int:
    return time.time_ns() + shift


# -- the measurement -----------------------------------------------------------


def estimate_clock_offset(group: Any = None, rounds: int = DEFAULT_ROUNDS) -> ClockOffset:
    """Measure this rank's clock minus rank 0's (of ``group``, default: the default
    group) with ``rounds + 1`` all-reduces; see the module docstring.

    A collective: every rank of the group must call it. Rank 0 gets offset 0 and
    uncertainty 0. Raises RuntimeError when no process group is initialized.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("hooktrace: estimate_clock_offset needs an initialized "
                           "torch.distributed process group (dist.init_process_group)")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    world = dist.get_world_size(group)
    me = dist.get_rank(group)
    shift = injected_offset_ns(_current_rank())
    backend = str(dist.get_backend(group))
    # (NCCL reduces device tensors only)
    device = (torch.device("cuda", torch.cuda.current_device()) if backend == "nccl"
              else torch.device("cpu"))
    send = np.zeros((rounds, world), np.int64)
    recv = np.zeros((rounds, world), np.int64)
    row = np.zeros((world, 2), np.int64)
    began = time.perf_counter_ns()
    at = _now_ns(shift)
    prev_recv = 0
    for k in range(rounds + 1):
        row[:] = 0
        t_send = _now_ns(shift)
        row[me] = (t_send, prev_recv)
        buf = torch.from_numpy(row).to(device)
        dist.all_reduce(buf, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # recv must follow completion (a later read is safe)
        t_recv = _now_ns(shift)
        got = buf.cpu().numpy()
        if k < rounds:
            send[k] = got[:, 0]
        if k > 0:
            recv[k - 1] = got[:, 1]
        prev_recv = t_recv
    cost = time.perf_counter_ns() - began
    # theta = clock_me - clock_0 is in [send_me - recv_0, recv_me - send_0] each round
    lo = send[:, me] - recv[:, 0]
    hi = recv[:, me] - send[:, 0]
    rtt = int((recv[:, me] - send[:, me]).min())
    consistent = int(lo.max()) <= int(hi.min())
    k = int(np.argmin(hi - lo))  # the narrowest round, when the bounds do not intersect
    a, b = (int(lo.max()), int(hi.min())) if consistent else (int(lo[k]), int(hi[k]))
    offset, uncertainty = (a + b) // 2, (b - a + 1) // 2
    if me == 0:
        offset, uncertainty, consistent = 0, 0, True
    return ClockOffset(offset, uncertainty, at, rounds, rtt, cost, consistent)


def align_clocks(trace: Any = None, *, group: Any = None,
                 rounds: int = DEFAULT_ROUNDS) -> ClockOffset | None:
    """Measure this rank's clock offset to rank 0 and keep it for the traces.

    A collective over ``group`` (default: the default group): **every rank must
    call it**, or the others wait forever; call it at the start and at the end
    of the traced block. Without an initialized process group it does nothing and
    returns None (safe to call from launcher integrations unconditionally).
    Inside a ``hooktrace.trace`` block the measurement goes into that trace's
    metadata when the block ends; ``align_clocks(tr)`` with a finished trace adds
    it to ``tr.info`` directly.

    Example::

        with hooktrace.trace(model) as tr:
            hooktrace.record.distributed.align_clocks()
            train()
            hooktrace.record.distributed.align_clocks()
        tr.info["clock_offset_ns"], tr.info["clock_offset_uncertainty_ns"]
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    m = estimate_clock_offset(group, rounds)
    with _lock:
        _measurements.append(m)
        del _measurements[:-_KEPT]
    if trace is not None:
        if getattr(trace, "done", True) is False:
            return m  # still recording: the trace takes it when the block ends
        info = trace.info
        kept = [ClockOffset(**s) for s in info.get("clock_sync", [])] + [m]
        info["clock_sync"] = [s.to_json() for s in kept]
        info.update(clock_offset_summary(kept))
    return m


def default_output_name(stem: str | os.PathLike[str], rank: int | None = None, *,
                        suffix: str = ".htrace") -> str:
    """Where rank ``rank`` (default: this process's rank) writes its trace, so that no
    two ranks of a job write the same file.

    ``stem`` is a file stem (``"run"``, or ``"run.htrace"``) or a directory
    (an existing one, or a name ending in ``/``). Without a rank (a single
    process) the name has no rank part.

    Example:
        >>> default_output_name("out/run", 3), default_output_name("run.htrace", 0)
        ('out/run.rank3.htrace', 'run.rank0.htrace')
        >>> default_output_name("traces/", 12), default_output_name("traces/", None)
        ('traces/rank12/trace.htrace', 'traces/trace.htrace')
    """
    name = os.fspath(stem)
    if rank is None:
        rank = _current_rank()
    if rank is not None and (not isinstance(rank, int) or rank < 0):
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    if name.endswith(("/", os.sep)) or os.path.isdir(name):
        where = os.path.join(name, f"rank{rank}") if rank is not None else name
        return os.path.join(where, f"trace{suffix}")
    if name.endswith(suffix):
        name = name[: -len(suffix)]
    return f"{name}.rank{rank}{suffix}" if rank is not None else f"{name}{suffix}"

