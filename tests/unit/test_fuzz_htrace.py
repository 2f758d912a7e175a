"""Seeded fuzzing of the .htrace reader (issue #8): refuse cleanly or load sane results.

Every mutant of a real-looking run (header fields, metadata values of the wrong
type or range, event fields, string table bytes, truncation), with the checksums
recomputed so that validation past them is exercised, must end one of two ways:

* ``refused``: ``load`` raises ``TraceFileError``, one line naming the file;
* ``loaded``: spans, summary, Chrome export and ``repr`` all work and are sane
  (durations and self times >= 0, every time within the recorded interval).

Anything else (another exception type, or a loaded run that is not sane) fails.
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import struct
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import build_events, build_trace, events_from

from hooktrace import _C  # noqa: F401  (the extension must be built)
from hooktrace._events import ENTER, EVENT_DTYPE, EXIT, NODE_BEGIN, NODE_END, Clock
from hooktrace.reading import TraceData
from hooktrace.result import load
from hooktrace.format import HEADER_SIZE, INTERVAL_SLACK_NS, TraceFileError

REPO = Path(__file__).resolve().parents[2]
START_NS = 1_760_000_000_000_000_000
NO_SEQ = 2**64 - 1
N_MUTANTS = 400
_HEADER = struct.Struct("<8sIIQQQQqdIII")  # the first 76 bytes; the header crc follows


def real_looking_run() -> TraceData:
    """Two forward threads, a backward on the engine's thread, as the recorder writes it."""
    rows: list[tuple[int, int, int, int, int, int]] = []  # tid, kind, id, t, seq, rf_tid
    t = 1_000
    seq = 0
    for tid, rf_tid, root in ((4101, 1, 0), (4102, 2, 4)):
        for _step in range(3):
            rows.append((tid, ENTER, root, t, seq, rf_tid))
            for child in (1, 2, 3):
                t += 7
                rows.append((tid, ENTER, child, t, seq, rf_tid))
                seq += 2  # each child creates two autograd nodes
                t += 30
                rows.append((tid, EXIT, child, t, seq, rf_tid))
            t += 5
            rows.append((tid, EXIT, root, t, seq, rf_tid))
    for s in range(seq - 1, -1, -1):  # backward on thread 4200, graph task 9, newest first
        rf_tid = 1 if s < seq // 2 else 2
        rows.append((4200, NODE_BEGIN, s % 3, t, s, rf_tid))
        t += 11
        rows.append((4200, NODE_END, 9, t, s, rf_tid))
    rows.append((4200, NODE_BEGIN, 3, t, NO_SEQ, 0))  # AccumulateGrad: unattributed
    rows.append((4200, NODE_END, 9, t + 4, NO_SEQ, 0))
    ev = events_from(rows, ("tid", "kind", "id", "t", "seq", "rf_tid"))
    ev["flags"][np.flatnonzero(ev["kind"] == EXIT)[4]] = 1  # one forward raised
    clock = Clock(ticks0=900, unix_ns0=START_NS + 50, ns_per_tick=0.37)
    modules = [("", "Net"), ("enc.0", "Linear"), ("enc.1", "ReLU"), ("enc.2", "Linear"),
               ("head", "Linear")]
    info = {
        "pid": 31337, "hostname": "fuzzhost", "torch_version": "2.13.0",
        "hooktrace_version": "0.1.0", "mode": "wrap", "backward": True,
        "emit_profiler": False, "policy": "drop", "capacity": 8 << 20,
        "dropped_events": 0, "overwritten_events": 0, "start_unix_ns": START_NS,
        "stop_unix_ns": START_NS + 10**9,
        "thread_names": {"4101": "MainThread", "4102": "worker", "4200": "autograd"},
    }
    return build_trace(ev, modules, node_names=["AddmmBackward0", "ReluBackward0", "TBackward0",
                                                "AccumulateGrad"], clock=clock, cls=TraceData,
                       **info)


class Parts:
    """A .htrace file taken apart, to be mutated and put back together with fresh CRCs."""

    def __init__(self, data: bytes) -> None:
        fields = list(_HEADER.unpack_from(data, 0))
        self.header = fields
        meta_len, strings_len = fields[3], fields[4]
        self.meta = data[HEADER_SIZE : HEADER_SIZE + meta_len]
        self.strings = data[HEADER_SIZE + meta_len : HEADER_SIZE + meta_len + strings_len]
        events_off = -(-(HEADER_SIZE + meta_len + strings_len) // 32) * 32
        self.events = bytearray(data[events_off:])

    def build(self, *, fix_lengths: bool = True, fix_crcs: bool = True) -> bytes:
        h = list(self.header)
        if fix_lengths:
            h[3], h[4], h[5] = len(self.meta), len(self.strings), len(self.events) // 32
        if fix_crcs:
            h[9] = zlib.crc32(self.meta + self.strings)
            h[10] = zlib.crc32(bytes(self.events))
        head = _HEADER.pack(*h)
        head += struct.pack("<I", zlib.crc32(head))
        events_off = -(-(HEADER_SIZE + len(self.meta) + len(self.strings)) // 32) * 32
        pad = b"\0" * max(0, events_off - HEADER_SIZE - len(self.meta) - len(self.strings))
        return head + self.meta + self.strings + pad + bytes(self.events)


WEIRD_VALUES: list[Any] = [
    None, True, False, -1, 0, 1, 2**31, 2**63, 2**64 + 3, -(2**70), 1.5, 1e308, "abc", "",
    "\ud800", [], [1, 2], {}, {"a": 1}, [[[[[[]]]]]], "12", 10**30,
]
RAW_JSON_VALUES = [b"NaN", b"Infinity", b"1" * 5000, b"1e999", b"[" * 600 + b"]" * 600,
                   b'"\\udfff"', b"-0", b"1E400"]
HEADER_FIELDS = {  # index in _HEADER fields -> (name, candidate values)
    1: ("version", [0, 1, 3, 2**32 - 1]),
    2: ("header_size", [0, 79, 81, 2**32 - 1]),
    3: ("meta_len", [0, 1, 2**63, 2**64 - 1]),
    4: ("strings_len", [0, 3, 2**40]),
    5: ("n_events", [0, 1, 2**58, 2**64 - 1]),
    6: ("ticks0", [0, 2**63, 2**64 - 1, 10**12]),
    7: ("unix_ns0", [0, -1, -(2**63), 2**63 - 1, START_NS - 10**15]),
    8: ("ns_per_tick", [float("nan"), 0.0, -1.0, 1e9, float("inf"), 1e-3, 1e3, 2e-4, 5e-324]),
    11: ("pid", [0, 1, 2**31, 2**32 - 1]),
}
EVENT_FIELDS = {
    "t": [0, 1, 2**63, 2**64 - 1, 10**15],
    "seq": [0, 2**64 - 1, 2**63, 12345],
    "id": [0, 1, 4, 5, 2**32 - 1, 3, 9],
    "tid": [0, 1, 4101, 4200, 2**32 - 1],
    "rf_tid": [0, 1, 2, 2**32 - 1],
    "kind": [0, 1, 2, 3, 4, 5, 255],
    "flags": [0, 1, 2, 255],
    "pad": [0, 1, 65535],
}


def mutate(base: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One mutant of ``base`` and what was done to it."""
    parts = Parts(base)
    kind = rng.choice(["header", "header", "meta", "meta", "meta", "raw_meta", "event",
                       "event", "event", "strings", "truncate", "flip"])
    if kind == "header":
        idx = rng.choice(list(HEADER_FIELDS))
        name, values = HEADER_FIELDS[idx]
        value = rng.choice(values)
        parts.header[idx] = value
        return f"header {name}={value!r}", parts.build(fix_lengths=idx not in (3, 4, 5))
    if kind in ("meta", "raw_meta"):
        meta = json.loads(parts.meta)
        key = rng.choice(sorted(meta) + ["extra"])
        if kind == "meta":
            value = rng.choice(WEIRD_VALUES)
            if key == "thread_names" and rng.random() < 0.5:
                value = {rng.choice(["4101", "x", "", "-1", "99999999999"]): value}
            elif key == "modules" and rng.random() < 0.5:
                value = [[0, value], [1, 2]]
            meta[key] = value
            parts.meta = json.dumps(meta, ensure_ascii=rng.random() < 0.5).encode("utf-8",
                                                                                  "surrogatepass")
            return f"meta {key}={value!r:.40}", parts.build()
        raw = rng.choice(RAW_JSON_VALUES)
        meta[key] = "@@RAW@@"
        parts.meta = json.dumps(meta).encode().replace(b'"@@RAW@@"', raw)
        return f"raw meta {key}={raw[:20]!r}", parts.build()
    if kind == "event":
        ev = np.frombuffer(bytes(parts.events), EVENT_DTYPE).copy()
        i = rng.randrange(len(ev))
        field = rng.choice(list(EVENT_FIELDS))
        if field == "t" and rng.random() < 0.6:  # small shifts: order and interval checks
            value = int(ev["t"][i]) + rng.choice([-100, -40, -1, 1, 40, 10**9, 10**11])
            value %= 2**64
        else:
            value = rng.choice(EVENT_FIELDS[field])
        ev[field][i] = value
        parts.events = bytearray(ev.tobytes())
        return f"event {i}.{field}={value}", parts.build()
    if kind == "strings":
        s = bytearray(parts.strings)
        pos = rng.randrange(len(s))
        s[pos] = rng.choice([0, 0xFF, 0x80, 0xC3, rng.randrange(256)])
        parts.strings = bytes(s)
        return f"strings byte {pos}", parts.build()
    if kind == "truncate":
        cut = rng.randrange(len(base))
        return f"truncated at {cut}", base[:cut]
    # flip: random bytes of the metadata or string table, all checksums recomputed
    blob = bytearray(parts.meta)
    for _ in range(rng.randrange(1, 4)):
        blob[rng.randrange(len(blob))] = rng.randrange(256)
    parts.meta = bytes(blob)
    return "meta bytes flipped", parts.build()


def check_sane(run: TraceData) -> None:
    """What a loaded run must satisfy; raises AssertionError when it does not."""
    repr(run)
    assert run.pid > 0 and isinstance(run.hostname, str)
    assert run.dropped_events >= 0 and run.overwritten_events >= 0
    spans = run.spans()
    nodes = spans.nodes
    assert np.all(spans.end_ns >= spans.start_ns), "negative span duration"
    assert np.all(spans.self_ns >= 0), "negative self time"
    assert np.all(nodes.end_ns >= nodes.start_ns) and np.all(nodes.self_ns >= 0)
    lo = int(run.info.get("start_unix_ns", 0)) - INTERVAL_SLACK_NS
    hi = int(run.info.get("stop_unix_ns", 2**62)) + INTERVAL_SLACK_NS
    for a in (spans.start_ns, spans.end_ns, nodes.start_ns, nodes.end_ns):
        assert np.all((a >= lo) & (a <= hi)), "time outside the recorded interval"
    for row in run.summary().rows:
        for key, value in row.items():
            if key.endswith("_ns"):
                assert value is None or value >= 0, (key, value)
    buf = io.BytesIO()
    from hooktrace.exporters.chrome import write_chrome

    write_chrome(run, buf, nodes=True)
    doc = json.loads(buf.getvalue())
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            assert math.isfinite(e["ts"]) and e["ts"] >= 0 and e["dur"] >= 0, e


def classify(path: Path) -> str:
    try:
        run = load(path)
    except TraceFileError as e:
        msg = str(e)
        assert "\n" not in msg and msg.startswith(f"{path}: offset "), msg
        return "refused"
    check_sane(run)  # an AssertionError here is a silent wrong result
    return "loaded"


@pytest.fixture(scope="module")
def mutants(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("fuzz")
    base_path = root / "base.htrace"
    real_looking_run().save(base_path)
    base = base_path.read_bytes()
    rng = random.Random(8)
    out = []
    for k in range(N_MUTANTS):
        what, data = mutate(base, rng)
        path = root / f"m{k:03d}.htrace"
        path.write_bytes(data)
        out.append((what, path))
    return out


def test_base_run_loads_sane(tmp_path: Path) -> None:
    path = tmp_path / "base.htrace"
    real_looking_run().save(path)
    run = load(path)
    check_sane(run)
    s = run.spans()
    assert len(s) == 2 * 3 * 4 + 2 * 3 * 4 and s.nodes.unattributed == 1  # fwd + bwd spans


def test_mutants_are_refused_or_load_sane(mutants: list[tuple[str, Path]]) -> None:
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    for what, path in mutants:
        try:
            outcome = classify(path)
        except AssertionError as e:
            outcome = "silent wrong"
            failures.append(f"{path.name} ({what}): {e}")
        except Exception as e:  # noqa: BLE001  (classifying is the point)
            outcome = f"unexpected {type(e).__name__}"
            failures.append(f"{path.name} ({what}): {type(e).__name__}: {e}")
        outcomes[outcome] += 1
    print(f"\nfuzz outcomes over {len(mutants)} mutants: {dict(sorted(outcomes.items()))}")
    assert not failures, "\n".join(failures[:20])
    # both paths are exercised: plenty refused past the checksums, some loaded
    assert outcomes["refused"] > N_MUTANTS // 2 and outcomes["loaded"] > 10, outcomes


CLI_DRIVER = r"""
import contextlib, io, json, sys, traceback
from hooktrace.cli import main
results = []
for path, out in json.loads(sys.argv[1]):
    for argv in (["summary", path], ["export", path, "-o", out]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except BaseException:  # what `python -m hooktrace` would print and exit 1 with
                traceback.print_exc()
                rc = 1
        results.append([argv[0], path, rc, err.getvalue()])
print(json.dumps(results))
"""


def test_cli_on_mutants_gives_one_line_errors(mutants: list[tuple[str, Path]],
                                              tmp_path: Path) -> None:
    # 20 mutants, as refused and loaded come, through the CLI's summary and export in
    # one subprocess (each `python -m hooktrace` would import torch again)
    chosen = mutants[:20]
    expected = {str(p): classify(p) for _, p in chosen}
    assert set(expected.values()) == {"refused", "loaded"}
    jobs = [[str(p), str(tmp_path / f"{p.stem}.json")] for _, p in chosen]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", CLI_DRIVER, json.dumps(jobs)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.splitlines()[-1])
    assert len(results) == 40
    for command, path, rc, err in results:
        assert "Traceback" not in err, (command, path, err)
        if expected[path] == "refused":
            assert rc == 1 and err.count("\n") == 1, (command, path, rc, err)
            assert err.startswith(f"hooktrace: error: {path}: offset "), err
        else:
            assert rc == 0 and err == "", (command, path, rc, err)


def test_cli_process_on_a_chrome_trace_and_a_mutant(mutants: list[tuple[str, Path]],
                                                    tmp_path: Path) -> None:
    # the real entry point, twice: what a user sees when handing over the wrong file
    chrome = tmp_path / "trace.json"
    chrome.write_text('{"traceEvents": []}')
    refused = next(p for _, p in mutants if classify(p) == "refused")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for argv, fragment in ((["summary", str(chrome)], "is JSON (a Chrome trace?)"),
                           (["export", str(refused), "-o", str(tmp_path / "o.json")], "offset")):
        proc = subprocess.run([sys.executable, "-m", "hooktrace", *argv], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr and fragment in proc.stderr, proc.stderr


def test_events_from_build_events_still_round_trip(tmp_path: Path) -> None:
    # the synthetic helpers' traces (pid 4242, identity clock) remain writable and readable
    from conftest import build_trace

    trace = build_trace(build_events([(1, ENTER, 0, 5), (1, EXIT, 0, 9)]))
    trace.save(tmp_path / "s.htrace")
    assert load(tmp_path / "s.htrace").spans().duration_ns.tolist() == [4]
