"""A run's traces as data (issue #29): Arrow tables, Parquet, DuckDB and Spark.

* :mod:`hooktrace.data.schema`: the versioned Arrow schema of the tables ``spans``,
  ``steps``, ``modules``, ``memory``, ``numerics`` and ``runs`` (docs/schema.md);
* :mod:`hooktrace.data.tables`: a run's tables as Arrow record batches, in bounded
  memory;
* :mod:`hooktrace.data.parquet`: Parquet files and hive-partitioned datasets
  (``rank=N/``, ``window=K/``);
* :mod:`hooktrace.data.engine`: DuckDB over ``.htrace`` files or Parquet datasets, the
  engine of ``hooktrace query`` and of the many-rank straggler tables;
* :mod:`hooktrace.data.spark`: the same queries with PySpark.

They need the ``data`` extra (``pip install hooktrace[data]``: pyarrow, duckdb;
``hooktrace[spark]`` for PySpark), imported only when used: :func:`require` says in one
line what to install.
"""

from __future__ import annotations

from hooktrace._input import DataExtraMissing, require

__all__ = ["DataExtraMissing", "require"]
