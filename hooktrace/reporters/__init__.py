"""Human-facing reports of one run (``hooktrace report``): one module per format,
each fed by a :class:`~hooktrace.reading.TraceData`; none imports another."""
