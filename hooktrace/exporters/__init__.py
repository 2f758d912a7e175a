"""Output formats, one module each, all fed by the same reader object (``TraceData``).

Exporters (each writes one whole file):

* :mod:`hooktrace.exporters.chrome`: Chrome / Perfetto trace JSON (``.json[.gz]``);
* :mod:`hooktrace.exporters.perfetto`: Perfetto's native protobuf (``.pftrace``);
* :mod:`hooktrace.exporters.merged`: a run merged into a torch.profiler trace
  (``hooktrace.merge`` re-exports it);
* :mod:`hooktrace.exporters.ranks`: many ranks on one timeline.

Helpers they share, which import no exporter:
:mod:`~hooktrace.exporters._layout` (the one convention all follow: categories,
rows, lanes, filters applied), :mod:`~hooktrace.exporters._chrome_json` (Chrome JSON
text), :mod:`~hooktrace.exporters._chrome_events` (the Chrome events of spans, nodes,
kernels, steps and counters: ``chrome``, ``merged`` and ``ranks`` write them),
:mod:`~hooktrace.exporters._extra_args` and :mod:`~hooktrace.exporters._profiler_merge`
(the merge with a profiler trace: ``merged`` writes it, ``ranks`` runs it per rank).
``formats`` is the suffix table that picks an exporter. No exporter imports another
(``tests/unit/test_architecture.py`` checks it); each keeps its public names
importable from where they were (``chrome``'s event writers, ``merged``'s merge).

Exporters import the reader; the reader imports an exporter only inside the
convenience method that calls it (``TraceData.export_chrome``), so the import
graph stays one-way.
"""
