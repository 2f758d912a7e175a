"""A tiny pure-Python reader of the Perfetto protobuf traces hooktrace writes,
and the Chrome export's slices in the same shape, to compare the two.

It follows the protos (trace_packet.proto, track_event.proto, interned_data.proto,
clock_snapshot.proto) only as far as hooktrace uses them; anything else fails.
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from decimal import Decimal
from typing import Any

# A slice: (row name, name, category, start ns, end ns, args as a sorted tuple)
Slice = tuple[str, str, str, int, int, tuple[tuple[str, Any], ...]]


def fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """(field, wire type, value) of one message: ints for varints, bytes for LEN."""
    out = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            v = buf[i:i + n]
            assert len(v) == n, "truncated message"
            i += n
        elif wire == 1:  # I64: a double
            v = struct.unpack_from("<d", buf, i)[0]
            i += 8
        else:
            raise AssertionError(f"wire type {wire} is not used by hooktrace")
        out.append((field, wire, v))
    return out


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def one(msg: bytes, field: int, default: Any = None) -> Any:
    vals = [v for f, _, v in fields(msg) if f == field]
    return vals[-1] if vals else default


def decode(data: bytes) -> dict[str, Any]:
    """``{"slices": [Slice], "tracks": {uuid: descriptor dict}, "info": {name: value},
    "sequences": n}`` of a hooktrace .pftrace."""
    tracks: dict[int, dict[str, Any]] = {}
    seqs: dict[int, dict[str, Any]] = {}
    open_slices: dict[int, list[tuple[int, str, str, tuple]]] = defaultdict(list)
    slices: list[tuple[int, str, str, int, int, tuple]] = []
    info: dict[str, Any] = {}
    for field, _, packet in fields(data):
        assert field == 1, field
        p = fields(packet)
        seq_id = one(packet, 10, 0)
        flags = one(packet, 13, 0)
        if flags & 1:  # SEQ_INCREMENTAL_STATE_CLEARED
            seqs[seq_id] = {"cats": {}, "names": {}, "ann": {}, "strings": {}, "clock": None,
                            "last": None, "track": None}
        st = seqs.get(seq_id)
        for f, _, v in p:
            if f == 59:  # trace_packet_defaults
                assert one(v, 58) == 64
                st["track"] = one(one(v, 11), 11)
                st["clock"] = 64
            elif f == 12:  # interned_data
                for g, _, entry in fields(v):
                    table = {1: "cats", 2: "names", 3: "ann", 29: "strings"}[g]
                    iid, text = one(entry, 1), one(entry, 2).decode()
                    assert st[table].get(iid, text) == text, "iid reused for another value"
                    st[table][iid] = text
            elif f == 6:  # clock_snapshot
                clocks = {one(c, 1): (one(c, 2), one(c, 3, 0)) for g, _, c in fields(v)
                          if g == 1}
                assert clocks[64][1] == 1 and clocks[64][0] == clocks[6][0]
                st["last"] = clocks[64][0]
            elif f == 60:  # track_descriptor
                d: dict[str, Any] = {"parent": one(v, 5), "name": one(v, 2),
                                     "rank": one(v, 12), "ordering": one(v, 11)}
                thread, process = one(v, 4), one(v, 3)
                if thread is not None:
                    d.update(pid=one(thread, 1), tid=one(thread, 2),
                             name=one(thread, 5).decode())
                elif process is not None:
                    d.update(pid=one(process, 1), name=one(process, 6).decode(), process=True)
                else:
                    d["name"] = d["name"].decode()
                tracks[one(v, 1)] = d
        ev = one(packet, 11)
        if ev is None:
            continue
        ts = one(packet, 8)
        if st is not None and st["clock"] == 64:
            ts = st["last"] = st["last"] + ts
        track = one(ev, 11, st["track"] if st else 0)
        kind = one(ev, 9)
        if kind == 3:  # the info instant event: inline names and values
            assert one(ev, 22).decode() == "hooktrace.info"
            for g, _, a in fields(ev):
                if g == 4:
                    info[one(a, 10).decode()] = _value(a, None)
            info["_ts"], info["_track"] = ts, track
        elif kind == 1 and st is None:  # the steps row: inline names (sequence 1)
            name, cat = one(ev, 23).decode(), one(ev, 22).decode()
            args = tuple(sorted((one(a, 10).decode(), _value(a, None))
                                for g, _, a in fields(ev) if g == 4))
            open_slices[track].append((ts, name, cat, args))
        elif kind == 1:
            name = st["names"][one(ev, 10)]
            cat = st["cats"][one(ev, 3)]
            args = tuple(sorted((st["ann"][one(a, 1)], _value(a, st))
                                for g, _, a in fields(ev) if g == 4))
            open_slices[track].append((ts, name, cat, args))
        elif kind == 2:
            start, name, cat, args = open_slices[track].pop()
            assert ts >= start
            slices.append((track, name, cat, start, ts, args))
        else:
            raise AssertionError(f"event type {kind}")
    assert not any(open_slices.values()), "unterminated slices"
    rows = {uuid: d["name"] for uuid, d in tracks.items()}
    return {"slices": [(rows[t], *rest) for t, *rest in slices], "tracks": tracks,
            "info": info, "sequences": len(seqs)}


def _value(a: bytes, st: dict[str, Any] | None) -> Any:
    for f, _, v in fields(a):
        if f == 2:
            return bool(v)
        if f == 4:
            return _int64(v)
        if f == 5:
            return v
        if f == 6:
            return v.decode()
        if f == 17 and st is not None:
            return st["strings"][v]
        if f in (11, 12):
            return "<nested>"
    raise AssertionError("annotation without a value")


def chrome_slices(data: bytes) -> list[Slice]:
    """The Chrome export's X events as slices on their named rows (null args left out;
    real-valued args as floats, as the .pftrace's doubles)."""
    doc = json.loads(data, parse_float=Decimal)
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    base = doc["baseTimeNanoseconds"]
    out = []
    for e in doc["traceEvents"]:
        if e["ph"] != "X":
            continue
        start = base + int(e["ts"] * 1000)
        args = tuple(sorted((k, float(v) if isinstance(v, Decimal) else v)
                            for k, v in e["args"].items() if v is not None))
        out.append((names[e["tid"]], e["name"], e["cat"], start,
                    start + int(e["dur"] * 1000), args))
    return out
