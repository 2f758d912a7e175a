// Perfetto protobuf writer: spans and autograd nodes as TrackEvent slices, on
// the tracks hooktrace/exporters/perfetto.py describes, streamed to a Python
// file object's write() in ~chunk_bytes pieces (like chrome_writer.h).
//
// One packet sequence per track (trusted_packet_sequence_id = first_sequence_id
// + track index), because that makes every sequence's packets time-ordered and
// lets each sequence use
//  * an incremental clock (ClockSnapshot clock 64, is_incremental): a packet's
//    timestamp is the delta from the previous packet's, 1-3 bytes instead of a
//    10-byte absolute Unix ns (the snapshot pins clock 64 to BOOTTIME at the
//    track's first timestamp, so the absolute ns are kept exactly);
//  * TracePacketDefaults{timestamp_clock_id: 64, track_event_defaults:
//    {track_uuid}}: no track_uuid or clock id on any event;
//  * interning: categories and argument names in the sequence's first packet,
//    event names and string argument values in the packet that first uses them.
// Measured on benchmarks/pftrace.py's synthetic run this is ~50 bytes per span
// (BEGIN + END) against ~150 in Chrome JSON.
//
// Per sequence:
//   packet {seq, sequence_flags: INCREMENTAL_STATE_CLEARED, trace_packet_defaults,
//           interned_data {event_categories, debug_annotation_names}}
//   packet {seq, clock_snapshot {clock 64 = T0 incremental, BOOTTIME = T0}}
//   packet {seq, timestamp: delta, [interned_data {event_names, string values}],
//           track_event {type: SLICE_BEGIN, name_iid, category_iids,
//                        debug_annotations {name_iid, int/bool/string_value_iid}...}}
//   packet {seq, timestamp: delta, track_event {type: SLICE_END}}  ...
//
// Slices of one track are written as strictly nested BEGIN/END pairs: visited
// by (start ascending, end descending, input order), the visiting order of
// lanes.h and of Perfetto's JSON importer; a slice that would cross the open
// slice it starts in (possible only if the caller's rows do not nest) is
// skipped and counted, as Perfetto's JSON importer drops such an "X" event.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>

#include "slice_columns.h"

namespace hooktrace {

// One row per slice of `slices` (perfetto_slice_columns).
// flags: kSpanError | kSpanUnfinished | kSpanClipped (spans.h), plus kSliceNode for an
// autograd node. Arguments written (debug annotations):
//   span: module = strings[str_a], type = strings[str_b], call = int_a,
//         error / unfinished = true when set, nodes = int_b if >= 0;
//   node: seq = int_a, module = strings[str_a] ("" when str_a < 0),
//         pass = int_b if >= 0;
//   kernel (kSliceKernel, hooktrace/analysis/kernels.py): module = strings[str_a], type =
//         strings[str_b], kernel = strings[int_a], derived = true;
//   then, every slice, the argument columns where present, in order (slice_columns.h:
//   ArgColumn: int, double or bool true; e.g. FLOPs), and clipped = true when set.
// name[i] indexes `names` (the event name), cat[i] `cat_names`, track[i]
// `track_uuid`. `extra` (optional): per slice an index into extra_annotations (-1:
// none), whose bytes (encoded TrackEvent.debug_annotations fields) are appended to
// the slice's begin event (shapes and numerics). Returns {"slices": written,
// "not_nested": skipped}.
pybind11::dict write_perfetto_slices(const pybind11::object& write, const SliceColumns& slices,
                                     pybind11::array_t<uint64_t> track_uuid,
                                     const pybind11::sequence& names,
                                     const pybind11::sequence& strings,
                                     const pybind11::sequence& cat_names,
                                     const pybind11::sequence& extra_annotations,
                                     uint32_t first_sequence_id, size_t chunk_bytes);

// The columns write_perfetto_slices reads, from Python's dict (slice_columns.h):
// start_ns, end_ns, str_a, str_b, int_a, int_b (int64), track, name (uint32), cat,
// flags (uint8); optional extra (int64); and the argument columns `args`.
SliceColumns perfetto_slice_columns(const pybind11::handle& columns,
                                    const pybind11::handle& args);

constexpr uint8_t kSliceNode = 0x80;
constexpr uint8_t kSliceKernel = 0x40;

}  // namespace hooktrace
