"""The analysis layer: per-module tables and statistics computed from a loaded trace.

The summary (``summary``), the comparison of runs (``diff``, ``_diff_inputs``), the
ranks of a job (``rankset``, ``stragglers``), the profiler's kernels put on modules
(``attribution``), and the readings of each optional recording (``memory``, ``flops``,
``kernels``, ``numerics``, ``shapes``, ``device_time``). They read a trace (a
:class:`~hooktrace.reading.TraceData`) and record nothing; their recording side lives
in ``hooktrace.record``. Import the modules themselves: this package imports nothing.
"""
