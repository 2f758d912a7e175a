"""``open_output``'s temporary file (hooktrace._output): created by the call itself, under
a name nobody can guess, never through a link. In a folder other users can write (a
shared results folder, /tmp), a link planted at a predictable temporary name would have
the output written through it: over a file of the user's that the link points to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import hooktrace._output as output


def test_a_planted_link_at_the_temp_name_is_not_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    out = tmp_path / "shared" / "out.json"
    out.parent.mkdir()
    tokens = iter(["0" * 16, "1" * 16])  # the first name taken by the link, then a free one
    monkeypatch.setattr(output.secrets, "token_hex", lambda n: next(tokens))
    os.symlink(victim, out.parent / f".out.json.{'0' * 16}.tmp")
    with output.open_output(out) as f:
        f.write(b"{}")
    assert victim.read_bytes() == b"precious"
    assert out.read_bytes() == b"{}"
    assert os.path.islink(out.parent / f".out.json.{'0' * 16}.tmp")  # (not ours: left)
    assert sorted(p.name for p in out.parent.iterdir()) == [f".out.json.{'0' * 16}.tmp",
                                                           "out.json"]


def test_a_failed_write_removes_only_its_own_temp_file(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with output.open_output(out) as f:
            f.write(b"new, cut short")
            raise RuntimeError("disk full")
    assert out.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_the_output_keeps_the_umask_mode(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        with output.open_output(tmp_path / "out.bin") as f:
            f.write(b"x")
    finally:
        os.umask(old)
    assert (tmp_path / "out.bin").stat().st_mode & 0o777 == 0o640
