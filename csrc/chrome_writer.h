// Chrome trace writer: formats spans as Chrome "X" (complete) events and hands
// them to a Python file object's write() in ~chunk_bytes pieces, so the output
// can be streamed through gzip and is never held as one giant string.
//
// Times are printed exactly from integer nanoseconds as "<us>.<3 digits>",
// relative to base_ns (the trace's "baseTimeNanoseconds"): a double cannot
// hold absolute Unix microseconds to the nanosecond, and exact decimal output
// keeps every child inside its parent.
//
// hooktrace/chrome.py writes the surrounding JSON object and metadata events;
// every event written here is preceded by ",\n".
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "slice_columns.h"

namespace hooktrace {

// Spans, one row per span of `spans` (chrome_span_columns). names_json[m]: the
// JSON string literal (quotes included) used as "name" for module slot m;
// args_json[m]: the args object's opening, e.g. `{"module":"encoder","type":"Linear"`;
// cat_names[c]: category text for cat c (plain, JSON-safe). Columns: `tid` is the row
// to draw on (the OS tid, or a synthetic track tid for backward spans). `nodes`
// (optional): per span a count written as args "nodes" when >= 0 (autograd nodes
// attributed directly to the span). flags: kSpanError, kSpanUnfinished add "error",
// "unfinished": true. Then the argument columns (slice_columns.h: ArgColumn, e.g.
// FLOPs), `"name":value` where present, in order; then kSpanClipped adds
// "clipped": true. `extra` (optional): per span an index into extra_json (-1: none),
// whose fragment (`,"key":value...`) is appended to the args as is (shapes and
// numerics: hooktrace/exporters/_extra_args.py). Returns the number of events written.
uint64_t write_chrome_events(const pybind11::object& write, const SliceColumns& spans,
                             const pybind11::sequence& names_json,
                             const pybind11::sequence& args_json,
                             const pybind11::sequence& cat_names,
                             const pybind11::sequence& extra_json, int64_t base_ns, uint32_t pid,
                             size_t chunk_bytes);

// The columns write_chrome_events reads, from Python's dict (slice_columns.h):
// start_ns, end_ns (int64), module, tid, call (uint32), flags, cat (uint8); optional
// nodes, extra (int64); and the argument columns `args` ((name, array) pairs).
SliceColumns chrome_span_columns(const pybind11::handle& columns, const pybind11::handle& args);

// Autograd node executions, one "X" event per row of `nodes`
// (chrome_node_columns), all of category `cat` (plain, JSON-safe):
//   {"ph":"X","cat":<cat>,"name":<node_names_json[name]>,"pid","tid","ts","dur",
//    "args":{"seq":<seq>,"module":<module_names_json[span_module]> or "",
//            "pass":<pass_id> or null when pass_id == UINT32_MAX[, "clipped":true]}}
// `span_module` is the module slot of the span the node is attributed to, -1 for
// none. `flags` (optional): kSpanClipped adds "clipped":true.
uint64_t write_chrome_nodes(const pybind11::object& write, const SliceColumns& nodes,
                            const pybind11::sequence& node_names_json,
                            const pybind11::sequence& module_names_json, const std::string& cat,
                            int64_t base_ns, uint32_t pid, size_t chunk_bytes);

// The columns write_chrome_nodes reads: start_ns, end_ns, span_module (int64), name,
// tid, pass_id (uint32), seq (uint64); optional flags (uint8).
SliceColumns chrome_node_columns(const pybind11::handle& columns);

}  // namespace hooktrace
