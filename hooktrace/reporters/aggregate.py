"""``hooktrace report DIR``: the HTML report of an ``aggregate=`` folder (issue #31).

One self-contained file, like the trace report (hooktrace.reporters.html, whose
plotly.js, colours and table sorting it shares): the step-time chart from the
aggregate table's ``step`` rows (per window: the mean step and the longest one; the
steps kept whole are marked on it), the per-module table over the whole run (per module
and mode: calls, total, ms per step, the median step's time (weighted by steps), the
longest call, and device time, memory peak, TFLOP/s and numerics when recorded; click a header
to sort), and the list of the steps kept whole by the detail policy, each a trace with
the command that reports it.

The table comes in as a pyarrow Table (``hooktrace.data.aggregates.load_aggregates``),
the kept steps as dicts with ``step``, ``why`` and ``path``.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from hooktrace._output import open_output
from hooktrace.data.schema import AGGREGATES
from hooktrace.reporters.html import (
    BACKWARD_COLOR,
    FORWARD_COLOR,
    OTHER_COLOR,
    PAGE_HEAD,
    TABLE_SORT_SCRIPT,
    plotly_js,
    script_json,
    sortable_table,
)
from hooktrace.analysis.columns import cell_text, declared
from hooktrace.data.aggregates import aggregate_rows, step_rows
from hooktrace.text import display_path

__all__ = ["KEPT_SHOWN", "render_aggregate_report", "step_figure", "write_aggregate_report"]

KEPT_SHOWN = 200  # the kept steps listed by name; the rest are counted
LOG_SCALE_ABOVE = 10.0  # the step chart's y axis is logarithmic when the longest step is
# more than this many times the median window's mean step

# (key, header, tooltip) of the table's columns; then the recorded quantities' (their
# providers' declared aggregates columns: hooktrace.analysis.columns.declared), which
# appear when a row has a value
COLUMNS = (
    ("module", "module", "the module's qualified name (<step>: the steps themselves)"),
    ("mode", "mode", "forward, backward, eval (no_grad or module.eval() calls), or step "
                     "(the steps' wall times)"),
    ("calls", "calls", "calls over the run (step: steps)"),
    ("total_ms", "total ms", "time over the run"),
    ("ms_per_step", "ms/step", "total over the steps aggregated"),
    ("p50_ms_per_step", "p50 ms/step", "the median step's time: each window's time per step, "
                                       "weighted by its steps (a module: over the steps of "
                                       "the windows it ran in)"),
    ("max_ms", "max ms", "the longest call (step: step) of the run"),
)


def step_figure(table: Any, kept: list[dict[str, Any]]) -> dict[str, Any]:
    """The step chart (plotly ``data``, ``layout``): per window of the ``step`` rows (x:
    its first step), the mean step and the longest one (ms); the kept steps as markers
    on the longest-step line of their window."""
    rows = step_rows(table).sort_by("step")
    first = rows["step"].to_pylist()
    steps = rows["steps"].to_pylist()
    mean = [t / max(1, n) for t, n in zip(rows["total_ms"].to_pylist(), steps, strict=True)]
    longest = rows["max_ms"].to_pylist()
    marks: dict[str, list[Any]] = {"x": [], "y": [], "text": []}
    for k in kept:
        i = next((i for i, (f, n) in enumerate(zip(first, steps, strict=True))
                  if f <= k["step"] < f + max(1, n)), None)
        if i is not None:
            marks["x"].append(k["step"])
            marks["y"].append(longest[i])
            marks["text"].append(f"step {k['step']} kept whole ({k.get('why') or '?'})")
    data = [
        {"type": "scatter", "mode": "lines+markers", "name": "mean step", "x": first,
         "y": mean, "customdata": steps, "line": {"color": FORWARD_COLOR},
         "hovertemplate": "from step %{x}: %{y:.3f} ms per step over %{customdata} "
                          "steps<extra></extra>"},
        {"type": "scatter", "mode": "lines", "name": "longest step", "x": first,
         "y": longest, "line": {"color": BACKWARD_COLOR, "dash": "dot"},
         "hovertemplate": "from step %{x}: longest %{y:.3f} ms<extra></extra>"},
        {"type": "scatter", "mode": "markers", "name": "kept whole", "x": marks["x"],
         "y": marks["y"], "text": marks["text"],
         "marker": {"color": OTHER_COLOR, "size": 10, "symbol": "diamond"},
         "hovertemplate": "%{text}<extra></extra>"},
    ]
    # a first step (compilation, a validation pass, the FLOP counter) 10x the typical one
    # would flatten the rest: a log scale then
    typical = sorted(mean)[len(mean) // 2] if mean else 0.0
    log = typical > 0 and max(v for v in longest if v is not None) > LOG_SCALE_ABOVE * typical
    yaxis: dict[str, Any] = {"title": {"text": "ms (log scale)" if log else "ms"}}
    if log:
        yaxis["type"] = "log"
    layout = {"xaxis": {"title": {"text": "step"}}, "yaxis": yaxis,
              "margin": {"t": 40},
              "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1.02,
                         "yanchor": "bottom"}}
    return {"data": data, "layout": layout}


def _cell(key: str, value: Any) -> tuple[str, str]:
    if value is None:
        return "", ""
    text = cell_text(key, value)  # (a recorded quantity's, as its provider formats it)
    if isinstance(value, float):
        return text or (f"{value:.3f}" if key.endswith(("_ms", "_step")) else f"{value:.3g}"
                        ), repr(value)
    return text or str(value), str(value)


def _table_html(rows: list[dict[str, Any]]) -> str:
    cols = list(COLUMNS) + [(c.key, c.title, c.tip) for c in declared(AGGREGATES)
                            if any(r.get(c.key) is not None for r in rows)]
    return sortable_table(cols, [[_cell(k, r.get(k)) for k, _, _ in cols] for r in rows],
                          ("module", "mode"))


def _kept_html(kept: list[dict[str, Any]], link_base: str | None) -> str:
    if not kept:
        return '<p id="kept">No step was kept whole (the detail policy did not fire).</p>'
    items = []
    for k in kept[:KEPT_SHOWN]:
        path = os.fspath(k["path"])
        name = os.path.basename(path)
        href = (quote(os.path.relpath(os.path.abspath(path), link_base)) if link_base
                else "file://" + quote(os.path.abspath(path)))
        report = f"hooktrace report {display_path(path)} -o {name[:-len('.htrace')]}.html"
        items.append(f'<li><a href="{html.escape(href)}">{html.escape(name)}</a>: step '
                     f"{k['step']} ({html.escape(k.get('why') or 'why not recorded')}); "
                     f"<code>{html.escape(report)}</code></li>")
    more = (f"<li>and {len(kept) - KEPT_SHOWN} more in the same folder</li>"
            if len(kept) > KEPT_SHOWN else "")
    return f'<ul id="kept">{"".join(items)}{more}</ul>'


def render_aggregate_report(table: Any, kept: list[dict[str, Any]], *,
                            source: str | None = None, title: str | None = None,
                            link_base: str | None = None, notes: Sequence[str] = ()) -> str:
    """The report's HTML text; ``link_base``: the folder the page is written in (the
    kept steps are linked relative to it), None for absolute links; ``notes``: what the
    folder lacks (hooktrace.data.aggregates.unwritten_lines), after the facts."""
    js = plotly_js()
    rows, n_steps = aggregate_rows(table)
    name = source or "the aggregate folder"
    title = title or ("hooktrace report: " + (os.path.basename(os.path.normpath(source))
                                              if source else "aggregates"))
    step_row = next((r for r in rows if r["mode"] == "step"), None)
    windows = len(step_rows(table))
    facts = [f"{n_steps} steps aggregated in {windows} windows", f"{len(table)} rows",
             f"{len({r['module'] for r in rows if r['mode'] != 'step'})} modules"]
    if step_row is not None and step_row["p50_ms_per_step"] is not None:
        facts.append(f"step p50 {step_row['p50_ms_per_step']:.3f} ms (the median step, "
                     f"weighted by steps), longest {step_row['max_ms']:.3f} ms")
    facts.append(f"{len(kept)} steps kept whole")
    facts += [c.fact for c in declared(AGGREGATES)
              if c.fact and any(r[c.key] is not None for r in rows)]
    facts += list(notes)
    return _TEMPLATE.format(
        title=html.escape(title), plotly=js.replace("</script", "<\\/script"),
        facts=html.escape(" · ".join(facts)), name=html.escape(name),
        table=_table_html(rows), steps=script_json(step_figure(table, kept)),
        kept=_kept_html(kept, link_base), sort_script=TABLE_SORT_SCRIPT)


def write_aggregate_report(table: Any, kept: list[dict[str, Any]],
                           path: str | os.PathLike[str], *, source: str | None = None,
                           title: str | None = None, notes: Sequence[str] = ()) -> None:
    """Write the report to ``path`` (through a temporary file, like every output)."""
    out = os.fspath(path)
    base = None if out == "-" else os.path.dirname(os.path.abspath(out))
    text = render_aggregate_report(table, kept, title=title, link_base=base, notes=notes,
                                   source=None if source is None else display_path(source))
    with open_output(path, gzip_by_name=False) as f:
        f.write(text.encode("utf-8"))


_TEMPLATE = PAGE_HEAD + """#steps {{ height: 320px; }}
code {{ background: #f6f6f6; }}
</style>
<script>{plotly}</script>
</head><body>
<h1>{title}</h1>
<div class="facts">{facts}</div>
<div class="hint">The per-step aggregates of {name} (<code>trace(aggregate=...)</code>,
<code>hooktrace run --aggregate</code>): a row per module and mode per window of steps,
the raw events dropped except for the steps kept whole.</div>
<h2>Step times</h2>
<div class="hint">Per window of steps (x: its first step): the mean step and the longest
one; diamonds: steps kept whole.</div>
<div id="steps"></div>
<h2>Per module, over the run</h2>
<div class="hint">Click a column header to sort.</div>
{table}
<h2>Steps kept whole</h2>
<div class="hint">Each is a trace like any other: <code>hooktrace summary</code>,
<code>diff</code>, <code>report</code>, <code>export</code> (Perfetto) open it.</div>
{kept}
<script>
(function () {{
  var config = {{displaylogo: false, responsive: true, showLink: false,
                showSendToCloud: false}};
  var s = {steps};
  Plotly.newPlot("steps", s.data, s.layout, config);
{sort_script}
}})();
</script>
</body></html>
"""
