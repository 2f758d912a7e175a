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

namespace hooktrace {

// Spans. names_json[m]: the JSON string literal (quotes included) used as
// "name" for module slot m; args_json[m]: the args object's opening, e.g.
// `{"module":"encoder","type":"Linear"`; cat_names[c]: category text for cat c
// (plain, JSON-safe). `tid` is the row to draw on (the OS tid, or a synthetic
// track tid for backward spans). `nodes`: empty, or one count per span written
// as args "nodes" when >= 0 (autograd nodes attributed directly to the span).
// `flops`: empty, or one FLOP count per span written as args "flops" when >= 0;
// `tflops`: empty, or per span, written as args "tflops" (shortest round-trip
// decimal) when finite (hooktrace/flops.py computes both).
// flags: kSpanError, kSpanUnfinished, kSpanFlopsCounted, kSpanClipped add "error",
// "unfinished", "flops_counted", "clipped": true. `extra`: empty, or per span an
// index into extra_json (-1: none), whose fragment (`,"key":value...`) is appended
// to the args as is (shapes and numerics: hooktrace/exporters/_extra_args.py).
// Returns the number of events written.
uint64_t write_chrome_events(pybind11::object write, pybind11::array_t<int64_t> start_ns,
                             pybind11::array_t<int64_t> end_ns,
                             pybind11::array_t<uint32_t> module, pybind11::array_t<uint32_t> tid,
                             pybind11::array_t<uint32_t> call, pybind11::array_t<uint8_t> flags,
                             pybind11::array_t<uint8_t> cat, pybind11::array_t<int64_t> nodes,
                             pybind11::array_t<int64_t> flops, pybind11::array_t<double> tflops,
                             pybind11::sequence names_json, pybind11::sequence args_json,
                             pybind11::sequence cat_names, int64_t base_ns, uint32_t pid,
                             size_t chunk_bytes, pybind11::array_t<int64_t> extra,
                             pybind11::sequence extra_json);

// Autograd node executions, one "X" event each, all of category `cat` (plain,
// JSON-safe):
//   {"ph":"X","cat":<cat>,"name":<node_names_json[name]>,"pid","tid","ts","dur",
//    "args":{"seq":<seq>,"module":<module_names_json[module]> or "",
//            "pass":<pass_id> or null when pass_id == UINT32_MAX[, "clipped":true]}}
// `module` is the module slot of the span the node is attributed to, -1 for none.
// `flags`: empty, or per node; kSpanClipped adds "clipped":true.
uint64_t write_chrome_nodes(pybind11::object write, pybind11::array_t<int64_t> start_ns,
                            pybind11::array_t<int64_t> end_ns, pybind11::array_t<uint32_t> name,
                            pybind11::array_t<uint32_t> tid, pybind11::array_t<uint64_t> seq,
                            pybind11::array_t<uint32_t> pass_id,
                            pybind11::array_t<int64_t> module, pybind11::array_t<uint8_t> flags,
                            pybind11::sequence node_names_json,
                            pybind11::sequence module_names_json, const std::string& cat,
                            int64_t base_ns, uint32_t pid, size_t chunk_bytes);

}  // namespace hooktrace
