"""Formatting at the bottom of the package: durations, counts and byte sizes as a
person reads them, a flight-recorder dump's one-line-per-thread account, and the
line that says where to open a trace.

Nothing here imports hooktrace: the summary, the diff, the exporters, the report
and the commands all format through these.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["CUT_NOTE", "ELLIPSIS", "OPEN_HINT", "align_columns", "csv_text", "describe_dump",
           "display_path", "format_bytes", "format_count", "format_ns", "open_hint",
           "printable", "shorten_distinct", "shorten_middle", "shorten_name",
           "terminal_width", "text_lines"]

DEFAULT_WIDTH = 120  # the width of a table when the output is not a terminal (issue #7)


def terminal_width(default: int = DEFAULT_WIDTH) -> int:
    """The columns a table may use: ``$COLUMNS`` when set, else the terminal's width,
    else ``default`` (output to a file or a pipe)."""
    return max(shutil.get_terminal_size((default, 24)).columns, 40)


def display_path(path: str) -> str:
    r"""A file name as text that any UTF-8 output can hold: bytes of the name that are
    not UTF-8 (which Python keeps as lone surrogates) are written ``\xNN``.

    Example:
        >>> display_path("runs/r\udcff.htrace"), display_path("ok/é.htrace")
        ('runs/r\\xff.htrace', 'ok/é.htrace')
    """
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


# Control characters (C0, DEL, C1), the Unicode line and paragraph separators and the
# bidirectional overrides: in a name from a trace file they would act on the terminal
# (an OSC sequence sets its title, ESC[2K erases a line) or forge a line of a CI log
# (issue #35), so text output writes them as escapes.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _ESCAPES.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(text: str) -> str:
    r"""``text`` with its control characters written visibly (``\x1b``, ``\n``, ``\u202e``):
    what every line of text output goes through (:func:`text_lines`).

    Example:
        >>> printable("fc\x1b]0;title\x07"), printable("a\nb"), printable("model.fc1")
        ('fc\\x1b]0;title\\x07', 'a\\nb', 'model.fc1')
    """
    return _CONTROL.sub(_escape, text)


def text_lines(lines: Iterable[str]) -> str:
    """``lines`` as text for a terminal or a text file: each line :func:`printable` (a
    newline inside a module name stays inside its line), joined by newlines."""
    return "\n".join(printable(line) for line in lines)


def open_hint(what: str) -> str:
    """Where to open a trace ``what`` names (an export or a merge: never a .htrace)."""
    return f"open {what} at https://ui.perfetto.dev (Open trace file) or in chrome://tracing (Load)"


OPEN_HINT = open_hint("it")


def format_ns(ns: float) -> str:
    """Human-readable duration.

    Example:
        >>> format_ns(850), format_ns(12_345), format_ns(4_560_000), format_ns(2.5e9)
        ('850 ns', '12.3 µs', '4.56 ms', '2.50 s')
        >>> format_ns(999_955), format_ns(9_996), format_ns(999.7)
        ('1.00 ms', '10.0 µs', '1.00 µs')
    """
    # Three significant digits, judged on the value as rounded (issue #47: 999,955 ns
    # printed as "1000 µs", 9,996 ns as "10.00 µs"): a value that rounds up to the next
    # power of ten gets one digit fewer, or the next unit.
    a = abs(ns)
    sign = "-" if ns < 0 else ""
    if float(f"{a:.0f}") < 1e3:
        return f"{sign}{a:.0f} ns"
    for scale, unit in ((1e3, "µs"), (1e6, "ms")):
        v = a / scale
        for digits in (2, 1, 0):
            if float(f"{v:.{digits}f}") < 10 ** (3 - digits):
                return f"{sign}{v:.{digits}f} {unit}"
    return f"{sign}{a / 1e9:.2f} s"


def format_count(value: float, unit: str) -> str:
    """``1.23 GFLOP``-style: SI prefixes, three significant digits."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def format_bytes(n: float) -> str:
    """Human-readable byte count (binary units, signed).

    Example:
        >>> format_bytes(512), format_bytes(98304), format_bytes(-3 * 2**20), format_bytes(0)
        ('512 B', '96.0 KiB', '-3.00 MiB', '0 B')
    """
    a = abs(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if a >= scale:
            v = n / scale
            digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2
            return f"{v:.{digits}f} {unit}"
    return f"{n:.0f} B"


def describe_dump(info: dict[str, Any]) -> list[str]:
    """One line per thread of a dump's ``info["dump"]``: where it was."""
    d = info.get("dump")
    if not isinstance(d, dict):
        return []
    step = d.get("step")
    where = f", step {step}" if isinstance(step, int) else ""
    lines = []
    if d.get("error_in"):
        lines.append(f"{d.get('exception', 'an exception')} raised inside "
                     f"{d['error_in']} forward{where}")
    lines += [f"{t.get('name')} is inside {t['open'][-1]} forward{where}, for "
              f"{t.get('since_ns', 0) / 1e9:.1f} s"
              for t in d.get("threads", []) if isinstance(t, dict) and t.get("open")]
    if not lines:
        lines.append(f"no thread is inside a traced module call{where}")
    return lines


def csv_text(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> str:
    """CSV text of ``rows`` (dicts) with a header of ``columns``; None is blank."""
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


def align_columns(table: Sequence[Sequence[str]], left: int) -> list[str]:
    """Lines of ``table`` (its first row the header) in aligned columns, two spaces
    apart: the first ``left`` columns flush left, the others flush right; each cell
    :func:`printable` before it is measured."""
    table = [[printable(c) for c in row] for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in table]


# Markers a table puts after a name (" [eval]", " [kernels]", " [kernel launches]"): a cut
# keeps them whole.
_MARKERS = re.compile(r"( \[[a-z][a-z ]*\])+$")
ELLIPSIS = "…"
# The footer line of a table whose names were cut (shorten_distinct): what the … means
# and how to see the names whole (issue #47: nothing said names were cut).
CUT_NOTE = (f"{ELLIPSIS}: whole dotted parts of a name left out to fit the width; --wide "
            "or a wider COLUMNS shows names whole")


def shorten_middle(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters: its start (up to a third,
    ending at a ``.`` when there is one) and as much of its end as fits. For text that
    is not a module's name (a class name, a shape signature); names are cut at their
    dots (:func:`shorten_name`).

    Example:
        >>> shorten_middle("model.layers.11.self_attn.q_proj", 24)
        'model.….self_attn.q_proj'
        >>> shorten_middle("VeryLongModuleClassName", 12)
        'Ver…lassName'
        >>> shorten_middle("transformer.h.0.attn.c_attn [eval] [kernels]", 32)
        'tran…ttn.c_attn [eval] [kernels]'

    Markers at the end (`` [eval]``, `` [kernels]``) are kept whole.
    """
    if len(text) <= width:
        return text
    name, mark = _split_mark(text)
    if mark and width - len(mark) >= 8:
        return shorten_middle(name, width - len(mark)) + mark
    if width < 4:
        return text[len(text) - width:]
    room = (width - 1) // 3
    dot = text.rfind(".", 0, room)
    return _cut(text, width, dot + 1 if dot >= 0 else room)


def _split_mark(text: str) -> tuple[str, str]:
    """``text`` as its name and its end markers (`` [eval]``), the latter kept whole."""
    marks = _MARKERS.search(text)
    if marks is None or marks.start() == 0:
        return text, ""
    return text[:marks.start()], marks.group()


def _segments(name: str) -> list[str]:
    """The parts a cut keeps or leaves out whole: ``name``'s dotted components, each
    with the indices after it (``layers.11``, ``transformer_blocks.0``), so that an
    index is never shown without the name it indexes."""
    segments: list[list[str]] = []
    for part in name.split("."):
        if segments and part.isascii() and part.isdigit():
            segments[-1].append(part)
        else:
            segments.append([part])
    return [".".join(s) for s in segments]


def _elide(segments: Sequence[str], head: int, tail: int, mark: str) -> str:
    """The first ``head`` and the last ``tail`` segments around a ``…`` standing for those
    between, then the markers: ``down_blocks.0.….transformer_blocks.0 [eval]``."""
    return ".".join([*segments[:head], ELLIPSIS, *segments[len(segments) - tail:]]) + mark


def shorten_name(text: str, width: int) -> str:
    """A module's name cut to ``width`` characters the one way every table cuts names
    (:func:`shorten_distinct`, which also keeps a cut from reading as another name).

    Example:
        >>> shorten_name("model.layers.11.self_attn.q_proj", 28)
        '….layers.11.self_attn.q_proj'
        >>> shorten_name("model.decoder.layers.11.self_attn.q_proj [eval]", 31)
        'model.….self_attn.q_proj [eval]'
        >>> shorten_name("encoder.layer.3.attention.output.dense", 8)
        '….dense'
    """
    return shorten_distinct([text], width)[0]


def shorten_distinct(texts: Sequence[str], width: int, *, names: bool = True) -> list[str]:
    """Each of ``texts`` (module names) cut to ``width`` characters the one way every
    table cuts names: whole dotted parts in the middle of a name become one ``…``; its
    end (the most specific part: the leaf with its index, ``transformer_blocks.0``) is
    always kept, then as much of the rest of its end and of its start as fits, the end
    first. An index is never kept or left out without the name before it. A cut never
    reads as another of ``texts``: no other name has the same start and end around a
    middle (names that differ only in a part a cut leaves out are cut elsewhere, or
    less). A name that no such cut fits in ``width`` gets the narrowest cut that is its
    own (longer than ``width``), or stays whole. Markers after a name (`` [eval]``) are
    kept whole.

    Not ``names`` (class names): each cut in the middle of its characters
    (:func:`shorten_middle`), two different texts never becoming the same.

    Example:
        >>> shorten_distinct(["transformer.h.0.attn.resid_dropout",
        ...                   "transformer.h.1.attn.resid_dropout"], 24)
        ['….h.0.attn.resid_dropout', '….h.1.attn.resid_dropout']
        >>> shorten_distinct(["down_blocks.0.attentions.0.transformer_blocks.0",
        ...                   "down_blocks.1.attentions.0.transformer_blocks.0"], 30)
        ['down_blocks.0.….transformer_blocks.0', 'down_blocks.1.….transformer_blocks.0']
    """
    if names:
        cuts = _NameCuts(texts)
        return [cuts.cut(t, width) for t in texts]
    out = [shorten_middle(t, width) for t in texts]
    while True:
        by_cut: dict[str, set[str]] = {}
        for t, c in zip(texts, out):
            by_cut.setdefault(c, set()).add(t)
        clash = next((g for g in by_cut.values() if len(g) > 1), None)
        if clash is None:
            return out
        # every text sharing a cut with a member of the clash is re-cut with it
        group = sorted(clash)
        taken = {c for t, c in zip(texts, out) if t not in clash}
        fixed = _separate(group, width, taken)
        out = [fixed.get(t, c) for t, c in zip(texts, out)]


class _NameCuts:
    """The cuts of a table's names (:func:`shorten_distinct`), each checked against the
    other names (issue #47: ``down_blocks.0…0.attentions.0…0`` was no name, and LoRA's
    ``lora_A``/``lora_B`` were exactly the part cut out)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.parts: dict[str, tuple[list[str], str]] = {}
        # (markers, kept head, kept tail) -> how many names a cut keeping them fits
        self.fits: dict[tuple[str, tuple[str, ...], tuple[str, ...]], int] = {}
        for text in dict.fromkeys(texts):
            name, mark = _split_mark(text)
            segments = _segments(name)
            self.parts[text] = (segments, mark)
            n = len(segments)
            for head in range(n - 1):
                start = tuple(segments[:head])
                for tail in range(1, n - head):
                    key = (mark, start, tuple(segments[n - tail:]))
                    self.fits[key] = self.fits.get(key, 0) + 1

    def cut(self, text: str, width: int) -> str:
        if len(text) <= width:
            return text
        segments, mark = self.parts[text]
        n = len(segments)
        # every cut, in the order preferred: as much of the end as fits, then of the start
        cuts = [(_elide(segments, head, tail, mark), head, tail)
                for tail in range(n - 1, 0, -1) for head in range(n - tail - 1, -1, -1)]
        cuts = [c for c in cuts if len(c[0]) < len(text)]
        fitting = [c for c in cuts if len(c[0]) <= width]
        rest = sorted((c for c in cuts if len(c[0]) > width), key=lambda c: len(c[0]))
        for cut, head, tail in fitting + rest:  # (else the narrowest, though over width)
            key = (mark, tuple(segments[:head]), tuple(segments[n - tail:]))
            if self.fits.get(key) == 1:  # reads as this name only
                return cut
        return text


def _separate(group: list[str], width: int, taken: set[str]) -> dict[str, str]:
    """Cuts of the (different) texts ``group`` (not names: class names), pairwise
    different and none in ``taken``: at the narrowest width from ``width`` on at which
    one cut position (more end first) keeps the part that tells each apart."""
    prefix = len(os.path.commonprefix(group))
    suffix = len(os.path.commonprefix([t[::-1] for t in group]))
    differs = {t: t[prefix:max(len(t) - suffix, prefix)] for t in group}
    for w in range(width, max(len(t) for t in group) + 1):
        usual = max((w - 1) // 3, 0)
        heads = [*range(usual, -1, -1), *range(usual + 1, w)]
        for head in heads:
            cuts = {t: _cut_kept(t, w, head) for t in group}
            values = set(cuts.values())
            if (len(values) == len(group) and not values & taken
                    and all(len(c) <= w for c in values)
                    and all(differs[t] in c for t, c in cuts.items())):
                return cuts
    return {t: t for t in group}


def _cut(text: str, width: int, head: int) -> str:
    """``text`` as its first ``head`` characters, ``…`` and its end, ``width`` in all."""
    return text[:head] + ELLIPSIS + text[len(text) - (width - 1 - head):]


def _cut_kept(text: str, width: int, head: int) -> str:
    """``text`` cut at ``head`` to ``width``, its end markers (`` [eval]``) kept whole."""
    if len(text) <= width:
        return text
    name, mark = _split_mark(text)
    if mark:
        room = width - len(mark)
        if len(name) <= room:
            return name + mark
        if room >= 2:  # the markers stay whole, whatever the cut position
            return _cut(name, room, min(head, room - 1)) + mark
    return _cut(text, width, min(head, width - 1))
