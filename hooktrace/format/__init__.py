"""The versioned ``.htrace`` binary trace file: writer and validating reader.

Two versions are read: 2, which ``save()`` writes (:mod:`hooktrace.format.v2`, laid
out there), and 3, the stream that ``hooktrace.trace(model, out=...)`` and ``hooktrace
run`` append to while the model runs (:mod:`hooktrace.format.stream`). What both share (layouts, the metadata
block, the string table) is :mod:`hooktrace.format.meta`; what a reader checks,
:mod:`hooktrace.format.validate`.
"""

from hooktrace.format.meta import (
    BLOCK_CLOCK,
    BLOCK_EVENTS,
    BLOCK_FOOTER,
    BLOCK_META,
    BLOCK_MODULES,
    BLOCK_NODE_NAMES,
    BLOCK_STATS,
    FORMAT_VERSION,
    HEADER_SIZE,
    INTERVAL_SLACK_NS,
    MAGIC,
    NS_PER_TICK_RANGE,
    READABLE_KINDS,
    STREAM_FORMAT_VERSION,
    STREAM_HEADER_SIZE,
    TraceFileContents,
    TraceFileError,
    encode_json,
)
from hooktrace.format.stream import rolling_segments, stream_block, stream_header
from hooktrace.format.v2 import read_trace, write_trace

__all__ = [
    "BLOCK_CLOCK", "BLOCK_EVENTS", "BLOCK_FOOTER", "BLOCK_META", "BLOCK_MODULES",
    "BLOCK_NODE_NAMES", "BLOCK_STATS", "FORMAT_VERSION", "HEADER_SIZE", "INTERVAL_SLACK_NS",
    "MAGIC", "NS_PER_TICK_RANGE", "READABLE_KINDS", "STREAM_FORMAT_VERSION", "STREAM_HEADER_SIZE",
    "TraceFileContents", "TraceFileError", "encode_json", "read_trace", "rolling_segments", "stream_block",
    "stream_header", "write_trace",
]
