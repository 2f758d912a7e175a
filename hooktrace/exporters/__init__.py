"""Output formats, one module each, all fed by the same reader object (``TraceData``).

* :mod:`hooktrace.exporters.chrome`: Chrome / Perfetto trace JSON (``.json[.gz]``);
* :mod:`hooktrace.exporters.perfetto`: Perfetto's native protobuf (``.pftrace``);
* :mod:`hooktrace.exporters._layout`: the one convention both follow (categories,
  rows, lanes, filters applied), also used by ``hooktrace.merge``. No exporter
  imports another.

Exporters import the reader; the reader imports an exporter only inside the
convenience method that calls it (``TraceData.export_chrome``), so the import
graph stays one-way.
"""
