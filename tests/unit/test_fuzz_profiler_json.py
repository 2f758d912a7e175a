"""Seeded fuzzing of profiler-JSON input to merge and attribution (issue #8).

The base is a real torch.profiler trace (CPU, Sequential(Linear, ReLU, Linear),
forward and backward) recorded next to a hooktrace run, plus a few kineto-style
GPU rows (launches, kernels linked by correlation and by an ``ac2g`` flow) so
those paths are reached too. Every mutant (byte flips, truncation, values
replaced by huge ints, floats, NaN/Infinity, strings, lists, objects, deep
nesting, invalid UTF-8, duplicate keys, baseTimeNanoseconds variants, events
removed, replaced or added) must end one of two ways, for ``merge_traces`` and
for ``attribute`` alike:

* ``refused``: a HooktraceError, one line, starting with the profiler trace's
  path, and nothing left at the output path;
* ``merged`` / ``attributed``: the output is strict JSON (UTF-8, no NaN or
  Infinity) whose every X event has a finite ts >= 0 on a base >= 0, and the
  attribution table renders (text and strict JSON).

Anything else (another exception type, or output that is not so) fails.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import torch

import hooktrace
from hooktrace.cli import main
from hooktrace.errors import HooktraceError
from hooktrace.merge import attribute, merge_traces
from hooktrace.reading import TraceData

REPO = Path(__file__).resolve().parents[2]
N_MUTANTS = 300
SEED = 8

# Raw JSON texts put where a value was (numbers, strings, containers, non-JSON).
RAW_VALUES = [
    "0", "-1", "1", "7", str(2**63), str(2**64 + 3), str(-(2**70)), str(10**30), "1" * 5000,
    "1e30", "-1e300", "1e999", "1E400", "4e-400", "1.5", "0.0001", "-0.5", "-0",
    "123456789012345678901234567890.5", "NaN", "Infinity", "-Infinity", '"12"', '"abc"', '""',
    '"\\udfff"', '"\\u0000"', "null", "true", "false", "[]", "[1, 2]", "{}", '{"a": 1}',
    "[[[[[]]]]]", "[" * 1000 + "]" * 1000,
]
VALUE_KEYS = ["ts", "dur", "tid", "pid", "Sequence number", "Fwd thread id", "correlation", "cat",
              "id", "name", "ph", "External id", "sort_index", "baseTimeNanoseconds"]
BASE_VALUES = ["0", "-1", "1", str(2**62), str(2**63), str(10**30), "1e30", "1.5", "null", "[]",
               '"1790857026000000000"', "1" * 5000, "NaN", "true"]
UTF8_INSERTS = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe2\x82", b"\x80abc", b"\xc3\xa9",
                b"\xf0\x9f\x98\x80", b"\\udfff", b"\x00", b"\t"]
DEEP = [("[" * n + "]" * n) for n in (150, 201, 250, 1000, 50_000)] + [
    '{"a":' * 300 + "1" + "}" * 300]

_NUM = re.compile(r'"@@N([^@"]*)@@"')
_RAW = re.compile(r'"@@R(\d+)@@"')


def parse(text: bytes) -> dict[str, Any]:
    """The trace with every number kept as its text ("@@N<text>@@"), for ``dump``."""
    return json.loads(text, parse_float=lambda s: f"@@N{s}@@",  # type: ignore[no-any-return]
                      parse_int=lambda s: f"@@N{s}@@")


def dump(doc: Any, raws: list[str]) -> bytes:
    """``doc`` as kineto-like JSON: number texts restored, ``@@R<k>@@`` -> ``raws[k]``."""
    text = json.dumps(doc, indent=1, ensure_ascii=False)
    text = _NUM.sub(lambda m: m.group(1), text)
    return _RAW.sub(lambda m: raws[int(m.group(1))], text).encode("utf-8")


def raw(raws: list[str], text: str) -> str:
    raws.append(text)
    return f"@@R{len(raws) - 1}@@"


def with_gpu_rows(text: bytes) -> bytes:
    """The real CPU trace plus kineto's GPU rows: 2 launches in the first aten::linear,
    a kernel by correlation, a kernel by ac2g flow only."""
    doc = parse(text)
    lin = next(e for e in doc["traceEvents"] if e.get("name") == "aten::linear")
    pid, tid = lin["pid"], lin["tid"]
    t0 = Decimal(lin["ts"][3:-2])

    def at(off: str) -> str:
        return f"@@N{t0 + Decimal(off):.3f}@@"

    def x(name: str, cat: str, off: str, dur: str, pid_: Any, tid_: Any, **args: Any
          ) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": pid_, "tid": tid_, "ts": at(off),
                "dur": f"@@N{dur}@@", "args": args}

    doc["traceEvents"] += [
        x("cudaLaunchKernel", "cuda_runtime", "0.001", "0.001", pid, tid, correlation=41),
        x("cudaLaunchKernel", "cuda_runtime", "0.003", "0.001", pid, tid),
        x("sgemm_kernel", "kernel", "0.010", "0.500", 0, 7, correlation=41),
        x("relu_kernel", "kernel", "0.600", "0.500", 0, 7),
        {"ph": "s", "id": 99, "pid": pid, "tid": tid, "ts": at("0.003"), "cat": "ac2g",
         "name": "ac2g"},
        {"ph": "f", "id": 99, "pid": 0, "tid": 7, "ts": at("0.600"), "cat": "ac2g",
         "name": "ac2g", "bp": "e"},
    ]
    return dump(doc, [])


def _value_spans(text: bytes, key: str) -> list[tuple[int, int]]:
    """(start, end) of each scalar value of ``"key":`` in ``text``."""
    pat = re.compile(rb'"' + re.escape(key.encode()) +
                     rb'"\s*:\s*(-?[0-9][0-9.eE+-]*|"(?:[^"\\]|\\.)*"|true|false|null)')
    return [m.span(1) for m in pat.finditer(text)]


def mutate(base: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One mutant of ``base`` and what was done to it."""
    kind = rng.choice(["flip", "truncate", "value", "value", "value", "value", "base", "utf8",
                       "deep", "dup", "event", "event", "top"])
    if kind == "flip":
        data = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.choice(
                [rng.randrange(256), 0x00, 0x80, 0xFF, 0xC3, ord('"'), ord("{"), ord("]")])
        return "bytes flipped", bytes(data)
    if kind == "truncate":
        cut = rng.randrange(len(base))
        return f"truncated at {cut}", base[:cut]
    if kind in ("value", "base"):
        key = "baseTimeNanoseconds" if kind == "base" else rng.choice(VALUE_KEYS)
        spans = _value_spans(base, key)
        if not spans:
            return f"no {key} to change", base
        a, b = rng.choice(spans)
        if kind == "base" and rng.random() < 0.4:  # a valid base, but shifted
            new = str(int(base[a:b]) + rng.choice([-86_400 * 10**9, -10**9, 1, 10**9,
                                                   3_600 * 10**9]))
        else:
            new = rng.choice(BASE_VALUES if kind == "base" else RAW_VALUES)
        return f"{key}={new[:20]}", base[:a] + new.encode() + base[b:]
    if kind == "utf8":
        spans = _value_spans(base, rng.choice(["name", "cat", "traceName"]))
        a, b = rng.choice(spans)
        at = rng.randrange(a + 1, b)  # inside the string
        ins = rng.choice(UTF8_INSERTS)
        return f"inserted {ins!r} in a string", base[:at] + ins + base[at:]
    if kind == "deep":
        spans = _value_spans(base, rng.choice(["name", "External id", "ts"]))
        a, b = rng.choice(spans)
        deep = rng.choice(DEEP)
        return f"deep value ({len(deep)} chars)", base[:a] + deep.encode() + base[b:]
    if kind == "dup":
        key_value = rng.choice([b'"ts": 0.000, ', b'"ts": 5, ', b'"pid": 1, ', b'"ph": "X", ',
                                b'"baseTimeNanoseconds": 1, ', b'"traceEvents": [], ',
                                b'"cat": [1], '])
        if key_value.startswith((b'"base', b'"traceE')):
            at = base.index(b"{") + 1
        else:
            at = rng.choice([m.end() for m in re.finditer(rb'\{\s*(?="ph")', base)])
        return f"duplicate {key_value!r}", base[:at] + key_value + base[at:]
    doc = parse(base)
    raws: list[str] = []
    events: list[Any] = doc["traceEvents"]
    i = rng.randrange(len(events))
    if kind == "event":
        what = rng.choice(["delete", "replace", "insert", "insert"])
        if what == "delete" and isinstance(events[i], dict) and events[i]:
            key = rng.choice(sorted(events[i]))
            del events[i][key]
            return f"event {i}: {key} deleted", dump(doc, raws)
        if what == "replace":
            events[i] = raw(raws, rng.choice(["5", '"x"', "[]", "null", "{}", "[{}]"]))
            return f"event {i} replaced by {raws[-1]}", dump(doc, raws)
        # an event of the run's own process (the pid of its ops), at odd times
        pid = next(e["pid"] for e in events if e.get("cat") == "cpu_op")
        ts = rng.choice(["0.000", "-1e15", "-9000000000000.5", "1e15", "4e15", "-4611686018427387"])
        dur = rng.choice(["1", "-5", "1e16"])
        new = {"ph": rng.choice(["X", "i", "s", "f", "B"]),
               "cat": rng.choice(["cpu_op", "ac2g", "kernel"]), "name": "fuzz", "pid": pid,
               "tid": 7, "ts": f"@@N{ts}@@", "dur": f"@@N{dur}@@", "id": 99}
        if rng.random() < 0.3:
            del new["ts"]
        events.insert(i, new)
        return f"event inserted at {i}: {new['ph']} ts={new.get('ts')}", dump(doc, raws)
    # top: the object's own keys
    what = rng.choice(["base_after", "no_base", "hooktrace", "events_not_list", "no_events"])
    if what == "base_after":
        doc["baseTimeNanoseconds"] = doc.pop("baseTimeNanoseconds")
    elif what == "no_base":
        del doc["baseTimeNanoseconds"]
    elif what == "hooktrace":
        doc["hooktrace"] = {"version": "x"}
    elif what == "events_not_list":
        doc["traceEvents"] = {"0": events[0]}
    else:
        del doc["traceEvents"]
    return f"top: {what}", dump(doc, raws)


def _refuse_constant(name: str) -> Any:
    raise AssertionError(f"non-JSON constant {name} in the output")


def check_merged(out: Path) -> None:
    """The merged output is strict JSON with every X event at a finite ts >= 0."""
    try:
        text = out.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise AssertionError(f"output is not UTF-8: {e}") from None
    doc = json.loads(text, parse_constant=_refuse_constant)
    base = doc["baseTimeNanoseconds"]
    assert isinstance(base, int) and not isinstance(base, bool) and base >= 0, base
    for e in doc["traceEvents"]:
        if isinstance(e, dict) and e.get("ph") == "X":
            ts = e.get("ts")
            assert isinstance(ts, (int, float)) and not isinstance(ts, bool), e
            assert math.isfinite(ts) and ts >= 0, e


def classify(run: TraceData, path: Path, out: Path) -> tuple[str, str]:
    """(merge outcome, attribute outcome); AssertionError for a bad result."""
    outcomes = []
    for what in ("merge", "attribute"):
        try:
            if what == "merge":
                merge_traces(run, path, out)
            else:
                table = attribute(run, path)
        except HooktraceError as e:
            msg = str(e)
            assert "\n" not in msg and msg.startswith(f"{path}: "), msg
            assert not out.exists(), "a refused merge left its output behind"
            outcomes.append("refused")
            continue
        if what == "merge":
            check_merged(out)
            out.unlink()
            outcomes.append("merged")
        else:
            assert table.to_text()
            json.loads(table.to_json(), parse_constant=_refuse_constant)
            outcomes.append("attributed")
    return outcomes[0], outcomes[1]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> tuple[TraceData, Path, bytes]:
    """(the run, its .htrace path, the profiler trace with GPU rows added)."""
    root = tmp_path_factory.mktemp("real")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with hooktrace.trace(model) as tr, torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(torch.randn(4, 8)).pow(2).mean().backward()
    prof.export_chrome_trace(str(root / "profiler.json"))
    tr.save(root / "run.htrace")
    return tr, root / "run.htrace", with_gpu_rows((root / "profiler.json").read_bytes())


@pytest.fixture(scope="module")
def mutants(real: tuple[TraceData, Path, bytes], tmp_path_factory: pytest.TempPathFactory
            ) -> list[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("fuzz")
    rng = random.Random(SEED)
    out = []
    for k in range(N_MUTANTS):
        what, data = mutate(real[2], rng)
        path = root / f"m{k:03d}.json"
        path.write_bytes(data)
        out.append((what, path))
    return out


def test_base_trace_merges_and_attributes_gpu_rows(real: tuple[TraceData, Path, bytes],
                                                   tmp_path: Path) -> None:
    run, _, base = real
    path = tmp_path / "p.json"
    path.write_bytes(base)
    assert classify(run, path, tmp_path / "m.json") == ("merged", "attributed")
    table = attribute(run, path)
    # the added GPU rows are reached: one kernel by correlation, one by flow
    assert table.counts["gpu_activities"] == 2 and table.counts["attributed_gpu"] == 2


def test_mutants_are_refused_or_give_valid_output(real: tuple[TraceData, Path, bytes],
                                                  mutants: list[tuple[str, Path]],
                                                  tmp_path: Path) -> None:
    run = real[0]
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    for what, path in mutants:
        try:
            merged, attributed = classify(run, path, tmp_path / "out.json")
            outcome = f"{merged}/{attributed}"
        except AssertionError as e:
            outcome = "invalid output"
            failures.append(f"{path.name} ({what}): {e}")
        except Exception as e:  # noqa: BLE001  (classifying is the point)
            outcome = f"unexpected {type(e).__name__}"
            failures.append(f"{path.name} ({what}): {type(e).__name__}: {e}")
        outcomes[outcome] += 1
        (tmp_path / "out.json").unlink(missing_ok=True)
    print(f"\nfuzz outcomes over {len(mutants)} mutants: {dict(sorted(outcomes.items()))}")
    assert not failures, "\n".join(failures[:20])
    # both paths are exercised
    assert outcomes["refused/refused"] > N_MUTANTS // 3, outcomes
    assert outcomes["merged/attributed"] > N_MUTANTS // 10, outcomes


@pytest.mark.parametrize(
    ("mutation", "fragment"),
    [
        # (merge only: attribution reads the last ts, as json does)
        ((b'"ph": "X"', b'"ph": "X", "ts": 1, "ts": 2'), "several top-level 'ts' keys"),
        ((b'"Sequence number": ', b'"Sequence number": 1' + b"0" * 20 + b", \"x\": "),
         "'Sequence number' is 10000"),
        ((b'"baseTimeNanoseconds": ', b'"baseTimeNanoseconds": 1e30, "x": '),
         "'baseTimeNanoseconds' is 1e30, expected an integer"),
        ((b'"name": "aten::linear"', b'"name": "aten::\xfflinear"'), "invalid UTF-8 (byte 0xff"),
        ((b'"cat": "cpu_op"', b'"cat": ["cpu_op"]'), "'cat' is ['cpu_op'], expected a string"),
        ((b'"id": 99', b'"id": [99]'), "flow 'id' is [99], expected an integer or a string"),
        ((b'"tid": 7', b'"tid": 1' + b"0" * 25), "'tid' is 1000"),
        ((b'"dur": 0.500', b'"dur": Infinity'), "contains Infinity, which is not JSON"),
        ((b'"External id": ', b'"External id": ' + b"[" * 1000 + b"]" * 1000 + b', "y": '),
         "nests deeper than 200 levels"),
    ],
)
def test_each_malformed_value_names_event_and_key(
        real: tuple[TraceData, Path, bytes], tmp_path: Path, mutation: tuple[bytes, bytes],
        fragment: str) -> None:
    run, _, base = real
    old, new = mutation
    assert old in base
    path = tmp_path / "p.json"
    path.write_bytes(base.replace(old, new, 1))
    calls = [lambda: merge_traces(run, path, tmp_path / "m.json"), lambda: attribute(run, path)]
    for call in calls[: 1 if b'"ts": 2' in new else 2]:
        with pytest.raises(HooktraceError) as info:
            call()
        msg = str(info.value)
        # file, position (line/column/byte, or event index and line/column/byte), what
        assert msg.startswith(f"{path}: ") and fragment in msg, msg
        assert re.search(r"line \d+ column \d+ \(byte \d+\)|'baseTimeNanoseconds'", msg), msg
        assert "\n" not in msg
    assert not (tmp_path / "m.json").exists()


def test_cli_on_mutants_gives_one_line_errors(real: tuple[TraceData, Path, bytes],
                                              mutants: list[tuple[str, Path]], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    run_path = real[1]
    run = real[0]
    chosen = mutants[:20]
    seen = Counter()
    for _, path in chosen:
        expected = classify(run, path, tmp_path / "o.json")
        for argv, outcome in (
                (["merge", str(run_path), str(path), "-o", str(tmp_path / "o.json")], expected[0]),
                (["summary", str(run_path), "--profiler", str(path)], expected[1])):
            rc = main(argv)
            err = capsys.readouterr().err
            assert "Traceback" not in err, (argv, err)
            if outcome == "refused":
                assert rc == 1 and err.count("\n") == 1, (argv, rc, err)
                assert err.startswith(f"hooktrace: error: {path}: "), err
            else:
                assert rc == 0 and err == "", (argv, rc, err)
            seen[outcome] += 1
            (tmp_path / "o.json").unlink(missing_ok=True)
    assert seen["refused"] and (seen["merged"] or seen["attributed"]), seen


def test_cli_process_on_mutants(real: tuple[TraceData, Path, bytes],
                                mutants: list[tuple[str, Path]], tmp_path: Path) -> None:
    # the real entry point on refused mutants: one line on stderr, exit 1, no traceback
    run = real[0]
    refused = [p for _, p in mutants
               if classify(run, p, tmp_path / "o.json") == ("refused", "refused")][:2]
    assert len(refused) == 2
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for argv in (["merge", str(real[1]), str(refused[0]), "-o", str(tmp_path / "o.json")],
                 ["summary", str(real[1]), "--profiler", str(refused[1])]):
        proc = subprocess.run([sys.executable, "-m", "hooktrace", *argv], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stderr.startswith("hooktrace: error: "), proc.stderr
    assert not (tmp_path / "o.json").exists()

