"""Output formats, one module each, all fed by the same reader object (``TraceData``).

Exporters (each writes one whole file):

* :mod:`hooktrace.exporters.chrome`: Chrome / Perfetto trace JSON (``.json[.gz]``);
* :mod:`hooktrace.exporters.perfetto`: Perfetto's native protobuf (``.pftrace``);
* :mod:`hooktrace.exporters.merged`: a run merged into a torch.profiler trace
  (``hooktrace.merge`` re-exports it);
* :mod:`hooktrace.exporters.ranks`: many ranks on one timeline.

Helpers they share, which write no file and import no exporter:
:mod:`~hooktrace.exporters._layout` (the one convention all follow: categories,
rows, lanes, filters applied), :mod:`~hooktrace.exporters._chrome_json` (Chrome JSON
text) and :mod:`~hooktrace.exporters._extra_args`. ``formats`` is the suffix table
that picks an exporter. The aim is that no exporter imports another
(``tests/unit/test_architecture.py`` checks it); ``merged`` and ``ranks`` still
borrow ``chrome``'s event writers, listed there as what is left of issue #27.

Exporters import the reader; the reader imports an exporter only inside the
convenience method that calls it (``TraceData.export_chrome``), so the import
graph stays one-way.
"""
