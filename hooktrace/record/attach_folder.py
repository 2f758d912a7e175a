"""The private folder ``hooktrace attach`` makes for each job (issue #46), both sides of it:
:class:`PrivateFolder` is the attaching side's (:mod:`hooktrace.record.attach`), :class:`JobFolder`
the job's (:mod:`hooktrace.record.attach_agent`).

The folder, ``.hooktrace-attach-<random>`` in the output's folder, is made by attach with
mode 0700, given to the job's user, checked after creation and used by descriptor only on
both sides (its name may be renamed by anyone who can write the output folder; its
content by no one else). What is in it, by name: ``token`` (the nonce, taken by the job:
one shot), ``status`` (the job's, JSON with the nonce, replaced through a temporary file),
``go``, ``stop`` and ``left`` (from attach), and ``o<k>/`` (the job's outputs before they
are renamed into place). See docs/attach.md for why another user cannot steer any of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hooktrace.errors import AttachError
from hooktrace.text import printable

__all__ = ["FOLDER_PREFIX", "GO", "LEFT", "STATUS", "STOP", "TOKEN", "Credentials", "JobFolder",
           "PrivateFolder", "check_job_can_write", "check_not_shared", "checked_status",
           "proc_status", "remove_folder", "remove_tree"]

# A status larger than this is not the agent's (it writes a few KB)
MAX_STATUS_BYTES = 1 << 20
# The names in the private folder
TOKEN, STATUS, GO, STOP, LEFT = "token", "status", "go", "stop", "left"
FOLDER_PREFIX = ".hooktrace-attach-"


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


@dataclass(frozen=True)
class Credentials:
    """The user a process creates files as (effective ids, from /proc/PID/status)."""

    uid: int
    gid: int
    groups: frozenset[int]

    @classmethod
    def of(cls, pid: int) -> Credentials:
        try:
            st = proc_status(pid)
            uid, gid = int(st["Uid"].split()[1]), int(st["Gid"].split()[1])
            groups = frozenset(int(g) for g in st.get("Groups", "").split())
        except (OSError, KeyError, ValueError, IndexError):
            raise AttachError(f"no process with PID {pid}") from None
        return cls(uid, gid, groups | {gid})

    def may(self, path: str, write: bool) -> bool:
        """Whether this user can search ``path`` (and write it): its mode bits, as the
        kernel checks them (ACLs aside)."""
        if self.uid == 0:
            return True
        try:
            st = os.stat(path)
        except OSError:
            return False
        shift = 6 if st.st_uid == self.uid else 3 if st.st_gid in self.groups else 0
        need = 0o1 | (0o2 if write else 0)
        return (st.st_mode >> shift) & need == need


def check_job_can_write(pid: int, creds: Credentials, folder: str) -> None:
    """AttachError unless the job's user can reach and write ``folder`` (the job moves
    its outputs there: checked first, not after recording for --timeout seconds)."""
    path = os.path.abspath(folder)
    parts = [path, *(str(p) for p in Path(path).parents)]
    for i, part in enumerate(reversed(parts)):
        last = i == len(parts) - 1
        if not creds.may(part, write=last):
            raise AttachError(
                f"process {pid} runs as uid {creds.uid}, which cannot "
                f"{'write' if last else 'reach'} {printable(path)}"
                f"{'' if last else f' (no search permission on {printable(part)})'}: "
                "choose an output folder that user can write (-o)")


def check_not_shared(pid: int, creds: Credentials, name: str, path: str) -> None:
    """A folder option (--aggregate, --dump-dir) is written where it is named: refused
    when another user could plant names in it (or in its parent, if it does not exist yet)."""
    where = path if os.path.isdir(path) else os.path.dirname(path.rstrip(os.sep)) or "."
    try:
        st = os.stat(where)
    except OSError:
        return  # (made by the job; its own checks say what is wrong)
    shared_group = st.st_mode & 0o020 and _others_in_group(st.st_gid, creds.uid)
    if st.st_uid not in (creds.uid, 0) or st.st_mode & 0o002 or shared_group:
        raise AttachError(
            f"--{name.replace('_', '-')} {printable(path)}: {printable(where)} can be "
            "written by other users, who could plant links the job would follow: "
            "choose a folder only the job's user can write")


def _others_in_group(gid: int, uid: int) -> bool:
    """Whether group ``gid`` has members other than user ``uid`` (a user's private
    group, the default on most distributions, has none); True when unknown."""
    import grp
    import pwd

    try:
        members = set(grp.getgrgid(gid).gr_mem)
        members |= {p.pw_name for p in pwd.getpwall() if p.pw_gid == gid}
        me = pwd.getpwuid(uid).pw_name
    except KeyError:
        return True
    return bool(members - {me})


class PrivateFolder:
    """attach's side of one target's private folder: the job's credentials, the folder
    (held by descriptor) and the nonce that proves the folder, the boot code and the
    status are this attach's."""

    def __init__(self, pid: int, parent: str) -> None:
        self.pid = pid
        self.creds = Credentials.of(pid)
        self.parent = parent
        self.nonce = secrets.token_hex(16)
        self.name = FOLDER_PREFIX + secrets.token_hex(8)
        self.path = os.path.join(parent, self.name)
        self.fd = -1
        self.job: dict[str, Any] = {}  # the job's last status (checked)
        self.started_by_job = False  # the job consumed the token (it runs the request)

    @property
    def job_state(self) -> str:
        return str(self.job.get("state", "waiting"))

    def make_folder(self) -> None:
        """The private folder: made 0700, given to the job's user, checked after."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        parent = os.open(self.parent, flags & ~os.O_NOFOLLOW)
        try:
            os.mkdir(self.name, 0o700, dir_fd=parent)
            self.fd = os.open(self.name, flags, dir_fd=parent)
            if os.fstat(self.fd).st_uid != self.creds.uid:
                try:
                    os.fchown(self.fd, self.creds.uid, self.creds.gid)
                except PermissionError:
                    raise AttachError(
                        f"process {self.pid} runs as uid {self.creds.uid}: attaching to "
                        "another user's process needs root (its private folder must be "
                        "that user's)") from None
            os.fchmod(self.fd, 0o700)
            st, named = os.fstat(self.fd), os.stat(self.name, dir_fd=parent,
                                                    follow_symlinks=False)
        finally:
            os.close(parent)
        if (st.st_uid != self.creds.uid or stat.S_IMODE(st.st_mode) != 0o700
                or (st.st_dev, st.st_ino) != (named.st_dev, named.st_ino)):
            raise AttachError(f"{printable(self.path)}: the private folder is not as made "
                              "(owner, mode or inode changed): another user is interfering")
        self._write(TOKEN, self.nonce)

    def _write(self, name: str, text: str) -> None:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=self.fd)
        try:
            os.write(fd, text.encode())
            if os.fstat(fd).st_uid != self.creds.uid:
                os.fchown(fd, self.creds.uid, self.creds.gid)
        finally:
            os.close(fd)

    def signal(self, name: str) -> None:
        """Leaves ``go``, ``stop`` or ``left`` for the job (once)."""
        with contextlib.suppress(FileExistsError, OSError):
            self._write(name, name)

    def withdraw(self) -> bool:
        """Removes the token: True when the job had not taken it (it never will: its
        queued call finds no token and does nothing), False when it had."""
        try:
            os.unlink(TOKEN, dir_fd=self.fd)
            return True
        except FileNotFoundError:
            self.started_by_job = True
            return False

    def read_status(self) -> None:
        """``job``: the job's status file, if it is the job's: a regular
        file of the job's user, at most MAX_STATUS_BYTES, JSON with this attach's nonce;
        anything else is ignored (the job had no way to write it)."""
        try:
            fd = os.open(STATUS, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=self.fd)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != self.creds.uid \
                    or st.st_size > MAX_STATUS_BYTES:
                return
            raw = os.read(fd, MAX_STATUS_BYTES)
        finally:
            os.close(fd)
        status = checked_status(raw, self.nonce)
        if status is not None:
            self.started_by_job = True
            self.job = status

    def remove(self) -> None:
        """Removes the private folder and what is left in it (the job's outputs are
        moved out before it says done)."""
        if self.fd < 0:
            return
        remove_folder(self.fd)
        os.close(self.fd)
        self.fd = -1


def remove_folder(fd: int) -> None:
    """Empties the folder open as ``fd`` and removes it from its parent, found by inode
    (``..`` of the descriptor: whatever name it has now; errors ignored)."""
    with contextlib.suppress(OSError):
        remove_tree(fd)
        mine = os.fstat(fd)
        parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        try:
            for name in os.listdir(parent):
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                    os.rmdir(name, dir_fd=parent)
                    break
        finally:
            os.close(parent)


def remove_tree(fd: int) -> None:
    """Empties the folder open as ``fd`` (never following a link)."""
    for entry in os.listdir(fd):
        try:
            os.unlink(entry, dir_fd=fd)
        except IsADirectoryError:
            sub = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            try:
                remove_tree(sub)
            finally:
                os.close(sub)
            os.rmdir(entry, dir_fd=fd)


_STATES = ("recording", "done", "error")


def checked_status(raw: bytes, nonce: str) -> dict[str, Any] | None:
    """The status the job wrote, its fields type-checked, or None if it is not the
    job's answer to this attach (no nonce, not JSON, wrong types)."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("nonce") != nonce or doc.get("state") not in _STATES:
        return None
    out: dict[str, Any] = {"state": doc["state"]}
    for key, kind in (("message", str), ("output", str), ("steps", int),
                      ("attached_unix_ns", int), ("first_step_unix_ns", int),
                      ("detached_unix_ns", int), ("compiled", bool)):
        value = doc.get(key)
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            out[key] = value
    lines = doc.get("lines")
    if isinstance(lines, list):
        out["lines"] = [line for line in lines if isinstance(line, str)]
    return out




class JobFolder:
    """The private folder attach made for this process, by descriptor (never by name:
    another user may rename names in the output folder, never the folder's content)."""

    def __init__(self, fd: int, nonce: str) -> None:
        self.fd = fd
        self.nonce = nonce

    def write_status(self, status: dict[str, Any]) -> None:
        """The status file, replaced at once (attach polls it), with the nonce."""
        tmp = f"status.{os.getpid()}.{threading.get_ident()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=self.fd)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=self.fd)
        with os.fdopen(fd, "w") as f:
            json.dump({**status, "nonce": self.nonce}, f)
        os.replace(tmp, STATUS, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def has(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            return True
        except OSError:
            return False

    def told_to_stop(self) -> bool:
        """attach said ``stop`` or ``left``, or removed the folder."""
        try:
            gone = os.fstat(self.fd).st_nlink == 0
        except OSError:
            gone = True
        return gone or self.has(STOP) or self.has(LEFT)

    def abandoned(self) -> bool:
        """Nobody waits for this folder any more: the job removes it."""
        try:
            return os.fstat(self.fd).st_nlink == 0 or self.has(LEFT)
        except OSError:
            return True

    def remove(self) -> None:
        """Empties the folder and removes it from its parent (if it is still there)."""
        remove_folder(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
