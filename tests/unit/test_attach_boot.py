"""The code ``hooktrace attach`` has a job run, and what it trusts (issues #46, #47), in this
process, without gdb: the pending call's namespace, the one-shot token, a forged status,
and which signals are sent again after gdb detached."""

from __future__ import annotations

import builtins
import json
import os
import signal
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import pytest

from hooktrace.record import attach as attach_mod
from hooktrace.record import attach_agent
from hooktrace.record.attach import _Target, held_back, pending_code
from hooktrace.record.attach_folder import checked_status


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[dict[str, Any], int]]:
    """What the boot code hands the agent (the agent itself is not run here)."""
    calls: list[tuple[dict[str, Any], int]] = []
    # (the boot code asks for torch imported, as a training job has it)
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    monkeypatch.setattr(attach_agent, "start",
                        lambda request, fd: calls.append((request, fd)) or os.close(fd))
    return calls


def target(tmp_path: Path) -> _Target:
    t = _Target(os.getpid(), str(tmp_path))
    t.make_folder()
    return t


def run_pending(code: str, namespace: dict[str, Any]) -> None:
    """As PyRun_SimpleString runs it: in __main__'s namespace."""
    exec(compile(code, "<pending>", "exec"), namespace)


def test_the_pending_call_leaves_the_scripts_namespace_as_it_was(
        tmp_path: Path, started: list[Any]) -> None:
    # GIVEN a script whose globals shadow builtins (nanoGPT's `compile = False`)
    t = target(tmp_path)
    main = {"__name__": "__main__", "__builtins__": builtins, "compile": False,
            "exec": None, "open": None, "os": "not the module", "sys": 0}
    before = dict(main)
    # WHEN the job runs the pending call
    run_pending(pending_code(t, {"nonce": t.nonce}), main)
    # THEN the agent was started, and the script's globals are the ones it had
    assert [request for request, _ in started] == [{"nonce": t.nonce}]
    assert main == before
    t.remove()


def test_the_token_is_one_shot_and_withdrawn_when_attach_gives_up(
        tmp_path: Path, started: list[Any]) -> None:
    t = target(tmp_path)
    code = pending_code(t, {"nonce": t.nonce})
    run_pending(code, {"__builtins__": builtins})
    run_pending(code, {"__builtins__": builtins})  # (queued twice: runs once)
    assert len(started) == 1
    assert not t.withdraw() and t.started_by_job
    t.remove()
    # a queued call attach gave up on (it withdrew the token first) does nothing
    t2 = target(tmp_path)
    assert t2.withdraw()
    run_pending(pending_code(t2, {"nonce": t2.nonce}), {"__builtins__": builtins})
    assert len(started) == 1
    t2.remove()
    # and neither does one whose folder is gone, or was made again by someone else
    run_pending(pending_code(t2, {}), {"__builtins__": builtins})
    os.mkdir(t2.path, 0o700)
    Path(t2.path, "token").write_text(t2.nonce)
    os.chmod(t2.path, 0o755)  # (not private: not attach's)
    run_pending(pending_code(t2, {}), {"__builtins__": builtins})
    assert len(started) == 1


def test_a_process_without_torch_says_so_and_imports_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(attach_agent, "start", lambda request, fd: pytest.fail("started"))
    t = target(tmp_path)
    run_pending(pending_code(t, {}), {"__builtins__": builtins})
    t.read_status()
    assert t.job["state"] == "error" and "has not imported torch" in t.job["message"]
    assert "torch" not in sys.modules
    t.remove()


def test_a_folder_of_another_user_is_not_trusted(tmp_path: Path, started: list[Any]) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another uid needs root (CI runs as root)")
    t = target(tmp_path)
    os.chown(t.path, 61234, 61234)  # (as another user would have made it, with the nonce)
    run_pending(pending_code(t, {}), {"__builtins__": builtins})
    assert started == []
    t.remove()


def test_the_private_folder_is_the_jobs_users_and_no_one_elses(tmp_path: Path) -> None:
    t = target(tmp_path)
    st = os.stat(t.path)
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.geteuid()
    assert sorted(os.listdir(t.path)) == ["token"]
    assert os.stat(Path(t.path, "token")).st_mode & 0o777 == 0o600
    t.remove()
    assert not os.path.exists(t.path)


NONCE = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("doc", [
    {"state": "done", "steps": 9},  # no nonce: not the job's answer to this attach
    {"state": "done", "nonce": "guess"},
    {"state": "pwned", "nonce": NONCE},
    ["state", "done"],
    "not json",
])
def test_a_status_without_this_attachs_nonce_is_ignored(doc: Any) -> None:
    raw = (doc if isinstance(doc, str) else json.dumps(doc)).encode()
    assert checked_status(raw, NONCE) is None


def test_a_status_keeps_only_fields_of_the_right_type() -> None:
    raw = json.dumps({"state": "done", "nonce": NONCE, "steps": "9", "output": 3,
                      "lines": ["a", 3, "b\x1b[2K"], "message": "m"}).encode()
    assert checked_status(raw, NONCE) == {"state": "done", "message": "m",
                                           "lines": ["a", "b\x1b[2K"]}


def test_a_status_not_the_jobs_users_or_not_a_file_is_not_read(tmp_path: Path) -> None:
    t = target(tmp_path)
    os.symlink(tmp_path / "elsewhere", Path(t.path, "status"))
    (tmp_path / "elsewhere").write_text(json.dumps({"state": "done", "nonce": t.nonce}))
    t.read_status()
    assert t.job == {}
    t.remove()


def test_signals_gdb_held_back_are_sent_again_once_each() -> None:
    out = ("\nProgram received signal SIGUSR1, User defined signal 1.\n"
           "\nThread 2 \"python\" received signal SIGUSR1, User defined signal 1.\n"
           "\nProgram received signal SIGSEGV, Segmentation fault.\n"
           "\nProgram received signal SIGTERM, Terminated.\n"
           "\nProgram received signal SIG40, Real-time event 40.\n"
           "\nProgram received signal SIG40, Real-time event 40.\n")
    assert held_back(out) == [signal.SIGUSR1, signal.SIGTERM, 40, 40]


def test_gdb_holds_signals_back_and_runs_in_a_session_of_its_own() -> None:
    # (the command line: what makes a signal during the injection safe for the job)
    source = Path(attach_mod.__file__).read_text()
    assert '"handle all nostop print nopass"' in source
    assert "start_new_session=True" in source


def test_a_folder_option_other_users_can_write_is_refused(tmp_path: Path) -> None:
    from hooktrace.errors import AttachError
    from hooktrace.record.attach_folder import Credentials, check_not_shared

    me = Credentials(os.geteuid(), os.getegid(), frozenset({os.getegid()}))
    mine, open_to_all = tmp_path / "mine", tmp_path / "shared"
    mine.mkdir(mode=0o700)
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    check_not_shared(1, me, "aggregate", str(mine))
    check_not_shared(1, me, "aggregate", str(mine / "new"))
    for path in (open_to_all, open_to_all / "new"):
        with pytest.raises(AttachError, match="--aggregate .* can be written by other users"):
            check_not_shared(1, me, "aggregate", str(path))


def test_an_output_folder_the_jobs_user_cannot_write_is_refused(tmp_path: Path) -> None:
    from hooktrace.errors import AttachError
    from hooktrace.record.attach_folder import Credentials, check_job_can_write

    other = Credentials(61234, 61234, frozenset({61234}))
    with pytest.raises(AttachError, match="runs as uid 61234, which cannot reach"):
        check_job_can_write(1, other, str(tmp_path))  # (pytest's base folder is 0700)
    base = Path(tempfile.mkdtemp())  # (reachable by everyone: 0755)
    try:
        os.chmod(base, 0o755)
        with pytest.raises(AttachError, match="runs as uid 61234, which cannot write"):
            check_job_can_write(1, other, str(base))
        os.chmod(base, 0o777)
        check_job_can_write(1, other, str(base))
    finally:
        os.rmdir(base)
