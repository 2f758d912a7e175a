"""The same queries on Spark, for a fleet (issue #29): a run's Parquet tables as Spark
temporary views, and the straggler and per-module summaries built with PySpark.

When the ranks' traces sit on shared storage, export them once
(``hooktrace export traces/ -o /shared/run1/``: one hive-partitioned dataset per table,
:mod:`hooktrace.data.parquet`) and run the queries where the cluster is::

    from hooktrace.data.spark import register, session, spark_summary
    spark = session("spark://head:7077")          # or local[N]
    register(spark, "/shared/run1")               # views spans, steps, modules, ...
    spark.sql("SELECT rank, sum(dur_ns) FROM spans GROUP BY rank").show()
    print(spark_summary(spark).to_text())          # hooktrace summary DIR's tables

or from the command line: ``hooktrace query --engine spark --master URL DIR "SELECT ..."``.
The SQL is the DuckDB engine's (:data:`hooktrace.data.engine.STRAGGLER_SQL`,
:data:`~hooktrace.data.engine.MODULE_TOTALS_SQL`), so both engines give the same
numbers; only the small per-(rank, module, step) aggregates come back to the driver.
Needs ``pip install hooktrace[spark]`` and a Java runtime (17 or later).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from hooktrace.analysis.stragglers import RanksSummary, summary_from_tables
from hooktrace.data import require
from hooktrace.data.engine import (
    MODULE_TOTALS_SQL,
    STRAGGLER_SQL,
    QueryError,
    Source,
    check_source,
    find_source,
)
from hooktrace.data.schema import TABLES, file_schema

__all__ = ["check_parquet", "java_missing", "module_totals", "register", "session",
           "spark_summary", "straggler_tables"]


def java_missing() -> str | None:
    """Why Spark cannot start here (no ``java`` on PATH nor under JAVA_HOME), else None."""
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return None
    if shutil.which("java"):
        return None
    return ("no Java runtime: Spark needs one (Debian: apt-get install default-jre-headless; "
            "or set JAVA_HOME)")


def session(master: str = "local[2]", app: str = "hooktrace") -> Any:
    """A SparkSession on ``master`` (``local[N]``, ``spark://host:port``, ``yarn``...),
    with UTC as the session time zone and few shuffle partitions (the aggregates are
    small)."""
    require("pyspark")
    why = java_missing()
    if why is not None:
        raise QueryError(why)
    from pyspark.sql import SparkSession

    try:
        return (SparkSession.builder.master(master).appName(app)
                .config("spark.sql.session.timeZone", "UTC")
                .config("spark.sql.shuffle.partitions", "8")
                .config("spark.ui.enabled", "false")
                # the stage progress bars ("[Stage 3:>  (0 + 2) / 8]") go to the terminal
                # between the query's output lines: the CLI prints the result only
                .config("spark.ui.showConsoleProgress", "false")
                # the JVM's own log (hundreds of lines when a master is unreachable) stays
                # quiet: what went wrong is this function's one line
                .config("spark.log.level", "OFF")
                .getOrCreate())
    except Exception as e:  # py4j's Java exception, pyspark's own: one line naming the master
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
        raise QueryError(f"could not start Spark on master {master!r}: "
                         f"{type(e).__name__}: {first[:300]}") from None


def _frame(spark: Any, path: str, hive: bool) -> Any:
    """A table's files as a DataFrame with ``rank`` and ``window`` (long) first."""
    from pyspark.sql import functions as F

    if hive:  # DIR/**/*.parquet -> DIR: Spark discovers rank=N/window=K itself
        base = path[: path.index("**")].rstrip("/")
        df = spark.read.option("mergeSchema", "true").parquet(base)
    else:
        df = spark.read.parquet(path)
    cols = []
    for c in ("rank", "window"):
        cols.append((F.col(c) if c in df.columns else F.lit(None)).cast("long").alias(c))
    rest = [F.col(c) for c in df.columns if c not in ("rank", "window")]
    return df.select(*cols, *rest)


def check_parquet(path: str | os.PathLike[str] | Source) -> Source:
    """``path``'s tables (:func:`find_source`), or the one-line error when it holds no
    Parquet export: Spark reads Parquet, not ``.htrace`` files."""
    src = path if isinstance(path, Source) else find_source(path)
    if not src.parquet:
        raise QueryError(f"{src.path}: Spark reads Parquet; export the traces first "
                         f"(hooktrace export {src.path} -o DIR/) and query DIR")
    check_source(src, TABLES, os.cpu_count() or 1)  # (as DuckDB's views: issue #35)
    return src


def register(spark: Any, path: str | os.PathLike[str] | Source) -> list[str]:
    """``path``'s Parquet tables (as ``hooktrace export`` writes them) as temporary views
    of their names; returns the names. A table the export left out is an empty view.
    ``.htrace`` inputs must be exported first (Spark reads Parquet)."""
    src = check_parquet(path)
    from pyspark.sql.pandas.types import from_arrow_schema

    for t in TABLES:
        if t in src.parquet:
            g, hive = src.parquet[t]
            _frame(spark, g, hive).createOrReplaceTempView(t)
        else:
            schema = _plain(file_schema(t, partitioned=False))
            spark.createDataFrame([], from_arrow_schema(schema)).createOrReplaceTempView(t)
    return list(TABLES)


def _plain(schema: Any) -> Any:
    """Dictionary-encoded string fields as plain strings (Spark's types)."""
    pa = require("pyarrow")
    return pa.schema([pa.field(f.name, pa.string() if pa.types.is_dictionary(f.type) else f.type,
                               f.nullable) for f in schema])


def module_totals(spark: Any) -> Any:
    """Per rank and (module, mode, phase): calls, total and self ns (Arrow table), the
    DuckDB engine's :data:`~hooktrace.data.engine.MODULE_TOTALS_SQL` run on Spark."""
    return spark.sql(MODULE_TOTALS_SQL).toArrow()


def straggler_tables(spark: Any) -> dict[str, Any]:
    """The straggler tables' per-file aggregates (the DuckDB engine's
    :data:`~hooktrace.data.engine.STRAGGLER_SQL`) run on Spark over the registered views,
    as Arrow tables on the driver; :func:`hooktrace.analysis.stragglers.spark_summary` combines
    them into ``hooktrace summary DIR``'s tables."""
    return {k: spark.sql(sql).toArrow() for k, sql in STRAGGLER_SQL.items()}


def spark_summary(spark: Any, **kwargs: Any) -> RanksSummary:
    """``hooktrace summary DIR``'s straggler tables computed by Spark over the views
    :func:`register` made: the per-file aggregates run on the cluster, the small tables
    are combined on the driver as for DuckDB. ``kwargs``: ``threshold``,
    ``min_excess_ns``, ``profilers`` (files on the driver)."""
    return summary_from_tables([straggler_tables(spark)], **kwargs)


def query(spark: Any, path: str | os.PathLike[str] | Source, sql: str) -> Any:
    """``sql`` over ``path``'s tables on Spark, as a ``pyarrow.Table``."""
    register(spark, path)
    return spark.sql(sql).toArrow()
