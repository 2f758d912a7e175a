"""The command line's inputs and options (issue #26 part 3): every bad input is one
``hooktrace: error:`` line, never a traceback, a hang or a silently wrong result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """\
import torch
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(3):
    x = torch.randn(8, 4)
    if i == 1 and NAN:
        x[0, 0] = float("nan")
    m(x).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def run_cli(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m hooktrace ARGS`` in a subprocess; a hang fails the test at ``timeout``."""
    return subprocess.run([sys.executable, "-m", "hooktrace", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})


def one_line_error(r: subprocess.CompletedProcess[str], *needles: str, code: int = 1) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("hooktrace: error: "), r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr


def traced_run(out: Path | str, folder: Path, *options: str, nan: bool = False) -> None:
    """``hooktrace run [options] -o out`` of a three-step script (written in ``folder``)."""
    script = folder / ("nan_script.py" if nan else "script.py")
    script.write_text(SCRIPT.replace("NAN", str(nan)))
    r = run_cli("run", *options, "-o", str(out), str(script), timeout=300)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("run")
    traced_run(d / "run.htrace", d)
    return d / "run.htrace"


# -- 1. a FIFO (or any non-regular file) as an input is refused, not read forever --------


def test_open_input_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    from hooktrace._input import open_input
    from hooktrace.errors import InputPathError

    fifo = tmp_path / "pipe.htrace"
    os.mkfifo(fifo)  # no writer: a plain open() would block forever
    for path, kind in ((fifo, "a FIFO"), ("/dev/zero", "a character device"),
                       (tmp_path, "a directory")):
        with pytest.raises(InputPathError, match=f"^{path}: is {kind}"):
            open_input(path)
    regular = tmp_path / "f"
    regular.write_bytes(b"x")
    with open_input(regular) as f:
        assert f.read() == b"x"


@pytest.mark.parametrize("verb", ["summary", "export", "report", "diff A", "diff B", "stacks",
                                  "merge RUN", "merge PROFILER", "merge-ranks",
                                  "summary --profiler"])
def test_every_verb_refuses_a_fifo_input_in_one_line(verb: str, run_file: Path,
                                                     tmp_path: Path) -> None:
    fifo = str(tmp_path / "pipe.htrace")
    os.mkfifo(fifo)
    run, out = str(run_file), str(tmp_path / "out.json")
    argv = {"summary": ["summary", fifo], "export": ["export", fifo, "-o", out],
            "report": ["report", fifo, "-o", str(tmp_path / "r.html")],
            "diff A": ["diff", fifo, run], "diff B": ["diff", run, fifo],
            "stacks": ["stacks", fifo], "merge RUN": ["merge", fifo, fifo, "-o", out],
            "merge PROFILER": ["merge", run, fifo, "-o", out],
            "merge-ranks": ["merge-ranks", fifo, "-o", out],
            "summary --profiler": ["summary", run, "--profiler", fifo]}[verb]
    one_line_error(run_cli(*argv, timeout=60), f"{fifo}: is a FIFO (named pipe), not a "
                                               "regular file")
    assert not os.path.exists(out)


# -- 2. file names that are not UTF-8 -------------------------------------------------


def test_report_and_merge_ranks_take_file_names_that_are_not_utf8(run_file: Path,
                                                                  tmp_path: Path) -> None:
    ff = os.fsdecode(b"r\xff")  # 'r\udcff': how Python holds the byte \xff of a name
    folder = tmp_path / ff
    folder.mkdir()
    odd = folder / f"{ff}.htrace"
    odd.write_bytes(run_file.read_bytes())
    strict = {"PYTHONIOENCODING": "utf-8"}  # stdout as a UTF-8 terminal has it: strict
    report = tmp_path / f"{ff}.html"
    r = run_cli("report", str(odd), "-o", str(report), **strict)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "r\\xff.htrace" in report.read_bytes().decode("utf-8")  # valid UTF-8, name shown
    for inputs in ([str(folder)], [str(odd)]):
        merged = tmp_path / f"{ff}.json"
        r = run_cli("merge-ranks", *inputs, "-o", str(merged), **strict)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert "wrote " in r.stdout
        doc = json.loads(merged.read_bytes().decode("utf-8"))
        assert os.fsencode(doc["hooktrace"]["ranks"][0]["path"]) == os.fsencode(odd)


# -- 3. --start/--end out of any run's range --------------------------------------------


@pytest.mark.parametrize("option", ["--start=1e300", "--end=1e300", "--start=-1e300",
                                    "--end=-1e300", "--start=1e10"])
def test_export_refuses_a_start_or_end_beyond_any_run(option: str, run_file: Path,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    one_line_error(run_cli("export", str(run_file), "-o", str(out), option),
                   option.split("=")[0][2:] + " must be a number of seconds within +-1e+09")
    assert not out.exists()


def test_filters_bound_start_and_end_for_the_api_too() -> None:
    from hooktrace.analysis._filters import FilterError, Filters

    with pytest.raises(FilterError, match="end must be a number of seconds within"):
        Filters(end=1e300)
    assert Filters(start=-5.0, end=1e9).end == 1e9  # as far as the bound itself


# -- 4. float options: finite and in range ------------------------------------------------


@pytest.mark.parametrize("argv, needle", [
    (["summary", "RUN", "RUN", "--threshold", "nan"], "argument --threshold: expected a finite"),
    (["summary", "RUN", "RUN", "--threshold", "inf"], "argument --threshold: expected a finite"),
    (["summary", "RUN", "RUN", "--min-excess-ms", "nan"], "argument --min-excess-ms"),
    (["summary", "RUN", "RUN", "--min-excess-ms", "1e300"], "--min-excess-ms must be at most"),
    (["summary", "RUN", "--peak-tflops", "inf"], "argument --peak-tflops"),
    (["report", "RUN", "-o", "OUT.html", "--peak-tflops", "nan"], "argument --peak-tflops"),
    (["diff", "RUN", "RUN", "--fail-above", "inf"], "argument --fail-above"),
    (["diff", "RUN", "RUN", "--fail-above", "1", "--min-share", "nan"], "argument --min-share"),
    (["diff", "RUN", "RUN", "--fail-above", "1", "--min-share", "101"],
     "--min-share must be a percentage from 0 to 100"),
    (["export", "RUN", "-o", "OUT.json", "--start", "nan"], "argument --start"),
    (["run", "--dump-on", "hang", "--hang-timeout", "inf", "SCRIPT"], "argument --hang-timeout"),
    (["run", "--dump-on", "hang", "--hang-timeout", "nan", "SCRIPT"], "argument --hang-timeout"),
])
def test_float_options_refuse_non_finite_and_out_of_range_values(
        argv: list[str], needle: str, run_file: Path, tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    names = {"RUN": str(run_file), "OUT.html": str(tmp_path / "o.html"),
             "OUT.json": str(tmp_path / "o.json"), "SCRIPT": str(script)}
    r = run_cli(*(names.get(a, a) for a in argv))
    one_line_error(r, needle, code=2 if "argument " in needle else 1)
    assert "ran" not in r.stdout and not list(tmp_path.glob("o.*"))


def test_analyze_refuses_a_nan_threshold() -> None:
    from hooktrace.analysis.stragglers import analyze

    with pytest.raises(ValueError, match="finite"):
        analyze([], threshold=float("nan"))


# -- 5. numerics holding a NaN: no numpy warning ------------------------------------------


def test_summary_of_numerics_with_a_nan_prints_no_warning(tmp_path: Path) -> None:
    import warnings

    import hooktrace
    from hooktrace.analysis.numerics import history

    run = tmp_path / "nan.htrace"
    traced_run(run, tmp_path, "--numerics", nan=True)
    r = run_cli("summary", str(run), "--numerics")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning fails here
        trace = hooktrace.load(run)
        rows = history(trace)
        trace.summary()
    # NaN still sticks: the step with the NaN input has a NaN abs-max, the others not
    nan_steps = {row["step"] for row in rows if row["absmax"] == "nan"}
    assert 1 in nan_steps and 0 not in nan_steps, rows


# -- 6. the output's suffix picks its format: an unknown one is refused -------------------


@pytest.mark.parametrize("name, found", [("t.csv", "unknown output suffix '.csv'"),
                                         ("t.json.bz2", "unknown output suffix '.bz2'"),
                                         ("trace", "no output suffix")])
def test_export_refuses_an_unknown_output_suffix(name: str, found: str, run_file: Path,
                                                 tmp_path: Path) -> None:
    out = tmp_path / name
    one_line_error(run_cli("export", str(run_file), "-o", str(out)),
                   f"{out}: {found}; give a name ending in .json, .json.gz, .pftrace")
    # a directory of ranks goes through merge-ranks: refused the same way
    one_line_error(run_cli("export", str(run_file.parent), "-o", str(out)), found)
    one_line_error(run_cli("merge-ranks", str(run_file.parent), "-o", str(out)), found)
    assert not out.exists()


def test_every_output_suffix_has_its_format(run_file: Path, tmp_path: Path) -> None:
    from hooktrace.exporters.formats import CHROME, OUTPUT_FORMATS, PERFETTO, output_format

    for suffix, fmt in OUTPUT_FORMATS.items():
        assert output_format(f"x{suffix}") is fmt
        out = tmp_path / f"t{suffix}"
        r = run_cli("export", str(run_file), "-o", str(out))
        assert r.returncode == 0, r.stderr
        data = out.read_bytes()
        if suffix.endswith(".gz"):
            import gzip

            data = gzip.decompress(data)
        assert data.startswith(b'{"traceEvents"') == (fmt is CHROME), suffix
        assert (fmt is PERFETTO) == suffix.startswith((".pftrace", ".perfetto-trace"))
    assert output_format("-") is CHROME and output_format("/dev/null") is CHROME


# -- 8. separate runs in one folder are not ranks ------------------------------------------

RANK_SCRIPT = """\
import time
import torch
m = torch.nn.Linear(4, 4)
for _ in range(2):
    m(torch.randn(2, 4)).sum().backward()
time.sleep(float(__import__("os").environ.get("HOLD", "0")))  # ranks overlap in time
"""


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two separate ``hooktrace run -o runs/`` of one script, no launcher."""
    d = tmp_path_factory.mktemp("two")
    runs = d / "runs"
    runs.mkdir()
    traced_run(f"{runs}/", d)
    traced_run(f"{runs}/", d)
    assert len(list(runs.glob("*.htrace"))) == 2
    return runs


def test_two_separate_runs_in_a_folder_are_refused_as_ranks(two_runs: Path,
                                                            tmp_path: Path) -> None:
    a, b = sorted(two_runs.glob("*.htrace"))
    out = tmp_path / "m.json"
    for argv in (["summary", str(two_runs)], ["summary", str(a), str(b)],
                 ["merge-ranks", str(two_runs), "-o", str(out)],
                 ["export", str(two_runs), "-o", str(out)]):
        one_line_error(run_cli(*argv), f"{a} (by ", f"{b} (by ", "are traces of separate runs")
    assert not out.exists()
    # diff refuses the same folder; each file alone is a run it compares
    one_line_error(run_cli("diff", str(two_runs), str(two_runs)), "processes without a rank",
                   "different runs")
    assert run_cli("diff", str(a), str(b)).returncode == 0


def start_rank(script: Path, out: Path, rank: int, hold: str) -> subprocess.Popen[str]:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "HOLD": hold}
    return subprocess.Popen([sys.executable, "-m", "hooktrace", "run", "-o", f"{out}/",
                             str(script)], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_ranks_of_one_run_are_a_rank_set_and_two_runs_of_ranks_are_not(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    job = tmp_path / "job"
    job.mkdir()
    # one job: ranks 0 and 1 recording at the same time (as under torchrun)
    procs = [start_rank(script, job, r, "6") for r in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    r = run_cli("summary", str(job))
    assert r.returncode == 0 and "2 ranks" in r.stdout, r.stderr
    assert run_cli("merge-ranks", str(job), "-o", str(tmp_path / "job.json")).returncode == 0
    # a second job's rank 0 in the same folder: rank 0 twice, by two processes
    second = start_rank(script, job, 0, "0")
    assert second.wait(timeout=300) == 0
    for argv in (["summary", str(job)], ["merge-ranks", str(job), "-o", str(tmp_path / "x.json")]):
        one_line_error(run_cli(*argv), "are both rank 0: ranks of separate runs")
    one_line_error(run_cli("diff", str(job), str(job)), "2 processes wrote rank 0")
