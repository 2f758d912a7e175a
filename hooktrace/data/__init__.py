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

import importlib
from types import ModuleType

from hooktrace.errors import HooktraceError

__all__ = ["DataExtraMissing", "require"]


class DataExtraMissing(HooktraceError):
    """pyarrow, duckdb or pyspark is not installed."""


_EXTRA = {"pyarrow": "data", "duckdb": "data", "pyspark": "spark", "pandas": "data"}


def require(module: str) -> ModuleType:
    """``import module``, or :class:`DataExtraMissing` naming the extra to install.

    Example:
        >>> require("pyarrow").__name__
        'pyarrow'
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        extra = _EXTRA.get(top, "data")
        raise DataExtraMissing(f"{top} is not installed ({e}); pip install "
                               f"hooktrace[{extra}]") from None
