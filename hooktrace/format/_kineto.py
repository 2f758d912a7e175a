"""Streaming reader (and pass-through copier) for torch.profiler / kineto Chrome traces.

A profiler trace can be gigabytes of JSON, so it is never loaded as one
document: the top-level object is walked key by key, each element of
``traceEvents`` is decoded on its own (``json.JSONDecoder.raw_decode``, C speed)
and handed to a callback, and, when an output file is given, the original bytes
are copied through unchanged, with extra bytes inserted just before the
array's closing ``]`` and before the object's closing ``}``.

Memory: one read buffer (``READ_BYTES``, grown only for a single element larger
than it) plus whatever the callback keeps. The text is decoded as Latin-1,
which maps every byte to one character: offsets in the buffer are byte offsets
in the file, and copying through is byte-exact whatever the encoding.

Times: kineto writes ``ts``/``dur`` as microseconds with three decimals
(exact nanoseconds), ``ts`` relative to the top-level ``baseTimeNanoseconds``.
Fractional numbers are kept as their source text (:class:`JsonNumber`, a
``str``, so that they stay apart from JSON strings) and converted to integer ns
by :func:`us_to_ns`: a float64 of ~4.4e12 µs (kineto's offsets are ~50 days)
is only good to ~1 ns.

Hostile input: the file must be UTF-8 (checked as it is read, so what is
copied through is valid JSON text); ``NaN``/``Infinity`` (which Python's json
accepts) are refused; values nest at most :data:`MAX_DEPTH` levels; integers
of thousands of digits are refused by the decoder's own digit limit. A
callback refuses a value it cannot use by raising :class:`BadValue`, which
:func:`scan` turns into a :class:`ProfilerTraceError` naming the event's index
and position.

Example:
    >>> import io, json
    >>> src = b'{"baseTimeNanoseconds": 5000, "traceEvents": [{"ph": "X", "ts": 1.5, "dur": 2}]}'
    >>> seen, out = [], io.BytesIO()
    >>> top = scan(io.BytesIO(src), "t.json", seen.append, out=out,
    ...            before_array_end=lambda nonempty: b',{"ph":"i"}')
    >>> top["baseTimeNanoseconds"], [us_to_ns(e["ts"]) for e in seen]
    (5000, [1500])
    >>> json.loads(out.getvalue())["traceEvents"][1]
    {'ph': 'i'}
"""

from __future__ import annotations

import codecs
import gzip
import json
import math
import os
import re
import sys
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import IO, Any, BinaryIO

from hooktrace._input import open_input
from hooktrace.errors import HooktraceError

__all__ = ["BadValue", "JsonNumber", "MAX_DEPTH", "ProfilerTraceError", "READ_BYTES",
           "TIME_LIMIT_NS", "open_binary", "scan", "us_to_ns"]

# 4 MiB per read: large enough that the per-read Python overhead vanishes,
# small enough to be irrelevant next to the trace itself.
READ_BYTES = 4 << 20

# Kineto nests 4 levels (event > args > "Input Dims" > dims). Well below Python's
# recursion limit (~1000, where the C decoder raises RecursionError, and repr()
# of the value would too, depending on the stack), so the refusal is the same
# from any caller; high enough that the check runs only for values longer than
# 2 * MAX_DEPTH characters, which few kineto events are.
MAX_DEPTH = 200
# Bound of |ts| and |dur| in ns (146 years: old traces without a base give Unix
# times as ts). With 0 <= baseTimeNanoseconds < 2**62 the sums stay far from
# overflowing Python arithmetic, and collect() checks that base + ts + dur fits
# int64 (its numpy columns).
TIME_LIMIT_NS = 2**62
_DEPTH_CHECK_CHARS = 2 * MAX_DEPTH

_WS = re.compile(r"[ \t\n\r]*")
_GZIP_MAGIC = b"\x1f\x8b"


class ProfilerTraceError(HooktraceError):
    """The profiler trace is not usable; the message names the file and position."""


class BadValue(Exception):
    """Raised by a :func:`scan` callback for a value it cannot use: says what was expected.

    Not a ValueError, so that it passes through ``except ValueError`` clauses.
    """


class JsonNumber(str):
    """The source text of a JSON number with a fraction or exponent (``parse_float``)."""

    __slots__ = ()


class _Constant(Exception):
    """NaN, Infinity or -Infinity in the input: not JSON, though Python's json takes them."""


def _refuse_constant(name: str) -> Any:
    raise _Constant(name)


_DECODER = json.JSONDecoder(parse_float=JsonNumber, parse_constant=_refuse_constant)


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists/objects more than ``limit`` levels (iteratively)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        items = v.values() if isinstance(v, dict) else v
        stack.extend((c, depth + 1) for c in items if isinstance(c, (dict, list)))
    return False


def show(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters, for one-line error messages.

    A :class:`JsonNumber` shows as the number it is, not as a quoted string.
    """
    text = str.__str__(value) if type(value) is JsonNumber else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def us_to_ns(value: Any) -> int:
    """Exact integer nanoseconds from a JSON microsecond number (int or decimal text).

    Raises ValueError for anything else and for results beyond ±:data:`TIME_LIMIT_NS`.

    Example:
        >>> us_to_ns("4389865968648.250"), us_to_ns(12), us_to_ns("1e-3"), us_to_ns("-0.5")
        (4389865968648250, 12000, 1, -500)
    """
    ns: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        ns = value * 1000
    elif isinstance(value, str):
        whole, dot, frac = value.partition(".")
        digits = whole[1:] if whole.startswith("-") else whole
        # isascii: Latin-1 text has other "digits" ('\xb2'.isdigit() is True)
        if (value.isascii() and digits.isdigit() and len(digits) <= 20
                and (not dot or (frac.isdigit() and len(frac) <= 3))):
            ns = int(whole) * 1000 + (int(frac.ljust(3, "0")) if frac else 0) * (
                -1 if whole.startswith("-") else 1)
        else:
            try:
                d = Decimal(value)
            except InvalidOperation:
                d = None
            # adjusted(): the exponent of the leading digit; checked before
            # arithmetic so that "1e999999999" costs nothing
            if d is not None and d.is_finite() and d.adjusted() <= 20:
                ns = int((d * 1000).to_integral_value())
    elif isinstance(value, float) and math.isfinite(value) and abs(value) < 1e20:
        ns = round(value * 1000)
    if ns is None:
        raise ValueError(f"not a number of microseconds: {show(value)}")
    if not -TIME_LIMIT_NS <= ns <= TIME_LIMIT_NS:
        raise ValueError(f"{show(value)} microseconds, beyond +-2**62 ns (146 years)")
    return ns


def open_binary(path: str | os.PathLike[str]) -> BinaryIO:
    """Open ``path`` for reading, transparently gunzipping (by content, not name)."""
    f = open_input(path)
    magic = f.read(2)
    f.seek(0)
    if magic == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    return f


class _Reader:
    """A growing Latin-1 window over a binary stream, with file positions for errors."""

    def __init__(self, f: IO[bytes], name: str, out: IO[bytes] | None) -> None:
        self.f = f
        self.name = name
        self.out = out
        self.buf = ""
        self.pos = 0  # parse position in buf
        self.copied = 0  # buf[:copied] was written to out (or is not to be)
        self.base = 0  # byte offset of buf[0] in the stream
        self.lines = 0  # newlines in the stream before buf[0]
        self.line_start = 0  # byte offset just after the last newline before buf[0]
        self.eof = False
        self.read_bytes = READ_BYTES
        # Bytes are copied through as they are: checking them as UTF-8 here keeps
        # the output valid JSON text (RFC 8259 requires UTF-8).
        self.utf8 = codecs.getincrementaldecoder("utf-8")()

    def where(self, pos: int) -> str:
        nl = self.buf.count("\n", 0, pos)
        line = self.lines + nl + 1
        last = self.buf.rfind("\n", 0, pos)
        col_start = self.base + last + 1 if last >= 0 else self.line_start
        offset = self.base + pos
        return f"line {line} column {offset - col_start + 1} (byte {offset})"

    def error(self, what: str, pos: int | None = None) -> ProfilerTraceError:
        p = self.pos if pos is None else pos
        return ProfilerTraceError(f"{self.name}: malformed profiler trace JSON at {self.where(p)}: "
                                  f"{what}")

    def value_error(self, label: str, pos: int, what: str) -> ProfilerTraceError:
        """A well-formed value that is not what a trace has there (``label``: its place)."""
        return ProfilerTraceError(f"{self.name}: {label} at {self.where(pos)}: {what}")

    def check_utf8(self, data: bytes, final: bool) -> None:
        """Check the block just appended to buf (``data``) as the continuation of UTF-8 text."""
        pending = len(self.utf8.getstate()[0])  # an incomplete sequence from the last block
        if not pending and not final and data.isascii():
            return  # the usual case, at memchr speed
        try:
            self.utf8.decode(data, final)
        except UnicodeDecodeError as e:
            # e.start counts from the pending bytes, which precede data in buf
            at = len(self.buf) - len(data) - pending + e.start
            byte = f" 0x{ord(self.buf[at]):02x}" if 0 <= at < len(self.buf) else ""
            raise self.error(f"invalid UTF-8 (byte{byte}: {e.reason}); a JSON file must be "
                             "UTF-8", max(at, 0)) from None

    def more(self) -> bool:
        """Read another block; drop the consumed prefix (writing it out first)."""
        if self.eof:
            return False
        try:
            data = self.f.read(self.read_bytes)
        except (OSError, EOFError) as e:  # gzip: truncated or corrupt stream
            raise ProfilerTraceError(f"{self.name}: cannot read the profiler trace at byte "
                                     f"{self.base + len(self.buf)} of its content: {e}") from e
        if not data:
            self.eof = True
            self.check_utf8(b"", True)
            return False
        self.flush(self.pos)
        drop = min(self.pos, self.copied)
        if drop:
            head = self.buf[:drop]
            nl = head.count("\n")
            if nl:
                self.lines += nl
                self.line_start = self.base + head.rfind("\n") + 1
            self.base += drop
            self.buf = self.buf[drop:]
            self.pos -= drop
            self.copied -= drop
        self.buf += data.decode("latin-1")
        self.check_utf8(data, False)
        return True

    def flush(self, upto: int) -> None:
        """Copy buf[copied:upto] through to out."""
        if upto > self.copied:
            if self.out is not None:
                self.out.write(self.buf[self.copied:upto].encode("latin-1"))
            self.copied = upto

    def replace(self, start: int, text: str | None) -> None:
        """Write ``text`` instead of the bytes from stream offset ``start`` to ``pos``."""
        if text is None or self.out is None:
            return
        self.flush(start - self.base)
        self.out.write(text.encode("latin-1"))
        self.copied = self.pos

    def skip_ws(self) -> None:
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf) or not self.more():
                return

    def peek(self) -> str:
        self.skip_ws()
        return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def expect(self, ch: str, what: str) -> None:
        got = self.peek()
        if got != ch:
            found = repr(got) if got else "the end of the file"
            raise self.error(f"expected {what}, found {found}")
        self.pos += 1

    def value(self) -> Any:
        self.skip_ws()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                # Maybe just cut by the read block: read more (growing the block
                # so a huge single value costs O(n), not O(n^2)) and retry.
                self.read_bytes = max(self.read_bytes, len(self.buf) - self.pos)
                if self.more():
                    continue
                raise self.error(e.msg, e.pos) from None
            except _Constant as e:
                raise self.error(f"the value starting here contains {e}, which is not JSON; "
                                 "expected finite numbers") from None
            except RecursionError:
                raise self.error(f"the value starting here nests deeper than {MAX_DEPTH} "
                                 "levels") from None
            except ValueError:  # int(): more digits than sys.get_int_max_str_digits()
                raise self.error("the value starting here has an integer of over "
                                 f"{sys.get_int_max_str_digits()} digits; expected numbers "
                                 "that fit 64 bits") from None
            # A number ending exactly at the block end may continue in the next.
            if end == len(self.buf) and self.more():
                continue
            # Nesting deeper than MAX_DEPTH takes over 2 * MAX_DEPTH brackets:
            # the length and then counting (C speed) spare the walk for usual values.
            if (end - self.pos > _DEPTH_CHECK_CHARS
                    and self.buf.count("[", self.pos, end) + self.buf.count("{", self.pos, end)
                    > MAX_DEPTH and _too_deep(obj, MAX_DEPTH)):
                raise self.error(f"the value starting here nests deeper than {MAX_DEPTH} levels")
            self.pos = end
            return obj


def scan(
    f: IO[bytes],
    name: str,
    on_event: Callable[[Any], None],
    *,
    out: IO[bytes] | None = None,
    before_array_end: Callable[[bool], bytes] | None = None,
    before_object_end: Callable[[], bytes] | None = None,
    top: dict[str, Any] | None = None,
    rewrite_event: Callable[[Any, str], str | None] | None = None,
    rewrite_top: Callable[[str, Any], str | None] | None = None,
) -> dict[str, Any]:
    """Walk a Chrome trace object, calling ``on_event`` for each ``traceEvents`` element.

    Returns the other top-level keys (parsed). With ``out``, the input bytes are
    copied there unchanged, plus ``before_array_end(array_was_nonempty)`` just
    before the ``]`` of ``traceEvents`` and ``before_object_end()`` before the
    final ``}``. ``top``, if given, is the dict filled (and returned) as the
    top-level keys are read, so a callback sees the keys that preceded it.
    ``rewrite_event(event, text)`` may return replacement text (Latin-1, see
    above) for an element of ``traceEvents`` and ``rewrite_top(key, value)``
    for the value of a top-level key; None keeps the original bytes. A callback
    refuses a value by raising :class:`BadValue` (what was expected). Raises
    :class:`ProfilerTraceError` naming ``name`` and the line, column and byte of
    the problem (of the decompressed content for gzip input), and for a refused
    value the event's index or the key.
    """
    r = _Reader(f, name, out)
    top = {} if top is None else top
    seen_events = False
    if r.peek() == "[":
        raise r.error("a bare JSON array of events; expected the object form "
                      '{"traceEvents": [...]} that torch.profiler writes')
    r.expect("{", "'{' (a Chrome trace JSON object)")
    if r.peek() != "}":
        while True:
            key_pos = r.pos
            if r.peek() != '"':
                raise r.error("expected a key string")
            key = r.value()
            if key in top:  # json would keep the last silently; kineto writes each once
                raise r.error(f"a second {show(key)} key", key_pos)
            r.expect(":", "':' after a key")
            if key == "traceEvents":
                if seen_events:
                    raise r.error("a second 'traceEvents' key", key_pos)
                seen_events = True
                r.expect("[", "'[' starting the traceEvents array")
                nonempty = False
                index = 0
                if r.peek() != "]":
                    while True:
                        r.skip_ws()
                        start = r.base + r.pos
                        event = r.value()
                        try:
                            on_event(event)
                            if rewrite_event is not None:
                                r.replace(start, rewrite_event(event,
                                                               r.buf[start - r.base:r.pos]))
                        except BadValue as e:
                            raise r.value_error(f"traceEvents[{index}]", start - r.base,
                                                str(e)) from None
                        index += 1
                        nonempty = True
                        if r.peek() == "]":
                            break
                        r.expect(",", "',' or ']' in the traceEvents array")
                r.flush(r.pos)
                if out is not None and before_array_end is not None:
                    out.write(before_array_end(nonempty))
                r.pos += 1
            else:
                r.skip_ws()
                start = r.base + r.pos
                top[key] = r.value()
                if rewrite_top is not None:
                    try:
                        r.replace(start, rewrite_top(key, top[key]))
                    except BadValue as e:
                        raise r.value_error(f"{show(key)}", start - r.base, str(e)) from None
            if r.peek() == "}":
                break
            r.expect(",", "',' or '}' between top-level keys")
    r.flush(r.pos)
    if out is not None and before_object_end is not None:
        out.write(before_object_end())
    r.pos += 1
    if r.peek():
        raise r.error("extra data after the trace object")
    r.flush(r.pos)
    if not seen_events:
        raise ProfilerTraceError(f"{name}: no 'traceEvents' array: not a Chrome trace written by "
                                 "torch.profiler (export_chrome_trace / tensorboard_trace_handler)")
    return top
