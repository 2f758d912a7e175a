"""A phase's one encoding (issue #48): its numbers and names in the per-call table,
diff, the rank reduction and their SQL (:mod:`hooktrace.data.engine`, which generates its
phase expressions here).

* a call's phase: its span category (``Spans.cat``, hooktrace.reading), ``CAT_FORWARD``
  0, ``CAT_BACKWARD`` 1, ``CAT_RECOMPUTE`` 2, named :data:`PHASES` (the Parquet
  ``phase`` column's values); its mode, :data:`MODES` (eval: grad off or
  ``module.eval()``); :func:`phase_label` names a (phase, mode);
* diff's keys, :data:`KEY_PHASES` (:func:`key_phases`): forward, backward and eval
  (forward calls in eval mode) on the host, then the same three on the device
  (:data:`GPU_PHASES`, recompute counted as forward there);
* the rank reduction's phases (hooktrace.analysis.stragglers), :data:`RANK_PHASES`
  (:func:`rank_phase`): forward and backward on the host, then on the device, the mode
  apart.

Example:
    >>> import numpy as np
    >>> cat = np.array([CAT_FORWARD, CAT_BACKWARD, CAT_RECOMPUTE, CAT_FORWARD])
    >>> [KEY_PHASES[k] if k >= 0 else None
    ...  for k in key_phases(cat, np.array([0, 0, 0, 1], bool), device=True)]
    ['gpu forward', 'gpu backward', 'gpu forward', 'gpu eval']
    >>> RANK_PHASES[int(rank_phase(np.array(True), True))], phase_label(CAT_RECOMPUTE, True)
    ('gpu bwd', 'eval recompute')
"""

from __future__ import annotations

import numpy as np

from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, CAT_NAMES, CAT_RECOMPUTE

__all__ = ["CAT_BACKWARD", "CAT_EVAL", "CAT_FORWARD", "CAT_RECOMPUTE", "EVAL", "GPU_PHASES",
           "HOST_PHASES", "KEY_PHASES", "MODES", "PHASES", "RANK_DEVICE", "RANK_PHASES", "SQL_EVAL",
           "SQL_HOST_PHASES", "key_phases",
           "phase_label", "rank_phase", "sql_key_phase", "sql_rank_phase"]

PHASES = CAT_NAMES  # by span category: forward, backward, recompute
MODES = ("train", "eval")  # eval: grad off or module.eval() (SPAN_EVAL)
EVAL = 2  # diff's key of the forward calls in eval mode, beside CAT_FORWARD and CAT_BACKWARD
KEY_PHASES = (*PHASES[:EVAL], MODES[1], *(f"gpu {p}" for p in (*PHASES[:EVAL], MODES[1])))
HOST_PHASES, GPU_PHASES = KEY_PHASES[:EVAL + 1], KEY_PHASES[EVAL + 1:]
# the category key of eval forward calls where calls are keyed by (module, category): no
# span category's (the aggregates' device time, hooktrace.analysis.device_time)
CAT_EVAL = -1
RANK_PHASES = ("fwd", "bwd", "gpu fwd", "gpu bwd")
RANK_DEVICE = 2  # the first device phase of RANK_PHASES


def phase_label(cat: int, eval_: bool) -> str:
    """A (phase, mode)'s one-word name in the views that key rows by it (diff, the
    aggregates): ``forward``, ``backward``, ``recompute``; ``eval`` for eval forward
    calls, ``eval backward``/``eval recompute`` for the others made in eval mode."""
    name = PHASES[cat]
    return ("eval" if cat == CAT_FORWARD else f"eval {name}") if eval_ else name


def key_phases(cat: np.ndarray, eval_: np.ndarray, device: bool) -> np.ndarray:
    """Per call (its category and mode), its index into :data:`KEY_PHASES` (int64), -1
    for none: a backward call in eval mode, and on the host a recompute."""
    backward = cat == CAT_BACKWARD
    forward = ~backward if device else cat == CAT_FORWARD
    k = np.where(backward, np.where(eval_, -1, CAT_BACKWARD),
                 np.where(forward, np.where(eval_, EVAL, CAT_FORWARD), -1)).astype(np.int64)
    return np.where(k >= 0, k + (EVAL + 1) * device, k)


def rank_phase(backward: np.ndarray, device: bool) -> np.ndarray:
    """Per call (``backward``: whether it is), its index into :data:`RANK_PHASES`."""
    return backward.astype(np.int64) + RANK_DEVICE * int(device)


def _sql(name: str) -> str:
    return f"'{name}'"


SQL_EVAL = f"mode = {_sql(MODES[1])}"  # a row's mode as a boolean, in SQL
SQL_HOST_PHASES = f"phase <> {_sql(PHASES[CAT_RECOMPUTE])}"  # the rank reduction's host rows


def sql_key_phase(device: bool) -> str:
    """:func:`key_phases` in SQL over a table's ``phase`` and ``mode`` columns (NULL for
    none)."""
    forward = (f"phase <> {_sql(PHASES[CAT_BACKWARD])}" if device
               else f"phase = {_sql(PHASES[CAT_FORWARD])}")
    off = (EVAL + 1) * device
    train, eval_ = (f"mode = {_sql(m)}" for m in MODES)
    return (f"CASE WHEN {forward} AND {train} THEN {CAT_FORWARD + off} "
            f"WHEN phase = {_sql(PHASES[CAT_BACKWARD])} AND {train} THEN {CAT_BACKWARD + off} "
            f"WHEN {forward} AND {eval_} THEN {EVAL + off} END")


def sql_rank_phase(device: bool) -> str:
    """:func:`rank_phase` in SQL over a table's ``phase`` column (BIGINT)."""
    forward, backward = rank_phase(np.array([False, True]), device).tolist()
    return (f"CAST(CASE WHEN phase = {_sql(PHASES[CAT_BACKWARD])} THEN {backward} "
            f"ELSE {forward} END AS BIGINT)")

