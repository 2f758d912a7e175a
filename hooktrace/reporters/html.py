"""``hooktrace report``: one self-contained HTML file that opens offline.

What it holds: the module hierarchy as an icicle chart (plotly.js's ``icicle``;
width = time, forward, backward and eval calls side by side under the run, click a box to
zoom into it, click the top bar to zoom out), step times as a bar chart when
the run has step marks, the summary table (click a header to sort), and how to
open the full trace. plotly.js (~4.8 MB minified) is inlined from the installed
``plotly`` Python package: the file needs no network access, and there is no
hand-written chart code to maintain.

How time maps to widths. Forward: each module's own box is its ``self`` time,
so a box's width (its own plus its children's) is exactly its forward
``total``. Backward: a module's ``bwd_total`` is not the sum of its
children's (the engine's time between nodes, and children that overlap on
several threads), so its own box is ``max(0, bwd_total - children's
bwd_total)`` and its width is the larger of the two. Autograd nodes attributed
to no module get one box, ``<unattributed>``. A module called under several
parents (a shared module) appears once, under its name's parent.

FLOPs. For a run recorded with ``trace(model, flops=True)`` the table has the
summary's FLOP columns (``flops`` and ``bwd_flops`` per call, ``TFLOP/s`` and
``bwd_TFLOP/s`` achieved, and ``MFU`` when a peak is known: ``peak_tflops``,
``hooktrace report --peak-tflops``, or the device's known peak), the icicle's
hover text gives each module's TFLOP/s, and the facts line the root module's (as
FLOPs' column provider says: hooktrace.analysis.flops.FlopColumns).

Example::

    import hooktrace
    from hooktrace.reporters.html import write_report
    write_report(hooktrace.load("run.htrace"), "report.html", source="run.htrace")
"""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from hooktrace._output import open_output
from hooktrace.errors import HooktraceError
from hooktrace.text import display_path, format_bytes
from hooktrace.analysis.columns import PROVIDERS, cell_text
from hooktrace.analysis.summary import (
    UNATTRIBUTED,
    StepTable,
    Summary,
    format_ns,
)

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

__all__ = ["ICICLE_OPTIONS", "OTHER_MEANS", "PAGE_HEAD", "ReportError", "TABLE_SORT_SCRIPT",
           "plotly_js", "render_report", "script_json", "sortable_table", "steps_figure",
           "write_report"]

RUN_ID = "run"  # the icicle's root box

# Table headers (and their tooltips) that differ from the summary's keys; a recorded
# quantity's are its column provider's (hooktrace.analysis.columns: ColumnProvider.headers).
_HEADERS = {
    "timing": ("timing", "measured: module calls timed as they ran; kernels: time of the "
                         "compiled region's kernels attributed to this module (its calls "
                         "were compiled away)"),
}


class ReportError(HooktraceError):
    """The report cannot be written (plotly is not installed)."""


def plotly_js() -> str:
    """The minified plotly.js bundled with the ``plotly`` Python package.

    Read as a file rather than through ``plotly.offline.get_plotlyjs()``:
    importing ``plotly.offline`` costs ~1 s of imports for nothing else used.
    """
    try:
        path = resources.files("plotly") / "package_data" / "plotly.min.js"
        return path.read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise ReportError("the HTML report inlines plotly.js from the plotly package, which is "
                          "not installed: pip install plotly") from e


def _name_parent(name: str) -> str:
    """The qualified name of the parent module; "" for a top-level one and for a row
    hooktrace names in angle brackets (``<torch.compile>``: issue #38, a box ``<torch``
    held a child ``compile>``)."""
    return "" if _bracketed(name) else name.rpartition(".")[0]


def _name_label(name: str) -> str:
    """A box's label: the last part of the name (a bracketed name whole)."""
    if not name:
        return "<root>"
    return name if _bracketed(name) else name.rpartition(".")[2]


def _bracketed(name: str) -> bool:
    return name.startswith("<") and name.endswith(">")


# One colour per phase, the same in every chart of every report.
FORWARD_COLOR = "#ff7f0e"
BACKWARD_COLOR = "#1f77b4"
OTHER_COLOR = "#2ca02c"
EVAL_COLOR = "#9467bd"
RUN_COLOR = "#dddddd"


def _box_color(id_: str) -> str:
    branch = id_.split("/", 2)[1] if "/" in id_ else ""
    return {"forward": FORWARD_COLOR, "backward": BACKWARD_COLOR,
            "eval": EVAL_COLOR}.get(branch, RUN_COLOR)


def icicle_data(summary: Summary) -> dict[str, list[Any]]:
    """The icicle's boxes: ``ids``, ``labels``, ``parents``, ``values`` (µs, own part),
    ``hover`` text; see the module docstring for how widths are chosen."""
    # the training calls under forward and backward; eval calls (model.eval() or
    # no_grad: a validation pass) under a branch of their own, beside them (issue #38:
    # 12.5 s of nanoGPT's eval was invisible here)
    rows = [r for r in summary.rows if r["module"] != UNATTRIBUTED and r.get("mode") != "eval"]
    eval_rows = [r for r in summary.rows
                 if r["module"] != UNATTRIBUTED and r.get("mode") == "eval" and r["calls"]]
    by_name = {r["module"]: r for r in rows}
    eval_by_name = {r["module"]: r for r in eval_rows}
    boxes: dict[str, dict[str, Any]] = {}
    order: list[str] = []

    def box(id_: str, label: str, parent: str, value_ns: float, hover: str) -> None:
        if id_ not in boxes:
            order.append(id_)
            boxes[id_] = {"label": label, "parent": parent, "value": 0.0, "hover": hover}
        boxes[id_]["value"] += max(0.0, value_ns) / 1e3

    def ensure(phase: str, name: str) -> str:
        """The box id of module ``name`` in ``phase`` (``run/PHASE/NAME``), creating its
        ancestors."""
        pid = f"{RUN_ID}/{phase}"
        table = eval_by_name if phase == "eval" else by_name
        if name == "" and "" not in table:
            return pid
        chain = []
        n: str | None = name
        while n is not None:
            chain.append(n)
            n = None if n == "" else _name_parent(n)
        parent = pid
        for n in reversed(chain):
            id_ = f"{pid}/{n or '<root>'}"
            row = table.get(n)
            label = _name_label(n)
            hover = f"{n or '<root>'}<br>{row['type']}" if row else f"{n}<br>(not called)"
            box(id_, label, parent, 0.0, hover)
            parent = id_
        return parent

    def called_ancestor(name: str, table: dict[str, dict[str, Any]],
                        calls: str = "calls") -> str | None:
        """The nearest ancestor of ``name`` with ``calls`` in ``table``, or None."""
        while name:
            name = _name_parent(name)
            if name in table and table[name][calls]:
                return name
        return None

    def calls_branch(phase: str, called: list[dict[str, Any]], table: dict[str, dict[str, Any]],
                     what: str) -> None:
        """The branch of the forward (or eval) calls: each module's own box is its self."""
        total = sum(r["total_ns"] for r in called if called_ancestor(r["module"], table) is None)
        box(f"{RUN_ID}/{phase}", phase, RUN_ID, 0.0, f"{what}: {format_ns(total)}")
        for r in called:
            id_ = ensure(phase, r["module"])
            boxes[id_]["value"] += r["self_ns"] / 1e3
            boxes[id_]["hover"] += (f"<br>{phase} total {format_ns(r['total_ns'])} in "
                                    f"{r['calls']} calls<br>self {format_ns(r['self_ns'])}"
                                    + (_hover(r, "") if phase == "forward" else ""))

    bwd_rows = [r for r in rows if r["bwd_calls"]]
    box(RUN_ID, "run", "", 0.0, "the run: forward and backward time")
    calls_branch("forward", [r for r in rows if r["calls"]], by_name, "forward")
    if bwd_rows or any(r["module"] == UNATTRIBUTED for r in summary.rows):
        box(f"{RUN_ID}/backward", "backward", RUN_ID, 0.0, "backward")
        children_ns: dict[str, float] = {}
        for r in bwd_rows:
            # nearest called ancestor whose backward row exists gets the child's time
            p = called_ancestor(r["module"], by_name, "bwd_calls")
            if p is not None:
                children_ns[p] = children_ns.get(p, 0.0) + r["bwd_total_ns"]
        for r in bwd_rows:
            id_ = ensure("backward", r["module"])
            own = r["bwd_total_ns"] - children_ns.get(r["module"], 0.0)
            boxes[id_]["value"] += max(0.0, own) / 1e3
            boxes[id_]["hover"] += (f"<br>backward total {format_ns(r['bwd_total_ns'])} in "
                                    f"{r['bwd_calls']} spans<br>own nodes "
                                    f"{format_ns(r['bwd_self_ns'])}" + _hover(r, "bwd_"))
        loose = sum(r["bwd_total_ns"] for r in summary.rows if r["module"] == UNATTRIBUTED)
        if loose:
            box(f"{RUN_ID}/backward/{UNATTRIBUTED}", UNATTRIBUTED, f"{RUN_ID}/backward", loose,
                f"autograd nodes of no module (AccumulateGrad, the loss's): {format_ns(loose)}")
    if eval_rows:
        calls_branch("eval", eval_rows, eval_by_name, "eval calls (model.eval() or no_grad)")
    return {"ids": order, "labels": [boxes[i]["label"] for i in order],
            "parents": [boxes[i]["parent"] for i in order],
            "values": [round(boxes[i]["value"], 3) for i in order],
            "hover": [boxes[i]["hover"] for i in order],
            "colors": [_box_color(i) for i in order]}


def _hover(row: dict[str, Any], prefix: str) -> str:
    """What the recorded quantities' providers add to a box's hover text (FLOPs: per call,
    TFLOP/s)."""
    return "".join(p.hover(row, prefix) for p in PROVIDERS)


def _table_columns(summary: Summary) -> list[str]:
    """Summary's columns, in its order, that some row has a value for (so memory and
    FLOP columns appear when recorded, recompute columns when there was any)."""
    keys = list(summary.rows[0].keys()) if summary.rows else []
    if not any(r.get("mode") == "eval" for r in summary.rows):
        keys = [k for k in keys if k != "mode"]  # training calls only: nothing to tell apart
    if all(r.get("timing", "measured") == "measured" for r in summary.rows):
        keys = [k for k in keys if k != "timing"]  # no compiled region seen inside
    return [k for k in keys if any(r.get(k) is not None and r.get(k) != 0 for r in summary.rows)
            or k in ("module", "type", "calls")]


def _cell(key: str, value: Any) -> tuple[str, str]:
    """(shown text, sort key) of one table cell."""
    if value is None:
        return "", ""
    if key == "module":
        return (value or "<root>"), value
    if isinstance(value, (int, float)) and key.endswith("_ns"):  # (an int's repr: its str)
        return format_ns(value), repr(value)
    text = cell_text(key, value)  # a recorded quantity's cells read as in the terminal table
    if text is not None:
        return text, str(value)
    if key.endswith("_bytes"):
        return format_bytes(value), str(value)
    if isinstance(value, float):
        return f"{value:.3g}", repr(value)
    return str(value), str(value)


def _header(key: str, gpu: bool = False) -> tuple[str, str]:
    """(shown name, tooltip) of a column: a time column is named without its ``_ns`` (its
    cells carry their unit: ns, µs, ms, s), a byte column likewise. ``gpu`` (the run
    recorded device time): the host time columns are named ``host_...``."""
    if key in _HEADERS:
        return _HEADERS[key]
    for p in PROVIDERS:
        if key in p.headers:
            return p.headers[key]
    host = "host_" if gpu else ""
    if key.endswith("_ns"):
        return (f"{host}{key[:-3]} (time)", "time; each cell gives its unit (ns, µs, ms, s)"
                + ("; host time: when the calls ran on the CPU (kernel launches)" if gpu else ""))
    if key == "bwd_fwd_ratio":
        return f"{host}bwd/fwd", "backward total over forward total"
    return key, ""


def _table_html(summary: Summary) -> str:
    cols = _table_columns(summary)
    device = summary.gpu or "kernel_ns" in summary.columns
    return sortable_table([(c, *_header(c, device)) for c in cols],
                          [[_cell(c, r.get(c)) for c in cols] for r in summary.rows],
                          ("module", "type", "mode", "timing"))


def sortable_table(columns: Sequence[tuple[str, str, str]],
                   rows: Iterable[Sequence[tuple[str, str]]], text_keys: Collection[str]) -> str:
    """The reports' table (``table#summary``, sorted by TABLE_SORT_SCRIPT): ``columns``
    (key, header, tooltip), per row its cells' (shown text, sort key); the cells of
    ``text_keys`` are left-aligned, the others numbers."""
    head = "".join(f'<th data-col="{i}" data-key="{key}" title="{html.escape(tip)}'
                   f'{"; " if tip else ""}click to sort">{html.escape(name)}</th>'
                   for i, (key, name, tip) in enumerate(columns))
    body = "".join("<tr>" + "".join(
        f'<td data-v="{html.escape(v)}"{"" if key in text_keys else " class=n"}>'
        f"{html.escape(text)}</td>" for (key, _, _), (text, v) in zip(columns, row)) + "</tr>"
        for row in rows)
    # in a scrolling box: a wide table (memory and FLOP columns) never widens the page
    return (f'<div class="scroll"><table id="summary"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def script_json(value: Any) -> str:
    """``value`` as JSON inside a ``<script>``: module names' "</" would close it early."""
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")


# The icicle's trace options. sort False: boxes in the data's order, so forward is always
# left of backward (plotly sorts siblings by value by default, and the larger phase went
# first: they swapped sides between reports).
ICICLE_OPTIONS: dict[str, Any] = {"type": "icicle", "branchvalues": "remainder",
                                  "sort": False, "tiling": {"orientation": "v"}}
# What the step chart's "other" is (legend, hover and caption)
OTHER_MEANS = ("the step's time outside its outermost forward and backward calls: the "
               "optimizer step, data loading, the loss, Python between calls")


def steps_figure(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The step chart's plotly figure (``data``, ``layout``): per step, forward, backward
    and other time (ms), stacked in that order. The legend sits above the plot on the
    left, clear of plotly's toolbar (top right), and says what "other" is."""
    parts = [("forward", "forward", [r["forward_ns"] / 1e6 for r in rows], FORWARD_COLOR,
              "the step's outermost forward calls"),
             ("backward", "backward", [r["backward_ns"] / 1e6 for r in rows], BACKWARD_COLOR,
              "the step's outermost backward spans"),
             ("other", "other (optimizer, data, ...)",
              [max(0, r["duration_ns"] - r["forward_ns"] - r["backward_ns"]) / 1e6
               for r in rows], OTHER_COLOR, OTHER_MEANS)]
    data = [{"type": "bar", "name": label, "x": [r["step"] for r in rows], "y": y,
             # torch.compile compiled during the step: hatched bars
             "marker": {"color": color,
                        "pattern": {"shape": ["/" if r.get("compile") else "" for r in rows]}},
             "meta": key,
             "hovertemplate": f"{html.escape(key)}: %{{y:.3f}} ms<br>{html.escape(means)}"
                              "<extra></extra>"}
            for key, label, y, color, means in parts]
    layout = {"barmode": "stack", "xaxis": {"title": {"text": "step"}},
              "yaxis": {"title": {"text": "ms"}}, "margin": {"t": 40},
              "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1.02,
                         "yanchor": "bottom", "traceorder": "normal"}}
    return {"data": data, "layout": layout}


def _device_view(summary: Summary) -> Summary:
    """``summary`` with its device time in the host columns the icicle reads (forward:
    gpu_total / gpu_self over gpu_calls; backward: gpu_bwd_total / gpu_bwd_self), or,
    for kernel busy time (CUPTI), kernel / kernel_self and kernel_bwd / kernel_bwd_self."""
    g = summary.gpu
    total, own, bwd, bwd_own = (("gpu_total_ns", "gpu_self_ns", "gpu_bwd_total_ns",
                                 "gpu_bwd_self_ns") if g else
                                ("kernel_ns", "kernel_self_ns", "kernel_bwd_ns",
                                 "kernel_bwd_self_ns"))
    rows = []
    for r in summary.rows:
        if r.get(total) is None:  # unattributed nodes, compile time: no device time
            continue
        rows.append({**r, "calls": r["gpu_calls"] if g else r["calls"], "total_ns": r[total],
                     "self_ns": r[own], "bwd_total_ns": r[bwd], "bwd_self_ns": r[bwd_own],
                     "bwd_calls": (r["bwd_calls"] or 1) if r[bwd] else 0})
    return Summary(rows, summary.counts, summary.notes, summary.columns)


def render_report(trace: TraceData, *, source: str | None = None,
                  title: str | None = None, peak_tflops: float | None = None,
                  notes: Sequence[str] = ()) -> str:
    """The report's HTML text (see the module docstring); ``peak_tflops`` (TFLOP/s)
    gives the MFU column of a run recorded with FLOPs; ``notes``: facts about what the
    report covers (the steps it shows), first."""
    js = plotly_js()
    summary = Summary.from_trace(trace, peak_tflops=peak_tflops)
    steps = StepTable.from_trace(trace)
    device = summary.gpu or "kernel_ns" in summary.columns
    ice = icicle_data(_device_view(summary) if device else summary)
    title = title or f"hooktrace report: {os.path.basename(source) if source else 'run'}"
    info = trace.info
    facts = list(notes) + [f"{len(trace.spans())} spans", f"{len(trace.modules)} modules",
             f"host {trace.hostname}, pid {trace.pid}"]
    if info.get("torch_version"):
        facts.append(f"torch {info['torch_version']}")
    if summary.counts.get("steps"):
        facts.append(f"{summary.counts['steps']} complete steps, p50 "
                     f"{format_ns(summary.counts['step_p50_ns'])}")
    if device:
        facts.append(("device time" if summary.gpu else "kernel busy time (CUPTI)")
                     + " recorded: the table leads with it, the icicle shows it")
    if summary.counts.get("compile_steps"):
        facts.append(f"{summary.counts['compile_steps']} compile steps (hatched in the step "
                     "chart) left out of step statistics")
    # each recorded quantity's own (FLOPs, memory: hooktrace.analysis.columns' providers)
    root = next((r for r in summary.rows if r["module"] == "" and r.get("mode") != "eval"), None)
    facts += [fact for p in PROVIDERS for fact in p.facts(root, summary.columns)]
    # complete steps only: what follows the last step mark (an eval pass, the end of
    # the run) is not a training step and would set the chart's scale
    done = [r for r in steps.rows if r["complete"]] or steps.rows
    step_figure = steps_figure(done)
    src = html.escape(source or "RUN.htrace")
    return _TEMPLATE.format(
        title=html.escape(title), plotly=js.replace("</script", "<\\/script"),
        facts=html.escape(" · ".join(facts)),
        footer=html.escape(summary.footer()), table=_table_html(summary),
        icicle=script_json(ice), steps=script_json(step_figure), src=src,
        icicle_options=script_json(ICICLE_OPTIONS), other_means=html.escape(OTHER_MEANS),
        run_color=RUN_COLOR,
        steps_display="block" if steps.rows else "none", sort_script=TABLE_SORT_SCRIPT,
    )


def write_report(trace: TraceData, path: str | os.PathLike[str], *,
                 source: str | None = None, title: str | None = None,
                 peak_tflops: float | None = None, notes: Sequence[str] = ()) -> None:
    """Write the report to ``path`` (through a temporary file, like every output)."""
    # a file name that is not UTF-8 would not encode: shown with \xNN escapes
    text = render_report(trace, source=None if source is None else display_path(source),
                         title=title, peak_tflops=peak_tflops, notes=notes)
    with open_output(path, gzip_by_name=False) as f:
        f.write(text.encode("utf-8"))


# Click a header of table#summary to sort by it (blanks last, numbers as numbers); also
# used by reporters.aggregate
TABLE_SORT_SCRIPT = """  var table = document.getElementById("summary");
  table.querySelectorAll("th").forEach(function (th) {
    th.addEventListener("click", function () {
      var col = +th.dataset.col, asc = !th.classList.contains("asc");
      table.querySelectorAll("th").forEach(function (h) { h.classList.remove("asc", "desc"); });
      th.classList.add(asc ? "asc" : "desc");
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
        var nx = parseFloat(x), ny = parseFloat(y), c;
        if (x === "" || y === "") c = (x === "") - (y === "");
        else if (!isNaN(nx) && !isNaN(ny)) c = nx - ny;
        else c = x < y ? -1 : x > y ? 1 : 0;
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
"""

# The reports' shared head and look (this page's and reporters/aggregate.py's): the text,
# the sortable table; each page adds its charts' sizes to the style it leaves open. Braces
# doubled: part of a format template.
PAGE_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }}
h1 {{ font-size: 1.4em; margin-bottom: .2em; }} h2 {{ font-size: 1.1em; margin-top: 1.6em; }}
.facts, .hint {{ color: #555; }}
.scroll {{ overflow: auto; max-width: 100%; max-height: 80vh; }}
table {{ border-collapse: collapse; font-size: 12px; }}
th, td {{ padding: 2px 8px; border-bottom: 1px solid #eee; white-space: nowrap; }}
th {{ cursor: pointer; background: #f4f4f4; position: sticky; top: 0; user-select: none; }}
th.asc::after {{ content: " ▲"; }} th.desc::after {{ content: " ▼"; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
"""

_TEMPLATE = PAGE_HEAD + """#icicle {{ height: 560px; }} #steps {{ height: 300px; }}
pre {{ background: #f6f6f6; padding: .6em; white-space: pre-wrap; }}
</style>
<script>{plotly}</script>
</head><body>
<h1>{title}</h1>
<div class="facts">{facts}</div>
<h2>Where the time goes</h2>
<div class="hint">Width = time; forward and backward side by side. Click a box to zoom in,
the top bar to zoom out. Hover for totals and calls.</div>
<div id="icicle"></div>
<div id="steps-section" style="display:{steps_display}">
<h2>Step times</h2>
<div class="hint">Per step: forward, backward and other, {other_means}.</div>
<div id="steps"></div></div>
<h2>Per module</h2>
<div class="hint">Click a column header to sort.</div>
{table}
<pre>{footer}</pre>
<h2>The full trace</h2>
<div class="hint">Every call on a timeline: convert the run with
<code>hooktrace export {src} -o trace.json.gz</code>, then open trace.json.gz in the Perfetto
UI (ui.perfetto.dev, "Open trace file") or in chrome://tracing ("Load"). This report needs no
network; the trace viewer is a web page.</div>
<script>
(function () {{
  var config = {{displaylogo: false, responsive: true, showLink: false,
                showSendToCloud: false}};
  var ice = {icicle};
  Plotly.newPlot("icicle", [Object.assign({{
    ids: ice.ids, labels: ice.labels, parents: ice.parents,
    values: ice.values, customdata: ice.hover,
    hovertemplate: "%{{customdata}}<extra></extra>",
    marker: {{colors: ice.colors}}, root: {{color: "{run_color}"}}
  }}, {icicle_options})], {{margin: {{t: 10, l: 10, r: 10, b: 10}}}}, config);
  // the step chart (hooktrace.reporters.html.steps_figure): the icicle's colours
  var s = {steps};
  if (s.data[0].x.length) {{
    Plotly.newPlot("steps", s.data, s.layout, config);
  }}
{sort_script}
}})();
</script>
</body></html>
"""
