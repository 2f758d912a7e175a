"""Output formats, one module each, all fed by the same reader object (``TraceData``).

* :mod:`hooktrace.exporters.chrome`: Chrome / Perfetto trace JSON, and the track
  convention every hooktrace trace follows (also used by ``hooktrace.merge``).

Exporters import the reader; the reader imports an exporter only inside the
convenience method that calls it (``TraceData.export_chrome``), so the import
graph stays one-way.
"""
